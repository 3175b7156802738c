"""The PostgreSQL server behind a DSN, as a cluster on this machine a test may restart.

A test that restarts PostgreSQL must restart the server it was given and no
other (never "the machine's ``main`` cluster" whatever the DSN). So the
server is asked who it is, and the answer is checked on this machine:

* ``SHOW data_directory`` and ``SHOW port`` name the cluster;
* its ``postmaster.pid`` must be readable here, name that port, and its
  postmaster must be the parent of the backend serving our connection (so a
  remote server whose data directory happens to exist here too is refused);
* a Debian cluster (``pg_lsclusters`` lists that data directory) is restarted
  with ``pg_ctlcluster``; any other cluster (the embedded pgserver, a
  hand-started one) with the ``pg_ctl`` next to its running ``postgres``
  binary, as the data directory's owner, reusing its ``postmaster.opts``.

:func:`local_cluster` returns the cluster, or the reason it cannot be
restarted from here (the caller skips with it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psycopg


@dataclass(frozen=True)
class LocalCluster:
    data_dir: Path
    port: int
    owner_uid: int
    pg_ctl: Path
    debian: tuple[str, str] | None  # (version, cluster name) for pg_ctlcluster

    def describe(self) -> str:
        how = (f"pg_ctlcluster {self.debian[0]} {self.debian[1]}" if self.debian
               else f"{self.pg_ctl} -D {self.data_dir}")
        return f"{self.data_dir} (port {self.port}) via {how}"

    def restart(self) -> None:
        """Restart this cluster (fast shutdown), waiting until it accepts connections."""
        if self.debian is not None:
            _run(["pg_ctlcluster", "--skip-systemctl-redirect", *self.debian, "restart"])
        else:
            # pg_ctl restart reuses the options the server was started with
            # (postmaster.opts); the server's own output goes to -l.
            log = self.data_dir / "pgdurable-test-restart.log"
            _run([str(self.pg_ctl), "-D", str(self.data_dir), "-w", "-t", "120", "-m", "fast",
                  "-l", str(log), "restart"], uid=self.owner_uid)
        _refresh_pgserver_handle(self.data_dir)

    def start(self) -> None:
        """Start this cluster if it is down (after a failed restart)."""
        if self.debian is not None:
            _run(["pg_ctlcluster", "--skip-systemctl-redirect", *self.debian, "start"])
            _refresh_pgserver_handle(self.data_dir)
        else:
            self.restart()  # pg_ctl restart starts a stopped server


def local_cluster(dsn: str) -> LocalCluster | str:
    """The cluster serving ``dsn`` on this machine, or why it cannot be restarted here."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as c:
            row = c.execute("SELECT current_setting('data_directory'),"
                            " current_setting('port')::int, pg_backend_pid()").fetchone()
            assert row is not None
            # while our backend still lives
            parent = _parent_pid(int(row[2]))
    except psycopg.Error as exc:
        return f"cannot ask the server for its data directory: {exc}"
    data_dir, port, backend_pid = Path(row[0]).resolve(), int(row[1]), int(row[2])
    try:
        pid_lines = (data_dir / "postmaster.pid").read_text().splitlines()
        postmaster_pid, file_port = int(pid_lines[0]), int(pid_lines[3])
    except (OSError, ValueError, IndexError) as exc:
        return f"the server's data directory {data_dir} is not readable here ({exc}): remote server?"
    if file_port != port:
        return f"{data_dir}/postmaster.pid names port {file_port}, the server runs on {port}"
    if parent != postmaster_pid:
        return (f"our backend (pid {backend_pid}) is not a child of {data_dir}'s postmaster "
                f"(pid {postmaster_pid}): the server is not on this machine")
    try:
        pg_ctl = Path(os.readlink(f"/proc/{postmaster_pid}/exe")).parent / "pg_ctl"
    except OSError as exc:
        return f"cannot find the running server's binaries ({exc})"
    if not pg_ctl.exists():
        return f"no pg_ctl next to the running server binary ({pg_ctl})"
    return LocalCluster(data_dir=data_dir, port=port, owner_uid=data_dir.stat().st_uid,
                        pg_ctl=pg_ctl, debian=_debian_cluster(data_dir))


def _parent_pid(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return None


def _debian_cluster(data_dir: Path) -> tuple[str, str] | None:
    """(version, name) of the Debian cluster whose data directory is ``data_dir``."""
    if not (shutil.which("pg_lsclusters") and shutil.which("pg_ctlcluster")):
        return None
    out = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True,
                         timeout=60)
    for line in out.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 6 and Path(fields[5]).resolve() == data_dir:
            return fields[0], fields[1]
    return None


def _run(cmd: list[str], *, uid: int | None = None) -> None:
    # pg_ctl's children inherit its stdout: files, not pipes, or run() would wait on them
    with tempfile.TemporaryFile() as out:
        user = uid if os.geteuid() == 0 and uid not in (None, 0) else None
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=180, user=user)
        if done.returncode != 0:
            out.seek(0)
            raise RuntimeError(f"{cmd} failed ({done.returncode}): {out.read().decode()}")


def _refresh_pgserver_handle(data_dir: Path) -> None:
    """Point this process's pgserver handle (if it owns the cluster) at the new postmaster.

    pgserver remembers the postmaster it started and, at cleanup, stops it
    only if that process is still running: after a restart it would leave the
    new server running in a deleted directory.
    """
    mod = sys.modules.get("pgserver.postgres_server")
    if mod is None:
        return
    server = mod.PostgresServer._instances.get(data_dir)
    if server is not None:
        from pgserver.utils import PostmasterInfo

        server._postmaster_info = PostmasterInfo.read_from_pgdata(data_dir)
