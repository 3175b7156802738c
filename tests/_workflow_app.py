"""A workflow app for real-process crash tests (tests/test_workflows_crash.py).

Run as ``python -m pgdurable.worker _workflow_app:app`` with ``PYTHONPATH=tests``
and ``PGDURABLE_DSN`` set. Every step function first records its execution
durably in the ledger ``wf_ledger(run_id, name, pid)`` (created by the test),
so the test counts from the database how often each ``fn`` ran.

The input (a dict) chooses where the process SIGKILLs itself, once per run
(``wf_kills`` remembers that it did):

* ``kill_in`` -- inside that step's fn, after its ledger row (the fn is in
  flight: its result is never checkpointed);
* ``kill_after`` -- in the workflow body right after that entry was recorded
  (a step boundary: checkpoint committed, next entry not started);
* ``finish`` -- the last step ``report`` is ``ctx.finish`` (its checkpoint
  is the completion) instead of ``ctx.step`` and ``return``;
* ``stall`` -- the fn of step ``slow`` blocks the event loop that many
  seconds the first time it runs (the zombie test SIGSTOPs the process
  meanwhile), then returns into its checkpoint.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from typing import Any

import psycopg

import pgdurable
from pgdurable import StepPolicy, WorkflowContext
from pgdurable.foundation.db import resolve_dsn

app = pgdurable.Durable()


def _db() -> psycopg.Connection[Any]:
    return psycopg.connect(resolve_dsn() or "", autocommit=True)


def _ledger(rid: str, name: str, kill: str | None = None) -> int:
    """Record one execution of ``name`` (and, with ``kill``, the kill point if
    it is the first time) in ONE transaction; SIGKILL this process if the kill
    point was new. How many executions there were (this one included). A
    database error leaves no row (a retried attempt is not counted twice)."""
    with _db() as c, c.transaction():
        c.execute("INSERT INTO wf_ledger (run_id, name, pid) VALUES (%s, %s, %s)",
                  (rid, name, os.getpid()))
        row = c.execute("SELECT count(*) FROM wf_ledger WHERE run_id = %s AND name = %s",
                        (rid, name)).fetchone()
        first = kill is not None and c.execute(
            "INSERT INTO wf_kills VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING 1",
            (rid, kill)).fetchone()
    if first:
        os.kill(os.getpid(), signal.SIGKILL)
    assert row is not None
    return int(row[0])


def _kill_once(rid: str, point: str) -> None:
    with _db() as c:
        first = c.execute("INSERT INTO wf_kills VALUES (%s, %s) ON CONFLICT DO NOTHING "
                          "RETURNING 1", (rid, point)).fetchone()
    if first:
        os.kill(os.getpid(), signal.SIGKILL)


def tool(rid: str, name: str, spec: dict[str, Any], value: Any) -> Any:
    """A step's fn: ledger row (and the kill in flight, if it is this step's)."""
    _ledger(rid, name, f"in:{name}" if spec.get("kill_in") == name else None)
    return value


async def slow(rid: str, spec: dict[str, Any], value: Any) -> Any:
    """Step 'slow' (async): the first time, with ``stall``, it BLOCKS THE EVENT
    LOOP (a stalled process: no heartbeat runs), then returns straight into
    its fenced checkpoint, after a ledger row 'slow:returned'."""
    n = _ledger(rid, "slow", "in:slow" if spec.get("kill_in") == "slow" else None)
    if n == 1 and spec.get("stall"):
        time.sleep(float(spec["stall"]))  # noqa: ASYNC251 (deliberate: a stalled loop)
        _ledger(rid, "slow:returned")
    return value


def push(rid: str, spec: dict[str, Any], notes: list[str]) -> str:
    """A side effect (reconcile policy): the 'remote' row is written before the kill."""
    ref = f"build-{rid[:8]}-{len(notes)}"
    with _db() as c:  # the remote side effect, then the ledger (and the kill)
        c.execute("INSERT INTO wf_remote VALUES (%s, %s) ON CONFLICT DO NOTHING", (rid, ref))
    _ledger(rid, "push", "in:push" if spec.get("kill_in") == "push" else None)
    return ref


def find_push(rid: str, spec: dict[str, Any], notes: list[str]) -> str:
    """Reconcile: the push's real outcome, from the remote side."""
    _ledger(rid, "reconcile:push")
    with _db() as c:
        row = c.execute("SELECT ref FROM wf_remote WHERE run_id = %s", (rid,)).fetchone()
    if row is None:
        raise LookupError("no push found")
    return str(row[0])


def report_and_result(rid: str, spec: dict[str, Any], final: Any, build: str) -> Any:
    """Step 'report' as ``ctx.finish`` (``finish`` in the input): its result is the run's."""
    return {"report": tool(rid, "report", spec, final), "build_prefix": build.split("-")[0]}


@app.workflow("agent", revision="1")
async def agent(ctx: WorkflowContext, spec: dict[str, Any]) -> dict[str, Any]:
    """Six steps, a sleep, a signal wait and an approval."""
    rid = ctx.run_id

    def boundary(name: str) -> None:
        if spec.get("kill_after") == name and not ctx.replaying:
            _kill_once(rid, f"after:{name}")

    topic = spec["topic"]
    sources = await ctx.step("search", tool, rid, "search", spec, [f"{topic}/a", f"{topic}/b"])
    boundary("search")
    notes = await ctx.step("read", tool, rid, "read", spec, [s.upper() for s in sources])
    boundary("read")
    await ctx.sleep(timedelta(milliseconds=50))
    boundary("sleep")
    slow_n = await ctx.step("slow", slow, rid, spec, len(notes))
    boundary("slow")
    build = await ctx.step("push", push, rid, spec, notes,
                           policy=StepPolicy(replay="reconcile", reconcile=find_push))
    boundary("push")
    ci = await ctx.wait_signal("ci", f"ci-{topic}", timeout=timedelta(minutes=5))
    boundary("ci")
    summary = await ctx.step("summarize", tool, rid, "summarize", spec,
                             {"notes": notes, "ci": ci})
    boundary("summarize")
    ok = await ctx.approval(f"report-{topic}")
    boundary("approval")
    final = {"summary": summary, "ok": ok, "slow": slow_n}
    if spec.get("finish"):  # the last step's checkpoint IS the completion
        return await ctx.finish("report", report_and_result, rid, spec, final, build)
    report = await ctx.step("report", tool, rid, "report", spec, final)
    return {"report": report, "build_prefix": build.split("-")[0]}
