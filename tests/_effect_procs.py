"""Subprocess helpers for tests/test_tasks.py and tests/test_idempotency.py.

Run as ``python tests/_effect_procs.py <command> <args...>``. Each command
talks to the test database only through pgdurable and plain SQL on scratch
tables the parent test created in schema ``public``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import psycopg

from pgdurable import (
    DurableStep,
    PostgresDurableStore,
    define_durable_task,
    with_idempotency,
    with_idempotency_sync,
)

GATE_KEY = 4242  # advisory lock the parent holds until every child is ready
STEP_GATE_KEY = 777  # advisory lock a step waits on (exclusivity test)


def is_count(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("count"), int)


def _sql(dsn: str, query: str, args: tuple[Any, ...] = ()) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(query, args)


def _pass_gate(dsn: str, key: int) -> None:
    """Block until the parent releases advisory lock ``key`` (shared, so all pass)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_advisory_lock_shared(%s)", (key,))
        c.execute("SELECT pg_advisory_unlock_shared(%s)", (key,))


# ---------------------------------------------------------------- tasks
def reconcile_crash(dsn: str, task_id: str) -> None:
    """A reconcile step that commits its effect, then hangs until SIGKILLed."""

    def commit(state: Any, _ctx: Any) -> Any:
        _sql(dsn, "INSERT INTO committed (key, value) VALUES (%s, %s)", (task_id, state["count"] + 1))
        while True:
            time.sleep(60)

    def reconcile(state: Any, _ctx: Any) -> Any:
        raise AssertionError("the crashing process never reconciles")

    task = define_durable_task(
        id="count", revision="1", is_state=is_count, initial_state={"count": 0},
        steps=[DurableStep(id="commit", run=commit, replay="reconcile", reconcile=reconcile)],
    )

    async def main() -> None:
        async with PostgresDurableStore(dsn) as store:
            await task.run(task_id=task_id, store=store)

    asyncio.run(main())


def exclusive(dsn: str, task_id: str, who: str, fail_at: str, gate: str) -> None:
    """Three logged steps; optionally wait on a gate in s1 and fail at a step."""

    def make(step_id: str) -> Any:
        def run(state: Any, _ctx: Any) -> Any:
            _sql(dsn, "INSERT INTO step_log (who, step, phase) VALUES (%s, %s, 'start')",
                 (who, step_id))
            if step_id == "s1" and gate == "gate":
                _pass_gate(dsn, STEP_GATE_KEY)
            if step_id == fail_at:
                raise RuntimeError(f"{who} fails at {step_id}")
            _sql(dsn, "INSERT INTO step_log (who, step, phase) VALUES (%s, %s, 'end')",
                 (who, step_id))
            return {"count": state["count"] + 1, "by": [*state.get("by", []), who]}

        return run

    task = define_durable_task(
        id="exclusive", revision="1", is_state=is_count, initial_state={"count": 0},
        steps=[DurableStep(id=s, run=make(s)) for s in ("s1", "s2", "s3")],
    )

    async def main() -> int:
        async with PostgresDurableStore(dsn) as store:
            try:
                state = await task.run(task_id=task_id, store=store)
            except RuntimeError:
                return 3
            print(json.dumps(state))
            return 0

    sys.exit(asyncio.run(main()))


# ---------------------------------------------------------------- effects
def idem(dsn: str, key: str, mode: str) -> None:
    """Pass the gate, then race with_idempotency on ``key``; print the result."""

    def effect() -> Any:
        _sql(dsn, "INSERT INTO executions (key, pid) VALUES (%s, %s)", (key, os.getpid()))
        time.sleep(0.2)  # let the others pile up as waiters (not a correctness threshold)
        return {"executed_by": os.getpid()}

    _pass_gate(dsn, GATE_KEY)
    if mode == "sync":
        result = with_idempotency_sync(dsn, key, effect)
    else:
        result = asyncio.run(with_idempotency(dsn, key, effect))
    print(json.dumps(result))


def idem_hang(dsn: str, key: str, phase: str = "acted") -> None:
    """Claim ``key`` with a 1 s lease, then hang in fn (to be killed): after
    recording the execution (``acted``), or before acting, having only
    recorded that it entered fn (``entered``, in scratch table ``entered``)."""

    def effect() -> Any:
        if phase == "acted":
            _sql(dsn, "INSERT INTO executions (key, pid) VALUES (%s, %s)", (key, os.getpid()))
        else:
            _sql(dsn, "INSERT INTO entered (key) VALUES (%s)", (key,))
        while True:
            time.sleep(60)

    with_idempotency_sync(dsn, key, effect, lease=1.0)


def idem_interrupted(dsn: str, via: str, key: str, mode: str) -> None:
    """with_idempotency on ``key`` through conninfo ``via`` (the parent's proxy),
    lease 1.5 s; fn records its execution (on ``dsn``) and returns. The parent
    interrupts this process (SIGINT) while the outcome is being recorded."""

    def effect() -> Any:
        _sql(dsn, "INSERT INTO executions (key, pid) VALUES (%s, %s)", (key, os.getpid()))
        return {"charged": os.getpid()}

    if mode == "sync":
        result = with_idempotency_sync(via, key, effect, lease=1.5)
    else:
        result = asyncio.run(with_idempotency(via, key, effect, lease=1.5))
    print(json.dumps(result))


COMMANDS = {
    "reconcile-crash": reconcile_crash,
    "exclusive": exclusive,
    "idem": idem,
    "idem-hang": idem_hang,
    "idem-interrupted": idem_interrupted,
}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])  # type: ignore[operator]
