"""``pgdurable schedule ...``: list, add, pause, resume, delete, trigger, runs.

A typer sub-app registered by :mod:`pgdurable.ops.cli` (shared helpers -- the
database connection, errors, JSON output -- come from there). Exit codes as
in ``pgdurable.cli``: 2 bad input (nothing written), 3 no such schedule.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich import box
from rich.table import Table

from ..foundation.db import translated
from ..foundation.errors import PgDurableError, ScheduleNotFound
from ..foundation.queries import schedules as sq
from ..foundation.queries.core import Query, first_sync, listing_sync
from ..runs.schedules import (
    CATCHUPS,
    OVERLAPS,
    ScheduleInfo,
    list_schedules_sync,
    make_schedule,
    resume_schedule_sync,
    upsert_schedule_sync,
)
from . import cli_common as cli
from .retention import parse_age

schedule_app = typer.Typer(
    name="schedule",
    help="Schedules: cron and interval runs stored in Postgres (one run per tick).",
    no_args_is_help=True,
)

DsnOption = Annotated[
    str | None,
    typer.Option("--dsn", help="PostgreSQL conninfo or URL (default: $PGDURABLE_DSN, then "
                               "$DATABASE_URL).", show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
NameArg = Annotated[str, typer.Argument(help="The schedule's name.")]

T = TypeVar("T")


def _fail(message: str, code: int | None = None) -> NoReturn:
    cli.fail(message, cli.EXIT_BAD_INPUT if code is None else code)
    raise AssertionError("unreachable")  # cli.fail exits


def _not_found(name: str) -> NoReturn:
    _fail(f"no schedule {name!r}", cli.EXIT_NOT_FOUND)


def _as_dict(info: ScheduleInfo) -> dict[str, Any]:
    d = dataclasses.asdict(info)
    d["undeclared"] = info.undeclared
    return d


def _cadence(info: ScheduleInfo) -> str:
    if info.cron is not None:
        return f"{info.cron} ({info.timezone})"
    return f"every {cli.human_age(info.every)}"


@schedule_app.command("list")
def list_(dsn: DsnOption = None, as_json: JsonOption = False) -> None:
    """List schedules: cadence, next tick, last run; marks those no code declares any more."""
    with cli.database(dsn) as conn:
        infos = list_schedules_sync(conn)
    if as_json:
        cli.print_json([_as_dict(i) for i in infos])
        return
    t = Table(title=f"{len(infos)} schedule(s)", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("name", no_wrap=True)
    t.add_column("cadence")
    t.add_column("task")
    t.add_column("next tick (UTC)", no_wrap=True)
    for col in ("last run", "fired", "state"):
        t.add_column(col)
    t.add_column("declared", no_wrap=True)
    for i in infos:
        state = "paused" if i.paused else "active"
        if i.last_error:
            state += f" ({cli._short(i.last_error, 40)})"
        if i.declared_by is None:
            source = "cli/sql"
        elif i.undeclared:
            source = "[yellow]not in code[/]"
        else:
            source = i.declared_by
        last = (i.last_run_status or "pruned") if i.last_run_id else ""
        t.add_row(i.name, cli._short(_cadence(i), 30), i.task,
                  f"{i.next_fire_at.astimezone(UTC):%m-%d %H:%M:%S}", last,
                  f"{i.fired}" + (f" ({i.skipped} skipped)" if i.skipped else ""), state, source)
    cli.show(t)


@schedule_app.command()
def add(
    name: NameArg,
    task: Annotated[str, typer.Option("--task", help="Task each tick starts.")],
    cron: Annotated[str | None, typer.Option("--cron", help="Cron expression, e.g. '0 7 * * 1-5'.")] = None,
    every: Annotated[str | None, typer.Option("--every", help="Interval: 90s, 10m, 2h, 1d.")] = None,
    timezone: Annotated[str, typer.Option("--timezone", help="IANA zone the cron is read in.")] = "UTC",
    state: Annotated[str | None, typer.Option("--state", help="JSON start state of each run.")] = None,
    queue: Annotated[str, typer.Option("--queue", help="Queue of the runs.")] = "default",
    overlap: Annotated[str, typer.Option("--overlap", help=f"One of: {', '.join(OVERLAPS)}.")] = "skip",
    catchup: Annotated[str, typer.Option("--catchup", help=f"One of: {', '.join(CATCHUPS)}.")] = "latest",
    catchup_limit: Annotated[int, typer.Option("--catchup-limit", help="catchup all: at most this many missed ticks.")] = 100,
    revision: Annotated[str, typer.Option("--revision", help="Task revision of the runs.")] = "1",
    max_attempts: Annotated[int, typer.Option("--max-attempts", help="max_attempts of the runs.")] = 3,
    dsn: DsnOption = None,
) -> None:
    """Create or update a schedule (the same as declaring it in code, or SQL upsert_schedule)."""
    try:
        interval = parse_age(every) if every is not None else None
        value = json.loads(state) if state is not None else None
        schedule = make_schedule(
            name, task=task, cron=cron, every=interval, timezone=timezone, state=value,
            queue=queue, overlap=overlap, catchup=catchup, catchup_limit=catchup_limit,
            revision=revision, max_attempts=max_attempts)
    except (ValueError, TypeError, PgDurableError) as exc:
        _fail(f"--state is not JSON: {exc}" if isinstance(exc, json.JSONDecodeError) else str(exc))
    with cli.database(dsn) as conn:
        what = upsert_schedule_sync(conn, schedule)
        info = list_schedules_sync(conn, name)[0]
    cli.out.print(f"schedule {name} {what}; next tick {info.next_fire_at:%Y-%m-%d %H:%M:%S %Z}",
                  highlight=False)


def _one(query: Query[T], name: str, dsn: str | None) -> T | None:
    with cli.database(dsn) as conn:
        try:
            with translated():
                return first_sync(conn, query, (name,))
        except ScheduleNotFound:
            _not_found(name)


@schedule_app.command()
def pause(name: NameArg, dsn: DsnOption = None) -> None:
    """Pause a schedule: no tick fires until it is resumed."""
    changed = _one(sq.PAUSE, name, dsn)
    cli.out.print(f"schedule {name} paused" if changed else f"schedule {name} was already paused",
                     highlight=False)


@schedule_app.command()
def resume(name: NameArg, dsn: DsnOption = None) -> None:
    """Resume a paused schedule from the next tick after now (missed ticks are not caught up)."""
    with cli.database(dsn) as conn:
        try:
            changed = resume_schedule_sync(conn, name)
        except ScheduleNotFound:
            _not_found(name)
        except ValueError as exc:  # its cron (written by SQL) cannot be planned
            _fail(f"schedule {name!r} cannot be resumed: {exc}")
    cli.out.print(f"schedule {name} resumed" if changed else f"schedule {name} was not paused",
                  highlight=False)


@schedule_app.command()
def delete(name: NameArg, dsn: DsnOption = None) -> None:
    """Delete a schedule (its runs stay; one still declared in code comes back at worker start)."""
    if not _one(sq.DELETE, name, dsn):
        _not_found(name)
    cli.out.print(f"schedule {name} deleted", highlight=False)


@schedule_app.command()
def trigger(name: NameArg, dsn: DsnOption = None) -> None:
    """Start a run of the schedule now, outside its cadence; prints the run id."""
    run_id = _one(sq.TRIGGER, name, dsn)
    typer.echo(str(run_id))


@schedule_app.command()
def runs(
    name: NameArg,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10000, help="At most this many, newest tick first.")] = 50,
    dsn: DsnOption = None,
    as_json: JsonOption = False,
) -> None:
    """The runs a schedule started: tick (or trigger time), run id, status."""
    with cli.database(dsn) as conn:
        rows = listing_sync(conn, sq.RUNS, (name, limit))
    if as_json:
        cli.print_json(rows)
        return
    t = Table(title=f"runs of schedule {name}", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("tick", no_wrap=True)
    t.add_column("run", no_wrap=True, min_width=36)
    t.add_column("status")
    t.add_column("how")
    for r in rows:
        t.add_row(f"{r['tick']:%Y-%m-%d %H:%M:%S %Z}", str(r["run_id"]), r["status"],
                  "trigger" if r["triggered"] else "tick")
    cli.show(t)
