"""with_idempotency recovers (issue 37): an outcome is recorded even when its
caller is cancelled after ``fn`` returned, and a key whose outcome is unknown
is resolved by the caller's ``reconcile``.

Executions are counted durably (rows in a scratch table). Statements are held
in the network by a local TCP proxy (tests/_pgnet.py) or at the server by a
row lock; callers are cancelled in process (``task.cancel()``) or interrupted
in a real process (SIGINT); lapsed claims are those of SIGKILLed owners.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _pgnet import Proxy, proxied
from _waiting import WAIT_LIMIT, until
from _waiting import until_sync as wait_until

from pgdurable import (
    NOT_PERFORMED,
    EffectFailed,
    ReconcileFailed,
    with_idempotency,
    with_idempotency_sync,
)

ROOT = Path(__file__).resolve().parent.parent
HELPER = str(ROOT / "tests" / "_effect_procs.py")
#: what with_idempotency logs when it defers an interruption to record an outcome
DEFERRED = "recording it first"


@pytest.fixture
def scratch(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE executions (seq bigserial PRIMARY KEY, key text, pid int)")
        c.execute("CREATE TABLE entered (key text)")
        yield c


@pytest.fixture
def proxy(dsn: str) -> Iterator[tuple[Proxy, str]]:
    with proxied(dsn) as (p, via):
        p.forwarding = True
        yield p, via


def executions(c: psycopg.Connection[Any], key: str) -> int:
    row = c.execute("SELECT count(*) FROM executions WHERE key = %s", (key,)).fetchone()
    return int(row[0]) if row else 0


def key_row(c: psycopg.Connection[Any], key: str) -> tuple[Any, ...] | None:
    return c.execute("SELECT status, result, error->>'type' FROM pgdurable.idempotency_keys "
                     "WHERE key = %s", (key,)).fetchone()


def spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, HELPER, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def is_true(value: bool) -> Any:
    async def answer() -> bool:
        return value

    return answer()


# ------------------------------------------------------- cancelled after fn returned
@pytest.mark.parametrize("hold", [
    "the settle held in the network",
    "the settle blocked at the server",
    "a renewal held as fn returns",
])
async def test_a_result_is_recorded_when_its_caller_is_cancelled_after_fn(
    dsn: str, scratch: psycopg.Connection[Any], proxy: tuple[Proxy, str], hold: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """fn has acted and returned; the caller is cancelled before its outcome is
    recorded: while the write that records it is held by the network (the
    proxy), while it waits at the server for a row lock (psycopg cancels a
    statement whose caller is cancelled), or before it is sent, while a
    heartbeat renewal holds the connection. The outcome is recorded all the
    same, the caller then ends cancelled, and the next caller gets the stored
    result without running fn again (before the fix the claim stayed running,
    lapsed with its lease and fn ran a second time)."""
    caplog.set_level(logging.WARNING, logger="pgdurable.effects")
    p, via = proxy
    p.hold_on = {"the settle held in the network": b"idempotency_finish",
                 "a renewal held as fn returns": b"idempotency_renew"}.get(hold)
    locker = psycopg.connect(dsn)  # holds the key's row in "blocked at the server"
    returning = asyncio.Event()

    async def effect() -> Any:
        scratch.execute("INSERT INTO executions (key, pid) VALUES ('charge', 1)")
        if hold == "a renewal held as fn returns":
            await asyncio.to_thread(p.holding.wait, WAIT_LIMIT)
        if hold == "the settle blocked at the server":
            locker.execute("SELECT 1 FROM pgdurable.idempotency_keys WHERE key = 'charge' "
                           "FOR UPDATE")
        returning.set()  # no await follows: the caller goes on until it waits on the database
        return {"charged": 42}

    try:
        caller = asyncio.create_task(with_idempotency(via, "charge", effect, lease=1.5))
        await asyncio.wait_for(returning.wait(), WAIT_LIMIT)
        if hold == "the settle blocked at the server":
            await until(lambda: is_true(scratch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE '%%idempotency_finish%%'"
            ).fetchone() == (1,)), "the settle to wait for the row lock")
        else:
            await asyncio.to_thread(p.holding.wait, WAIT_LIMIT)
            assert p.holding.is_set()
        assert not caller.done()
        caller.cancel()
        await asyncio.sleep(0)  # deliver the cancellation while the statement is held
        await until(lambda: is_true(caller.done() or DEFERRED in caplog.text),
                    "the caller to stop, or to say it records the outcome first")
        p.release()
        locker.rollback()
        with pytest.raises(asyncio.CancelledError):
            await caller
    finally:
        locker.close()

    def again() -> Any:
        scratch.execute("INSERT INTO executions (key, pid) VALUES ('charge', 2)")
        return {"charged": "twice"}

    # (before the fix: this caller waited for the claim to lapse, then ran fn again)
    assert await with_idempotency(dsn, "charge", again, wait_timeout=WAIT_LIMIT) == {
        "charged": 42}
    assert executions(scratch, "charge") == 1
    assert key_row(scratch, "charge") == ("succeeded", {"charged": 42}, None)


@pytest.mark.crash
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_process_interrupted_while_its_outcome_is_recorded_records_it_first(
    dsn: str, scratch: psycopg.Connection[Any], proxy: tuple[Proxy, str], mode: str
) -> None:
    """A real process is interrupted (SIGINT: KeyboardInterrupt in the sync twin,
    the main task cancelled under asyncio.run) while the write recording fn's
    result is held in the network. It records the result, then stops; the
    next caller does not run fn again."""
    p, via = proxy
    p.hold_on = b"idempotency_finish"
    proc = spawn("idem-interrupted", dsn, via, "charge", mode)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        wait_until(lambda: p.holding.is_set() or proc.poll() is not None, "the held settle")
        assert p.holding.is_set(), "".join(err)
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: proc.poll() is not None or DEFERRED in "".join(err),
                   "the process to stop, or to say it records the outcome first")
        p.release()
        proc.wait(WAIT_LIMIT)
        reader.join(WAIT_LIMIT)  # stderr is the reader's alone (not communicate's)
        out = proc.stdout.read() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0 and "KeyboardInterrupt" in "".join(err), (out, err)

    def again() -> Any:
        scratch.execute("INSERT INTO executions (key, pid) VALUES ('charge', 2)")
        return {"charged": "twice"}

    # (before the fix: this caller waited for the claim to lapse, then ran fn again)
    assert with_idempotency_sync(dsn, "charge", again, wait_timeout=WAIT_LIMIT) == {
        "charged": proc.pid}
    assert executions(scratch, "charge") == 1
    assert key_row(scratch, "charge") == ("succeeded", {"charged": proc.pid}, None)


# ------------------------------------------------------- reconcile: outcome unknown
def lapsed(scratch: psycopg.Connection[Any], key: str, phase: str) -> None:
    """A real lapsed claim on ``key``: an owner (1 s lease) is SIGKILLed in fn,
    after acting (``acted``) or before (``entered``)."""
    proc = spawn("idem-hang", scratch.info.dsn, key, phase)
    table = "executions" if phase == "acted" else "entered"
    try:
        wait_until(lambda: scratch.execute(f"SELECT count(*) FROM {table} WHERE key = %s",
                                           (key,)).fetchone() == (1,)
                   or proc.poll() is not None, "the owner in fn")
        assert proc.poll() is None, proc.communicate()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    row = key_row(scratch, key)
    assert row is not None and row[0] == "running"


@pytest.mark.crash
@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_reconcile_finds_the_effect_performed(
    dsn: str, scratch: psycopg.Connection[Any], mode: str
) -> None:
    """The owner acted and died: the next caller (after the lease lapsed) asks
    reconcile, which finds the effect; its answer is stored and returned, fn
    never runs again, and later callers get the same answer."""
    lapsed(scratch, "charge", "acted")
    calls: list[str] = []

    def fn() -> Any:
        calls.append("fn")
        return {"charged": "again"}

    def find() -> Any:
        calls.append("reconcile")
        row = scratch.execute("SELECT pid FROM executions WHERE key = 'charge'").fetchone()
        return NOT_PERFORMED if row is None else {"charged": row[0], "found": True}

    if mode == "sync":
        got = await asyncio.to_thread(with_idempotency_sync, dsn, "charge", fn,
                                      reconcile=find, wait_timeout=WAIT_LIMIT)
    else:
        got = await with_idempotency(dsn, "charge", fn, reconcile=find, wait_timeout=WAIT_LIMIT)
    pid = scratch.execute("SELECT pid FROM executions").fetchone()
    assert pid is not None and got == {"charged": pid[0], "found": True}
    assert calls == ["reconcile"]
    assert key_row(scratch, "charge") == ("succeeded", got, None)
    assert await with_idempotency(dsn, "charge", fn, reconcile=find) == got
    assert with_idempotency_sync(dsn, "charge", fn) == got
    assert calls == ["reconcile"] and executions(scratch, "charge") == 1


@pytest.mark.crash
async def test_reconcile_not_performed_runs_fn_once(
    dsn: str, scratch: psycopg.Connection[Any]
) -> None:
    """The owner died in fn before it acted: reconcile finds no trace and says
    NOT_PERFORMED; fn runs now, once, and its result is the key's."""
    lapsed(scratch, "charge", "entered")
    calls: list[str] = []

    async def fn() -> Any:
        calls.append("fn")
        scratch.execute("INSERT INTO executions (key, pid) VALUES ('charge', 7)")
        return {"charged": 7}

    def find() -> Any:
        calls.append("reconcile")
        return NOT_PERFORMED if executions(scratch, "charge") == 0 else {"charged": "found"}

    assert await with_idempotency(dsn, "charge", fn, reconcile=find,
                                  wait_timeout=WAIT_LIMIT) == {"charged": 7}
    assert calls == ["reconcile", "fn"]
    assert key_row(scratch, "charge") == ("succeeded", {"charged": 7}, None)
    assert await with_idempotency(dsn, "charge", fn, reconcile=find) == {"charged": 7}
    assert calls == ["reconcile", "fn"] and executions(scratch, "charge") == 1


@pytest.mark.crash
@pytest.mark.parametrize("answer", ["raises", "not JSON"])
async def test_a_failing_reconcile_keeps_the_key_interrupted(
    dsn: str, scratch: psycopg.Connection[Any], answer: str
) -> None:
    """reconcile cannot tell (it raises, or answers what cannot be stored): the
    caller gets ReconcileFailed, fn does not run, the key stays Interrupted
    (EffectFailed for a caller without reconcile), and a later reconcile that
    can tell resolves it."""
    lapsed(scratch, "charge", "acted")
    calls: list[str] = []

    def fn() -> Any:
        calls.append("fn")
        return "again"

    def cannot_tell() -> Any:
        calls.append("reconcile")
        if answer == "raises":
            raise LookupError("the provider does not answer")
        return {1, 2}

    with pytest.raises(ReconcileFailed, match="stays unknown") as info:
        await with_idempotency(dsn, "charge", fn, reconcile=cannot_tell, wait_timeout=WAIT_LIMIT)
    assert isinstance(info.value.__cause__, LookupError if answer == "raises" else TypeError)
    assert calls == ["reconcile"]
    assert key_row(scratch, "charge") == ("failed", None, "Interrupted")
    with pytest.raises(EffectFailed, match="Interrupted"):
        await with_idempotency(dsn, "charge", fn, wait_timeout=WAIT_LIMIT)
    with pytest.raises(ReconcileFailed):
        with_idempotency_sync(dsn, "charge", fn, reconcile=cannot_tell)
    assert await with_idempotency(dsn, "charge", fn, reconcile=lambda: "found") == "found"
    assert key_row(scratch, "charge") == ("succeeded", "found", None)
    assert "fn" not in calls and executions(scratch, "charge") == 1


async def test_reconcile_resolves_a_key_recorded_interrupted(
    dsn: str, scratch: psycopg.Connection[Any]
) -> None:
    """An owner cancelled while fn ran records the key Interrupted (outcome
    unknown); a caller with reconcile takes it over at once, without waiting
    for the record to expire, and stores what reconcile found."""
    started = asyncio.Event()

    async def slow() -> Any:
        scratch.execute("INSERT INTO executions (key, pid) VALUES ('mail', 1)")
        started.set()
        await asyncio.Event().wait()

    owner = asyncio.create_task(with_idempotency(dsn, "mail", slow))
    await started.wait()
    owner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await owner
    assert key_row(scratch, "mail") == ("failed", None, "Interrupted")
    with pytest.raises(EffectFailed, match="outcome is unknown"):
        await with_idempotency(dsn, "mail", lambda: "never")

    def sent() -> Any:
        return {"sent": executions(scratch, "mail") == 1}

    assert await with_idempotency(dsn, "mail", lambda: "never", reconcile=sent) == {"sent": True}
    assert with_idempotency_sync(dsn, "mail", lambda: "never") == {"sent": True}
    assert executions(scratch, "mail") == 1


async def test_reconcile_is_not_asked_while_the_owner_lives(
    dsn: str, scratch: psycopg.Connection[Any]
) -> None:
    """A running claim of a live owner is waited for, not reconciled; a key
    claimed afresh runs fn, not reconcile."""
    release = asyncio.Event()
    asked: list[int] = []

    async def effect() -> Any:
        await release.wait()
        return "done"

    first = asyncio.create_task(with_idempotency(dsn, "k", effect))
    await until(lambda: is_true(key_row(scratch, "k") is not None), "the claim")
    waiter = asyncio.create_task(with_idempotency(dsn, "k", effect,
                                                  reconcile=lambda: asked.append(1)))
    # the owner's session and the waiter's both last sent a claim: the waiter has polled
    await until(lambda: is_true(scratch.execute(
        "SELECT count(*) >= 2 FROM pg_stat_activity WHERE datname = current_database() "
        "AND query LIKE '%%idempotency_claim_v2%%' AND pid <> pg_backend_pid()"
    ).fetchone() == (True,)), "the waiter to poll")
    release.set()
    assert await asyncio.gather(first, waiter) == ["done", "done"]
    assert await with_idempotency(dsn, "fresh", lambda: 1, reconcile=lambda: asked.append(1)) == 1
    assert asked == []


def test_claim_v2_boundaries_in_sql(conn: psycopg.Connection[Any]) -> None:
    """Which rows idempotency_claim_v2 takes over, and when it says the outcome
    is unknown (database clock, boundary pairs of +-1 s)."""
    interrupted = '{"type": "Interrupted", "message": "m"}'
    rows = [  # key, status, error, expires_at offset
        ("running-past", "running", None, "-1 second"),
        ("running-future", "running", None, "1 second"),
        ("done-past", "succeeded", None, "-1 second"),
        ("failed-kept", "failed", '{"type": "ValueError", "message": "m"}', "1 second"),
        ("interrupted-kept", "failed", interrupted, "1 second"),
        ("interrupted-past", "failed", interrupted, "-1 second"),
    ]
    for key, status, error, offset in rows:
        conn.execute("INSERT INTO pgdurable.idempotency_keys (key, status, owner, error, "
                     "expires_at) VALUES (%s, %s, 'old', %s::jsonb, "
                     "pgdurable.now() + %s::interval)", (key, status, error, offset))
    claim = ("SELECT claimed, owner, unknown FROM pgdurable.idempotency_claim_v2(%s, %s, "
             "'30 s', %s)")

    expected = {  # (without reconcile, with reconcile)
        "running-past": ((True, "new", True), (True, "new", True)),
        "running-future": ((False, "old", False), (False, "old", False)),
        "done-past": ((True, "new", False), (True, "new", False)),
        "failed-kept": ((False, "old", False), (False, "old", False)),
        "interrupted-kept": ((False, "old", False), (True, "new", True)),
        "interrupted-past": ((True, "new", False), (True, "new", False)),
        "absent": ((True, "new", False), (True, "new", False)),
    }
    for key, (plain, reconciling) in expected.items():
        for reconcile, want in ((False, plain), (True, reconciling)):
            with pytest.raises(_Rollback), conn.transaction():  # each claim on the same rows
                got = conn.execute(claim, (key, "new", reconcile)).fetchone()
                assert got == want, (key, reconcile)
                raise _Rollback


class _Rollback(Exception):
    """Raised to roll a transaction back."""


async def test_bad_reconcile_is_rejected_before_sql(
    dsn: str, scratch: psycopg.Connection[Any]
) -> None:
    with pytest.raises(TypeError, match="reconcile must be callable"):
        await with_idempotency(dsn, "k", lambda: 1, reconcile="no")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="reconcile must be callable"):
        with_idempotency_sync(dsn, "k", lambda: 1, reconcile=5)  # type: ignore[arg-type]
    assert scratch.execute("SELECT count(*) FROM pgdurable.idempotency_keys").fetchone() == (0,)

