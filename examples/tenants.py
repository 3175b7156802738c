"""Two tenants in one database, a schema each: neither's worker touches the other's runs.

Run with any database (it needs no `pgdurable` schema; it migrates its own two):
    PGDURABLE_DSN=postgresql://... python examples/tenants.py

The same from a shell: `pgdurable --schema tenant_acme migrate`, then
`pgdurable --schema tenant_acme worker myapp:app` (docs/schemas.md).
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

import pgdurable
from pgdurable import Done, RunContext, Wait

DSN = pgdurable.resolve_dsn()
TENANTS = ("example_tenant_acme", "example_tenant_globex")


def tenant_app(schema: str) -> pgdurable.Durable:
    app = pgdurable.Durable(DSN, schema=schema)

    @app.task("review", revision="1")
    async def review(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.wake is None:  # first step: wait for a human's approval
            return Wait(("approval", state["doc"]), timeout=3600)
        return Done({"tenant": schema, "doc": state["doc"], "approved": ctx.wake["payload"]})

    return app


async def main() -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        existed = {s for (s,) in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", (list(TENANTS),))}
    for schema in TENANTS:
        pgdurable.migrate(DSN, schema=schema)  # `pgdurable --schema NAME migrate`
    acme, globex = (tenant_app(s) for s in TENANTS)
    try:
        async with acme, globex:
            # the same document name in both tenants: two runs that never meet
            a = await acme.start("review", {"doc": "q3-report"})
            g = await globex.start("review", {"doc": "q3-report"})
            worker = acme.worker(poll_interval=30)  # acme's worker only
            running = asyncio.create_task(worker.run())
            # a signal sent before the run parks is kept until it waits for it
            await acme.signal("approval", "q3-report", "yes, ship it")
            print("acme:", await acme.result(a, timeout=30))
            run = await globex.get_run(g)
            print(f"globex: {run.status} (attempts {run.attempts}): acme's worker never saw it")
            assert run.status == "runnable" and run.attempts == 0
            await worker.stop()
            await running
            await globex.cancel(g)
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            for schema in TENANTS:
                if schema not in existed:  # leave the database as it was
                    conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    if DSN is None:
        raise SystemExit("set PGDURABLE_DSN to a PostgreSQL database")
    asyncio.run(main())
