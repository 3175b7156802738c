"""What the agent framework test apps share (tests/_pydantic_ai_app.py, _agents_app.py,
_adk_app.py): a ledger of what really ran, crashes armed from the test, and a signal
sent from another process with the CLI.

* :func:`ledger` commits a row ``(event, pid, tag)`` into ``test_ledger`` before a
  model or a tool returns, so a test counts from the database what ran, and where.
* :func:`maybe_die` SIGKILLs the calling process if the test armed ``point`` (a row of
  ``test_kills``); the row is taken first, so exactly one process dies there.
* :func:`cli_signal` runs ``python -m pgdurable signal KIND REF --payload JSON``.

:data:`TABLES` creates both tables (a test's ``db`` fixture runs it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
from _waiting import WAIT_LIMIT

from pgdurable.foundation.db import resolve_dsn

ROOT = Path(__file__).resolve().parent.parent
TABLES = ("CREATE TABLE test_ledger (event text, pid int, tag text, "
          "at timestamptz DEFAULT clock_timestamp()); "
          "CREATE TABLE test_kills (point text PRIMARY KEY)")


def _conn() -> psycopg.Connection[Any]:
    return psycopg.connect(resolve_dsn() or "", autocommit=True)


def ledger(event: str, tag: str = "") -> None:
    """Record that ``event`` happened in this process (committed at once)."""
    with _conn() as conn:
        conn.execute("INSERT INTO test_ledger (event, pid, tag) VALUES (%s, %s, %s)",
                     (event, os.getpid(), tag))


def maybe_die(point: str) -> None:
    """SIGKILL this process if ``point`` is armed (once: the row is taken first)."""
    with _conn() as conn:
        row = conn.execute("DELETE FROM test_kills WHERE point = %s RETURNING point",
                           (point,)).fetchone()
    if row is not None:
        ledger("killed", point)
        os.kill(os.getpid(), signal.SIGKILL)


def cli_signal(dsn: str, kind: str, ref: str, payload: Any) -> None:
    """Send a signal the way an operator does: ``pgdurable signal`` in another process."""
    out = subprocess.run([sys.executable, "-m", "pgdurable", "signal", kind, ref,
                          "--payload", json.dumps(payload), "--dsn", dsn], cwd=ROOT,
                         capture_output=True, text=True, timeout=WAIT_LIMIT)
    assert out.returncode == 0, out.stderr
