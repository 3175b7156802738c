"""A Durable app for tests/test_durable_runs.py and tests/test_effects_crash.py.

``make_app(dsn, hang=...)`` builds the app; the module attribute ``app`` is the
one a worker subprocess loads (``python -m pgdurable.worker
tests._effects_app:app``) with ``PGD_EFFECTS_DSN`` (and ``PGD_EFFECTS_HANG=1``)
in its environment. With ``hang``, the code under test blocks at the crash
point after writing a marker row, so that the parent can SIGKILL the process
exactly there. Every effect, step run and reconcile appends a row to the
scratch table ``public.effect_log(what, run_id)`` through its own connection,
so executions are counted by the database, not by the process that died.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import psycopg

from pgdurable import NOT_PERFORMED, Done, Durable, DurableStep, RunContext, define_durable_task
from pgdurable.models.durable_runs import DurableRunContext

SCRATCH = "CREATE TABLE public.effect_log (id serial PRIMARY KEY, what text NOT NULL, run_id text)"


def log(dsn: str, what: str, run_id: str | None = None) -> int:
    """Append a row to the scratch log; return its id."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            "INSERT INTO public.effect_log (what, run_id) VALUES (%s, %s) RETURNING id",
            (what, run_id),
        ).fetchone()
        assert row is not None
        return int(row[0])


def count(dsn: str, what: str, run_id: str | None = None) -> int:
    """Rows of the scratch log with ``what`` (and ``run_id`` if given)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT count(*) FROM public.effect_log WHERE what = %s "
            "AND (%s::text IS NULL OR run_id = %s::text)",
            (what, run_id, run_id),
        ).fetchone()
        assert row is not None
        return int(row[0])


def _hang() -> None:
    """Block this thread for good (sync code runs in a worker thread)."""
    while True:
        time.sleep(60)


async def _hang_async() -> None:
    """Block this coroutine for good without blocking the event loop, so the
    process's other runs still reach their own crash points."""
    await asyncio.Event().wait()


def is_commit_state(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("count"), int)


def make_app(dsn: str, *, hang: bool = False) -> Durable:
    """The test app: two effect tasks and one durable definition with a reconcile step."""
    app = Durable(dsn, pool_size=4)

    @app.task("charge_then_crash", max_attempts=3)
    async def charge_then_crash(ctx: RunContext, state: Any) -> Any:
        """An effect that completes and is recorded; then (hang) the process dies
        before the step's checkpoint."""

        def charge() -> Any:
            return {"charge_id": log(dsn, "charge", ctx.run_id)}

        result = await ctx.effect("charge", charge)
        if hang:
            log(dsn, "after-effect", ctx.run_id)
            await _hang_async()
        return Done(result=result)

    @app.task("crash_inside_effect", max_attempts=3)
    async def crash_inside_effect(ctx: RunContext, state: Any) -> Any:
        """An effect whose first execution dies inside fn (started, never finished).
        ``state["policy"]`` is "safe" (no reconcile) or "reconcile"."""

        def send() -> Any:
            log(dsn, "send", ctx.run_id)
            if hang:
                _hang()
            return {"sent": True}

        def reconcile() -> Any:
            log(dsn, "reconcile", ctx.run_id)
            if state.get("reconcile_fails"):
                raise RuntimeError("the remote system does not know this message")
            return {"sent": "reconciled"}

        if state.get("policy") == "reconcile":
            result = await ctx.effect("send", send, reconcile=reconcile)
        else:
            result = await ctx.effect("send", send)
        return Done(result=result)

    @app.task("crash_before_send", max_attempts=3)
    async def crash_before_send(ctx: RunContext, state: Any) -> Any:
        """An effect recorded started whose process dies before fn performed it;
        reconcile finds no trace of it and says NOT_PERFORMED."""

        def send() -> Any:
            if hang:
                log(dsn, "entered", ctx.run_id)
                _hang()
            log(dsn, "send", ctx.run_id)
            return {"sent": True}

        def reconcile() -> Any:
            log(dsn, "reconcile", ctx.run_id)
            return NOT_PERFORMED if count(dsn, "send", ctx.run_id) == 0 else {"sent": "found"}

        return Done(result=await ctx.effect("send", send, reconcile=reconcile))

    def prepare(state: Any, context: DurableRunContext) -> Any:
        log(dsn, "prepare", context.run.run_id)
        return {**state, "count": state["count"] + 1}

    def commit(state: Any, context: DurableRunContext) -> Any:
        log(dsn, "commit", context.run.run_id)
        if hang:
            _hang()
        return {**state, "count": state["count"] + 10}

    def reconcile_commit(state: Any, context: DurableRunContext) -> Any:
        log(dsn, "reconcile-commit", context.run.run_id)
        if state.get("reconcile_fails"):
            raise RuntimeError("cannot tell whether the commit happened")
        if count(dsn, "commit", context.run.run_id) == 0:
            raise RuntimeError("no commit found")
        return {**state, "count": state["count"] + 10, "reconciled": True}

    def finish(state: Any, context: DurableRunContext) -> Any:
        log(dsn, "finish", context.run.run_id)
        return {**state, "finished": True}

    app.register(define_durable_task(
        id="commit", revision="1", is_state=is_commit_state, initial_state={"count": 0},
        max_attempts=3,
        steps=[
            DurableStep(id="prepare", run=prepare),
            DurableStep(id="commit", run=commit, replay="reconcile", reconcile=reconcile_commit),
            DurableStep(id="finish", run=finish),
        ],
    ), retry_base=0.0, retry_cap=0.0)

    return app


_DSN = os.environ.get("PGD_EFFECTS_DSN")
app = make_app(_DSN, hang=os.environ.get("PGD_EFFECTS_HANG") == "1") if _DSN else None


def _race(dsn: str, key: str, gate: int) -> None:
    """Open an app, wait at the parent's gate, then call app.with_idempotency(key)."""
    import json

    async def main() -> Any:
        async with Durable(dsn, pool_size=2) as racer:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("SELECT pg_advisory_lock_shared(%s)", (gate,))
                c.execute("SELECT pg_advisory_unlock_shared(%s)", (gate,))

            async def fn() -> Any:
                log(dsn, "race")
                await asyncio.sleep(0.2)
                return {"pid": os.getpid()}

            return await racer.with_idempotency(key, fn)

    print(json.dumps(asyncio.run(main())))


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "race":
        _race(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
