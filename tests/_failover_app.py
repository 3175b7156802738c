"""The app of the failover tests (tests/test_failover.py): multi-step runs with a signal.

Run by the fleet as ``python -m pgdurable.worker _failover_app:app`` with
``PGDURABLE_DSN`` the pair's multi-host DSN. A ``chain`` run takes ``n`` steps;
at step ``wait_at`` it parks on the signal ``("go", <its id>)`` (sent by the
test, possibly before it parks) and goes on when it comes. Its state keeps the
path of steps the database accepted (``path``): the result is that path, so a
step accepted twice or skipped shows in it.

Every step start is appended to ``$FAILOVER_LOG`` (one file per worker:
``time run_id i token pid``) before the step does anything: a step that starts
with ``i`` accepted steps proves the checkpoint of step ``i - 1`` committed and
was acknowledged to the worker (the worker runs the next step only after its
write returned). The test reads these lines to see which checkpoints were
acknowledged before the primary stopped, and which steps ran again.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pgdurable
from pgdurable import Continue, Done, RunContext, Wait

app = pgdurable.Durable(pool_size=4)


def _note(ctx: RunContext, i: int) -> None:
    path = os.environ.get("FAILOVER_LOG")
    if path:
        with open(path, "a") as f:  # one short line, appended whole (O_APPEND)
            f.write(f"{time.time():.6f} {ctx.run_id} {i} {ctx.token} {os.getpid()}\n")


@app.task("chain", revision="1")
async def chain(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Step ``i`` of ``n``; parks once on ``("go", run id)`` at ``wait_at``."""
    path: list[int] = list(state.get("path", []))
    i = len(path)
    if i == state["wait_at"] and ctx.wake is None:
        return Wait(signal=("go", str(ctx.run_id)), state=state)
    _note(ctx, i)
    await asyncio.sleep(float(state.get("sleep", 0.02)))
    new = {**state, "path": [*path, i]}
    if i + 1 >= int(state["n"]):
        return Done({"path": new["path"]}, state=new)
    return Continue(new)
