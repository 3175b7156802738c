"""Scratch databases for the benchmarks (shared by every ``benchmarks/*.py``).

Each benchmark takes a maintenance DSN (``--dsn``), creates its own scratch
database next to it, migrates it, and drops it at the end. Imported as
``_scratch``: running ``python benchmarks/X.py`` puts ``benchmarks/`` first on
``sys.path``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgdurable

# tests/_released.py: the migrations as released (a baseline schema of an earlier version)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _released import migrate_released


def scratch_dsn(admin_dsn: str, db: str, before: int | None = None) -> str:
    """(Re)create database ``db`` next to ``admin_dsn``, migrate it, return its DSN.

    ``before``: the schema of the release whose last migration is numbered just
    below it, as that release made it (tests/released_sql/: its functions as
    they were then), for a benchmark's baseline; nothing later is applied."""
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    dsn = make_conninfo(admin_dsn, dbname=db)
    if before is not None:
        migrate_released(dsn, before - 1)
    else:
        pgdurable.migrate(dsn)
    return dsn


def drop_scratch(admin_dsn: str, *dbs: str) -> None:
    """Drop the scratch databases ``dbs`` (connections to them are terminated)."""
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        for db in dbs:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(db)))


def add_watch_args(ap: argparse.ArgumentParser) -> None:
    """``--watched`` and ``--live-steps``: who listens to the watch-only NOTIFYs
    (sql/0023_listener_presence.sql), for :func:`set_watch`."""
    ap.add_argument("--watched", action="store_true",
                    help="as with a dashboard open: pgdurable_steps and pgdurable_done announced "
                         "(sent), else nobody listens (not sent)")
    ap.add_argument("--live-steps", choices=("on", "off"), default="on",
                    help="pgdurable.live_steps on the database (off: no live-step NOTIFY even "
                         "when watched)")


def set_watch(dsn: str, args: argparse.Namespace) -> None:
    """Apply :func:`add_watch_args`' options to the scratch database at ``dsn``."""
    with psycopg.connect(dsn, autocommit=True) as c:
        if args.live_steps == "off":
            c.execute(sql.SQL("ALTER DATABASE {} SET pgdurable.live_steps = off").format(
                sql.Identifier(str(c.info.dbname))))
        if args.watched:  # for longer than any benchmark runs
            for ch in ("pgdurable_steps", "pgdurable_done"):
                c.execute("SELECT pgdurable.listen_presence(%s, 3600)", (ch,))
