"""Through a real PgBouncer (Debian's package), started by each test on a free local port.

* Library connections send no startup parameter a pooler refuses; a refusal
  (here: the user's own ``options``) is an error at once that names the cause.
* Session mode: real worker processes run starts, signals, timers, claims,
  checkpoints and leases as directly, LISTEN included.
* Transaction mode (``pooler="transaction"``): no prepared statements (the
  same calls without it break, shown first); real workers through it, LISTEN on
  a direct ``listen_dsn``, or polling with a warning without one; session
  advisory locks (``PostgresDurableStore``) refused at construction.
* Each worker test SIGKILLs a worker and restarts PgBouncer mid-run; every run
  completes with exactly one checkpoint per step. A worker whose start-up
  declaration loses its connection to a restart declares again and runs.

Skipped when ``pgbouncer`` is not installed (``.ci/run`` installs it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _pgbouncer import PGBOUNCER, PgBouncer
from _waiting import WAIT_LIMIT, WORKERS_LISTENING, until_sync
from fix_fleet import Fleet, WorkerProc
from psycopg.conninfo import conninfo_to_dict

from pgdurable import (
    DatabaseUnavailable,
    Done,
    Durable,
    DurableClient,
    InvalidInput,
    PostgresDurableStore,
    PostgresLeaseProvider,
    RunContext,
)
from pgdurable.foundation.pooler import connect as pooler_connect
from pgdurable.foundation.queries.schedules import DECLARE_LOCK, DECLARE_LOCK_KEY
from pgdurable.ops.retention import prune_sync

pytestmark = [
    pytest.mark.skipif(PGBOUNCER is None, reason="pgbouncer is not installed "
                       "(apt-get install pgbouncer; .ci/run installs it)"),
    pytest.mark.crash,
]

SHOW = ("SELECT current_setting('application_name'),"
        " current_setting('idle_in_transaction_session_timeout')")

Bouncers = Callable[..., PgBouncer]


@pytest.fixture
def bouncer(pg_server: Any, tmp_path: Path) -> Iterator[Bouncers]:
    """``bouncer(mode, pool_size=20)``: a started PgBouncer, stopped after the test."""
    started: list[PgBouncer] = []

    def make(mode: str, pool_size: int = 20) -> PgBouncer:
        b = PgBouncer(pg_server, mode, tmp_path / f"pgbouncer-{len(started)}", pool_size=pool_size)
        started.append(b)
        b.start()
        return b

    yield make
    for b in started:
        b.stop()


def dbname(dsn: str) -> str:
    return str(conninfo_to_dict(dsn)["dbname"])


# -- connecting -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["session", "transaction"])
async def test_library_connections_pass_through_a_default_pgbouncer(
        dsn: str, bouncer: Bouncers, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGAPPNAME", raising=False)
    monkeypatch.delenv("PGOPTIONS", raising=False)
    b = bouncer(mode)
    pooled = b.dsn(dbname(dsn))
    pooler = "transaction" if mode == "transaction" else None
    async with Durable(pooled, pooler=pooler) as app:
        row = await app.fetchone(SHOW, ())
        assert row is not None and row[0] == "pgdurable"
        if mode == "session":
            # session settings apply as directly
            assert row[1] == "1min"
    with DurableClient(pooled, pooler=pooler) as client:
        assert client.get_run  # opened: the schema check went through PgBouncer
    with pooler_connect(pooled, pooler) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
    with PostgresLeaseProvider(pooled, prepare=False) as leases:
        assert leases.acquire_lease("k", "me", 60_000).acquired
    assert prune_sync(pooled, "1d", dry_run=True).runs == 0


async def test_a_refused_startup_parameter_fails_at_once_with_the_cause(
        dsn: str, bouncer: Bouncers) -> None:
    """The user's own ``options`` are still sent, and PgBouncer refuses them: the error
    says so at once (not a pool timeout that names no cause)."""
    b = bouncer("transaction")
    refused = b.dsn(dbname(dsn), options="-c work_mem=8MB")
    app = Durable(refused, pooler="transaction")
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match="unsupported startup parameter: options"):
        await app.open()
    print(f"refused after {time.monotonic() - started:.2f} s")
    await app.close()
    client = DurableClient(refused, pooler="transaction")
    with pytest.raises(DatabaseUnavailable, match="unsupported startup parameter: options"):
        client.open()
    client.close()


async def test_an_app_opened_while_pgbouncer_is_down_says_so_at_once(
        dsn: str, bouncer: Bouncers) -> None:
    """Nothing answering at the DSN is said at once, naming the port (issue 38: not a
    pool timeout 30 s later); the same app opens once PgBouncer is back. (A pooler that
    accepts and drops a connection while it restarts is waited for: the tests above.)"""
    b = bouncer("transaction")
    b.stop()
    app = Durable(b.dsn(dbname(dsn)), pooler="transaction")
    port = psycopg.conninfo.conninfo_to_dict(b.dsn(dbname(dsn)))["port"]
    with pytest.raises(DatabaseUnavailable, match=f"nothing answers at .*:{port}"):
        await app.open()
    await asyncio.to_thread(b.start)
    await app.open()
    assert await app.fetchone("SELECT 1", ()) == (1,)
    await app.close()


async def test_transaction_mode_needs_no_prepared_statements(dsn: str, bouncer: Bouncers) -> None:
    """Two apps share one server connection (pool_size=1). Without ``pooler=`` the second
    app's prepared statement collides with the first's; with it, none is prepared."""
    b = bouncer("transaction", pool_size=1)
    pooled = b.dsn(dbname(dsn))
    async with Durable(pooled) as one, Durable(pooled) as two:
        await one.fetchone("SELECT 1", (), prepare=True)
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
            await two.fetchone("SELECT 1", (), prepare=True)
    async with Durable(pooled, pooler="transaction") as one, \
            Durable(pooled, pooler="transaction") as two:
        for _ in range(10):
            assert await one.fetchone("SELECT 1", (), prepare=True) == (1,)
            assert await two.fetchone("SELECT 1", (), prepare=True) == (1,)


def test_lease_providers_through_transaction_mode(dsn: str, bouncer: Bouncers) -> None:
    """PostgresLeaseProvider(prepare=False): acquire, renew, transfer, release."""
    b = bouncer("transaction", pool_size=1)
    pooled = b.dsn(dbname(dsn))
    with PostgresLeaseProvider(pooled, prepare=False) as p1, \
            PostgresLeaseProvider(pooled, prepare=False) as p2:
        for i in range(10):
            key = f"k{i}"
            assert p1.acquire_lease(key, "a", 60_000).acquired
            assert not p2.acquire_lease(key, "b", 60_000).acquired
            assert p1.renew_lease(key, "a", 60_000)
            assert p1.transfer_lease(key, "a", "b", 60_000)
            assert p2.get_lease_owner(key) == "b"
            p2.release_lease(key, "b")
            assert p1.get_lease_owner(key) is None


def test_session_advisory_locks_refuse_transaction_mode(dsn: str) -> None:
    with pytest.raises(InvalidInput, match="session advisory lock"):
        PostgresDurableStore(dsn, pooler="transaction")
    PostgresDurableStore(dsn, pooler="session")  # fine, nothing opened


@pytest.mark.parametrize(("bad", "error"), [("statement", InvalidInput), ("", InvalidInput),
                                             (1, TypeError), (True, TypeError)])
def test_bad_pooler_is_refused(dsn: str, bad: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        Durable(dsn, pooler=bad)
    with pytest.raises(error):
        DurableClient(dsn, pooler=bad)
    with pytest.raises(error):
        PostgresDurableStore(dsn, pooler=bad)


def test_bad_listen_dsn_is_refused(dsn: str) -> None:
    with pytest.raises(InvalidInput):
        Durable(dsn, listen_dsn="mysql://x@y/z")
    with pytest.raises(TypeError):
        Durable(dsn, listen_dsn=5)  # type: ignore[arg-type]


async def test_streams_follow_runs_by_polling_without_a_listen_connection(
        dsn: str, bouncer: Bouncers, caplog: pytest.LogCaptureFixture) -> None:
    b = bouncer("transaction")
    app = Durable(b.dsn(dbname(dsn)), pooler="transaction")

    @app.task("emit")
    async def emit(ctx: RunContext, state: dict[str, Any]) -> Any:
        await ctx.emit({"n": 1})
        return Done({"ok": True})

    async with app:
        rid = await app.start("emit", {})
        worker = app.worker(poll_interval=0.2, lease_ttl=5.0)
        task = asyncio.create_task(worker.run())
        try:
            events = [e async for e in app.stream(rid, poll=0.2)]
        finally:
            await worker.stop()
            await task
    assert events[0].event == {"n": 1}
    assert events[-1].final
    assert "no LISTEN" in caplog.text


# -- real workers -------------------------------------------------------------------


#: The workers' options (the ``fleet`` fixture, tests/fix_fleet.py); each test gives
#: them the pooled DSN (and pooler, listen DSN) in their environment.
WORKERS = pytest.mark.fleet("_pgbouncer_app:app", ttl=2.0, poll=0.5, concurrency=8,
                            grace=10.0)


def count(conn: psycopg.Connection[Any], sql: str, *params: Any) -> int:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return int(row[0])


STEPS, N, APPROVALS, NAPS = 40, 4, 10, 5
BOTH_REGISTERED = ("SELECT count(DISTINCT worker_id) FROM pgdurable.worker_revisions "
                   "WHERE worker_id IN ('a', 'b')")


def _scenario(dsn: str, b: PgBouncer, fleet: Fleet, env: dict[str, str],
              pooler: str | None) -> list[WorkerProc]:
    """Starts, claims, checkpoints, leases, timers and signals through PgBouncer, with a
    worker SIGKILLed and PgBouncer restarted mid-run. Returns the workers (for their logs)."""
    pooled = b.dsn(dbname(dsn))
    with DurableClient(pooled, pooler=pooler) as client:
        rids = [client.start("steps", {"n": N, "sleep": 0.05}, revision="1")
                for _ in range(STEPS)]
        rids += [client.start("approve", {"ref": f"r{i}"}, revision="1")
                 for i in range(APPROVALS)]
        rids += [client.start("nap", {"seconds": 0.5}, revision="1") for _ in range(NAPS)]
    a = fleet.start("a", env=env)
    b_ = fleet.start("b", env=env)
    with psycopg.connect(dsn, autocommit=True) as c:
        until_sync(lambda: count(c, "SELECT count(*) FROM pgdurable.runs WHERE task = 'steps' "
                                 "AND status = 'completed'") >= 5, "some runs to complete")
        # both up before the restart (a worker still opening would miss it): listening,
        # or registered where they only poll
        listening = pooler != "transaction" or "PGDURABLE_LISTEN_DSN" in env
        until_sync(lambda: count(c, WORKERS_LISTENING if listening else BOTH_REGISTERED) == 2,
                   "workers a and b to be up")
        a.kill()  # SIGKILL (reaped): its leased runs are reclaimed after the TTL
        b.restart()  # every client connection of every worker is dropped
        later = fleet.start("c", env=env)
        until_sync(lambda: count(c, "SELECT count(*) FROM pgdurable.runs WHERE task = 'approve' "
                                 "AND status = 'waiting'") == APPROVALS, "approvals to park")
        with DurableClient(pooled, pooler=pooler) as client:  # signals through PgBouncer
            for i in range(APPROVALS):
                assert len(client.signal("approval", f"r{i}", {"ok": i})) == 1
        until_sync(lambda: count(c, "SELECT count(*) FROM pgdurable.runs WHERE id = ANY(%s) "
                                 "AND status = 'completed'", rids) == len(rids),
                   "every run to complete", timeout=4 * WAIT_LIMIT)
        # exactly one checkpoint per step (the primary key forbids two), none missing
        per_task = dict(c.execute(
            "SELECT r.task, count(*) FROM pgdurable.checkpoints k JOIN pgdurable.runs r "
            "ON r.id = k.run_id GROUP BY r.task").fetchall())
        assert per_task["steps"] == STEPS * N
        results = c.execute("SELECT task, result FROM pgdurable.runs WHERE id = ANY(%s)",
                            (rids,)).fetchall()
    assert sorted(r["payload"]["ok"] for t, r in results if t == "approve") == list(range(APPROVALS))
    assert all(r == {"i": N} for t, r in results if t == "steps")
    assert all(r == {"woke": "timeout"} for t, r in results if t == "nap")
    for w in (b_, later):
        assert w.terminate() == 0, w.log()
    for w in (a, b_, later):
        assert "prepared statement" not in w.log()
    return [a, b_, later]


@WORKERS
def test_workers_through_pgbouncer_session_mode(dsn: str, bouncer: Bouncers,
                                                fleet: Fleet) -> None:
    b = bouncer("session")
    env = {"PGDURABLE_DSN": b.dsn(dbname(dsn))}
    ws = _scenario(dsn, b, fleet, env, None)
    assert "reconnecting" in ws[1].log()  # its LISTEN (through PgBouncer) saw the restart


@WORKERS
def test_workers_through_pgbouncer_transaction_mode_listen_direct(
        dsn: str, bouncer: Bouncers, fleet: Fleet) -> None:
    b = bouncer("transaction", pool_size=4)
    env = {"PGDURABLE_DSN": b.dsn(dbname(dsn)), "PGDURABLE_POOLER": "transaction",
           "PGDURABLE_LISTEN_DSN": dsn}
    ws = _scenario(dsn, b, fleet, env, "transaction")
    assert "polling" not in ws[1].log()


@WORKERS
def test_workers_through_pgbouncer_transaction_mode_poll_only(
        dsn: str, bouncer: Bouncers, fleet: Fleet) -> None:
    b = bouncer("transaction", pool_size=4)
    env = {"PGDURABLE_DSN": b.dsn(dbname(dsn)), "PGDURABLE_POOLER": "transaction"}
    ws = _scenario(dsn, b, fleet, env, "transaction")
    for w in ws:
        assert "no LISTEN" in w.log()  # the warning at start


@WORKERS
def test_a_transaction_mode_worker_wakes_on_notify_through_its_direct_connection(
        dsn: str, bouncer: Bouncers, fleet: Fleet) -> None:
    """poll=3600: only a NOTIFY, received on the direct listen connection, can wake it."""
    b = bouncer("transaction", pool_size=2)
    pooled = b.dsn(dbname(dsn))
    w = fleet.start("w", env={"PGDURABLE_DSN": pooled, "PGDURABLE_POOLER": "transaction",
                              "PGDURABLE_LISTEN_DSN": dsn}, poll=3600)
    with psycopg.connect(dsn, autocommit=True) as c, \
            DurableClient(pooled, pooler="transaction") as client:
        until_sync(lambda: count(c, WORKERS_LISTENING), "the worker's listener")
        for i in range(3):  # each start after the previous run completed: the worker is idle
            rid = client.start("steps", {"n": 1}, revision="1")
            until_sync(lambda rid=rid: client.get_run(rid).status == "completed",
                       f"run {i} to be claimed on NOTIFY")
    assert w.terminate() == 0


@WORKERS
def test_a_worker_starting_through_a_pgbouncer_restart_declares_again(
        dsn: str, bouncer: Bouncers, fleet: Fleet) -> None:
    """PgBouncer restarts while a starting worker's schedule declaration is under way
    (held on the declaration's advisory lock, taken here first): the declaration is
    asked again on a new connection, and the worker goes on to run runs."""
    b = bouncer("session")
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as c:
        holder.execute(DECLARE_LOCK.sql, (DECLARE_LOCK_KEY,))  # held until holder's commit
        w = fleet.start("w", env={"PGDURABLE_DSN": b.dsn(dbname(dsn))})
        until_sync(lambda: count(c, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                "current_database() AND wait_event_type = 'Lock' "
                                "AND query LIKE 'SELECT pg_advisory_xact_lock%%'"),
                   "the worker's declaration to wait on the lock")
        b.restart()  # the declaration's connection is dropped under it
        time.sleep(0.5)
        assert w.poll() is None, w.log()
        holder.commit()
        with DurableClient(b.dsn(dbname(dsn))) as client:
            rid = client.start("steps", {"n": 2}, revision="1")
            until_sync(lambda: client.get_run(rid).status == "completed", "the run to complete")
        assert count(c, "SELECT count(*) FROM pgdurable.worker_revisions "
                     "WHERE worker_id = 'w'") > 0
    assert w.terminate() == 0, w.log()
