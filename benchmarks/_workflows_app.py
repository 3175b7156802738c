"""The app benchmarks/workflows.py runs in its worker process (and in-process).

``python -m pgdurable.worker _workflows_app:app`` with ``PYTHONPATH=benchmarks``
and ``PGDURABLE_DSN`` set. The same logic twice on one app: ``noop3`` (the
task of benchmarks/_throughput_app.py: three no-op steps, two checkpoints then
checkpoint + completion) and ``wf3`` (a workflow: three no-op recorded steps,
then the completion: four writes) and ``wf3f`` (the same, its last step by
``ctx.finish``: the last checkpoint and the completion in one write, three
writes like the task). ``long`` records ``n`` steps, parks on a signal, then
records one more step.
"""

from __future__ import annotations

import time
from typing import Any

from _throughput_app import app, noop3

from pgdurable import WorkflowContext

__all__ = ["app", "first_new_step", "noop3"]

#: monotonic time at which the first new step after the resume of ``long`` ran
first_new_step: dict[str, float] = {}


async def anoop(i: int) -> int:
    return i


@app.workflow("wf3", revision="1")
async def wf3(ctx: WorkflowContext, _: Any) -> int:
    """Three recorded no-op steps (async fns, like noop3's async step)."""
    a = await ctx.step("a", anoop, 1)
    b = await ctx.step("b", anoop, a + 1)
    return await ctx.step("c", anoop, b + 1)


@app.workflow("wf3f", revision="1")
async def wf3f(ctx: WorkflowContext, _: Any) -> int:
    """wf3 with ``ctx.finish`` as its last step (the task's ``Done``)."""
    a = await ctx.step("a", anoop, 1)
    b = await ctx.step("b", anoop, a + 1)
    return await ctx.finish("c", anoop, b + 1)


def _mark(run_id: str) -> int:
    first_new_step.setdefault(run_id, time.monotonic())
    return 0


@app.workflow("long", revision="1")
async def long(ctx: WorkflowContext, n: int) -> int:
    """``n`` recorded steps, a park, then the first new step (timed)."""
    for i in range(n):
        await ctx.step(f"s{i}", anoop, i)
    await ctx.wait_signal("go", ctx.run_id)
    return await ctx.step("after", _mark, ctx.run_id)
