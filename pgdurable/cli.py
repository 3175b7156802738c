"""The ``pgdurable`` command line.

Exit codes: 0 success; 1 the command ran but found a problem (e.g. a drifted
migration in ``--status``); 2 bad input or an unusable database (one-line error
on stderr, no traceback, nothing half-applied).
"""

from __future__ import annotations

import sys
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from . import migrations
from ._db import resolve_dsn, validate_dsn
from .errors import PgDurableError

app = typer.Typer(
    name="pgdurable",
    help="Durable AI-agent runs on PostgreSQL alone.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

DsnOption = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        help="PostgreSQL conninfo or URL (default: $PGDURABLE_DSN, then $DATABASE_URL).",
        show_default=False,
    ),
]


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a one-line error and exit (2 = bad input or unusable database)."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def need_dsn(dsn: str | None) -> str:
    """The DSN from the option or the environment, validated, or exit 2."""
    resolved = resolve_dsn(dsn)
    if resolved is None:
        fail("no database given: pass --dsn or set PGDURABLE_DSN or DATABASE_URL")
    try:
        return validate_dsn(resolved)
    except (PgDurableError, TypeError) as exc:
        fail(str(exc))


@app.command()
def migrate(
    dsn: DsnOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the SQL of pending migrations; apply nothing.")] = False,
    status: Annotated[bool, typer.Option("--status", help="Show each migration's state; apply nothing.")] = False,
) -> None:
    """Apply pending schema migrations (safe to run from many processes at once)."""
    target = need_dsn(dsn)
    try:
        if status:
            states = migrations.migration_status(target)
            table = Table("version", "name", "status", "applied at")
            for s in states:
                table.add_row(
                    f"{s.migration.version:04d}",
                    s.migration.name,
                    s.status,
                    s.applied_at.isoformat(timespec="seconds") if s.applied_at else "",
                )
            out.print(table)
            if any(s.drifted for s in states):
                raise typer.Exit(1)
            return
        if dry_run:
            pending = migrations.migrate(target, dry_run=True)
            if not pending:
                out.print("-- nothing to apply", highlight=False)
            sys.stdout.write(migrations.pending_sql(pending))
            return
        applied = migrations.migrate(
            target, on_apply=lambda m: out.print(f"applied {m.name}", highlight=False)
        )
        if not applied:
            out.print(f"schema is up to date (version {migrations.required_version()})")
    except PgDurableError as exc:
        fail(str(exc))


@app.command()
def demo(
    dsn: DsnOption = None,
    data_dir: Annotated[str | None, typer.Option("--data-dir", help="Embedded server data directory.")] = None,
) -> None:
    """Start an embedded PostgreSQL (or use --dsn), migrate it and show its status."""
    from .embedded import start_embedded

    try:
        target = resolve_dsn(dsn)
        server = None
        if target is None:
            out.print("starting an embedded PostgreSQL ...")
            server, target = start_embedded(data_dir)
        applied = migrations.migrate(validate_dsn(target))
        out.print(f"migrated: {len(applied)} applied now")
        for s in migrations.migration_status(target):
            out.print(f"  {s.migration.name}: {s.status}", highlight=False)
        del server
    except PgDurableError as exc:
        fail(str(exc))


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
