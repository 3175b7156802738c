"""A primary and its streaming standby, two local PostgreSQL instances a test owns.

:func:`start_pair` runs ``initdb`` for the primary on a free port in a temporary
directory, starts it, clones it with ``pg_basebackup -R`` into a standby on
another free port and starts that; with ``synchronous=True`` the primary names
the standby in ``synchronous_standby_names`` (``synchronous_commit = on``: a
commit is acknowledged once the standby has flushed its WAL). The pair's
:attr:`Pair.dsn` is the multi-host DSN the fleet uses
(``host=127.0.0.1,127.0.0.1 port=P,S target_session_attrs=read-write``).

* **Binaries**: Debian's ``/usr/lib/postgresql/<v>/bin``, else those of the
  embedded server (pgserver ships ``pginstall/bin``), else ``pg_config --bindir``;
  :func:`binaries` says which, or why there are none (the test skips with it).
* **As root** (initdb refuses to run as root) every server binary runs as the
  ``postgres`` OS user (``subprocess.run(user=...)``), and the directories are
  made its own.
* The servers are stopped (``-m immediate``) and their directories removed by
  :meth:`Pair.close`, whatever the test did to them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

HOST = "127.0.0.1"
WAIT = 120  # seconds pg_ctl waits for a start, a stop or a promotion


def lsn(text: str) -> int:
    """A WAL position ``X/Y`` as a number."""
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) + int(lo, 16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def binaries() -> Path | str:
    """The directory holding initdb, pg_ctl and pg_basebackup, or why there is none."""
    candidates: list[Path] = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    with contextlib.suppress(ImportError):
        import pgserver  # the embedded server of the README's test command

        candidates.append(Path(pgserver.__file__).parent / "pginstall" / "bin")
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                 timeout=30, check=True)
            candidates.append(Path(out.stdout.strip()))
    need = ("initdb", "pg_ctl", "pg_basebackup", "postgres")
    for d in candidates:
        if all((d / b).exists() for b in need):
            return d
    return f"no directory with {', '.join(need)} (looked in {[str(c) for c in candidates]})"


def _os_user() -> int | None:
    """The uid the servers run as: ``postgres`` when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres").pw_uid
    except KeyError as exc:
        raise RuntimeError("running as root and there is no 'postgres' OS user to run "
                           "the servers as") from exc


@dataclass
class Node:
    """One instance: its data directory and port."""

    name: str
    data: Path
    port: int
    bindir: Path
    uid: int | None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.data.parent / f"{self.name}.log"

    @property
    def dsn(self) -> str:
        """A single-host DSN of this instance (database ``postgres``)."""
        return f"host={HOST} port={self.port} user=postgres dbname=postgres"

    def run(self, *argv: str) -> None:
        run(self.bindir, self.uid, *argv)

    def pg_ctl(self, *argv: str) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-w", "-t", str(WAIT), *argv)

    def start(self) -> None:
        self.pg_ctl("-l", str(self.log), "start")

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("-m", mode, "stop")

    def promote(self) -> None:
        """``pg_ctl promote``: returns once the standby accepts writes."""
        self.pg_ctl("promote")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def conf(self, text: str) -> None:
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(text)


def run(bindir: Path, uid: int | None, *argv: str) -> None:
    # pg_ctl's children inherit its stdout: a file, not a pipe, or run() would wait on them
    with tempfile.TemporaryFile() as out:
        done = subprocess.run([str(bindir / argv[0]), *argv[1:]], stdout=out,
                              stderr=subprocess.STDOUT, timeout=WAIT + 60, user=uid,
                              cwd="/")
        if done.returncode != 0:
            out.seek(0)
            raise RuntimeError(f"{argv} failed ({done.returncode}): {out.read().decode()}")


@dataclass
class Pair:
    """A primary and its standby (see the module docstring)."""

    root: Path
    primary: Node
    standby: Node
    synchronous: bool

    @property
    def dsn(self) -> str:
        """The multi-host DSN: whichever of the two accepts writes."""
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        return (f"host={HOST},{HOST} port={self.primary.port},{self.standby.port} "
                f"user=postgres dbname={dbname} target_session_attrs=read-write")

    def wait_replaying(self) -> None:
        """Until the primary sees its standby streaming (in sync if asked)."""
        want = "sync" if self.synchronous else "async"
        end = time.monotonic() + WAIT
        with psycopg.connect(self.primary.dsn, autocommit=True) as c:
            while True:
                row = c.execute("SELECT sync_state FROM pg_stat_replication "
                                "WHERE state = 'streaming'").fetchone()
                if row is not None and row[0] == want:
                    return
                if time.monotonic() > end:
                    raise RuntimeError(f"the standby is not streaming ({want}): "
                                       f"{self.standby.log.read_text(errors='replace')}")
                time.sleep(0.05)

    def freeze_replication(self) -> list[int]:
        """SIGSTOP the primary's WAL senders: from now on the standby receives
        nothing (a replication link that stalls). With synchronous replication
        every commit now waits; with asynchronous ones commits go on, acknowledged,
        and only the primary has them. Returns the senders' pids."""
        with psycopg.connect(self.primary.dsn, autocommit=True) as c:
            pids = [int(r[0]) for r in c.execute("SELECT pid FROM pg_stat_replication")]
        assert pids, "no WAL sender"
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    def crash_primary(self, frozen: Sequence[int] = ()) -> None:
        """``pg_ctl stop -m immediate`` (the frozen WAL senders SIGKILLed, so that
        they send nothing more and the postmaster need not wait for them)."""
        cmd = [str(self.primary.bindir / "pg_ctl"), "-D", str(self.primary.data), "-w",
               "-t", str(WAIT), "-m", "immediate", "stop"]
        with tempfile.TemporaryFile() as out:
            stop = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    user=self.primary.uid, cwd="/")
            for pid in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if stop.wait(WAIT + 60) != 0:
                out.seek(0)
                raise RuntimeError(f"pg_ctl stop -m immediate failed: {out.read().decode()}")

    def received(self) -> int:
        """The end of the WAL the standby has received (all a promotion will have)."""
        with psycopg.connect(self.standby.dsn, autocommit=True) as c:
            row = c.execute("SELECT pg_last_wal_receive_lsn()::text").fetchone()
        assert row is not None and row[0] is not None
        return lsn(row[0])

    def close(self) -> None:
        for node in (self.primary, self.standby):
            if node.running():
                with contextlib.suppress(Exception):
                    node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start_pair(*, synchronous: bool, bindir: Path) -> Pair:
    """Start a primary and a streaming standby (see the module docstring)."""
    uid = _os_user()
    root = Path(tempfile.mkdtemp(prefix="pgd-failover-"))
    if uid is not None:
        os.chown(root, uid, -1)
    primary = Node("primary", root / "primary", free_port(), bindir, uid)
    standby = Node("standby", root / "standby", free_port(), bindir, uid)
    pair = Pair(root, primary, standby, synchronous)
    try:
        primary.run("initdb", "-D", str(primary.data), "-U", "postgres", "-A", "trust",
                    "--no-sync", "-E", "UTF8", "--locale=C")
        common = (f"\nlisten_addresses = '{HOST}'\nunix_socket_directories = '{root}'\n"
                  "wal_level = replica\nmax_wal_senders = 5\nhot_standby = on\n"
                  "max_connections = 100\nshared_buffers = 32MB\nfsync = on\n"
                  "wal_receiver_status_interval = 1s\n"
                  # a killed child ends the server (no crash restart): it stays down
                  "restart_after_crash = off\n")
        primary.conf(f"port = {primary.port}{common}")
        if synchronous:
            primary.conf("synchronous_standby_names = 'standby'\nsynchronous_commit = on\n")
        primary.start()
        standby.run("pg_basebackup", "-D", str(standby.data), "-R", "-X", "stream",
                    "-c", "fast", "-d",
                    f"host={HOST} port={primary.port} user=postgres application_name=standby")
        # the copied postgresql.conf names the primary's port; the last setting wins
        standby.conf(f"\nport = {standby.port}\nsynchronous_standby_names = ''\n")
        standby.start()
        pair.wait_replaying()
    except BaseException:
        pair.close()
        raise
    return pair


@contextlib.contextmanager
def pair(*, synchronous: bool, bindir: Path) -> Iterator[Pair]:
    p = start_pair(synchronous=synchronous, bindir=bindir)
    try:
        yield p
    finally:
        p.close()
