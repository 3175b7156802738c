"""A PgBouncer process for one test: its config in the test's directory, a free local port.

Never the system's pgbouncer service: the ``pgbouncer`` binary (Debian's
package) is started directly with a config written here: listening on
127.0.0.1 at a free port, no unix socket, ``auth_type = trust`` with a
userlist naming the suite's user, every database forwarded to the suite's
server, the given ``pool_mode`` and otherwise PgBouncer's defaults. It logs to
``pgbouncer.log`` beside its config and is stopped by its pid.

PgBouncer refuses to run as root: as root it is started with ``-u`` (the owner
of the server's unix-socket directory for the embedded server, else
``nobody``); it reads its config and userlist before it switches user, so the
config may stay in the test's private directory (it is never reloaded).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

PGBOUNCER = shutil.which("pgbouncer") or next(
    (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None)

START_LIMIT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """One pgbouncer process in front of the suite's server (``server``: host, port, user,
    password)."""

    def __init__(self, server: Any, mode: str, workdir: Path, *, pool_size: int = 20) -> None:
        assert PGBOUNCER is not None
        self.server, self.mode, self.workdir = server, mode, workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        self.ini = workdir / "pgbouncer.ini"
        self.log_path = workdir / "pgbouncer.log"
        target = f"host={server.host} port={server.port}"
        if server.password:
            target += f" password={server.password}"
        (workdir / "userlist.txt").write_text(f'"{server.user}" ""\n')
        self.ini.write_text(
            "[databases]\n"
            f"* = {target}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {workdir / 'userlist.txt'}\n"
            f"pool_mode = {mode}\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 500\n"
        )

    def dsn(self, dbname: str, **extra: Any) -> str:
        """A conninfo for ``dbname`` through this PgBouncer."""
        return make_conninfo(host="127.0.0.1", port=self.port, user=self.server.user,
                             dbname=dbname, **extra)

    def _run_as(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        host = Path(self.server.host)
        if host.is_absolute() and host.is_dir() and host.stat().st_uid != 0:
            return ["-u", pwd.getpwuid(host.stat().st_uid).pw_name]
        return ["-u", "nobody"]

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(PGBOUNCER), *self._run_as(), str(self.ini)],
                                         stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + START_LIMIT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self.proc.returncode}): {self.log()}")
            try:
                with psycopg.connect(self.dsn("postgres"), connect_timeout=2) as c:
                    c.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > end:
                    raise RuntimeError(f"pgbouncer did not accept connections: {self.log()}"
                                       ) from None
                time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop it (SIGTERM: PgBouncer's immediate shutdown, every connection dropped)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self) -> None:
        """Stop it hard and start a new process on the same port."""
        self.stop()
        self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")
