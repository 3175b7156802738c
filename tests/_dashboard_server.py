"""Run the dashboard ASGI app under uvicorn in a background thread (tests)."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

#: The dashboard's session cookie.
COOKIE = "pgdurable_session"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Serve ``app`` on a free port; yields its base URL; stops it after."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    end = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > end or not thread.is_alive():
            raise AssertionError("dashboard server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "dashboard server did not stop"


@contextmanager
def login(base: str, token: str, root: str = "") -> Iterator[httpx.Client]:
    """An httpx client holding the session cookie of a login through the form."""
    with httpx.Client(base_url=base, timeout=30) as client:
        r = client.post(f"{root}/login", data={"token": token, "next": "/runs"})
        assert r.status_code == 303, r.text
        assert r.headers["location"] == f"{root}/runs"
        assert COOKIE in client.cookies
        yield client


def form_csrf(html: str, action: str) -> str:
    """The CSRF token of the form of ``action`` on a run page."""
    m = re.search(rf'action="[^"]*/{action}">\s*<input type="hidden" name="csrf" value="(\w+)"',
                  html)
    assert m, html
    return m.group(1)
