"""The app benchmarks/throughput.py runs in its worker process.

``python -m pgdurable.worker _throughput_app:app`` with ``PYTHONPATH=benchmarks``
and ``PGDURABLE_DSN`` set. One task, ``noop3``: three no-op steps (two
fenced checkpoints, then the final checkpoint + completion).
"""

from __future__ import annotations

import os
from typing import Any

import pgdurable
from pgdurable import Continue, Done, RunContext

app = pgdurable.Durable(pool_size=int(os.environ.get("BENCH_POOL_SIZE", "8")))


@app.task("noop3", revision="1")
async def noop3(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Step i of 3: no work, just the state transition."""
    i = state.get("i", 0) + 1
    return Done(i) if i >= 3 else Continue({"i": i})
