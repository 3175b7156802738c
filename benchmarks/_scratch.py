"""Scratch databases for the benchmarks (shared by every ``benchmarks/*.py``).

Each benchmark takes a maintenance DSN (``--dsn``), creates its own scratch
database next to it, migrates it, and drops it at the end. Imported as
``_scratch``: running ``python benchmarks/X.py`` puts ``benchmarks/`` first on
``sys.path``.
"""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgdurable


def scratch_dsn(admin_dsn: str, db: str) -> str:
    """(Re)create database ``db`` next to ``admin_dsn``, migrate it, return its DSN."""
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    dsn = make_conninfo(admin_dsn, dbname=db)
    pgdurable.migrate(dsn)
    return dsn


def drop_scratch(admin_dsn: str, *dbs: str) -> None:
    """Drop the scratch databases ``dbs`` (connections to them are terminated)."""
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        for db in dbs:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(db)))
