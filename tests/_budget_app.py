"""A Durable app for the budget fleet test (tests/test_budgets.py).

Run as ``python -m pgdurable.worker _budget_app:app`` with ``PYTHONPATH=tests``
and ``PGDURABLE_DSN`` set to the test database.

* ``draw`` -- two charged steps; each reserves a pseudo-random 18..42 tokens of the
  run's budgets (the amounts follow from the run id and the step, so a replayed
  step asks for the same), holds them for a pseudo-random 0.05-0.4 s (the model
  call), settles a sixth of it and records what it settled in its state
  (``charged``): the checkpoints and the ledger can then be compared.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pgdurable
from pgdurable import Continue, Done, RunContext

app = pgdurable.Durable(pool_size=8)


@app.task("draw", revision="1", max_attempts=20)
async def draw(ctx: RunContext, state: dict[str, Any]) -> Any:
    if len(state.get("charged", [])) >= 2:  # (a park takes a step index too)
        return Done(None)
    rnd = random.Random(f"{ctx.run_id}:{ctx.step}")
    want = rnd.randint(18, 42)
    spend = want // 6
    async with ctx.reserve(tokens=want) as r:
        if not r.replayed:
            await asyncio.sleep(rnd.uniform(0.05, 0.4))
        r.settle(tokens=spend)
    return Continue({"charged": [*state.get("charged", []), spend]})
