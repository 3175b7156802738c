"""Per-step cost of the liveness guard (pgdurable/runs/liveness.py), in process.

Runs a trivial async step 100,000 times bare (the baseline), inside a guard
without limits, and inside a guard with step_timeout and heartbeat_timeout;
prints the added microseconds per step and the ratio to the baseline.
Usage: python benchmarks/step_guard.py (no database needed; a few seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from pgdurable.runs.liveness import StepGuard
from pgdurable.runs.steps import RunContext

N = 100_000


async def step(ctx: RunContext, state: Any) -> Any:
    return state


async def main() -> None:
    ctx = RunContext(run_id="x", task="t", step=0, attempt=1, token=1, wake=None,
                     deadline=None, budget=None, spent=0.0)
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(N):
            async with contextlib.nullcontext():
                await step(ctx, 1)
        base = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(N):
            async with StepGuard(ctx, None, None):
                await step(ctx, 1)
        none = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(N):
            async with StepGuard(ctx, 120.0, 30.0):
                await step(ctx, 1)
        both = time.perf_counter() - t0
        print(f"per step: baseline {base / N * 1e6:.2f} us; no limits +{(none - base) / N * 1e6:.2f} us "
              f"({none / base:.2f}x); both limits +{(both - base) / N * 1e6:.2f} us "
              f"({both / base:.2f}x)")


if __name__ == "__main__":
    asyncio.run(main())
