"""This backend's scan counters: which tables a call read sequentially, which
indexes it used (``pg_stat_xact_user_tables``, ``pg_stat_get_xact_numscans``).

Take :func:`scans` and :func:`scans_since` inside ONE transaction around the call:
pending counters are flushed only between transactions, so the difference is
exactly that call's scans. Needs no module (auto_explain) and means the same on
every server.
"""

from __future__ import annotations

from typing import Any

import psycopg


def scans(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], int]:
    """This backend's scan counters on pgdurable's tables: (kind, name) -> scans."""
    return {(kind, name): int(n) for kind, name, n in conn.execute("""
      SELECT 'seq', relname, seq_scan FROM pg_stat_xact_user_tables WHERE schemaname = 'pgdurable'
      UNION ALL
      SELECT 'idx', indexrelname, pg_stat_get_xact_numscans(indexrelid) FROM pg_stat_user_indexes
       WHERE schemaname = 'pgdurable'""").fetchall()}


def scans_since(conn: psycopg.Connection[Any],
                before: dict[tuple[str, str], int]) -> tuple[set[str], set[str]]:
    """(tables scanned sequentially, indexes scanned) since ``before``."""
    grown = {k for k, n in scans(conn).items() if n > before.get(k, 0)}
    return {n for k, n in grown if k == "seq"}, {n for k, n in grown if k == "idx"}
