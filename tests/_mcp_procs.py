"""MCP server processes for the tests: tests/_mcp_server.py (or another module) on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from _waiting import WAIT_LIMIT

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProc:
    """One MCP server process (Streamable HTTP at :attr:`url`)."""

    def __init__(self, dsn: str, log_dir: Path, name: str, script: str = "_mcp_server.py",
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log_path = log_dir / f"mcp-{name}.log"
        full = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}", "PGDURABLE_DSN": dsn,
                **(env or {})}
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, str(TESTS / script), str(self.port)],
                                         env=full, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        self.wait_ready()

    def wait_ready(self) -> None:
        end = time.monotonic() + WAIT_LIMIT
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"MCP server exited: {self.log_path.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > end:
                    raise AssertionError("MCP server never listened") from None
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: the process ends with whatever it held."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=WAIT_LIMIT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=WAIT_LIMIT)
