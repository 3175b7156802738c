"""A Durable app for tests/test_schemas.py's worker processes: its schema is
``PGDURABLE_SCHEMA`` (each process of the test is started with one), and its one
task says which worker process ran it and in which schema."""

from __future__ import annotations

import os
from typing import Any

import pgdurable
from pgdurable import Done, RunContext, Wait

app = pgdurable.Durable(pool_size=4)


@app.task("whoami")
async def whoami(ctx: RunContext, state: dict[str, Any]) -> Any:
    if "wait_for" in state and not state.get("woken"):
        state["woken"] = True
        return Wait(("go", state["wait_for"]), timeout=120)
    return Done({"worker": os.environ.get("FLEET_WORKER"), "schema": app.schema,
                 "wake": ctx.wake})
