"""``pgdurable start TASK``: start a run from the command line.

Registered on the CLI's typer app by :func:`register` (called at the end of
:mod:`pgdurable.ops.cli`). The same validation and the same one statement as
:meth:`pgdurable.Durable.start` (``start_params``, the flow-control start of
``--key``/``--delay``, the metadata labels): bad input exits 2 with one line
and writes nothing. Prints the run's id (``--json``: ``{"id", "created",
"task", "revision", "queue"}``).

The CLI loads no app, so it has no task registry: the revision is
``--revision``, else the one the workers that serve the task registered
(``pgdurable.worker_revisions``); none, or several, is an error that says
which to pass.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ..foundation.errors import PgDurableError, UnknownTask
from ..foundation.queries import cli as Q
from ..foundation.queries.core import many_sync, one_sync
from ..foundation.queries.start import started
from ..foundation.registry import TaskRegistry, start_params
from ..runs import flow
from ..runs.metadata import start_statement
from . import cli_common as c
from .retention import parse_age

__all__ = ["register"]


DsnOpt = Annotated[str | None, typer.Option(
    "--dsn", help="PostgreSQL conninfo or URL (default: $PGDURABLE_DSN, then $DATABASE_URL).",
    show_default=False)]


def _json_option(text: str | None, option: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        c.fail(f"{option} is not JSON: {exc}")


def served_revision(conn: Any, task: str) -> str:
    """The one revision of ``task`` that registered workers serve, else UnknownTask."""
    revisions = many_sync(conn, Q.SERVED, (task,))
    if len(revisions) == 1:
        return str(revisions[0])
    if not revisions:
        raise UnknownTask(f"no worker has registered task {task!r}: pass --revision (the "
                          "revision of the task the run should run)")
    raise UnknownTask(f"workers serve task {task!r} in revisions {', '.join(map(repr, revisions))}: "
                      "pass --revision to say which")


def register(app: typer.Typer) -> None:
    """Add ``start`` to the CLI ``app``."""

    @app.command()
    def start(
        task: Annotated[str, typer.Argument(help="The task to run.")],
        state: Annotated[str | None, typer.Option("--state", help="The run's start state, JSON (default: null).")] = None,
        queue: Annotated[str, typer.Option("--queue", help="The queue it goes to.")] = "default",
        key: Annotated[str | None, typer.Option("--key", help="Its concurrency/fairness key (flow_control.md).")] = None,
        delay: Annotated[str | None, typer.Option("--delay", help="Start it later: 90s, 30m, 12h, 7d.")] = None,
        metadata: Annotated[str | None, typer.Option("--metadata", help='Labels to search it by, a JSON object, e.g. \'{"tenant": "acme"}\'.')] = None,
        revision: Annotated[str | None, typer.Option("--revision", help="The task's revision (default: the one its registered workers serve).")] = None,
        idempotency_key: Annotated[str | None, typer.Option("--idempotency-key", help="The same key returns the run it started first.")] = None,
        dsn: DsnOpt = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of the id.")] = False,
    ) -> None:
        """Start a run of TASK (same checks as app.start()); print its id."""
        value = _json_option(state, "--state")
        labels = _json_option(metadata, "--metadata")
        try:
            wait = None if delay is None else parse_age(delay)
            if revision is not None:  # everything but the revision, checked before any SQL
                statement = _statement(task, value, queue, key, wait, labels, revision,
                                       idempotency_key)
        except (PgDurableError, TypeError, ValueError) as exc:
            c.fail(str(exc))
        with c.database(dsn) as conn:
            try:
                if revision is None:
                    revision = served_revision(conn, task)
                    statement = _statement(task, value, queue, key, wait, labels, revision,
                                           idempotency_key)
            except (PgDurableError, TypeError, ValueError) as exc:
                c.fail(str(exc))
            sql, params = statement
            run = one_sync(conn, started(sql), params)
        rid, created = run.run_id, run.created
        if as_json:
            c.print_json({"id": rid, "created": created, "task": task, "revision": revision,
                          "queue": queue})
            return
        c.out.print(rid, highlight=False, markup=False)
        if not created:
            c.err.print(f"--idempotency-key {idempotency_key!r}: the run it started before",
                        highlight=False, markup=False)


def _statement(task: str, state: Any, queue: str, key: str | None, delay: Any,
               metadata: Any, revision: str, idempotency_key: str | None,
               ) -> tuple[str, tuple[Any, ...]]:
    """The start statement, as :meth:`pgdurable.Durable.start` builds it (TypeError,
    ValueError or a typed error for bad input, before any SQL)."""
    params = start_params(TaskRegistry(), task, state, queue, 0, idempotency_key, None, None,
                          revision, None)
    sql, params = flow.start_sql(params, key, None, delay)
    return start_statement(sql, params, metadata)
