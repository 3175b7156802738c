"""Failover: one DSN for a primary and its standby, and what a read-only server says.

Run it on a migrated database (`pgdurable migrate` first):
    PGDURABLE_DSN=postgresql://... python examples/failover.py

In production the DSN lists the primary and its standby and asks for the one
that takes writes; after a promotion every new connection (the workers' pools,
their LISTEN, `result()` waiters, the dashboard) finds the new primary by itself:

    host=db-a,db-b port=5432,5432 dbname=app target_session_attrs=read-write

Here the one server is listed twice, which is the same DSN form. Then the
database is made read-only, as an old primary that comes back as a standby is:
a write through a DSN that names only it is `pgdurable.ReadOnlyDatabase` (SQLSTATE
25006), said at once, nothing written; a worker stops on it instead of retrying
forever. See docs/scaling.md, "Failover to a standby".
"""

import asyncio
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgdurable
from pgdurable import Done, RunContext

DSN = pgdurable.resolve_dsn() or ""
params = conninfo_to_dict(DSN)
host, port = params.get("host") or "localhost", str(params.get("port") or 5432)
BOTH = make_conninfo(DSN, host=f"{host},{host}", port=f"{port},{port}",
                     target_session_attrs="read-write")

app = pgdurable.Durable(BOTH)


@app.task("hello", revision="1")
async def hello(ctx: RunContext, state: dict[str, Any]) -> Done:
    return Done({"hello": state["name"]})


async def main() -> None:
    async with app:
        worker = app.worker(concurrency=2)
        running = asyncio.create_task(worker.run())
        run_id = await app.start("hello", {"name": "standby"})
        print(await app.result(run_id, timeout=60))
        await worker.stop(grace=5)
        await running

    # the database turns read-only (new sessions), as an old primary back as a standby
    dbname = params.get("dbname") or "postgres"
    with psycopg.connect(DSN, autocommit=True) as c:
        c.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on')
    try:
        async with pgdurable.Durable(DSN) as only_that_server:
            try:
                await only_that_server.start("hello", {"name": "x"}, revision="1")
            except pgdurable.ReadOnlyDatabase as exc:
                print("refused:", str(exc).split(" (")[0])
    finally:
        with psycopg.connect(DSN, autocommit=True) as c:
            c.execute("SET default_transaction_read_only = off")
            c.execute(f'ALTER DATABASE "{dbname}" RESET default_transaction_read_only')


if __name__ == "__main__":
    asyncio.run(main())
