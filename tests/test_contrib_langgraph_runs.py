"""LangGraph with real processes: one writer per thread, interrupt/resume, SIGKILL.

Workers are ``python -m pgdurable.worker _langgraph_app:app``; the one-writer
invocations are ``python tests/_langgraph_app.py invoke ...`` (both processes of the
``fleet`` fixture, tests/fix_fleet.py). What ran is read
from the ledger table the graph's nodes write (tests/_langgraph_app.py).
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

pytest.importorskip("langgraph")

from _waiting import WAIT_LIMIT, until_sync
from fix_fleet import ROOT, TESTS, Fleet, Proc, WorkerProc

pytestmark = [pytest.mark.crash,
              pytest.mark.fleet("_langgraph_app:app", poll=0.5, concurrency=2, grace=5.0)]


def invoke(fleet: Fleet, name: str, thread: str, wait: bool) -> Proc:
    """``python tests/_langgraph_app.py invoke THREAD wait|nowait NAME``: one invocation
    of the graph on ``thread`` by the process ``name`` (no worker)."""
    return fleet.spawn(name, str(TESTS / "_langgraph_app.py"), "invoke", thread,
                       "wait" if wait else "nowait", name)


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE test_ledger (event text, pid int, tag text, "
                     "at timestamptz DEFAULT clock_timestamp())")
        yield conn


def wait(fleet: Fleet, pred: Any, what: str) -> None:
    try:
        until_sync(pred, what)
    except AssertionError as exc:
        with psycopg.connect(fleet.dsn, autocommit=True) as c:
            runs = c.execute("SELECT status, state, error, attempts FROM pgdurable.runs").fetchall()
        raise AssertionError(f"{exc}\n{runs}") from None


def ledger(db: psycopg.Connection[Any], event: str) -> list[int]:
    return [r[0] for r in db.execute("SELECT pid FROM test_ledger WHERE event = %s ORDER BY at",
                                     (event,))]


def start(db: psycopg.Connection[Any], dsn: str, state: dict[str, Any], thread: str) -> str:
    import asyncio

    from _langgraph_app import build

    from pgdurable.contrib.langgraph import run_graph

    async def go() -> str:
        app, graph = build(dsn)
        async with app:
            return await run_graph(app, graph, state, thread_id=thread)

    return asyncio.run(go())


def run_row(db: psycopg.Connection[Any], rid: str) -> tuple[Any, ...]:
    row = db.execute("SELECT status, state, result FROM pgdurable.runs WHERE id = %s",
                     (rid,)).fetchone()
    assert row is not None
    return tuple(row)


def test_interrupt_parks_the_run_and_a_signal_from_another_process_resumes_it(
    db: psycopg.Connection[Any], dsn: str, fleet: Fleet
) -> None:
    a = fleet.start("a")
    rid = start(db, dsn, {"ask": True}, "thread-ask")
    wait(fleet, lambda: run_row(db, rid)[0] == "waiting", "the run to park on interrupt()")
    _, state, _ = run_row(db, rid)
    assert state["interrupts"] == [{"q": "approve?"}]
    assert ledger(db, "tool") and not ledger(db, "finish")
    # wait = exit: the parked run holds no worker; stop the worker that ran it
    assert a.terminate() == 0
    fleet.start("b")
    # the resume is a signal sent by another process (the CLI)
    out = subprocess.run(
        [sys.executable, "-m", "pgdurable", "signal", "langgraph.resume", "thread-ask",
         "--payload", json.dumps({"approved": True}), "--dsn", dsn],
        env=fleet.env, cwd=ROOT, capture_output=True, text=True, timeout=WAIT_LIMIT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == rid
    wait(fleet, lambda: run_row(db, rid)[0] == "completed", "the resumed run to complete")
    result = run_row(db, rid)[2]
    assert result["answer"] == {"approved": True}
    assert result["log"] == ["tool", "crash-survived", "asked", "finish"]
    assert len(ledger(db, "tool")) == 1 and len(ledger(db, "finish")) == 1


def test_sigkill_mid_graph_resumes_on_another_worker_without_repeating_a_recorded_tool(
    db: psycopg.Connection[Any], dsn: str, fleet: Fleet
) -> None:
    a = fleet.start("a")
    rid = start(db, dsn, {"kill": True}, "thread-kill")
    assert a.wait() == -signal.SIGKILL  # killed itself in node `crash`
    _another_worker_runs_the_rest(db, fleet, rid, a)


def _another_worker_runs_the_rest(db: psycopg.Connection[Any], fleet: Fleet, rid: str,
                                  a: WorkerProc) -> None:
    """Worker b finishes the run that worker ``a`` left when it SIGKILLed itself in node
    ``crash``: the tool's writes were saved before the kill, so it ran once, in ``a``;
    the graph went on from the super-step after it, in b; the run's text is tool's then finish's, once each."""
    b = fleet.start("b")
    wait(fleet, lambda: run_row(db, rid)[0] == "completed", "another worker to finish the run")
    assert ledger(db, "tool") == [a.pid]
    assert ledger(db, "killed") == [a.pid]
    assert ledger(db, "finish") == [b.pid]
    assert run_row(db, rid)[2]["log"] == ["tool", "crash-survived", "no-ask", "finish"]
    # the stream: tool's text (stored before the kill), then finish's, each once, no gap
    from _langgraph_app import FINISH_TEXT, TOOL_TEXT

    assert "".join(texts(db, rid)) == TOOL_TEXT + FINISH_TEXT


def texts(db: psycopg.Connection[Any], rid: str) -> list[str]:
    """The run's stored text rows, in order."""
    return [r[0] for r in db.execute(
        "SELECT event->>'text' FROM pgdurable.run_events WHERE run_id = %s "
        "AND event->>'type' = 'text' ORDER BY seq", (rid,))]


def test_the_chat_models_text_is_stored_in_few_rows(
    db: psycopg.Connection[Any], dsn: str, fleet: Fleet
) -> None:
    """The nodes' chat model streams a token per word and space (stream_mode="messages"):
    the stored text is what the model said, in far fewer rows than tokens."""
    from _langgraph_app import FINISH_TEXT, TOOL_TEXT

    fleet.start("a")
    rid = start(db, dsn, {}, "thread-text")
    wait(fleet, lambda: run_row(db, rid)[0] == "completed", "the run")
    said = texts(db, rid)
    assert "".join(said) == TOOL_TEXT + FINISH_TEXT
    tokens = len(TOOL_TEXT.split(" ")) + len(FINISH_TEXT.split(" "))
    assert 1 <= len(said) < tokens // 2  # a row per flush, not per token


def test_sigkill_after_a_super_steps_writes_but_before_its_checkpoint_runs_the_rest(
    db: psycopg.Connection[Any], dsn: str, fleet: Fleet
) -> None:
    # LangGraph saves a super-step's checkpoint in the background while the next one
    # runs: worker a dies with `tool`'s writes saved and the checkpoint after it not.
    # The newest checkpoint's only task then has its writes, so the snapshot's `next`
    # is empty although the graph has three nodes to go; b must run them, not
    # complete the run with the state after `tool`.
    a = fleet.start("a", env={"LG_HOLD_STEP": "1"})
    rid = start(db, dsn, {"kill": True}, "thread-held")
    assert a.wait() == -signal.SIGKILL, fleet.logs()
    newest = db.execute(
        "SELECT metadata->>'step', (SELECT count(*) FROM pgdurable.lg_writes w "
        "  WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns "
        "    AND w.checkpoint_id = c.checkpoint_id) "
        "FROM pgdurable.lg_checkpoints c WHERE thread_id = 'thread-held' "
        "ORDER BY checkpoint_id DESC LIMIT 1").fetchone()
    assert newest is not None and newest[0] == "0" and newest[1] > 0, newest
    _another_worker_runs_the_rest(db, fleet, rid, a)


def _writers_in_order(db: psycopg.Connection[Any], thread: str) -> list[str]:
    rows = db.execute(
        "SELECT metadata->>'writer', checkpoint_id, parent_checkpoint_id "
        "FROM pgdurable.lg_checkpoints WHERE thread_id = %s AND checkpoint_ns = '' "
        "ORDER BY checkpoint_id", (thread,)).fetchall()
    for prev, row in itertools.pairwise(rows):
        assert row[2] == prev[1], "every checkpoint follows the one before it"
    return [r[0] for r in rows]


def _blocks(writers: list[str]) -> list[str]:
    out: list[str] = []
    for w in writers:
        if not out or out[-1] != w:
            out.append(w)
    return out


def test_two_processes_on_one_thread_never_interleave_and_fail_fast_is_typed(
    db: psycopg.Connection[Any], fleet: Fleet
) -> None:
    gate = psycopg.connect(fleet.dsn, autocommit=True)
    gate.execute("SELECT pg_advisory_lock(918273)")
    p1 = invoke(fleet, "p1", "thread-x", wait=True)
    wait(fleet, lambda: ledger(db, "gate"), "p1 to hold the thread, inside the graph")
    # fail fast: a clear typed error, nothing written
    p2 = invoke(fleet, "p2", "thread-x", wait=False)
    assert p2.wait(timeout=WAIT_LIMIT) == 3, fleet.logs()
    assert "busy: LangGraph thread 'thread-x' is being run by" in fleet.logs()
    # wait: p3 waits for p1's invocation to end, then runs its own
    p3 = invoke(fleet, "p3", "thread-x", wait=True)
    gate.execute("SELECT pg_advisory_unlock(918273)")
    gate.close()
    assert p1.wait(timeout=WAIT_LIMIT) == 0, fleet.logs()
    assert p3.wait(timeout=WAIT_LIMIT) == 0, fleet.logs()
    writers = _writers_in_order(db, "thread-x")
    assert _blocks(writers) == ["p1", "p3"], writers
    assert len(ledger(db, "gate")) == 2


def test_a_crashed_holders_thread_lease_lapses_and_the_next_invocation_proceeds(
    db: psycopg.Connection[Any], fleet: Fleet
) -> None:
    gate = psycopg.connect(fleet.dsn, autocommit=True)
    gate.execute("SELECT pg_advisory_lock(918273)")
    p1 = invoke(fleet, "p1", "thread-y", wait=True)
    wait(fleet, lambda: ledger(db, "gate"), "p1 to hold the thread")
    p1.kill()
    gate.execute("SELECT pg_advisory_unlock(918273)")
    gate.close()
    p2 = invoke(fleet, "p2", "thread-y", wait=True)
    assert p2.wait(timeout=WAIT_LIMIT) == 0, fleet.logs()
    writers = _writers_in_order(db, "thread-y")
    assert _blocks(writers) == ["p1", "p2"], writers
