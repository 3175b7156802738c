"""``pgdurable.foundation.notifications.receive``: a LISTEN connection read with one reader per window.

Real connections: the NOTIFYs come from another connection, the loss is a
``pg_terminate_backend`` of the listening backend.

* every notification of the window reaches the connection's notify handlers,
  in order, and is counted; a quiet window returns 0 after its seconds;
* notifications that arrive while a statement runs on the connection (which
  psycopg reads itself), or between two windows, are not lost;
* a lost connection ends the window at once with ``psycopg.OperationalError``;
  a handler that raises ends it with that error, and the connection stays usable;
* the notifier (what result waiters and streams subscribe to) and the
  dashboard's broadcaster keep a notification that arrives while the notifier
  renews its presence (a statement on the listening connection, held here on
  the presence row's lock);
* a worker whose listener hears a stream of wake-ups runs every run, and a
  cancel NOTIFY still stops a running step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from _waiting import until, worker_listening

from pgdurable import Continue, Done, Durable, RunContext
from pgdurable.foundation import presence
from pgdurable.foundation.notifications import receive
from pgdurable.foundation.notifier import Notifier
from pgdurable.ops.dashboard import _live


async def _listening(dsn: str, heard: list[tuple[str, str]]) -> psycopg.AsyncConnection[Any]:
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    conn.add_notify_handler(lambda n: heard.append((n.channel, n.payload)))
    await conn.execute("LISTEN chan")
    return conn


async def test_a_window_hands_every_notification_to_the_handlers(dsn: str) -> None:
    heard: list[tuple[str, str]] = []
    conn = await _listening(dsn, heard)
    async with conn, await psycopg.AsyncConnection.connect(dsn, autocommit=True) as sender:

        async def send() -> None:
            for i in range(50):
                await sender.execute("SELECT pg_notify('chan', %s)", (str(i),))
                if i % 10 == 0:
                    await asyncio.sleep(0.01)  # some arrive alone, some together

        task = asyncio.create_task(send())
        got = await receive(conn, 1.0)
        await task
        got += await receive(conn, 0.2)  # any that came after the first window
    assert heard == [("chan", str(i)) for i in range(50)]
    assert got == 50


async def test_a_quiet_window_returns_0_after_its_seconds(dsn: str) -> None:
    heard: list[tuple[str, str]] = []
    conn = await _listening(dsn, heard)
    async with conn:
        t = time.monotonic()
        assert await receive(conn, 0.3) == 0
        assert time.monotonic() - t >= 0.29  # (the loop may fire a timer a tick early)
        # the connection is still usable afterwards (the worker's health check)
        assert (await (await conn.execute("SELECT 1")).fetchone()) == (1,)
    assert heard == []


async def test_notifications_during_a_statement_or_between_windows_are_kept(dsn: str) -> None:
    heard: list[tuple[str, str]] = []
    conn = await _listening(dsn, heard)
    async with conn, await psycopg.AsyncConnection.connect(dsn, autocommit=True) as sender:
        # arrives while the listening connection runs a statement: psycopg reads it
        slow = asyncio.create_task(conn.execute("SELECT pg_sleep(0.3)"))
        await asyncio.sleep(0.1)
        await sender.execute("NOTIFY chan, 'during'")
        await slow
        # arrives between two windows: waits in the socket for the next one
        await sender.execute("NOTIFY chan, 'between'")
        await asyncio.sleep(0.1)
        assert await receive(conn, 0.2) >= 1
    assert heard == [("chan", "during"), ("chan", "between")]


async def test_a_lost_connection_ends_the_window_at_once(dsn: str) -> None:
    heard: list[tuple[str, str]] = []
    conn = await _listening(dsn, heard)
    async with conn, await psycopg.AsyncConnection.connect(dsn, autocommit=True) as killer:
        pid = conn.info.backend_pid

        async def kill() -> None:
            await asyncio.sleep(0.2)
            await killer.execute("SELECT pg_terminate_backend(%s)", (pid,))

        task = asyncio.create_task(kill())
        t = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            await receive(conn, 30.0)
        assert time.monotonic() - t < 10.0  # not the window's 30 s
        await task


async def test_a_handler_that_raises_ends_the_window_with_its_error(dsn: str) -> None:
    def bad(n: psycopg.Notify) -> None:
        raise ValueError(f"bad payload {n.payload}")

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    async with conn, await psycopg.AsyncConnection.connect(dsn, autocommit=True) as sender:
        conn.add_notify_handler(bad)
        await conn.execute("LISTEN chan")

        async def send() -> None:
            await asyncio.sleep(0.2)
            await sender.execute("NOTIFY chan, 'x'")

        task = asyncio.create_task(send())
        t = time.monotonic()
        with pytest.raises(ValueError, match="bad payload x"):
            await receive(conn, 30.0)
        assert time.monotonic() - t < 10.0  # not the window's 30 s
        await task
        # the window let go of the socket and of the connection's lock
        assert not asyncio.get_running_loop().remove_reader(conn.pgconn.socket)
        assert not conn.lock.locked()
        conn.remove_notify_handler(bad)
        heard: list[str] = []
        conn.add_notify_handler(lambda n: heard.append(n.payload))
        assert (await (await conn.execute("SELECT 1")).fetchone()) == (1,)
        await sender.execute("NOTIFY chan, 'y'")
        assert await receive(conn, 0.3) == 1
    assert heard == ["y"]


RENEWAL_WAITING = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                   "AND wait_event_type = 'Lock' AND query LIKE '%listen_presence%' "
                   "AND pid <> pg_backend_pid()")


@pytest.fixture
def renewing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Listeners renew their presence ten times a second, and an announcement lasts
    2 s: a renewal writes the presence row about every second."""
    monkeypatch.setattr(presence, "TTL", 2)
    monkeypatch.setattr(presence, "RENEW", 0.1)


@asynccontextmanager
async def _renewal_held(dsn: str) -> AsyncIterator[None]:
    """For the block, a listener's renewal of its presence (see ``renewing``) is a
    statement held on the lock of the ``pgdurable_done`` presence row."""
    async with await psycopg.AsyncConnection.connect(dsn) as locker, \
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watcher:
        try:
            await locker.execute("SELECT 1 FROM pgdurable.listeners "
                                 "WHERE channel = 'pgdurable_done' FOR UPDATE")

            async def waiting() -> bool:
                row = await (await watcher.execute(RENEWAL_WAITING)).fetchone()
                return bool(row and row[0])

            await until(waiting, "the listener's renewal to wait on the presence row")
            yield
        finally:
            await locker.rollback()


async def test_the_notifier_keeps_a_notification_heard_while_it_announces(
        dsn: str, renewing: None) -> None:
    """result() waiters on pgdurable_done: a run's end notified while the notifier's
    connection runs its renewal is read by psycopg during that statement; the
    notifier's notify handler must still wake the run's subscribers."""
    notifier = Notifier(dsn)
    ev, other = asyncio.Event(), asyncio.Event()
    sub = notifier.subscribe(["pgdurable_done"], lambda _: ev.set(), key="run-x")
    sub_other = notifier.subscribe(["pgdurable_done"], lambda _: other.set(), key="run-y")
    try:
        await asyncio.wait_for(sub.ready.wait(), 30)
        await asyncio.sleep(max(presence.RECHECK) + 0.2)  # its re-reads are over
        ev.clear()
        other.clear()
        async with _renewal_held(dsn), \
                await psycopg.AsyncConnection.connect(dsn, autocommit=True) as sender:
            await sender.execute("NOTIFY pgdurable_done, 'run-x'")
            await asyncio.sleep(0.2)  # on the hub's socket while its statement waits
        await asyncio.wait_for(ev.wait(), 30)
        assert not other.is_set()  # only the notified run's subscribers
    finally:
        await sub_other.close()
        await sub.close()


async def test_the_dashboard_keeps_a_notification_heard_while_it_announces(
        dsn: str, renewing: None) -> None:
    b = _live.Broadcaster(dsn)
    q = b.subscribe()
    try:
        await asyncio.wait_for(b.ready.wait(), 30)
        await asyncio.sleep(max(presence.RECHECK) + 0.2)
        while not q.empty():  # the reconnects of its first announcement
            assert q.get_nowait() == {"channel": "reconnect"}
        async with _renewal_held(dsn), \
                await psycopg.AsyncConnection.connect(dsn, autocommit=True) as sender:
            await sender.execute("NOTIFY pgdurable_done, 'run-x'")
            await asyncio.sleep(0.2)
        assert await asyncio.wait_for(q.get(), 30) == {"channel": "done", "runs": ["run-x"]}
    finally:
        await b.close()


async def test_a_worker_hearing_a_stream_of_wakeups_runs_every_run_and_cancels(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """Polling once an hour and renewing every few minutes: only the listener can
    wake the worker for these starts (sent one by one) and stop the cancelled step."""
    app = Durable(dsn, pool_size=4)
    started = asyncio.Event()

    @app.task("quick", revision="1")
    async def quick(ctx: RunContext, state: dict[str, Any]) -> Any:
        return Done(None)

    @app.task("long", revision="1")
    async def long(ctx: RunContext, state: dict[str, Any]) -> Any:
        started.set()
        await asyncio.sleep(60)
        return Continue(state)

    async with app:
        worker = app.worker(poll_interval=3600, lease_ttl=600, concurrency=4)
        running = asyncio.create_task(worker.run())
        try:
            await worker_listening(conn)
            rids = []
            for _ in range(40):
                rids.append(await app.start("quick", {}, revision="1"))
                await asyncio.sleep(0.005)

            async def all_done() -> bool:
                return [(await app.get_run(r)).status for r in rids] == ["completed"] * 40

            await until(all_done, "every run to complete")
            rid = await app.start("long", {}, revision="1")
            await asyncio.wait_for(started.wait(), 10)
            await app.cancel(rid)

            async def cancelled() -> bool:
                return (await app.get_run(rid)).status == "cancelled"

            await until(cancelled, "the cancel NOTIFY to stop the step")
        finally:
            await worker.stop()
            await running
