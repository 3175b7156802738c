"""The ``pgdurable`` command line.

Commands: ``migrate`` (``--citus``: a cell, :mod:`pgdurable.ops.citus`), ``cell-dsn``,
``grant``, ``start TASK`` (:mod:`pgdurable.ops.cli_start`), ``runs``, ``run ID``, ``leases``, ``cancel ID``,
``retry ID``, ``signal KIND REF``, ``prune``, ``maintain``, ``worker``, ``stats``, ``demo``, and
``fork``, ``fork-failed``, ``rewind`` (:mod:`pgdurable.ops.cli_fork`). Every listing takes
``--json`` (one JSON document on stdout). The database comes from ``--dsn``,
else ``$PGDURABLE_DSN``, else ``$DATABASE_URL``; the schema from ``pgdurable
--schema NAME``, else ``$PGDURABLE_SCHEMA``, else ``pgdurable``.

Exit codes:

* ``0`` success;
* ``1`` the command ran but found a problem: a drifted migration under
  ``migrate --status``, a demo whose checks failed;
* ``2`` bad input or an unusable database (a one-line error on stderr, no
  traceback, nothing half-applied), e.g. a bad DSN, a bad ``--older-than``,
  ``retry`` of a run that is not failed or cancelled;
* ``3`` no such run (``run``, ``cancel``, ``retry`` with an unknown id).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from psycopg.conninfo import conninfo_to_dict
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..foundation import migrations
from ..foundation.db import connect, resolve_dsn, translated
from ..foundation.errors import InvalidInput, PgDurableError
from ..foundation.events import event_params
from ..foundation.queries import budgets as BQ
from ..foundation.queries import cli as Q
from ..foundation.queries import events as EQ
from ..foundation.queries.clock import NOW
from ..foundation.queries.core import first_sync, listing_sync, many_sync, one_sync
from ..foundation.schemas import check_schema_name, resolve_schema
from ..foundation.signals import DEFAULT_SIGNAL_TTL, parse_payload, signal_params
from ..foundation.text import escape_controls, plain
from ..runs.search import list_runs_query, make_page
from . import citus as cells
from . import partitions, retention
from .cli_common import (
    EXIT_BAD_INPUT,
    EXIT_NOT_FOUND,
    EXIT_PROBLEM,
    _error_line,
    _run_id,
    _short,
    database,
    err,
    fail,
    human_age,
    need_dsn,
    one_line,
    out,
    owner_dsn,
    print_json,
    schema_owner_switch,
    show,
    with_role,
)
from .cli_fork import register as _register_fork
from .cli_schedules import schedule_app
from .cli_start import register as _register_start
from .demo import run_demo
from .embedded import start_embedded
from .roles import grant_roles
from .worker_process import _load_app
from .worker_process import main as worker_main

app = typer.Typer(
    name="pgdurable",
    help="Durable AI-agent runs on PostgreSQL alone.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(schedule_app)  # pgdurable schedule list | add | pause | resume | delete | trigger


@app.callback()
def _options(
    schema: Annotated[str | None, typer.Option(
        "--schema", help="The schema pgdurable lives in (default: $PGDURABLE_SCHEMA, then "
        "pgdurable): each app or tenant of a database can have its own.",
        show_default=False)] = None,
) -> None:
    """Durable AI-agent runs on PostgreSQL alone."""
    if schema is not None:
        try:
            check_schema_name(schema)
        except InvalidInput as exc:
            fail(str(exc))
        # every command, and the processes it starts (worker processes), connect to it
        os.environ["PGDURABLE_SCHEMA"] = schema
    elif os.environ.get("PGDURABLE_SCHEMA"):
        try:
            check_schema_name(os.environ["PGDURABLE_SCHEMA"])
        except InvalidInput as exc:
            fail(f"PGDURABLE_SCHEMA: {exc}")

# statuses whose runs.error explains the status (a completed run may keep an old one)
_ERROR_SHOWN = frozenset({"failed", "cancelled", "incompatible", "runnable"})
STATUSES = ("runnable", "leased", "waiting", "completed", "failed", "cancelled", "incompatible")

DsnOption = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        help="PostgreSQL conninfo or URL (default: $PGDURABLE_DSN, then $DATABASE_URL).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

def _row(table: Table, *cells: object) -> None:
    """Add a row of data: each cell plain text (not markup), controls escaped."""
    table.add_row(*(c if isinstance(c, Text) else plain(c) for c in cells))


def _progress() -> Progress:
    """A progress bar on stderr, shown only on a terminal and erased when done."""
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True, disable=not err.is_terminal,
    )


# ---------------------------------------------------------------------------------------
@app.command()
def grant(
    dsn: DsnOption = None,
    owner_role: Annotated[str | None, typer.Option("--owner-role", help="NOLOGIN role that owns the schema and runs migrations.")] = None,
    app_role: Annotated[str | None, typer.Option("--app-role", help="Role of the application and workers: EXECUTE + SELECT, no table DML.")] = None,
    readonly_role: Annotated[str | None, typer.Option("--readonly-role", help="Operators' role: SELECT on the views only.")] = None,
) -> None:
    """Set up the role model on existing roles (run as a superuser; see docs/security.md)."""
    target = need_dsn(dsn)
    current = schema_owner_switch(target)
    if current is not None and owner_role is not None and owner_role != current:
        fail(f"schema pgdurable is owned by {current!r}, which may have changed any of its "
             f"functions: a superuser does not run them, and as {current!r} this cannot hand the "
             f"schema to {owner_role!r}. Install pgdurable afresh as {owner_role!r} (see "
             "docs/security.md, 'A schema a non-superuser migrated')")
    try:
        grant_roles(with_role(target, current), owner_role=owner_role, app_role=app_role,
                    readonly_role=readonly_role)
    except (PgDurableError, ValueError, TypeError) as exc:
        fail(str(exc))
    out.print("roles granted", highlight=False)


# ---------------------------------------------------------------------------------------
@app.command()
def migrate(
    dsn: DsnOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the SQL of pending migrations; apply nothing.")] = False,
    status: Annotated[bool, typer.Option("--status", help="Show each migration's state; apply nothing.")] = False,
    adopt: Annotated[bool, typer.Option("--adopt", help="Migrate an existing pgdurable schema even if it does not look like ours.")] = False,
    citus: Annotated[bool, typer.Option("--citus", help="On a Citus coordinator: migrate a statement at a time, distribute the schema (a cell) and print the DSN of the node holding it (scaling.md).")] = False,
) -> None:
    """Apply pending schema migrations (safe to run from many processes at once).

    An existing pgdurable schema that is not ours (another owner, a foreign
    schema_migrations, triggers or rules on it) is refused unless --adopt."""
    target = need_dsn(dsn)
    if citus and (status or dry_run):
        fail("--citus applies and distributes: not with --status or --dry-run")
    try:
        if status:
            with translated():  # a role that may not read them: one line, not a traceback
                states = migrations.migration_status(target)
                definitions = migrations.definition_status(target)
            table = Table("version", "name", "status", "applied at")
            for s in states:
                _row(
                    table,
                    f"{s.migration.version:04d}",
                    s.migration.name,
                    s.status,
                    s.applied_at.isoformat(timespec="seconds") if s.applied_at else "",
                )
            show(table)
            defined = Table("definitions", "status", "applied at")
            for d in definitions:
                _row(defined, d.definition.path, d.status,
                     d.applied_at.isoformat(timespec="seconds") if d.applied_at else "")
            show(defined)
            if any(s.drifted for s in states):
                raise typer.Exit(EXIT_PROBLEM)
            return
        pending = migrations.migrate(target, dry_run=True, adopt=adopt)
        changed = [d.definition for d in migrations.definition_status(target, adopt=adopt)
                   if d.status != "applied"]
        if dry_run:
            if not pending and not changed:
                out.print("-- nothing to apply", highlight=False)
            sys.stdout.write(migrations.pending_sql(pending, changed))
            return
        with _progress() as progress:
            bar = progress.add_task("migrating", total=len(pending))

            def applied_one(m: migrations.Migration) -> None:
                progress.advance(bar)
                out.print(f"applied {m.name}", highlight=False, markup=False)

            if citus:
                applied = cells.migrate_cell(target, on_apply=applied_one, adopt=adopt)
            else:
                applied = migrations.migrate(target, on_apply=applied_one, adopt=adopt)
        if citus:
            node = cells.distribute_schema(target, resolve_schema())
            out.print(f"cell: schema {node.schema} on {node.host}:{node.port}; its fleet "
                      f"connects there (`pgdurable cell-dsn`)", highlight=False, markup=False)
        if changed:
            which = ", ".join(d.path for d in changed) if len(changed) <= 6 else "functions and views"
            out.print(f"applied {len(changed)} definitions file(s) ({which})",
                      highlight=False, markup=False)
        if not applied and not changed:
            out.print(f"schema is up to date (version {migrations.required_version()})")
    except PgDurableError as exc:
        fail(str(exc))


@app.command("cell-dsn")
def cell_dsn(dsn: DsnOption = None) -> None:
    """Print the DSN of the Citus node holding the schema (a cell): where its fleet
    connects (--dsn: the coordinator). Again after a shard move: it follows it."""
    target = need_dsn(dsn)
    try:
        with translated():
            sys.stdout.write(cells.cell_dsn(target, resolve_schema()) + "\n")
    except PgDurableError as exc:
        fail(str(exc))


@app.command()
def runs(
    dsn: DsnOption = None,
    status: Annotated[str | None, typer.Option("--status", help=f"One of: {', '.join(STATUSES)}.")] = None,
    task: Annotated[str | None, typer.Option("--task", help="Only runs of this task.")] = None,
    queue: Annotated[str | None, typer.Option("--queue", help="Only runs in this queue.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most this many (newest first).")] = 50,
    metadata: Annotated[str | None, typer.Option("--metadata", help='Only runs whose metadata contains this JSON object, e.g. \'{"tenant": "acme"}\'.')] = None,
    since: Annotated[datetime | None, typer.Option("--since", help="Only runs started at or after this time (ISO 8601; UTC if no offset).")] = None,
    until: Annotated[datetime | None, typer.Option("--until", help="Only runs started before this time (ISO 8601; UTC if no offset).")] = None,
    id_prefix: Annotated[str | None, typer.Option("--id-prefix", help="Only runs whose id starts with these hex digits.")] = None,
    cursor: Annotated[str | None, typer.Option("--cursor", help="Continue after the page that printed this cursor.")] = None,
    as_json: JsonOption = False,
) -> None:
    """List runs, newest first: where each runs, what it waits on, why it failed."""
    if status is not None and status not in STATUSES:
        fail(f"unknown status {status!r}: use one of {', '.join(STATUSES)}")
    try:
        meta = None if metadata is None else json.loads(metadata)
        query, params = list_runs_query(
            status=status, task=task, queue=queue, metadata=meta, limit=limit, cursor=cursor,
            since=None if since is None else since.replace(tzinfo=since.tzinfo or UTC),
            until=None if until is None else until.replace(tzinfo=until.tzinfo or UTC),
            id_prefix=id_prefix)
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    with database(dsn) as conn:
        page = make_page(conn.execute(query, params).fetchall(), limit)
        now = first_sync(conn, NOW)
    rows = [{**asdict(r), "age": now - r.created_at if now else None} for r in page.items]
    if as_json:  # the whole page: its runs and where the next one starts
        print_json({"runs": rows, "next_cursor": page.next_cursor})
        return
    if page.next_cursor is not None:  # beside the table, not in it
        err.print(f"more: --cursor {page.next_cursor}", highlight=False, soft_wrap=True)
    table = Table(title=f"{len(rows)} run(s)", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("id", no_wrap=True, min_width=36)
    for name in ("task", "queue", "status", "step", "attempts", "where", "age", "error"):
        table.add_column(name, justify="right" if name in ("step", "attempts") else "left")
    for r in rows:
        where = ""
        expired = Text(" (lease expired)", "red") if r["lease_expired"] else Text()
        if r["status"] == "leased":
            where = f"{r['worker']}"
        elif r["status"] == "waiting":
            where = f"{r['wait_kind']}:{r['wait_ref']}" if r["wait_kind"] else "timer"
            if r["wake_at"]:
                where += f" until {r['wake_at']:%H:%M:%S}"
        error = ""
        if r["error_type"] and r["status"] in _ERROR_SHOWN:  # a completed run may keep one
            error = f"{r['error_type']}: {r['error_message']}"
        _row(table, str(r["id"]), one_line(r["task"]), one_line(r["queue"]), r["status"],
             str(r["step"]), f"{r['attempts']}/{r['max_attempts']}",
             Text.assemble(plain(one_line(where)), expired if r["status"] == "leased" else ""),
             human_age(r["age"]), one_line(error))
    show(table)


def _show_tree(nodes: list[dict[str, Any]], as_json: bool) -> None:
    """``run ID --tree``: the run and its descendants (pgdurable.run_tree), indented."""
    if as_json:
        print_json({"tree": nodes})
        return
    table = Table("run", "key", "task", "status", "policy", "error", box=box.SIMPLE_HEAD,
                  pad_edge=False, title=f"tree of {nodes[0]['id']}", title_justify="left")
    for n in nodes:
        _row(table, "  " * n["depth"] + str(n["id"]), _short(n["child_key"], 20),
             _short(n["task"], 24), n["status"], n["parent_policy"] or "",
             n["error_type"] or "")
    show(table)


def _woken_by(wake: dict[str, Any] | None) -> str:
    """What woke a run before a step: ``signal ci:b-1``, ``timeout``, ``children (3)``."""
    if not wake:
        return ""
    words = [str(wake.get("type") or "?")]
    if wake.get("kind"):
        words.append(f"{wake['kind']}:{wake.get('ref') or ''}")
    if isinstance(wake.get("children"), list | dict):
        words.append(f"({len(wake['children'])} finished)")
    return " ".join(words)


@app.command()
def run(
    run_id: Annotated[str, typer.Argument(help="The run's id.")],
    dsn: DsnOption = None,
    events: Annotated[int, typer.Option("--events", min=0, help="Show the last N events.")] = 20,
    as_json: JsonOption = False,
    tree: Annotated[bool, typer.Option("--tree", help="Show the run's tree of child runs.")] = False,
) -> None:
    """Show one run: state, steps, events, effects, lease, wait, error (or --tree)."""
    rid = _run_id(run_id)
    with database(dsn) as conn:
        full = bool(first_sync(conn, Q.CAN_READ))
        found = many_sync(conn, Q.RUN if full else Q.RUN_VIEW, (rid,))
        if not found:
            fail(f"no run {rid}", EXIT_NOT_FOUND)
        if tree:
            _show_tree(listing_sync(conn, Q.RUN_TREE, (rid,)), as_json)
            return
        info: dict[str, Any] = found[0]
        steps = listing_sync(conn, Q.CHECKPOINTS if full else Q.STEPS_VIEW, (rid,))
        evs = listing_sync(conn, Q.EVENTS, (rid, events)) if full else []
        effects = listing_sync(conn, Q.EFFECTS if full else Q.EFFECTS_VIEW, (rid,))
        rewinds = listing_sync(conn, Q.REWINDS, (rid,)) if full else []
    if not full:
        err.print("this role reads the views only: no state, result, payload or event is shown",
                  highlight=False)
    if as_json:
        print_json({"run": info, "steps": steps, "events": evs, "effects": effects,
                    "rewinds": rewinds})
        return
    head = Table(show_header=False, box=None, title=f"run {rid}", title_justify="left")
    head.add_column(style="bold")
    head.add_column()
    for key in ("task", "revision", "queue", "status", "step", "attempts", "max_attempts",
                "created_at", "updated_at", "finished_at"):
        _row(head, key, _short(info.get(key), 80))
    if info.get("status") == "leased":
        _row(head, "lease", f"{info['lease_owner']} token {info['lease_token']} "
                            f"until {info['lease_expires_at']}")
    if info.get("status") == "waiting":
        what = f"{info['wait_kind']}:{info['wait_ref']}" if info.get("wait_kind") else "timer"
        _row(head, "waits on", f"{what} since {info['wait_since']}"
                               + (f" until {info['wake_at']}" if info.get("wake_at") else ""))
    if info.get("affinity_worker"):
        _row(head, "affinity", f"{info['affinity_mode']} to worker {info['affinity_worker']} "
                               f"(wait {info['affinity_wait']}) since {info['affinity_since']}"
                               + (f" {_short(json.dumps(info['affinity_info']), 60)}"
                                  if info.get("affinity_info") else ""))
    if info.get("error"):
        e = info["error"]
        text = f"{e.get('type')}: {_short(e.get('message'), 100)}"
        if info.get("status") == "completed":  # the error of an attempt it got past
            _row(head, "recovered from", f"{text} (an earlier attempt; the run completed)")
        else:
            _row(head, "error" if info.get("status") in _ERROR_SHOWN else "last error", text)
    if info.get("forked_from"):
        _row(head, "forked from", f"{info['forked_from']} at step {info['forked_from_step']}")
    for w in rewinds:
        _row(head, "retried" if w.get("kind") == "retry" else "rewound",
             f"{w['created_at']} from step {w['from_step']} to step {w['to_step']} "
             f"(was {w['status']})")
    if info.get("heartbeat_at"):
        _row(head, "heartbeat", f"{info['heartbeat_at']} progress "
                                f"{_short(json.dumps(info.get('progress')), 80)}")
    if info.get("result") is not None:
        _row(head, "result", _short(json.dumps(info["result"]), 100))
    if "state" in info:
        _row(head, "state", _short(json.dumps(info["state"]), 100))
    show(head)
    steps_t = Table("step", "token", "at", "woken by", "state", title="steps",
                    box=box.SIMPLE_HEAD, pad_edge=False)
    for s in steps:
        woke = _woken_by(s["wake"])
        state = s.get("state")
        entry = state.get("workflow") if isinstance(state, dict) else None
        shown = (  # a workflow's entry by name (pgdurable.workflows)
            f"{entry.get('kind')} {entry.get('name')} "
            + _short(json.dumps(entry.get("error", entry.get("result"))), 40)
            if isinstance(entry, dict) else _short(json.dumps(state), 60) if "state" in s
            else s.get("step_name") or "")
        _row(steps_t, str(s["step"]), str(s["token"]), f"{s['created_at']:%H:%M:%S.%f}"[:-3],
             woke, shown)
    show(steps_t)
    if effects:
        eff_t = Table("effect", "status", "token", "result / error", title="effects", box=box.SIMPLE_HEAD, pad_edge=False)
        for e in effects:
            _row(eff_t, e["key"], e["status"], str(e["token"]),
                 _short(json.dumps(e["result"] if e["error"] is None else e["error"]), 60))
        show(eff_t)
    if evs:
        ev_t = Table("seq", "at", "event", title="events", box=box.SIMPLE_HEAD, pad_edge=False)
        for ev in evs:
            _row(ev_t, str(ev["seq"]), f"{ev['created_at']:%H:%M:%S}",
                 _short(json.dumps(ev["event"]), 80))
        show(ev_t)


@app.command()
def leases(dsn: DsnOption = None, as_json: JsonOption = False) -> None:
    """Show live leases: lease-provider keys and leased runs."""
    with database(dsn) as conn:
        keys = listing_sync(conn, Q.LEASES)
        held = listing_sync(conn, Q.RUN_LEASES)
    if as_json:
        print_json({"leases": keys, "runs": held})
        return
    t = Table("key", "owner", "token", "expires in", title=f"{len(keys)} lease(s)", box=box.SIMPLE_HEAD, pad_edge=False)
    for k in keys:
        _row(t, one_line(k["key"]), one_line(k["owner"]), str(k["token"]),
             human_age(k["ttl_remaining"]))
    show(t)
    r = Table("run", "task", "queue", "worker", "expires in", title=f"{len(held)} leased run(s)", box=box.SIMPLE_HEAD, pad_edge=False)
    for h in held:
        _row(r, str(h["id"]), h["task"], h["queue"], str(h["worker"]),
             Text("expired", "red") if h["lease_expired"] else human_age(h["ttl_remaining"]))
    show(r)


@app.command()
def cancel(run_id: Annotated[str, typer.Argument(help="The run's id.")], dsn: DsnOption = None) -> None:
    """Cancel a run (at once if runnable/waiting; its worker stops it if leased)."""
    rid = _run_id(run_id)
    with database(dsn) as conn:
        status = first_sync(conn, Q.CANCEL, (rid,)) or "?"
    if status == "cancelled":
        out.print(f"run {rid} cancelled")
    elif status == "leased":
        out.print(f"run {rid} is leased: cancel requested, its worker stops it at the next boundary")
    else:
        out.print(f"run {rid} is already {status}; nothing to cancel")


@app.command()
def retry(run_id: Annotated[str, typer.Argument(help="The run's id.")], dsn: DsnOption = None) -> None:
    """Make a failed or cancelled run live again: what failed runs again (a failed step, failed effects, failed children)."""
    rid = _run_id(run_id)
    with database(dsn) as conn:
        status = first_sync(conn, Q.RETRY, (rid,))
    if status == "waiting":
        out.print(f"run {rid} waits again for the failed children it retried (attempts reset)")
    else:
        out.print(f"run {rid} is runnable again (attempts reset)")


@app.command()
def events(
    dsn: DsnOption = None,
    name: Annotated[str | None, typer.Option("--name", help="Only events of this name.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most this many (newest first).")] = 50,
    as_json: JsonOption = False,
) -> None:
    """List events, newest first, and the trigger runs each one joined (docs/events.md)."""
    with database(dsn) as conn:
        rows = listing_sync(conn, EQ.LIST_EVENTS, {"name": name, "limit": limit})  # type: ignore[arg-type]
    if as_json:
        print_json(rows)
        return
    t = Table("id", "name", "event id", "time", "data", "triggered",
              title="events (docs/events.md)", box=box.SIMPLE_HEAD, pad_edge=False)
    for r in rows:
        runs = ", ".join(f"{x['trigger']} {str(x['run_id'])[:8]} {x['status'] or 'pruned'}"
                         for x in r["triggered"])
        _row(t, str(r["id"]), r["name"], r["event_key"] or "",
             r["created_at"].isoformat(timespec="seconds"),
             _short(json.dumps(r["data"])), runs)
    show(t)


@app.command("send-event")
def send_event(
    name: Annotated[str, typer.Argument(help="Event name, e.g. order.paid.")],
    data: Annotated[str | None, typer.Option("--data", help="The event's data, a JSON object (default: {}).")] = None,
    event_id: Annotated[str | None, typer.Option("--id", help="Deduplication id: the same id and data act once.")] = None,
    dsn: DsnOption = None,
) -> None:
    """Send an event (docs/events.md): its waits, cancel_on and triggers act on it; prints its number."""
    try:
        params = event_params(name, parse_payload(data or "{}"), event_id)
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    with database(dsn) as conn:
        sent = one_sync(conn, EQ.SEND_EVENT, params)
    sys.stdout.write(f"{sent.id}\n")
    if not sent.created:
        err.print("an event of this name was sent with this id before: nothing was done again",
                  highlight=False, markup=False)


@app.command()
def signal(
    kind: Annotated[str, typer.Argument(help="Signal kind, e.g. ci, approval.")],
    ref: Annotated[str, typer.Argument(help="Signal reference, e.g. a build id.")],
    payload: Annotated[str | None, typer.Option("--payload", help="JSON payload (default: null).")] = None,
    signal_id: Annotated[str | None, typer.Option("--signal-id", help="Deduplication id: the same id is delivered once.")] = None,
    dsn: DsnOption = None,
) -> None:
    """Send a signal: wake the runs waiting on KIND REF (printed, one id a line), else keep it pending."""
    try:
        value = parse_payload(payload or "")
        params = signal_params(kind, ref, value, signal_id, DEFAULT_SIGNAL_TTL)
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    with database(dsn) as conn:
        woken = many_sync(conn, Q.SIGNAL, params)
    for rid in woken:
        sys.stdout.write(rid + "\n")
    if not woken:
        err.print(f"no run waits on {escape_controls(kind)}:{escape_controls(ref)}; the signal "
                  "is kept pending for the next one "
                  f"(for {DEFAULT_SIGNAL_TTL})", highlight=False, markup=False)


@app.command()
def prune(
    dsn: DsnOption = None,
    older_than: Annotated[str, typer.Option("--older-than", help="Age of finished runs to delete: 7d, 12h, 30m, 90s, 2w.")] = "7d",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only count what would be deleted.")] = False,
    batch: Annotated[int, typer.Option("--batch", min=1, max=100000, help="Runs per transaction.")] = 1000,
    as_json: JsonOption = False,
) -> None:
    """Delete finished runs older than --older-than with their history, and consumed thread messages, in short batches."""
    try:
        age = retention.parse_age(older_than)
    except PgDurableError as exc:
        fail(str(exc))
    target = owner_dsn(dsn)
    try:
        preview = retention.prune_sync(target, age, dry_run=True)
        if dry_run:
            result = preview
        else:
            with _progress() as progress:
                bar = progress.add_task("pruning runs", total=preview.runs or None)
                result = retention.prune_sync(
                    target, age, batch=batch,
                    on_batch=lambda b: progress.advance(bar, b.runs),
                )
    except PgDurableError as exc:
        fail(str(exc))
    if as_json:
        print_json(result.as_dict())
        return
    verb = "would delete" if dry_run else "deleted"
    out.print(
        f"{verb} {result.runs} run(s) finished more than {older_than} ago, with "
        f"{result.checkpoints} checkpoint(s), {result.effects} effect(s), {result.events} "
        f"event(s), {result.signals} signal(s), {result.messages} consumed thread "
        f"message(s), {result.graph_checkpoints} LangGraph checkpoint(s), "
        f"{result.sent_events} sent event(s)"
        + ("" if dry_run else f" in {result.batches} batch(es)"),
        highlight=False,
    )


@app.command()
def maintain(
    dsn: DsnOption = None,
    days_ahead: Annotated[int, typer.Option("--days-ahead", min=0, max=366, help="Daily history partitions to keep ready ahead of today (UTC).")] = 3,
    older_than: Annotated[str | None, typer.Option("--older-than", help="Also drop history partitions older than this (30d, ...), keeping rows of runs retention keeps.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Create the history partitions ahead of time; with --older-than, drop old ones whole."""
    try:
        result = partitions.maintain_sync(owner_dsn(dsn), days_ahead=days_ahead,
                                          older_than=older_than)
    except PgDurableError as exc:
        fail(str(exc))
    if as_json:
        print_json(result.as_dict())
        return
    out.print(f"created {result.created} partition(s), moved {result.signals_moved} consumed "
              f"signal(s) to signal_history, dropped {len(result.dropped)}"
              + "".join(f"; {d.partition_name}: {d.rows_dropped} row(s) dropped, "
                        f"{d.rows_kept} kept" for d in result.dropped), highlight=False)


@app.command()
def stats(dsn: DsnOption = None, as_json: JsonOption = False) -> None:
    """Per queue: runnable, leased, waiting, failed, and the age of the oldest runnable run."""
    with database(dsn) as conn:
        rows = listing_sync(conn, Q.STATS)
    if as_json:
        print_json(rows)
        return
    t = Table("queue", "runnable", "due", "leased", "expired", "waiting", "done", "failed",
              "cancelled", "oldest due", title="queues (expired = leases of dead workers)", box=box.SIMPLE_HEAD, pad_edge=False)
    for r in rows:
        _row(t, r["queue"], str(r["runnable"]), str(r["due"]), str(r["leased"]),
             str(r["expired_leases"]), str(r["waiting"]), str(r["completed"]),
             str(r["failed"]), str(r["cancelled"]), human_age(r["oldest_runnable_age"]))
    show(t)
    _flow_tables(dsn)


def _flow_tables(dsn: str | None) -> None:
    """``stats``: the limited queues and the token buckets, when there are any."""
    with database(dsn) as conn:
        limits, buckets = listing_sync(conn, Q.LIMITS), listing_sync(conn, Q.BUCKETS)
    if limits:
        t = Table("queue", "concurrency", "active", "per key", "rate/s", "tokens", "keys queued",
                  title="queue limits (docs/flow_control.md)", box=box.SIMPLE_HEAD, pad_edge=False)
        for r in limits:
            _row(t, r["queue"], *(("-" if r[k] is None else f"{r[k]:g}" if k == "tokens"
                                   else str(r[k]))
                                  for k in ("concurrency", "active", "per_key_concurrency",
                                            "rate_per_second", "tokens", "keys_queued")))
        show(t)
    if buckets:
        t = Table("bucket", "rate/s", "burst", "tokens", title="token buckets",
                  box=box.SIMPLE_HEAD, pad_edge=False)
        for r in buckets:
            _row(t, r["name"], str(r["rate_per_second"]), str(r["burst"]), f"{r['tokens']:g}")
        show(t)


@app.command()
def buckets(dsn: DsnOption = None, as_json: JsonOption = False) -> None:
    """Token buckets shared by every worker (ctx.acquire): rate, burst, level now."""
    with database(dsn) as conn:
        rows = listing_sync(conn, Q.BUCKETS)
    if as_json:
        print_json(rows)
        return
    _flow_tables(dsn)


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:g}"


@app.command()
def budgets(
    dsn: DsnOption = None,
    as_json: JsonOption = False,
    runs: Annotated[bool, typer.Option("--runs", help="Show runs' own budgets (run:<id>) too.")] = False,
) -> None:
    """Spend budgets (docs/budgets.md): per budget and unit, the limit, the window,
    what is settled in the window, what live reservations hold and what is left."""
    with database(dsn) as conn:
        rows = listing_sync(conn, BQ.USAGE, (runs,))
    if as_json:
        print_json(rows)
        return
    t = Table("budget", "unit", "limit", "window", "policy", "settled", "held", "available",
              title=f"{len({r['budget_key'] for r in rows})} budget(s)", box=box.SIMPLE_HEAD,
              pad_edge=False)
    for r in rows:
        window = ("-" if r["window_kind"] == "none"
                  else f"{r['window_kind']} {human_age(r['window_length'])}")
        _row(t, one_line(r["budget_key"]), r["unit"], _num(r["limit_amount"]), window,
             r["policy"], _num(r["settled"]), _num(r["held"]), _num(r["available"]))
    show(t)


@app.command()
def worker(
    app_spec: Annotated[str, typer.Argument(metavar="MODULE:APP", help="module:attribute of a pgdurable.Durable app.")],
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Runs at once.")] = 16,
    queues: Annotated[str, typer.Option("--queues", help="Comma-separated queue names.")] = "default",
    lease_ttl: Annotated[float, typer.Option("--lease-ttl", min=0.1, help="Lease TTL, seconds.")] = 60.0,
    poll: Annotated[float, typer.Option("--poll", min=0.01, help="Poll interval, seconds.")] = 5.0,
    grace: Annotated[float, typer.Option("--grace", min=0, help="Shutdown grace, seconds.")] = 30.0,
    prune_older_than: Annotated[str | None, typer.Option("--prune-older-than", help="Also prune finished runs older than this (7d, 12h, ...), one pruner at a time across the fleet.")] = None,
    prune_every: Annotated[float, typer.Option("--prune-every", min=1, help="Seconds between prunes.")] = 3600.0,
    no_listen: Annotated[bool, typer.Option("--no-listen", help="Poll only, no LISTEN connection (PgBouncer in transaction mode).")] = False,
    maintain: Annotated[bool, typer.Option("--maintain", help="Also create history partitions ahead of time, hourly; one leader (a lease) across the fleet.")] = False,
    metrics_port: Annotated[int | None, typer.Option("--metrics-port", help="Serve Prometheus /metrics on this port (pgdurable[metrics]).")] = None,
    log_level: Annotated[str | None, typer.Option("--log-level", help="Level of pgdurable's log lines on stderr (DEBUG, INFO, WARNING, ERROR; default $PGDURABLE_LOG, else INFO).", show_default=False)] = None,
) -> None:
    """Run a worker for MODULE:APP until SIGTERM/SIGINT (same as python -m pgdurable.worker)."""
    _as_schema_owner(app_spec)
    if prune_older_than is not None:
        _start_pruner(app_spec, prune_older_than, prune_every)
    if maintain:
        _start_pruner(app_spec, None, 3600.0)
    with _one_line_exit():
        worker_main([app_spec, "--concurrency", str(concurrency), "--queues", queues,
                     "--lease-ttl", str(lease_ttl), "--poll", str(poll), "--grace", str(grace)]
                    + (["--no-listen"] if no_listen else [])
                    + ([] if metrics_port is None else ["--metrics-port", str(metrics_port)])
                    + ([] if log_level is None else ["--log-level", log_level]))


@app.command()
def dashboard(
    dsn: DsnOption = None,
    host: Annotated[str, typer.Option("--host", help="Interface to bind (not loopback: set --token, and --trusted-host for the names it is reached by).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port.")] = 8080,
    actions: Annotated[bool, typer.Option("--actions", help="Enable run cancel/retry/signal/fork and schedule pause/resume/trigger (needs --token or $PGDURABLE_DASHBOARD_TOKEN).")] = False,
    token: Annotated[str | None, typer.Option("--token", envvar="PGDURABLE_DASHBOARD_TOKEN", help="Token (at least 32 bytes) to log in with: every page needs it, and so does each action.", show_default=False)] = None,
    trusted_host: Annotated[list[str] | None, typer.Option("--trusted-host", help="A host name the dashboard is reached by (Host header and POST origins; repeatable; '*.example.com' for subdomains). Default: localhost, 127.0.0.1, [::1].", show_default=False)] = None,
) -> None:
    """Serve the web dashboard (pgdurable[dashboard]); read-only unless --actions."""
    try:
        from .dashboard import exposure_warnings, serve
    except ImportError as exc:
        fail(f"the dashboard needs its extra: pip install 'pgdurable[dashboard]' ({exc})")
    if actions and token is None:  # said in the command's words, not create_app's
        fail("--actions needs --token (or $PGDURABLE_DASHBOARD_TOKEN): a token of at least "
             "32 bytes that every action must give (who may act?)")
    try:
        warnings = exposure_warnings(host, token=token, trusted_hosts=trusted_host or None)
    except (TypeError, ValueError) as exc:
        fail(_as_flags(str(exc)))
    for message in warnings:
        err.print(Text.assemble(("WARNING:", "bold red"), f" {message}"), highlight=False,
                  soft_wrap=True)
    target = owner_dsn(dsn)
    try:  # nothing answers, no schema: one line now, not a 503 page later
        with connect(target) as conn, translated():
            migrations.check_schema(conn)
    except PgDurableError as exc:
        fail(str(exc))
    try:
        serve(target, host=host, port=port, actions=actions, token=token,
              trusted_hosts=trusted_host or None, warn=False)
    except ValueError as exc:
        fail(_as_flags(str(exc)))


# create_app's parameters in its messages, as `pgdurable dashboard` names them
_FLAGS = ((re.compile(r"\btrusted_hosts\b"), "--trusted-host"),
          (re.compile(r"^token must\b"), "--token must"))


def _as_flags(message: str) -> str:
    """A message of the dashboard's Python API with its parameter names as the
    command's options (``trusted_hosts`` -> ``--trusted-host``)."""
    for name, flag in _FLAGS:
        message = name.sub(flag, message)
    return message


@contextmanager
def _one_line_exit() -> Iterator[None]:
    """``SystemExit("message")`` (the worker's "cannot load the app") as a one-line error."""
    try:
        yield
    except SystemExit as exc:
        if isinstance(exc.code, str):
            fail(exc.code)
        raise


def _as_schema_owner(app_spec: str) -> None:
    """A superuser's worker runs as the schema's owner, as every other command does
    (:func:`schema_owner_switch`): its sessions, the pruner's and the maintainer's
    start with ``SET ROLE owner``, through ``PGOPTIONS`` (read by libpq for a DSN
    without ``options``), so nothing the owner may have redefined runs as superuser.
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    with _one_line_exit():
        target = need_dsn(_load_app(app_spec).conninfo)
    try:  # nothing answers: said as the worker says it (`the worker cannot start: ...`)
        with connect(target):
            pass
    except PgDurableError as exc:
        fail(f"the worker cannot start: {exc}")
    role = schema_owner_switch(target)
    if role is None:
        return
    if conninfo_to_dict(target).get("options"):
        fail(f"schema pgdurable is owned by {role!r}: a superuser's worker runs as that role, "
             "but the app's DSN sets its own options; connect the worker as the app role, "
             f"or add '-c role={role}' to the DSN's options")
    os.environ["PGOPTIONS"] = str(conninfo_to_dict(with_role(target, role)).get("options", ""))


def _start_pruner(app_spec: str, older_than: str | None, every: float) -> None:
    """A daemon thread pruning next to the worker (run_pruner_sync, exclusive batches).

    ``older_than=None``: the history partition maintenance instead
    (run_maintenance_sync, leader-elected).
    """
    import threading

    try:
        age = retention.parse_age(older_than) if older_than is not None else None
    except PgDurableError as exc:
        fail(str(exc))
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    with _one_line_exit():
        target = need_dsn(_load_app(app_spec).conninfo)
    if age is None:
        threading.Thread(target=partitions.run_maintenance_sync, name="pgdurable-maintenance",
                         daemon=True, kwargs={"target": target, "every": every}).start()
        return
    threading.Thread(
        target=retention.run_pruner_sync, name="pgdurable-pruner", daemon=True,
        kwargs={"target": target, "every": every, "older_than": age},
    ).start()


@app.command()
def demo(
    dsn: DsnOption = None,
    data_dir: Annotated[str | None, typer.Option("--data-dir", help="Embedded server data directory (default .pgdurable/pgdata).")] = None,
) -> None:
    """Run a durable research agent end to end: effects, CI webhook, approval, a killed worker."""
    try:
        ok = run_demo(dsn=resolve_dsn(dsn), data_dir=data_dir, console=out,
                      dsn_from_env=dsn is None)
    except PgDurableError as exc:
        fail(str(exc))
    if not ok:
        raise typer.Exit(EXIT_PROBLEM)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def embedded(
    ctx: typer.Context,
    data_dir: Annotated[str | None, typer.Option("--data-dir", help="Embedded server data directory (default .pgdurable/pgdata, the demo's).")] = None,
) -> None:
    """Run a pgdurable COMMAND on the embedded PostgreSQL (pgdurable[embedded]), e.g. `pgdurable embedded run RUN_ID` after `pgdurable demo`: the server starts for the command and stops after it."""
    command = list(ctx.args)
    if not command or command[0].startswith("-"):
        fail("name the command to run, e.g. pgdurable embedded run RUN_ID")
    if command[0] in ("embedded", "demo"):
        fail(f"{command[0]} starts the embedded server itself: run pgdurable {command[0]}")
    try:
        server, target = start_embedded(data_dir)
    except PgDurableError as exc:
        fail(str(exc))
    try:  # a process of its own: the command's exit code is this one's
        code = subprocess.call([sys.executable, "-m", "pgdurable", *command],
                               env={**os.environ, "PGDURABLE_DSN": target})
    finally:
        server.cleanup()
    raise typer.Exit(code)


# typer vendors click (typer._click): find its ClickException through a public class.
_CLICK_EXCEPTION: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: usage errors too are one line on stderr (exit 2)."""
    try:
        rv = app(args=argv, standalone_mode=False)
    except _CLICK_EXCEPTION as exc:
        code = int(getattr(exc, "exit_code", EXIT_BAD_INPUT))
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `pgdurable`: the help
            exc.show()  # type: ignore[attr-defined]
            sys.exit(code)
        where = getattr(getattr(exc, "ctx", None), "command_path", None) or "pgdurable"
        line = " ".join(str(exc.format_message()).split())  # type: ignore[attr-defined]
        err.print(_error_line(line, f" (see '{where} --help')"), highlight=False, soft_wrap=True)
        sys.exit(code)
    except typer.Abort:
        err.print("[bold red]error:[/] aborted", highlight=False)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


_register_fork(app)  # fork, fork-failed, rewind (pgdurable/ops/cli_fork.py)
_register_start(app)  # start TASK (pgdurable/ops/cli_start.py)

if __name__ == "__main__":  # pragma: no cover
    main()
