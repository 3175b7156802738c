"""Failover: a primary stopped with ``-m immediate`` mid-load, its standby promoted.

Each test starts its own pair of PostgreSQL instances (tests/_failover_cluster.py:
initdb, ``pg_basebackup -R``, ``synchronous_standby_names`` for the sync mode),
migrates a database on the primary, and runs real worker processes (the
``fleet`` fixture) of tests/_failover_app.py on the multi-host DSN
``host=a,b port=P,S target_session_attrs=read-write``. The test process is
the client: it starts multi-step runs, signals each one (before or after it
parks), and awaits results through ``app.result()``, while the replication link
stalls (SIGSTOP of the primary's WAL sender: commits in flight), the primary is
stopped (``pg_ctl stop -m immediate``, the stalled sender killed) and the standby
promoted. The workers, the notifier, the ``result()`` waiters and the dashboard
are not restarted: they must find the new primary by themselves.

* **synchronous** replication: no commit is acknowledged while the link is
  stalled; every acknowledged start, signal and checkpoint is on the new
  primary; every run completes with the path of its steps accepted exactly
  once; no acknowledged checkpoint is executed again (a step runs again only
  if its own write was not acknowledged: the at-least-once-per-step
  guarantee of fenced writes).
* **asynchronous** replication: what was lost is counted (starts, signals,
  checkpoints acknowledged but missing on the new primary) and printed. The
  accounting must be consistent: the starts the primary acknowledged after
  the link stalled are lost, everything lost was acknowledged at a WAL
  position past what the standby had received (the window of asynchronous
  replication), and every run the new primary has completes with each step
  accepted once (lost signals are sent again, as an application would).
* The recovery time, from the stop to the first claim on the new primary
  (the least ``leased_at`` after the promotion began, on the new primary's
  clock: the same machine; an upper bound), is printed with its ratio to the
  lease TTL (benchmarks/failover.py measures it without the stall).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
from _dashboard_server import serving
from _failover_cluster import Pair, binaries, lsn, start_pair
from _waiting import WAIT_LIMIT
from fix_fleet import Fleet

import pgdurable
from pgdurable.ops.dashboard import create_app

T = TypeVar("T")
TTL = 4.0
RUNS = 24
STEPS = 8
WAIT_AT = 3

BINDIR = binaries()
pytestmark = [
    pytest.mark.skipif(isinstance(BINDIR, str), reason=f"no PostgreSQL server binaries: {BINDIR}"),
    pytest.mark.fleet("_failover_app:app", ttl=TTL, concurrency=4, poll=2.0),
    pytest.mark.crash,  # a server is stopped -m immediate
]


@pytest.fixture(params=["sync", "async"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Pair]:
    assert isinstance(BINDIR, Path)
    p = start_pair(synchronous=request.param == "sync", bindir=BINDIR)
    try:
        with psycopg.connect(p.primary.dsn, autocommit=True) as c:
            c.execute("CREATE DATABASE app")
        pgdurable.migrate(p.dsn_for("app"))
        yield p
    finally:
        p.close()


@pytest.fixture
def dsn(cluster: Pair) -> str:
    """The fleet's DSN: the pair's multi-host DSN (overrides tests/conftest.py's)."""
    return cluster.dsn_for("app")


@dataclass
class Ack:
    """One call the client was told committed: when it began and was answered
    (time.time()), and an upper bound of its commit's WAL position
    (``pg_current_wal_lsn()`` read after the answer; None if that read failed)."""

    began: float
    answered: float
    lsn: int | None


@dataclass
class Ledger:
    """The client's acknowledged starts and signals, by run id."""

    started: dict[str, Ack] = field(default_factory=dict)
    signalled: dict[str, Ack] = field(default_factory=dict)
    retries: int = 0


@dataclass
class Note:
    at: float
    run: str
    i: int
    token: int


def notes(log_dir: Path) -> list[Note]:
    """Every step start the workers noted, in time order (one machine, one clock)."""
    out = []
    for f in log_dir.glob("steps-*.txt"):
        for line in f.read_text().splitlines():
            t, rid, i, token, _pid = line.split()
            out.append(Note(float(t), rid, int(i), int(token)))
    return sorted(out, key=lambda n: n.at)


async def _acked(app: pgdurable.Durable, ledger: Ledger,
                 op: Callable[[], Awaitable[T]]) -> tuple[T, Ack]:
    """``await op()`` until it answers (a retry of a call that committed is a
    no-op: same idempotency key or signal id), with its :class:`Ack`."""
    while True:
        began = time.time()
        try:
            value = await op()
            break
        except pgdurable.DatabaseUnavailable:
            ledger.retries += 1
            await asyncio.sleep(0.1)
    answered = time.time()
    try:
        row = await app.fetchone("SELECT pg_current_wal_lsn()::text", ())
    except pgdurable.DatabaseUnavailable:
        return value, Ack(began, answered, None)
    assert row is not None
    return value, Ack(began, answered, lsn(row[0]))


async def _client(app: pgdurable.Durable, ledger: Ledger, failover_at: asyncio.Event) -> None:
    """Start RUNS runs and signal each one (before or after it parks)."""
    for k in range(RUNS):
        if k == RUNS // 2:
            failover_at.set()
        state = {"n": STEPS, "wait_at": WAIT_AT, "sleep": 0.05}
        rid, ack = await _acked(app, ledger, partial(
            app.start, "chain", state, idempotency_key=f"run-{k}", revision="1"))
        ledger.started[rid] = ack
        _, ledger.signalled[rid] = await _acked(app, ledger, partial(
            app.signal, "go", rid, {"k": k}, signal_id=f"go-{rid}"))
        await asyncio.sleep(0.05)


def test_failover(cluster: Pair, fleet: Fleet, tmp_path: Path) -> None:
    workers = [fleet.start(n, env={"FAILOVER_LOG": str(tmp_path / f"steps-{n}.txt")})
               for n in ("a", "b")]
    fleet.ready(*workers)
    with serving(create_app(cluster.dsn_for("app"))) as board:
        asyncio.run(_scenario(cluster, tmp_path, board))
    assert all(w.poll() is None for w in workers), "a worker exited"
    fleet.ready(*workers)  # their LISTEN connections (notifiers) are on the new primary


async def _page(board: str, path: str) -> str:
    async with httpx.AsyncClient(base_url=board, timeout=WAIT_LIMIT) as http:
        r = await http.get(path)
        assert r.status_code == 200, r.text
        return r.text


async def _scenario(cluster: Pair, tmp_path: Path, board: str) -> None:
    sync = cluster.synchronous
    app = pgdurable.Durable(cluster.dsn_for("app"))
    ledger = Ledger()
    failover_at = asyncio.Event()
    async with app:
        client = asyncio.create_task(_client(app, ledger, failover_at))
        await asyncio.wait([client, asyncio.create_task(failover_at.wait())],
                           timeout=WAIT_LIMIT, return_when=asyncio.FIRST_COMPLETED)
        if client.done():
            client.result()  # its error
        assert failover_at.is_set()
        before = list(ledger.started)
        assert before[0][:8] in await _page(board, "/runs")
        # a run that waits for a signal sent after the failover, awaited by the sync
        # client in a thread (its own connection, which the failover breaks)
        held = await app.start("chain", {"n": 3, "wait_at": 1}, revision="1",
                               idempotency_key="held")
        standby = cluster.standby.dsn.replace("dbname=postgres", "dbname=app")
        await _until_on(standby, "SELECT count(*) FROM pgdurable.runs WHERE id = %s "
                        "AND status = 'waiting'", held)  # parked, and replicated
        sync_client = pgdurable.DurableClient(cluster.dsn_for("app"))
        sync_waiter = asyncio.create_task(
            asyncio.to_thread(sync_client.result, held, WAIT_LIMIT * 2))
        # result() waiters of the runs started so far, awaiting across the failover
        waiters = {rid: asyncio.create_task(app.result(rid, timeout=WAIT_LIMIT * 2))
                   for rid in before}

        # the replication link stalls; then the primary dies under load
        frozen = await asyncio.to_thread(cluster.freeze_replication)
        frozen_at = time.time()
        if sync:  # commits wait for the standby: until one does
            await _until_primary(cluster, "SELECT count(*) FROM pg_stat_activity "
                                 "WHERE wait_event = 'SyncRep'")
        else:  # commits go on: until two more starts were acknowledged by the primary alone
            n = len(ledger.started)
            await _until(lambda: len(ledger.started) >= n + 2)
        stopped = time.time()
        await asyncio.to_thread(cluster.crash_primary, frozen)
        switch = await asyncio.to_thread(cluster.received)
        promoting = time.time()
        await asyncio.to_thread(cluster.standby.promote)
        promoted = time.time() - stopped
        await asyncio.wait_for(client, WAIT_LIMIT * 2)

        # what the new primary has of what the client was told committed
        present = {r[0] for r in await app.fetchall("SELECT id::text FROM pgdurable.runs", ())}
        signals = {r[0] for r in await app.fetchall(
            "SELECT signal_id FROM pgdurable.signals WHERE kind = 'go' AND signal_id IS NOT NULL",
            ())}
        lost_starts = {rid for rid in ledger.started if rid not in present}
        lost_signals = {rid for rid in ledger.signalled if f"go-{rid}" not in signals}
        for rid in lost_signals - lost_starts:  # what an application does after a
            await app.signal("go", rid, {"again": True}, signal_id=f"go-{rid}")  # failover
        for rid in ledger.started:
            if rid not in waiters and rid not in lost_starts:
                waiters[rid] = asyncio.create_task(app.result(rid, timeout=WAIT_LIMIT * 2))
        results: dict[str, Any] = {}
        for rid, w in waiters.items():
            try:
                results[rid] = await w
            except pgdurable.RunNotFound:
                assert rid in lost_starts, rid
        assert not sync_waiter.done()
        await app.signal("go", held, {}, signal_id="go-held")
        assert await sync_waiter == {"path": [0, 1, 2]}, "the sync client's result()"
        sync_client.close()
        last = [rid for rid in ledger.started if rid not in lost_starts][-1]
        assert last[:8] in await _page(board, "/runs"), "the dashboard follows the new primary"
        # the first claim on the new primary: no earlier than the promotion began
        # (an upper bound: a run claimed again since shows its later claim)
        first = await app.fetchone(
            "SELECT extract(epoch FROM min(leased_at))::float8 FROM pgdurable.runs "
            "WHERE leased_at > to_timestamp(%s)", (promoting,))
    assert first is not None and first[0] is not None
    recovery = first[0] - stopped

    # every run the new primary has completed, each step accepted once, none skipped
    for rid in ledger.started:
        if rid not in lost_starts:
            assert results[rid] == {"path": list(range(STEPS))}, (rid, results[rid])
    # checkpoints: a step started with i accepted steps proves checkpoint i-1 was
    # acknowledged; a later start of the same run with fewer lost some
    seen: dict[str, int] = {}
    lost_checkpoints = rerun = 0
    for n in notes(tmp_path):
        prev = seen.get(n.run, -1)
        if n.i < prev:
            lost_checkpoints += prev - n.i
        elif n.i == prev:
            rerun += 1  # its write was not acknowledged: at least once per step
        seen[n.run] = n.i
    # acknowledged by the primary alone (asynchronous): begun after the link
    # stalled, answered before the stop
    alone = {rid for rid, a in ledger.started.items() if frozen_at < a.began and a.answered < stopped}
    print(f"\nfailover ({'sync' if sync else 'async'}): link stalled {stopped - frozen_at:.2f} s "
          f"before the stop; promoted {promoted:.2f} s after the stop; first claim on the new "
          f"primary {recovery:.2f} s after the stop = {recovery / TTL:.2f} x lease TTL "
          f"({TTL:.0f} s); client retries {ledger.retries}; acknowledged "
          f"{len(ledger.started)} starts, {len(ledger.signalled)} signals "
          f"({len(alone)} starts by the primary alone); lost: {len(lost_starts)} starts, "
          f"{len(lost_signals)} signals, {lost_checkpoints} checkpoints; steps run again "
          f"(their write unacknowledged) {rerun}")
    if sync:
        assert not alone, "a synchronous commit was acknowledged without the standby"
        assert not lost_starts and not lost_signals and lost_checkpoints == 0
    else:
        assert alone and alone <= lost_starts, "what only the primary had is lost"
    # what was lost was acknowledged after the last WAL the standby had received
    for rid in lost_starts:
        at = ledger.started[rid].lsn
        assert at is None or at > switch, (rid, at, switch)
    for rid in lost_signals:
        at = ledger.signalled[rid].lsn
        assert at is None or at > switch, (rid, at, switch)


async def _until(pred: Callable[[], bool]) -> None:
    end = time.monotonic() + WAIT_LIMIT
    while not pred():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.01)


async def _until_primary(cluster: Pair, query: str) -> None:
    await _until_on(cluster.primary.dsn, query)


async def _until_on(dsn: str, query: str, *params: Any) -> None:
    """Until ``query`` answers a true first column on the server of ``dsn``."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        end = time.monotonic() + WAIT_LIMIT
        while True:
            row = await (await c.execute(query, params)).fetchone()
            if row is not None and row[0]:
                return
            assert time.monotonic() < end, f"timed out: {query}"
            await asyncio.sleep(0.01)
