"""The process's one LISTEN connection (pgdurable/foundation/notifier.py), on a real Postgres.

* one process running a worker, a stream follower, a result waiter and a
  dashboard live page holds exactly ONE listening connection; when that
  backend is terminated (and cannot reconnect for a while), everything
  notified meanwhile is lost, and yet after the reconnect every subscriber
  catches up: the worker claims the run started meanwhile, the stream re-reads
  from its cursor, the result that completed meanwhile is returned, the page
  is told to refresh; still one connection;
* a channel is LISTENed while somebody wants it: UNLISTEN (the server stops
  sending it) when its last subscriber leaves, the connection closes with the
  last subscriber of all;
* a flood of notifications reaches every subscriber, in order, while one
  subscriber raises and one (a stalled dashboard tab) never reads: nothing
  waits for them, the connection stays up;
* a health check that is never answered (held in the network) counts as a
  lost connection: the notifier connects again and its subscribers look again;
* the same conninfo (however written) is one notifier per event loop, and
  ``Durable.notifier()`` hands out that one (None where nothing can LISTEN).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _pgnet import proxied
from _waiting import LISTENING, WAIT_LIMIT, until, until_sync
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgdurable import Durable
from pgdurable.foundation import notifier as notifier_mod
from pgdurable.foundation.notifier import Notifier, notifier_for
from pgdurable.ops.dashboard import _live

ROOT = Path(__file__).resolve().parent.parent
APPNAME = "pgd_one_notifier"
OURS = LISTENING[:-1] + f" AND application_name = '{APPNAME}')"


def one(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def _backend_gone(conn: psycopg.Connection[Any], pid: int) -> bool:
    return one(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)) == 0


class Child:
    """``tests._notifier_proc``: its JSON lines, read by a thread, waited for by kind."""

    def __init__(self, dsn: str, rid: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests._notifier_proc", dsn, rid], cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self._next: dict[str, int] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def expect(self, kind: str) -> Any:
        """The next line of ``kind`` (each is returned once, in order; every line
        read is kept in ``seen``)."""
        i = self._next.get(kind, 0)
        while True:
            for j in range(i, len(self.seen)):
                if kind in self.seen[j]:
                    self._next[kind] = j + 1
                    return self.seen[j][kind]
            i = len(self.seen)
            try:
                self.seen.append(self.lines.get(timeout=WAIT_LIMIT))
            except queue.Empty:
                raise AssertionError(f"no {kind!r} from the child: {self.stderr()}") from None

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def stop(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        self.expect("stopped")
        return self.proc.wait(30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


START = ("SELECT run_id FROM pgdurable.start_run(%s, '1', '{}', %s, 0, 3, NULL, NULL, NULL, "
         "NULL)")
CLAIM = ("SELECT lease_token FROM pgdurable.claim_runs('t', ARRAY['elsewhere'], "
         "ARRAY['outside'], ARRAY['1'], 1, interval '600 seconds')")
EMIT = "SELECT pgdurable.emit_event(%s, %s, 't', %s, %s)"


def test_one_process_holds_one_listen_connection_and_a_reconnect_loses_nothing(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    # the run the stream follows and the waiter waits for is run here, by hand
    rid = str(one(conn, START, ("outside", "elsewhere")))
    token = one(conn, CLAIM)
    assert one(conn, EMIT, (rid, token, 0, '"before"')) == 1
    with proxied(dsn) as (proxy, via):
        proxy.forwarding = True
        child = Child(make_conninfo(via, application_name=APPNAME), rid)
        try:
            first = child.expect("listening")
            ready = child.expect("ready")
            assert child.expect("event") == {"seq": 1, "event": "before", "final": False}
            # worker + stream + result waiter + live page: ONE listening backend
            assert one(conn, OURS) == 1
            assert one(conn, OURS.replace("count(*)", "min(pid)")) == ready["pid"]
            assert first["connects"] == 1

            # no connection can be made now; the listening backend is terminated
            proxy.forwarding = False
            conn.execute("SELECT pg_terminate_backend(%s)", (ready["pid"],))
            until_sync(lambda: _backend_gone(conn, ready["pid"]), "the backend to exit")
            # meanwhile, every NOTIFY is lost: a run for the worker (a wake-up), an
            # event and the end of the run the stream and the waiter follow
            before = len(child.seen)
            quick = one(conn, START, ("quick", "default"))
            assert one(conn, EMIT, (rid, token, 1, '"during"')) == 2
            assert one(conn, "SELECT pgdurable.complete_run(%s, %s, 't', '{}', %s)",
                       (rid, token, '{"answer": 42}')) == "completed"
            proxy.forwarding = True

            again = child.expect("listening")
            assert again["connects"] == 2 and again["pid"] != ready["pid"]
            assert child.expect("result") == {"answer": 42}  # read again at the reconnect
            assert child.expect("event") == {"seq": 2, "event": "during", "final": False}
            end = child.expect("event")
            assert end["seq"] == 3 and end["final"]
            until_sync(lambda: one(conn, "SELECT status FROM pgdurable.runs WHERE id = %s",
                                   (quick,)) == "completed", "the worker to claim on reconnect")
            # the live page was told to refresh after the reconnect
            while {"channel": "reconnect"} not in [m.get("sse") for m in child.seen[before:]]:
                child.expect("sse")
            assert one(conn, OURS) == 1
            assert one(conn, OURS.replace("count(*)", "min(pid)")) == again["pid"]
            assert child.stop() == 0, child.stderr()
        finally:
            child.kill()
    assert "listener connection lost" in child.stderr()


async def soon(cond: Callable[[], bool], what: str) -> None:
    """:func:`until` for a plain condition."""
    async def pred() -> bool:
        return cond()

    await until(pred, what)


def _query_of(conn: psycopg.Connection[Any], pid: int) -> Any:
    return one(conn, "SELECT query FROM pg_stat_activity WHERE pid = %s AND state = 'idle'",
               (pid,))


async def test_a_channel_is_unlistened_when_its_last_subscriber_leaves(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    notifier = Notifier(dsn)
    a_got: list[str] = []
    b_got: list[str] = []
    done_got: list[str] = []
    a = notifier.subscribe(["pgdurable_events"], lambda n: a_got.append(n.payload))
    b = notifier.subscribe(["pgdurable_events"], lambda n: b_got.append(n.payload))
    done = notifier.subscribe(["pgdurable_done"], lambda n: done_got.append(n.payload))
    try:
        for s in (a, b, done):
            await asyncio.wait_for(s.ready.wait(), WAIT_LIMIT)
        assert notifier.channels == ["pgdurable_events", "pgdurable_done"]
        assert one(conn, LISTENING) == 1
        pid = notifier.backend_pid
        assert pid is not None

        await a.close()  # b still wants it: still listened
        conn.execute("NOTIFY pgdurable_events, 'one'")
        await soon(lambda: b_got == ["one"], "b to hear 'one'")
        assert a_got == []

        await b.close()  # the last subscriber of pgdurable_events: UNLISTEN
        await soon(lambda: _query_of(conn, pid) == "UNLISTEN pgdurable_events", "the UNLISTEN")
        received = notifier.received
        conn.execute("NOTIFY pgdurable_events, 'two'")  # not sent to it any more
        conn.execute("NOTIFY pgdurable_done, 'barrier'")  # delivered after 'two' would be
        await soon(lambda: done_got == ["barrier"], "the barrier")
        assert notifier.received == received + 1, "the server still sent pgdurable_events"
        assert notifier.channels == ["pgdurable_done"]
        assert notifier.backend_pid == pid  # the same connection all along
    finally:
        await done.close()  # the last subscriber of all: the connection closes
    assert notifier.backend_pid is None
    await soon(lambda: _backend_gone(conn, pid), "the connection to close")


async def test_a_flood_fans_out_to_every_subscriber_without_waiting_for_any(
        dsn: str, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pgdurable.notifier")
    n_flood = 20000
    notifier = notifier_for(dsn)
    every: list[str] = []
    keyed: list[str] = []

    def bad(n: psycopg.Notify) -> None:
        raise ValueError(f"bad subscriber {n.payload}")

    sub_every = notifier.subscribe(["pgdurable_events"], lambda n: every.append(n.payload))
    sub_keyed = notifier.subscribe(["pgdurable_events"], lambda n: keyed.append(n.payload),
                                   key="777")
    sub_bad = notifier.subscribe(["pgdurable_events"], bad)
    tabs = _live.Broadcaster(dsn)  # the same notifier (same DSN, same loop)
    stalled = tabs.subscribe()  # a tab that never reads
    try:
        await asyncio.wait_for(tabs.ready.wait(), WAIT_LIMIT)
        assert tabs.connections == 1
        pid = notifier.backend_pid
        conn.execute("SELECT count(pg_notify('pgdurable_events', i::text)) "
                     "FROM generate_series(1, %s) AS i", (n_flood,))
        await soon(lambda: len(every) >= n_flood, "every notification")
        assert every == [str(i) for i in range(1, n_flood + 1)]  # all of them, in order
        assert keyed == ["777"]  # only its payload
        assert stalled.qsize() <= _live._QUEUE_SIZE  # bounded: the tab gets a refresh instead
        assert {"channel": "reconnect"} in [stalled.get_nowait() for _ in range(stalled.qsize())]
        assert notifier.connects == 1 and notifier.backend_pid == pid  # never dropped
        raised = [r for r in caplog.records if "raised" in r.getMessage()]
        assert len(raised) == 1  # logged once, not 20,000 times
        # and the notifier still serves: a new subscriber of a listened channel is ready at once
        late: list[str] = []
        sub_late = notifier.subscribe(["pgdurable_events"], lambda n: late.append(n.payload))
        assert sub_late.ready.is_set()
        conn.execute("NOTIFY pgdurable_events, 'late'")
        await soon(lambda: late == ["late"], "the late subscriber")
        await sub_late.close()
    finally:
        for s in (sub_every, sub_keyed, sub_bad):
            await s.close()
        await tabs.close()


async def test_an_unanswered_health_check_reconnects_and_subscribers_look_again(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The health check of a quiet socket (patched: after 0.3 s) is held in the
    network and never answered: after STATEMENT_TIMEOUT the connection counts as
    lost, a new one is made, and the subscriber's on_recheck is called again."""
    monkeypatch.setattr(notifier_mod, "HEALTH", 0.3)
    monkeypatch.setattr(notifier_mod, "STATEMENT_TIMEOUT", 1.0)
    with proxied(dsn) as (proxy, via):
        proxy.forwarding = True
        proxy.hold_on = b"SELECT 1"
        notifier = Notifier(via)
        rechecks: list[int | None] = []
        sub = notifier.subscribe(["pgdurable_wake"], None,
                                 lambda: rechecks.append(notifier.backend_pid))
        try:
            await soon(lambda: len(rechecks) >= 2, "a second connection")
            assert proxy.holding.is_set()  # the health check was the one held
            assert notifier.connects == 2
            assert rechecks[0] != rechecks[1]
            assert sub.ready.is_set()
        finally:
            await sub.close()


async def test_one_notifier_per_conninfo_and_loop_and_the_app_hands_it_out(dsn: str) -> None:
    params = conninfo_to_dict(dsn)
    reordered = make_conninfo(**dict(reversed(list(params.items()))))
    assert notifier_for(dsn) is notifier_for(reordered)
    assert notifier_for(dsn) is not notifier_for(make_conninfo(dsn, application_name="other"))
    app = Durable(dsn)
    assert app.notifier() is notifier_for(dsn)
    assert Durable(dsn, listen_dsn=make_conninfo(dsn, application_name="l")).notifier() is (
        notifier_for(make_conninfo(dsn, application_name="l")))
    assert Durable(dsn, pooler="transaction").notifier() is None  # poll only
    with pytest.raises(ValueError, match="channel"):
        notifier_for(dsn).subscribe(["bad; DROP TABLE x"])
    with pytest.raises(ValueError, match="channel"):
        notifier_for(dsn).subscribe([])
    assert notifier_for(dsn).subscribers == 0


def test_each_event_loop_has_its_own(dsn: str) -> None:
    async def get() -> Notifier:
        return notifier_for(dsn)

    assert asyncio.run(get()) is not asyncio.run(get())


async def test_a_subscriber_that_comes_as_the_last_one_leaves_waits_for_a_new_connection(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    notifier = Notifier(dsn)
    first = notifier.subscribe(["pgdurable_events"])
    await asyncio.wait_for(first.ready.wait(), WAIT_LIMIT)
    pid = notifier.backend_pid
    first.cancel()  # the last one: its connection is closing, not waited for
    heard: list[str] = []
    second = notifier.subscribe(["pgdurable_events"], lambda n: heard.append(n.payload))
    try:
        assert not second.ready.is_set(), "ready on a connection that is closing"
        await asyncio.wait_for(second.ready.wait(), WAIT_LIMIT)
        assert notifier.backend_pid != pid and notifier.connects == 2
        conn.execute("NOTIFY pgdurable_events, 'x'")
        await soon(lambda: heard == ["x"], "the new connection to hear it")
    finally:
        await second.close()
    assert pid is not None
    await soon(lambda: _backend_gone(conn, pid), "the first connection to close")
