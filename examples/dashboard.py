"""The web dashboard, mounted as an ASGI app, plus run metadata and list_runs.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/dashboard.py
(needs ``pip install 'pgdurable[dashboard]'``). It starts two labelled runs,
searches them with ``list_runs``, declares a schedule, serves the dashboard on a
free local port, fetches the Runs page filtered by metadata and the Schedules
page with httpx, and exits 0.

From a shell, the same dashboard:  pgdurable dashboard --port 8080
(read-only and without a login: for 127.0.0.1 only; --token T, at least 32
bytes, puts a login in front of every page; add --actions to allow
cancel/retry/signal/fork of runs and pause/resume/trigger of schedules;
--trusted-host NAME for each name it is reached by).
To mount it in your own Starlette/FastAPI app:
app.mount("/ops", create_app(dsn, token=..., trusted_hosts=["ops.example.com"])).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import httpx
import uvicorn

import pgdurable
from pgdurable.dashboard import create_app
from pgdurable.runs.schedules import make_schedule, upsert_schedule

DSN = os.environ["PGDURABLE_DSN"]


async def main() -> str:
    async with pgdurable.Durable(DSN) as app:
        acme = await app.start("agent", {"q": "hello"}, revision="1",
                               metadata={"tenant": "acme", "user": "u-7"})
        await app.start("agent", {"q": "hi"}, revision="1", metadata={"tenant": "globex"})
        page = await app.list_runs(task="agent", metadata={"tenant": "acme"}, limit=10)
        assert [r.id for r in page.items] == [acme] and page.next_cursor is None
        print(f"list_runs(metadata={{'tenant': 'acme'}}) -> {acme}")
        await upsert_schedule(app, make_schedule("nightly-report", task="agent",
                                                 cron="0 3 * * *", timezone="Europe/Paris"))

    return acme


def fetch_dashboard(acme: str) -> None:
    """Serve the dashboard in a thread and fetch its Runs page, filtered by metadata."""
    with socket.socket() as s:  # a free port for the demo server
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(DSN), host="127.0.0.1", port=port,
                                           log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/runs", params={"metadata": '{"tenant": "acme"}'})
        assert r.status_code == 200 and acme[:8] in r.text
        print(f"GET /runs?metadata=... -> {r.status_code}, shows run {acme[:8]}")
        r = httpx.get(f"http://127.0.0.1:{port}/schedules")
        assert r.status_code == 200 and "nightly-report" in r.text
        print(f"GET /schedules -> {r.status_code}, shows nightly-report and its next tick")
    finally:
        server.should_exit = True
        thread.join(30)


if __name__ == "__main__":
    fetch_dashboard(asyncio.run(main()))
