"""Integration seams between features merged in parallel (workflows x the
worker's lost-connection retry, children x fenced retries, results x poolers,
the app role x workers with schedules, children, workflows and signals)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from _waiting import app_running, finished

import pgdurable
from pgdurable import WorkflowContext


@asynccontextmanager
async def _running(worker: pgdurable.Worker) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``worker`` for the block (its task, to see it fail early); stop it after."""
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        await worker.stop(grace=2)
        await task


def _names(dsn: str, rid: str) -> list[str]:
    with psycopg.connect(dsn) as c:
        rows = c.execute(
            "SELECT state->'workflow'->>'name' FROM pgdurable.checkpoints "
            "WHERE run_id = %s ORDER BY step", (rid,)).fetchall()
    return [r[0] for r in rows]


async def test_workflow_lost_connection_after_a_checkpoint_resumes_from_it(dsn: str) -> None:
    """A workflow whose code hits a lost connection after recording steps is run
    again by the worker from its history: the recorded steps are not executed
    again and the history is not taken for corrupt (the worker's step counter
    follows the workflow's own checkpoints)."""
    app = pgdurable.Durable(dsn)
    calls: dict[str, int] = {}
    lost = {"n": 0}

    def tool(name: str) -> str:
        calls[name] = calls.get(name, 0) + 1
        return name

    @app.workflow("lc", revision="1")
    async def lc(ctx: WorkflowContext, _: Any) -> list[str]:
        a = await ctx.step("a", tool, "a")
        if not ctx.replaying and lost["n"] == 0:
            lost["n"] += 1  # the database went away under the code (not a step failure)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        b = await ctx.step("b", tool, "b")
        return [a, b]

    async with app, app_running(app):
        rid = await app.start("lc", None)
        info = await finished(app, rid)
    assert info.status == "completed", info.error
    assert info.result == ["a", "b"]
    assert calls == {"a": 1, "b": 1}
    assert lost["n"] == 1
    assert _names(dsn, rid) == ["a", "b", "return"]
    assert info.attempts == 0


async def test_app_role_runs_a_worker_with_a_schedule_a_workflow_a_child_and_a_signal(
        dsn: str) -> None:
    """The app role (EXECUTE + SELECT, `pgdurable grant`) is enough for a worker
    that declares and ticks a schedule, runs a workflow that starts a child and
    waits for a signal, and for the operator calls on schedules and pubsub."""
    from datetime import timedelta

    from _waiting import until
    from test_security_boundary import _as, _grant, roles

    from pgdurable.runs.schedules import list_schedules, pause_schedule, resume_schedule

    with roles(dsn, "NOLOGIN", "LOGIN", "LOGIN") as (owner, app_role, ro):
        _grant(dsn, owner, app_role, ro)
        app = pgdurable.Durable(_as(dsn, app_role))

        @app.task("kid")
        async def kid(ctx: pgdurable.RunContext, state: Any) -> pgdurable.Done:
            return pgdurable.Done(f"kid:{state}")

        @app.workflow("parent", revision="1")
        async def parent(ctx: WorkflowContext, state: Any) -> dict[str, Any]:
            child = await ctx.start_child("kid", "x")
            [out] = await ctx.gather([child])
            go = await ctx.wait_signal("go", ctx.run_id, timeout=timedelta(hours=1))
            return {"child": out["result"], "go": go}

        app.schedule("every-second", every=timedelta(seconds=1), task="parent")
        try:
            async with app, _running(app.worker(poll_interval=0.2)) as run_task:
                fired: list[str] = []

                async def ticked() -> bool:
                    if run_task.done():
                        run_task.result()  # the worker's own error, not a timeout
                    for s in await list_schedules(app, "every-second"):
                        if s.last_run_id is not None:
                            fired.append(str(s.last_run_id))
                    return bool(fired)

                await until(ticked, "the schedule to tick")
                assert await pause_schedule(app, "every-second")
                rid = fired[0]

                async def parked_on_signal() -> bool:
                    info = await app.get_run(rid)
                    return info.status == "waiting" and info.wait_kind == "go"

                await until(parked_on_signal, "the workflow to wait for its signal")
                await app.signal("go", rid, {"ok": True})
                info = await finished(app, rid)
                assert await resume_schedule(app, "every-second")
                assert await pause_schedule(app, "every-second")
            assert info.status == "completed", info.error
            assert info.result == {"child": "kid:x", "go": {"ok": True}}
            with psycopg.connect(_as(dsn, app_role), autocommit=True) as c:
                assert c.execute("SELECT pgdurable.pubsub_publish('t', ARRAY['{\"a\":1}'::json])"
                                 ).fetchone() is not None
                rows = c.execute("SELECT * FROM pgdurable.pubsub_read('t', -1, 10)").fetchall()
                assert len(rows) == 1
        finally:
            await app.close()


async def _cancel_blocked(dsn: str, needle: str) -> None:
    """pg_cancel_backend the backend of this database that waits on a lock in
    a statement containing ``needle`` (once it is there)."""
    from _waiting import until

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        async def cancelled() -> bool:
            cur = await c.execute(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND wait_event_type = 'Lock' AND query LIKE %s", (f"%{needle}%",))
            return any(r[0] for r in await cur.fetchall())

        await until(cancelled, f"a statement with {needle} waiting on a lock")


async def test_park_on_children_is_sent_again_after_a_transient_error(dsn: str) -> None:
    """The fenced park on children is retried over a transient error (here a
    cancelled statement, SQLSTATE 57014) like the other parks: the run parks,
    its lease is not left to lapse and its step does not run a second time."""
    from datetime import timedelta

    from _waiting import until

    app = pgdurable.Durable(dsn)
    ran = {"parent": 0}
    blocker: list[asyncio.Task[None]] = []

    @app.task("kid")
    async def kid(ctx: pgdurable.RunContext, state: Any) -> Any:
        if ctx.step == 0:
            return pgdurable.Wait(signal=("go", ctx.run_id), timeout=timedelta(hours=1))
        return pgdurable.Done("kid done")

    @app.task("parent")
    async def parent(ctx: pgdurable.RunContext, state: Any) -> Any:
        if ctx.step == 1:
            return pgdurable.Done(ctx.wake)
        ran["parent"] += 1
        cid = await ctx.start_child("kid", None, key="k")
        if ran["parent"] == 1:
            # hold the parent's row: the park on the child waits for it, and is cancelled
            lock = await psycopg.AsyncConnection.connect(dsn)
            await lock.execute("SELECT 1 FROM pgdurable.runs WHERE id = %s FOR UPDATE",
                               (ctx.run_id,))

            async def cancel_then_unlock() -> None:
                try:
                    await _cancel_blocked(dsn, "park_children")
                finally:
                    await lock.rollback()
                    await lock.close()

            blocker.append(asyncio.create_task(cancel_then_unlock()))
        return pgdurable.Wait.children([cid], state={"kid": cid})

    async with app, app_running(app):
        rid = await app.start("parent", None)

        async def parked() -> bool:
            info = await app.get_run(rid)
            return info.status == "waiting" and info.wait_kind == "children"

        await until(parked, "the parent to park on its child")
        await blocker[0]
        kid_id = (await app.get_run(rid)).state["kid"]
        await app.signal("go", kid_id, None)
        info = await finished(app, rid)
    assert info.status == "completed", info.error
    assert ran["parent"] == 1


def _fail_first_release(dsn: str) -> None:
    """A trigger that fails the first release of a run (leased -> runnable) with
    a serialization failure (SQLSTATE 40001: transient, nothing committed)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE SEQUENCE public.release_tries")
        c.execute("""
            CREATE FUNCTION pgdurable.test_fail_first_release() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
              IF OLD.status = 'leased' AND NEW.status = 'runnable'
                 AND pg_catalog.nextval('public.release_tries') = 1 THEN
                RAISE EXCEPTION 'injected' USING ERRCODE = '40001';
              END IF;
              RETURN NEW;
            END $$""")
        c.execute("CREATE TRIGGER fail_first_release BEFORE UPDATE ON pgdurable.runs "
                  "FOR EACH ROW EXECUTE FUNCTION pgdurable.test_fail_first_release()")


async def test_workflow_release_at_the_lease_window_is_retried_not_an_attempt(dsn: str) -> None:
    """A workflow gives its run back at a step boundary once the lease window is
    used up; a transient error of that release is retried under the lease like
    the worker's other fenced writes, not recorded as a failed attempt."""
    _fail_first_release(dsn)
    app = pgdurable.Durable(dsn)
    calls: list[int] = []

    @app.workflow("windowed", revision="1")
    async def windowed(ctx: WorkflowContext, n: int) -> int:
        total = 0
        for i in range(n):
            total += await ctx.step(f"s{i}", lambda i=i: calls.append(i) or i)
        return total

    async with app, app_running(app, lease_window=0.001):
        info = await finished(app, await app.start("windowed", 2))
    assert info.status == "completed", info.error
    assert info.result == 1
    assert calls == [0, 1]
    assert info.attempts == 0
    with psycopg.connect(dsn) as c:
        tries = c.execute("SELECT last_value FROM public.release_tries").fetchone()
    assert tries is not None and tries[0] >= 2  # the injected failure happened


def test_sync_result_listens_on_no_pooled_server_connection(
        dsn: str, tmp_path: Any, pg_server: Any) -> None:
    """DurableClient.result behind a transaction pooler: its LISTEN must not go
    through the pooler (the server connection is shared: the LISTEN would stay
    on it for other clients, and no notification reaches the waiter); it reads
    through the pooler without prepared statements and LISTENs on the listen DSN."""
    import pytest
    from _pgbouncer import PGBOUNCER, PgBouncer
    from psycopg.conninfo import conninfo_to_dict

    if PGBOUNCER is None:
        pytest.skip("pgbouncer is not installed")
    b = PgBouncer(pg_server, "transaction", tmp_path / "pgbouncer", pool_size=1)
    b.start()
    try:
        pooled = b.dsn(str(conninfo_to_dict(dsn)["dbname"]))
        app = pgdurable.Durable(pooled, pooler="transaction")

        @app.task("never")
        async def never(ctx: pgdurable.RunContext, state: Any) -> Any:
            return pgdurable.Done(None)

        with pgdurable.DurableClient(app=app) as client:
            rid = client.start("never", None)
            with pytest.raises(pgdurable.ResultTimeout):
                client.result(rid, timeout=0)
        with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as c:
            channels = c.execute("SELECT pg_catalog.pg_listening_channels()").fetchall()
        assert channels == []  # the one server connection LISTENs on nothing
    finally:
        b.stop()


def test_lease_provider_pools_keep_the_dsns_connect_timeout(dsn: str) -> None:
    """Like the app's and the client's pools: the library's 10 s connect timeout
    only when the DSN (or PGCONNECT_TIMEOUT) sets none (pool kwargs override the DSN)."""
    from psycopg.conninfo import make_conninfo

    own = make_conninfo(dsn, connect_timeout="3")
    for cls in (pgdurable.PostgresLeaseProvider, pgdurable.AsyncPostgresLeaseProvider):
        assert cls(dsn)._pool.kwargs["connect_timeout"] == 10
        assert "connect_timeout" not in cls(own)._pool.kwargs  # the DSN's own wins


def _half_server() -> tuple[Any, str]:
    """A TCP server that completes a PostgreSQL startup (no password) and then
    closes the connection at the first query: a pooler restarting under a
    connection that had just been accepted. Returns (socket, dsn)."""
    import socket
    import struct
    import threading

    def handle(c: socket.socket) -> None:
        with c:
            n = struct.unpack("!I", c.recv(4))[0]
            body = c.recv(n - 4)
            if struct.unpack("!I", body[:4])[0] == 80877103:  # SSLRequest: no
                c.sendall(b"N")
                n = struct.unpack("!I", c.recv(4))[0]
                c.recv(n - 4)
            c.sendall(b"R" + struct.pack("!II", 8, 0))  # AuthenticationOk
            for k, v in ((b"server_version", b"16.0"), (b"client_encoding", b"UTF8")):
                p = k + b"\0" + v + b"\0"
                c.sendall(b"S" + struct.pack("!I", 4 + len(p)) + p)
            c.sendall(b"Z" + struct.pack("!I", 5) + b"I")  # ReadyForQuery
            c.recv(1000)  # the first query; then gone

    def serve(s: socket.socket) -> None:
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(c,), daemon=True).start()

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    threading.Thread(target=serve, args=(s,), daemon=True).start()
    return s, f"host=127.0.0.1 port={s.getsockname()[1]} dbname=x user=x sslmode=disable"


async def test_a_connection_lost_during_setup_is_unavailable_not_a_crash() -> None:
    """A connection lost while the library sets it up (SESSION_SETUP) is
    DatabaseUnavailable like a failed connect, and the start-up probe lets the
    pool wait for the server (a worker started while PgBouncer restarts)."""
    import pytest

    from pgdurable.foundation.errors import DatabaseUnavailable
    from pgdurable.foundation.pooler import aconnect, aprobe, connect, probe

    s, half = _half_server()
    try:
        with pytest.raises(DatabaseUnavailable):
            connect(half)
        with pytest.raises(DatabaseUnavailable):
            await aconnect(half)
        probe(half)  # nothing refused: returns
        await aprobe(half)
    finally:
        s.close()
