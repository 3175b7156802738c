"""CLI commands of :mod:`pgdurable.runs.fork`: ``fork``, ``fork-failed``, ``rewind``.

Registered on the CLI's typer app by :func:`register` (called at the end of
:mod:`pgdurable.ops.cli`). Same SQL functions and validation as the Python API;
bad input exits 2, an unknown run 3, and nothing is written.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer

from ..foundation.errors import PgDurableError
from ..foundation.queries import fork as fq
from ..foundation.queries.core import many_sync, one_sync
from ..runs import fork as f
from . import cli_common as c

__all__ = ["register"]

StepOpt = Annotated[int, typer.Option("--step", help="The checkpoint (step number) to continue from.")]
ForkStepOpt = Annotated[int | None, typer.Option(
    "--step", help="The checkpoint (step number) to continue from (default: where a retry "
                   "would continue: a failed step runs again).", show_default=False)]
StateOpt = Annotated[str | None, typer.Option(
    "--state", help="JSON merge patch (RFC 7396) applied to that checkpoint's state.")]
ReplaceOpt = Annotated[bool, typer.Option(
    "--replace-state", help="--state replaces the state instead of patching it.")]
RevisionOpt = Annotated[str | None, typer.Option(
    "--revision", help="Run on this task revision (a worker must have registered it).")]
ForceOpt = Annotated[bool, typer.Option(
    "--force", help="Use --revision even if no worker registered it.")]
DsnOpt = Annotated[str | None, typer.Option(
    "--dsn", help="PostgreSQL conninfo or URL (default: $PGDURABLE_DSN, then $DATABASE_URL).",
    show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(app: typer.Typer) -> None:
    """Add ``fork``, ``fork-failed`` and ``rewind`` to the CLI ``app``."""
    def params(run_id: str, step: int | None, state: str | None, replace: bool,
               revision: str | None, force: bool) -> tuple[Any, ...]:
        patch: Any = None
        if state is not None:
            try:
                patch = json.loads(state)
            except ValueError as exc:
                c.fail(f"--state is not JSON: {exc}")
        try:
            return f.fork_params(c._run_id(run_id), step, patch,
                                 "replace" if replace else "merge", revision, force)
        except (PgDurableError, TypeError, ValueError) as exc:
            c.fail(str(exc))

    def since_time(text: str) -> datetime:
        if text and text[-1] in _UNITS and text[:-1].isdigit():
            return datetime.now(UTC) - timedelta(seconds=int(text[:-1]) * _UNITS[text[-1]])
        try:
            at = datetime.fromisoformat(text)
        except ValueError:
            c.fail(f"--since {text!r} is neither an ISO time nor an age like 2h")
        return at if at.tzinfo is not None else at.replace(tzinfo=UTC)

    @app.command()
    def fork(
        run_id: Annotated[str, typer.Argument(help="The run to fork.")],
        step: ForkStepOpt = None,
        state: StateOpt = None,
        replace_state: ReplaceOpt = False,
        revision: RevisionOpt = None,
        force: ForceOpt = False,
        dsn: DsnOpt = None,
    ) -> None:
        """Fork a run from one of its checkpoints into a new run (the source is untouched)."""
        p = params(run_id, step, state, replace_state, revision, force)
        with c.database(dsn) as conn:
            new = one_sync(conn, fq.FORK, p)
            at = one_sync(conn, fq.FORKED_AT, (new,))
        c.out.print(f"run {new} forked from {p[0]} at step {at}")

    @app.command("fork-failed")
    def fork_failed(
        task: Annotated[str, typer.Argument(help="Task whose failed runs to fork.")],
        error: Annotated[str | None, typer.Option(
            "--error", help="Error type, e.g. TimeoutError (default: any).")] = None,
        since: Annotated[str, typer.Option(
            "--since", help="ISO time, or an age such as 30m, 2h, 1d.")] = "1d",
        revision: RevisionOpt = None,
        force: ForceOpt = False,
        limit: Annotated[int, typer.Option("--limit", min=1)] = 1000,
        dsn: DsnOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Fork every failed run of TASK not forked yet (by --error, since --since), each from where a retry would continue."""
        try:
            p = f.fork_failed_params(task, error, since_time(since), revision, force, limit)
        except (PgDurableError, TypeError, ValueError) as exc:
            c.fail(str(exc))
        with c.database(dsn) as conn:
            forks = many_sync(conn, fq.FORK_FAILED, p)
        if as_json:
            c.print_json([{"source": r.source, "fork": r.fork} for r in forks])
            return
        for r in forks:
            c.out.print(f"{r.source} -> {r.fork}")
        c.out.print(f"{len(forks)} run(s) forked")

    @app.command()
    def rewind(
        run_id: Annotated[str, typer.Argument(help="The failed or cancelled run.")],
        step: StepOpt,
        state: StateOpt = None,
        replace_state: ReplaceOpt = False,
        revision: RevisionOpt = None,
        force: ForceOpt = False,
        dsn: DsnOpt = None,
    ) -> None:
        """Rewind a failed or cancelled run in place to one of its checkpoints (history kept)."""
        p = params(run_id, step, state, replace_state, revision, force)
        with c.database(dsn) as conn:
            one_sync(conn, fq.REWIND, p)
        c.out.print(f"run {p[0]} rewound to step {step}: runnable again")
