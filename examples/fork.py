"""Fix a run that went wrong: fork it from a recorded step, rewind it, bound its steps.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/fork.py

``agent`` runs four steps; each calls a paid "tool" through ``ctx.effect``
(recorded once per run and key). With a bad prompt its step 3 fails. We fork
the failed run from step 2 with a patched state: the fork continues from
checkpoint 2, so the tool calls of steps 1 and 2 are not paid again (their
effects were carried over) and steps 3 and 4 run. Then we rewind a second
failed run in place. ``wedged`` shows hung-step detection: it stops calling
``ctx.heartbeat`` and is cancelled and retried, then fails (StepHung).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pgdurable
from pgdurable import Continue, Done, RunContext

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL
tool_calls: list[str] = []  # what we "paid" for, in this process


@app.task("agent", max_attempts=1, step_timeout=timedelta(seconds=30))
async def agent(ctx: RunContext, state: dict[str, Any]) -> Any:
    n = ctx.step + 1
    if n == 3 and state["prompt"] == "bad":
        raise ValueError("the model answered nonsense to the bad prompt")

    async def tool() -> str:
        tool_calls.append(f"{ctx.run_id[:8]} step {n}")
        return f"answer {n}"

    answer = await ctx.effect(f"tool-{n}", tool)
    ctx.heartbeat({"step": n})  # progress, visible in pgdurable.runs.progress
    state = {**state, "answers": [*state["answers"], answer]}
    return Done(state["answers"]) if n == 4 else Continue(state)


@app.task("wedged", max_attempts=2, retry_base=0.1, heartbeat_timeout=timedelta(seconds=0.5))
async def wedged(ctx: RunContext, state: Any) -> Any:
    ctx.heartbeat({"phase": "calling a tool that never answers"})
    await asyncio.Event().wait()
    return Done()


async def main() -> None:
    async with app:
        worker = app.worker(concurrency=4, poll_interval=0.2)
        task = asyncio.create_task(worker.run())
        try:
            bad = await app.start("agent", {"prompt": "bad", "answers": []})
            try:
                await app.result(bad, timeout=60)
            except pgdurable.RunFailed as exc:
                print("failed:", exc.error and exc.error["message"])
            paid = len(tool_calls)  # steps 1 and 2
            fork = await app.fork(bad, from_step=2, state={"prompt": "good"})
            print("fork result:", await app.result(fork, timeout=60))
            info = await app.get_run(fork)
            print(f"fork {fork[:8]} of {bad[:8]} at step 2; tool calls paid: {tool_calls}")
            assert len(tool_calls) == paid + 2  # only steps 3 and 4 ran again
            assert (await app.get_run(bad)).status == "failed"  # the source is untouched
            assert info.status == "completed"

            again = await app.start("agent", {"prompt": "bad", "answers": []})
            try:
                await app.result(again, timeout=60)
            except pgdurable.RunFailed:
                pass
            await app.rewind(again, to_step=2, state={"prompt": "good"})  # same run id
            print("rewound result:", await app.result(again, timeout=60))

            hung = await app.start("wedged", {})
            try:
                await app.result(hung, timeout=60)
            except pgdurable.RunFailed as exc:
                print("hung step:", exc.error and exc.error["type"])
                assert exc.error is not None and exc.error["type"] == "StepHung"
        finally:
            await worker.stop()
            await task


if __name__ == "__main__":
    asyncio.run(main())
