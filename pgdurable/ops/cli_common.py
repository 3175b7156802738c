"""Helpers shared by the CLI's command modules (:mod:`pgdurable.ops.cli`,
:mod:`pgdurable.ops.cli_fork`, :mod:`pgdurable.ops.cli_schedules`): the consoles, exit
codes, one-line errors, the database connection of a command, JSON output and
short table cells. The command modules import this one; it imports none of
them (no circle).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, NoReturn

import psycopg
import typer
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..foundation import migrations
from ..foundation import schema_trust as _schema_trust
from ..foundation.db import connect, resolve_dsn, translated, validate_dsn
from ..foundation.errors import PgDurableError, RunNotFound
from ..foundation.text import escape_controls, escape_json_controls

out = Console()
err = Console(stderr=True)

EXIT_PROBLEM = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 3


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print a one-line error and exit (2 = bad input or unusable database)."""
    err.print(_error_line(message), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _warning_line(message: object) -> Text:
    """``warning: <message>`` on one line, the message as plain text (never markup)."""
    line = escape_controls(" ".join(str(message).split()))
    return Text.assemble(("warning:", "bold yellow"), f" {line}")


def _error_line(message: object, suffix: str = "") -> Text:
    """``error: <message>`` on one line, the message as plain text (never markup)."""
    line = escape_controls(" ".join(str(message).split()))
    return Text.assemble(("error:", "bold red"), f" {line}{suffix}")


def need_dsn(dsn: str | None) -> str:
    """The DSN from the option or the environment, validated, or exit 2."""
    resolved = resolve_dsn(dsn)
    if resolved is None:
        fail("no database given: pass --dsn or set PGDURABLE_DSN or DATABASE_URL")
    try:
        return validate_dsn(resolved)
    except (PgDurableError, TypeError) as exc:
        fail(str(exc))


def schema_owner_switch(target: str) -> str | None:
    """The owner a superuser's command must run as (see :func:`owner_dsn`), or None.

    Warns on stderr when that owner may log in (likely an app role that ran
    ``migrate``); the role model's ``NOLOGIN`` owner is switched to silently.
    Errors exit 2.
    """
    try:
        with connect(target) as conn, translated():
            switch = _schema_trust.owner_to_assume(conn)
    except PgDurableError as exc:
        fail(str(exc))
    except psycopg.Error as exc:
        fail(f"database error: {exc}")
    if switch is None:
        return None
    if switch.can_login:
        who = repr(switch.role)
        err.print(_warning_line(
            f"schema pgdurable is owned by {who}, which is neither a superuser nor a role "
            f"this superuser belongs to: running as {who} (SET ROLE), so that nothing {who} "
            "defined runs with superuser rights"), highlight=False, soft_wrap=True)
    return switch.role


def with_role(target: str, role: str | None) -> str:
    """``target`` whose sessions start with ``SET ROLE role`` (``options=-c role=...``)."""
    if role is None:
        return target
    given = conninfo_to_dict(target).get("options") or os.environ.get("PGOPTIONS", "")
    escaped = role.replace("\\", "\\\\").replace(" ", "\\ ")
    return make_conninfo(target, options=f"{given} -c role={escaped}".strip())


def owner_dsn(dsn: str | None) -> str:
    """The DSN of a CLI command: :func:`need_dsn`, then, for a superuser that does
    not own schema pgdurable while a non-superuser does, sessions that run as
    that owner (a superuser never executes code the owner may have redefined)."""
    target = need_dsn(dsn)
    return with_role(target, schema_owner_switch(target))


@contextmanager
def database(dsn: str | None) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit library connection with a checked schema, as :func:`owner_dsn`
    says; errors exit 2 (3 for no run)."""
    target = owner_dsn(dsn)
    try:
        with connect(target) as conn:
            with translated():
                migrations.check_schema(conn)
            with translated():
                yield conn
    except RunNotFound as exc:
        fail(str(exc), EXIT_NOT_FOUND)
    except PgDurableError as exc:
        fail(str(exc))
    except psycopg.Error as exc:
        fail(f"database error: {exc}")


def _run_id(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        fail(f"{value!r} is not a run id (a UUID)")


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def print_json(value: Any) -> None:
    """One JSON document on stdout (datetimes ISO 8601, intervals in seconds)."""
    text = json.dumps(_jsonable(value), indent=2, ensure_ascii=False)
    sys.stdout.write(escape_json_controls(text) + "\n")


def human_age(value: timedelta | None) -> str:
    """``3d4h``, ``12m05s``, ``850ms`` -- short durations for tables."""
    if value is None:
        return ""
    secs = value.total_seconds()
    sign = "-" if secs < 0 else ""
    secs = abs(secs)
    if secs < 1:
        return f"{sign}{secs * 1000:.0f}ms"
    if secs < 60:
        return f"{sign}{secs:.1f}s"
    if secs < 3600:
        return f"{sign}{int(secs // 60)}m{int(secs % 60):02d}s"
    if secs < 86400:
        return f"{sign}{int(secs // 3600)}h{int(secs % 3600 // 60):02d}m"
    return f"{sign}{int(secs // 86400)}d{int(secs % 86400 // 3600)}h"


def one_line(text: Any) -> str:
    """``text`` on one line (whitespace collapsed), whole: the cells of listings."""
    return " ".join(("" if text is None else str(text)).split())


def _short(text: Any, width: int = 60) -> str:
    """``text`` on one line, cut to ``width`` on a terminal; whole when the output
    is not a terminal (a pipe, a file, CI, ``docker logs``): nothing is lost there."""
    s = "" if text is None else str(text)
    s = " ".join(s.split())
    if not out.is_terminal:
        return s
    return s if len(s) <= width else s[: width - 1] + "…"


#: The widest a table is printed when the output is not a terminal (a safety bound).
MAX_PIPE_WIDTH = 100_000


def show(table: Table) -> None:
    """Print a table so that no value is cut.

    Anywhere but a terminal (a pipe, a file, CI) it is printed at its natural
    width: every value whole, one row a line, whatever ``COLUMNS`` says. On a
    terminal it is printed as a table when it fits; a table with a header that
    does not fit is printed one record per row instead (``column: value``
    lines, as ``psql``'s ``\\x auto``), and a cell too long for the window
    wraps instead of ending in "…".
    """
    wide = out.options.update(width=MAX_PIPE_WIDTH)
    natural = min(max(out.measure(table, options=wide).maximum, 1), MAX_PIPE_WIDTH)
    if not out.is_terminal:
        # a console as wide as the table (print(width=) cannot exceed the console's)
        Console(file=out.file, width=natural, highlight=False, force_terminal=False,
                no_color=out.no_color).print(table)
        return
    for column in table.columns:
        column.overflow = "fold"
    if natural <= out.width or not table.show_header or not table.row_count:
        out.print(table)
        return
    if table.title:
        out.print(Text(str(table.title), style="bold"))
    names = [str(column.header) for column in table.columns]
    label = max(len(n) for n in names)
    for i in range(table.row_count):
        out.print(Text(f"-[ {i + 1} ]" + "-" * max(0, min(out.width, 40) - 6 - len(str(i + 1))),
                       style="dim"))
        record = Table.grid(padding=(0, 1))
        record.add_column(style="bold", min_width=label, no_wrap=True)
        record.add_column(overflow="fold")
        for name, column in zip(names, table.columns, strict=True):
            record.add_row(name, column._cells[i])
        out.print(record)
