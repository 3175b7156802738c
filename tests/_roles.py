"""Real separate roles for the security tests: create them with unique names,
set up the role model, connect as them, run the CLI as them; drop them after.

Roles are cluster-wide, so every name carries the pid and a random suffix and
every role is dropped (its objects reassigned) at the end of the ``with``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

CLI = [sys.executable, "-m", "pgdurable"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``pgdurable ARGS`` in a subprocess (no DSN from the environment)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGDURABLE_DSN", "DATABASE_URL")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)


def as_role(dsn: str, role: str) -> str:
    """``dsn`` logging in as ``role`` (trust authentication on the test server)."""
    return make_conninfo(dsn, user=role)


@contextmanager
def roles(dsn: str, *specs: str) -> Iterator[list[str]]:
    """Create one role per spec ('LOGIN' / 'NOLOGIN'), unique names; drop them after."""
    names = [f"pgd_sec_{os.getpid()}_{uuid.uuid4().hex[:8]}_{i}" for i in range(len(specs))]
    admin = make_conninfo(dsn, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as c:
        for name, spec in zip(names, specs, strict=True):
            c.execute(sql.SQL("CREATE ROLE {} " + spec).format(sql.Identifier(name)))
    try:
        yield names
    finally:
        dbname = conninfo_to_dict(dsn)["dbname"]
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("ALTER DATABASE {} OWNER TO CURRENT_USER").format(
                sql.Identifier(str(dbname))))
            for name in names:
                c.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(sql.Identifier(name)))
                c.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        with psycopg.connect(admin, autocommit=True) as c:
            for name in names:
                c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def grant(dsn: str, owner: str, app_role: str, ro: str) -> None:
    """``pgdurable grant`` (the CLI, as the superuser of ``dsn``)."""
    r = cli("grant", "--dsn", dsn, "--owner-role", owner, "--app-role", app_role,
            "--readonly-role", ro)
    assert r.returncode == 0, r.stderr
