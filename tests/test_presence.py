"""The watch-only NOTIFYs (pgdurable_steps, pgdurable_done) are sent only while a
listener is present (sql/0023_listener_presence.sql, pgdurable/foundation/presence.py),
and every listener announces itself: result() (async and sync) and the
dashboard still wake on the notification, not on their safety poll."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import psycopg
import pytest
from _waiting import app_running

from pgdurable import Done, Durable, DurableClient, RunCancelled, RunContext
from pgdurable.foundation import presence
from pgdurable.foundation.errors import InvalidInput, PgDurableError, translate
from pgdurable.runs import results

WATCH = ("pgdurable_steps", "pgdurable_done")
START = ("SELECT run_id FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 3, NULL, NULL, "
         "NULL, NULL)")
TIMEOUT = 30.0
CLAIM = ("SELECT id, lease_token FROM pgdurable.claim_runs('w', ARRAY['default'], ARRAY['t'], "
         "ARRAY['1'], 1, interval '60 seconds')")


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn)
    await a.open()
    yield a
    await a.close()


def _heard(dsn: str) -> set[str]:
    """The watch-only channels a plain LISTEN connection hears while a run is
    claimed, checkpointed and completed."""
    with psycopg.connect(dsn, autocommit=True) as ear, \
            psycopg.connect(dsn, autocommit=True) as c:
        for ch in WATCH:
            ear.execute(f"LISTEN {ch}")
        c.execute(START)
        row = c.execute(CLAIM).fetchone()
        assert row is not None
        assert c.execute("SELECT pgdurable.checkpoint_run(%s, %s, 'w', '{\"n\": 1}', 0)",
                         row).fetchone() == ("leased",)
        assert c.execute("SELECT pgdurable.complete_run(%s, %s, 'w', '{}', '{}')",
                         row).fetchone() == ("completed",)
        return {n.channel for n in ear.notifies(timeout=0.5)}


def _announce(c: psycopg.Connection[Any], channel: str, ttl: int = 60) -> Any:
    row = c.execute("SELECT pgdurable.listen_presence(%s, %s) - statement_timestamp()", (channel, ttl)).fetchone()
    assert row is not None
    return row[0].total_seconds()


def test_watch_channels_are_sent_only_while_a_listener_is_present(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        assert _heard(dsn) == set(), "nobody announced: no watch-only NOTIFY"
        # each channel is announced on its own
        assert _announce(c, "pgdurable_steps") == 60
        assert _heard(dsn) == {"pgdurable_steps"}
        assert _announce(c, "pgdurable_done") == 60
        assert _announce(c, "pgdurable_done", 1) > 50, "a shorter ttl never shortens it"
        version = c.execute("SELECT xmin::text FROM pgdurable.listeners "
                            "WHERE channel = 'pgdurable_done'").fetchone()
        assert _announce(c, "pgdurable_done") > 50
        assert c.execute("SELECT xmin::text FROM pgdurable.listeners "
                         "WHERE channel = 'pgdurable_done'").fetchone() == version, \
            "an announcement more than half its ttl away is not written again"
        assert _heard(dsn) == set(WATCH)
        # the setting still switches the live timeline off
        db = c.info.dbname
        c.execute(f'ALTER DATABASE "{db}" SET pgdurable.live_steps = off')
        assert _heard(dsn) == {"pgdurable_done"}
        c.execute(f'ALTER DATABASE "{db}" RESET pgdurable.live_steps')
        # an announcement that lapsed counts for nothing
        c.execute("UPDATE pgdurable.listeners SET until = now() - interval '1 second'")
        assert _heard(dsn) == set()
        # a deleted row counts as nobody listening, and an announcement makes it again
        c.execute("DELETE FROM pgdurable.listeners")
        assert _heard(dsn) == set()
        assert _announce(c, "pgdurable_done") == 60
        assert _heard(dsn) == {"pgdurable_done"}


@pytest.mark.parametrize(("args", "what"), [
    (("pgdurable_wake", 60), "channel"), (("", 60), "channel"), ((None, 60), "channel"),
    (("pgdurable_done", 0), "ttl_seconds"), (("pgdurable_done", 3601), "ttl_seconds"),
    (("pgdurable_done", None), "ttl_seconds"),
])
def test_bad_announcements_are_refused_and_change_nothing(
    dsn: str, args: tuple[Any, Any], what: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        before = c.execute("SELECT * FROM pgdurable.listeners ORDER BY 1").fetchall()
        with pytest.raises(psycopg.Error) as err:
            c.execute("SELECT pgdurable.listen_presence(%s, %s)", args)
        exc = translate(err.value)
        assert isinstance(exc, InvalidInput) and what in str(exc)
        assert c.execute("SELECT * FROM pgdurable.listeners ORDER BY 1").fetchall() == before


def _register(app: Durable, gate: threading.Event) -> None:
    @app.task("slow")
    async def slow(ctx: RunContext, state: Any) -> Any:
        await asyncio.to_thread(gate.wait, 30)
        return Done({"ok": state["i"]})


def _waiter(app: Durable, client: DurableClient, how: str, rid: str) -> Awaitable[Any]:
    if how == "async":
        return app.result(rid, timeout=TIMEOUT)
    return asyncio.to_thread(client.result, rid, TIMEOUT)


async def _timed(waiter: Awaitable[Any]) -> tuple[Any, float]:
    """What ``waiter`` returned or raised, and how long it took (a wait that
    missed its wake-up would last until its timeout and read once more then)."""
    t0 = time.monotonic()
    try:
        out: Any = await waiter
    except PgDurableError as exc:
        out = exc
    return out, time.monotonic() - t0


@pytest.mark.parametrize("how", ["async", "sync"])
async def test_result_wakes_on_the_notification(
    app: Durable, dsn: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """No safety poll and no re-reads: only the pgdurable_done NOTIFY, sent because
    the waiter (alone: async or sync) announced itself, can end this wait early."""
    monkeypatch.setattr(results, "POLL", 3600.0)
    monkeypatch.setattr(presence, "RECHECK", ())  # the notifier's and the sync waiter's
    gate = threading.Event()
    _register(app, gate)
    rid = str(await app.start("slow", {"i": 1}))
    client = DurableClient(dsn, app=app)
    try:
        async with app_running(app, concurrency=2):
            waiter = asyncio.create_task(_timed(_waiter(app, client, how, rid)))
            await asyncio.sleep(0.5)  # it waits (listening, announced) before the run ends
            gate.set()
            out, took = await waiter
        assert out == {"ok": 1}
        assert took < TIMEOUT / 2, "woken by the NOTIFY, not at its timeout"
    finally:
        client.close()


@pytest.mark.parametrize("how", ["async", "sync"])
async def test_an_announcement_rereads_what_raced_it(
    app: Durable, dsn: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A run that ends in a transaction that looked for listeners before the
    waiter announced itself sends nothing; the waiter's re-reads after its
    announcement find the end (its safety poll would take an hour here)."""
    monkeypatch.setattr(results, "POLL", 3600.0)
    _register(app, threading.Event())
    rid = str(await app.start("slow", {"i": 1}))
    client = DurableClient(dsn, app=app)
    try:
        with psycopg.connect(dsn) as ender:  # one transaction: the cancel, no listener yet
            ender.execute("SELECT pgdurable.cancel_run(%s)", (rid,))
            waiter = asyncio.create_task(_timed(_waiter(app, client, how, rid)))
            await asyncio.sleep(0.3)  # it read 'runnable' (the cancel is not committed)
            ender.commit()  # ... and it sends no NOTIFY: it saw no listener
        out, took = await waiter
        assert isinstance(out, RunCancelled)
        assert took < TIMEOUT / 2, "found by a re-read, not at its timeout"
    finally:
        client.close()
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT until > now() FROM pgdurable.listeners "
                         "WHERE channel = 'pgdurable_done'").fetchone() == (True,)


def test_presence_constants_are_consistent() -> None:
    assert presence.RENEW * 2 < presence.TTL, "a listener renews well before it lapses"
    assert presence.CHANNELS == set(WATCH)
    assert max(presence.RECHECK) < results.POLL
