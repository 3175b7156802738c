"""A Citus cluster a test owns: a coordinator and two worker nodes on free ports.

:func:`start_cluster` runs ``initdb`` three times in a temporary directory
(``shared_preload_libraries = 'citus'``, trust auth, ``127.0.0.1`` on ports the
OS hands out, so two suites running at the same time never collide), starts
the three servers, and :meth:`Cluster.create_database` creates a database on
every node with ``CREATE EXTENSION citus``, names the coordinator
(``citus_set_coordinator_host``) and registers the two workers
(``citus_add_node``). :meth:`Cluster.close` stops them (``-m immediate``) and
removes the directory.

:func:`missing` says why no cluster can be started here (no ``citus.so`` in
the PostgreSQL the binaries belong to, no binaries): the tests skip with it.
``.ci/run`` builds Citus from ``../shared/vendor/citus`` when it is absent.

As root (initdb refuses to run as root) every server binary runs as the
``postgres`` OS user, as in ``tests/_failover_cluster.py`` (whose node helpers
this module reuses).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from _failover_cluster import HOST, Node, _os_user, binaries, free_port


def _libdir(bindir: Path) -> Path | None:
    """The pkglibdir of the PostgreSQL whose binaries are in ``bindir``."""
    pg_config = bindir / "pg_config"
    if pg_config.exists():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([str(pg_config), "--pkglibdir"], capture_output=True,
                                 text=True, timeout=30, check=True)
            return Path(out.stdout.strip())
    # Debian: /usr/lib/postgresql/15/bin -> /usr/lib/postgresql/15/lib
    lib = bindir.parent / "lib"
    return lib if lib.is_dir() else None


def citus_bindir() -> Path | str:
    """The binaries of a PostgreSQL with ``citus.so`` installed, or why there are none."""
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        lib = _libdir(d)
        if lib is not None and (lib / "citus.so").exists() and (d / "initdb").exists():
            return d
    found = binaries()
    if isinstance(found, str):
        return found
    lib = _libdir(found)
    if lib is not None and (lib / "citus.so").exists():
        return found
    return (f"Citus is not installed (no citus.so in {lib or found}): build it with "
            "../shared/vendor/citus/build.sh (.ci/run does)")


def missing() -> str | None:
    """Why no Citus cluster can be started here, or None."""
    found = citus_bindir()
    return found if isinstance(found, str) else None


@dataclass
class Cluster:
    """A coordinator and two workers (see the module docstring)."""

    root: Path
    coordinator: Node
    workers: tuple[Node, Node]

    @property
    def nodes(self) -> tuple[Node, Node, Node]:
        return (self.coordinator, *self.workers)

    def dsn(self, node: Node, dbname: str) -> str:
        return f"host={HOST} port={node.port} user=postgres dbname={dbname}"

    def create_database(self, dbname: str) -> str:
        """``dbname`` on every node with the citus extension, the workers registered.

        Returns the coordinator's DSN of it."""
        for node in self.nodes:
            with psycopg.connect(node.dsn, autocommit=True) as c:
                c.execute(f'CREATE DATABASE "{dbname}"')
            with psycopg.connect(self.dsn(node, dbname), autocommit=True) as c:
                c.execute("CREATE EXTENSION citus")
        with psycopg.connect(self.dsn(self.coordinator, dbname), autocommit=True) as c:
            c.execute("SELECT citus_set_coordinator_host(%s, %s)", (HOST, self.coordinator.port))
            for w in self.workers:
                c.execute("SELECT citus_add_node(%s, %s)", (HOST, w.port))
        return self.dsn(self.coordinator, dbname)

    def close(self) -> None:
        for node in self.nodes:
            if node.running():
                with contextlib.suppress(Exception):
                    node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster(bindir: Path) -> Cluster:
    """Start a coordinator and two workers (see the module docstring)."""
    uid = _os_user()
    root = Path(tempfile.mkdtemp(prefix="pgd-citus-"))
    if uid is not None:
        os.chown(root, uid, -1)
    nodes = [Node(name, root / name, free_port(), bindir, uid)
             for name in ("coordinator", "worker1", "worker2")]
    cluster = Cluster(root, nodes[0], (nodes[1], nodes[2]))
    try:
        for node in nodes:
            node.run("initdb", "-D", str(node.data), "-U", "postgres", "-A", "trust",
                     "--no-sync", "-E", "UTF8", "--locale=C")
            node.conf(f"\nport = {node.port}\nlisten_addresses = '{HOST}'\n"
                      f"unix_socket_directories = '{root}'\n"
                      "shared_preload_libraries = 'citus'\n"
                      "max_connections = 200\nshared_buffers = 64MB\n"
                      "max_worker_processes = 32\nlog_min_messages = warning\n"
                      # no client certificate lookup (the servers run with root's HOME)
                      "citus.node_conninfo = 'sslmode=disable'\n"
                      "log_line_prefix = '%m [%p] %d '\n")
            with open(node.data / "pg_hba.conf", "a") as f:
                f.write(f"host all all {HOST}/32 trust\n")
            node.start()
    except BaseException:
        cluster.close()
        raise
    return cluster


@contextlib.contextmanager
def cluster() -> Iterator[Cluster]:
    found = citus_bindir()
    if isinstance(found, str):
        raise RuntimeError(found)
    c = start_cluster(found)
    try:
        yield c
    finally:
        c.close()
