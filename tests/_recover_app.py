"""The app of tests/test_recover.py: runs that fail while a backend is down.

Loaded by worker subprocesses (``python -m pgdurable.worker _recover_app:app``,
``PYTHONPATH=tests``, ``PGDURABLE_DSN`` set). Every call of a tool, a
reconcile or an effect first appends a row to ``rc_ledger(run_id, name)``
through its own connection, so the test counts executions from the database.
The backend is down while ``rc_down`` has a row (the test deletes it to
"fix the backend"); a push that goes through writes ``rc_remote`` (the remote
side's record of an order, which a reconcile looks up). The test creates the tables.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import psycopg

import pgdurable
from pgdurable import (
    NOT_PERFORMED,
    Continue,
    Done,
    DurableStep,
    RunContext,
    StepFailed,
    StepPolicy,
    WorkflowContext,
    define_durable_task,
)
from pgdurable.foundation.db import resolve_dsn

#: a step retried in place twice, quickly: a down backend fails it for good
FAST = StepPolicy(max_attempts=2, retry_base=0.01, retry_cap=0.02)

app = pgdurable.Durable()


def _db() -> psycopg.Connection[Any]:
    return psycopg.connect(resolve_dsn() or os.environ["PGDURABLE_DSN"], autocommit=True)


def ledger(rid: str, name: str) -> None:
    with _db() as c:
        c.execute("INSERT INTO rc_ledger (run_id, name) VALUES (%s, %s)", (rid, name))


def backend_down() -> bool:
    with _db() as c:
        return c.execute("SELECT FROM rc_down WHERE backend = 'tool'").fetchone() is not None


def tool(rid: str, name: str, value: Any) -> Any:
    """A tool call: counted, then refused while the backend is down."""
    ledger(rid, name)
    if backend_down():
        raise ConnectionError(f"{name}: backend down")
    return value


def push(rid: str, order: str, lost_before: bool) -> str:
    """A side effect for ``order`` that goes through on the remote side, then
    its reply is lost while the backend is down (an ambiguous failure:
    reconcile finds it); with ``lost_before`` the request is lost before the
    remote side acts."""
    ledger(rid, "push")
    if lost_before and backend_down():
        raise TimeoutError("push: the request was lost")
    ref = f"push-{order}"
    with _db() as c:
        c.execute("INSERT INTO rc_remote VALUES (%s, %s) ON CONFLICT DO NOTHING", (order, ref))
    if backend_down():
        raise TimeoutError("push: no reply from the backend")
    return ref


def find_push(rid: str, order: str, lost_before: bool) -> Any:
    """Reconcile of push: the remote side's record of ``order``, or NOT_PERFORMED."""
    ledger(rid, "reconcile:push")
    with _db() as c:
        row = c.execute("SELECT ref FROM rc_remote WHERE order_id = %s", (order,)).fetchone()
    return NOT_PERFORMED if row is None else str(row[0])


@app.workflow("uncaught", revision="1")
async def uncaught(ctx: WorkflowContext, spec: dict[str, Any]) -> Any:
    """(a) The step ``fetch`` raises until the backend is fixed; nobody catches it.
    With ``first`` it is the run's first step (its record is checkpoint 1);
    with ``ask`` it comes right after a signal wait (the wake that started it)."""
    rid = ctx.run_id
    got = [] if spec.get("first") else [await ctx.step("prepare", ledger_ok, rid, "prepare")]
    if spec.get("ask"):
        got.append(await ctx.wait_signal("answer", rid, timeout=timedelta(minutes=5)))
    got.append(await ctx.step("fetch", tool, rid, "fetch", spec["topic"], policy=FAST))
    return got


def ledger_ok(rid: str, name: str) -> str:
    ledger(rid, name)
    return name


@app.workflow("caught", revision="1")
async def caught(ctx: WorkflowContext, spec: dict[str, Any]) -> Any:
    """(b) The step ``optional`` raises and the workflow handles it (a
    fallback); later the step ``fetch`` raises and nobody catches it."""
    rid = ctx.run_id
    try:
        extra = await ctx.step("optional", tool, rid, "optional", "extra", policy=FAST)
    except StepFailed as exc:
        extra = f"fallback after {exc.error_type}"
    fetched = await ctx.step("fetch", tool, rid, "fetch", spec["topic"], policy=FAST)
    return [extra, fetched]


@app.workflow("wrapped", revision="1", retry_base=0.01, retry_cap=0.02)
async def wrapped(ctx: WorkflowContext, spec: dict[str, Any]) -> Any:
    """(a) by another name: a handler of the step's ``StepFailed`` that did not
    handle it: it re-raises it (``reraise``), raises its own error from it
    (``wrap-from``) or inside the handler (``wrap-inside``)."""
    rid = ctx.run_id
    try:
        return [await ctx.step("fetch", tool, rid, "fetch", spec["topic"], policy=FAST)]
    except StepFailed as exc:
        if spec["how"] == "reraise":
            raise
        if spec["how"] == "wrap-from":
            raise LookupError(f"could not fetch {spec['topic']}") from exc
        raise LookupError(f"could not fetch {spec['topic']}")  # noqa: B904 (the point)


@app.workflow("after_last", revision="1", retry_base=0.01, retry_cap=0.02)
async def after_last(ctx: WorkflowContext, spec: dict[str, Any]) -> Any:
    """(c) Every step succeeds, a signal is received, then the body itself
    raises while the backend is down (no step failed)."""
    rid = ctx.run_id
    first = await ctx.step("prepare", ledger_ok, rid, "prepare")
    answer = await ctx.wait_signal("answer", rid, timeout=timedelta(minutes=5))
    ledger(rid, "body")
    if backend_down():
        raise RuntimeError("the body failed after its last step")
    return [first, answer]


@app.workflow("reconciled", revision="1")
async def reconciled(ctx: WorkflowContext, spec: dict[str, Any]) -> Any:
    """(d) A reconcile step whose effect goes through but whose reply is lost
    (with ``lost_before``: the request is lost before the remote side acts)."""
    rid = ctx.run_id
    ref = await ctx.step("push", push, rid, spec["order"], bool(spec.get("lost_before")),
                         policy=StepPolicy(
        max_attempts=1, replay="reconcile", reconcile=find_push))
    return {"ref": ref}


@app.workflow("child", revision="1")
async def child(ctx: WorkflowContext, spec: dict[str, Any]) -> Any:
    """A sub-agent: its step raises while the backend is down (unless ``ok``),
    and with ``hold`` it first waits for the signal ``go``."""
    rid = ctx.run_id
    if spec.get("hold"):
        await ctx.wait_signal("go", rid, timeout=timedelta(minutes=5))
    if spec.get("ok"):
        return await ctx.step("work", ledger_ok, rid, "child:work")
    return await ctx.step("work", tool, rid, "child:work", f"child-{spec['i']}", policy=FAST)


@app.workflow("parent", revision="1", retry_base=0.01, retry_cap=0.02)
async def parent(ctx: WorkflowContext, spec: dict[str, Any]) -> Any:
    """(e) Starts its children, gathers them (with ``combine``, then calls a
    tool that is down too), and fails if one failed."""
    ids = [await ctx.start_child("child", {"i": i, **c}, queue=c.get("queue", "default"))
           for i, c in enumerate(spec["children"])]
    outcomes = await ctx.gather(ids)
    if spec.get("combine"):  # a step right after the gather (its wake: the outcomes)
        await ctx.step("combine", tool, ctx.run_id, "combine", len(outcomes), policy=FAST)
    failed = [o for o in outcomes if o["status"] != "completed"]
    if failed:
        raise RuntimeError(f"{len(failed)} child run(s) failed: {failed[0]['error']}")
    return [o["result"] for o in outcomes]


@app.task("charge_task", max_attempts=2, retry_base=0.01, retry_cap=0.02)
async def charge_task(ctx: RunContext, state: Any) -> Any:
    """An ``@app.task`` step with an effect that fails while the backend is down."""
    if ctx.step == 0:
        return Continue({"prepared": True})
    ref = await ctx.effect("charge", lambda: tool(ctx.run_id, "charge", "charged"))
    return Done({"ref": ref})


async def _durable_send(state: Any, context: Any) -> Any:
    rid = context.run.run_id
    sent = await context.effect("send", lambda: tool(rid, "send", "sent"))
    return {**state, "sent": sent}


durable_send = define_durable_task(
    id="durable_send", revision="1", max_attempts=2,
    steps=[DurableStep(id="prepare", run=lambda s, c: {**s, "prepared": True}),
           DurableStep(id="send", run=_durable_send)],
    initial_state={}, is_state=lambda s: isinstance(s, dict))
app.register(durable_send, retry_base=0.01, retry_cap=0.02)
