"""Helper processes for the signal, webhook and idle-worker tests.

* ``python -m tests._signal_procs send DSN KIND REF PAYLOAD_JSON [SIGNAL_ID]``:
  sends one signal with the sync client, prints the woken ids as JSON.
* ``python -m tests._signal_procs idle DSN POLL WARMUP WINDOW``: runs a worker
  on a queue full of parked runs; after WARMUP seconds it measures, over
  WINDOW seconds, the process CPU time and the statements the worker issued
  (every pool statement goes through ``Durable.fetchone``/``fetchall``), and
  prints them as JSON.
* ``webhook_app()``: the ASGI factory uvicorn serves in the webhook tests
  (DSN from ``PGDURABLE_DSN``, secret from ``PGDURABLE_WEBHOOK_SECRET``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from pgdurable import Done, Durable, DurableClient, RunContext, Wait
from pgdurable.ops.webhooks import WebhookApp
from pgdurable.ops.webhooks import app as make_webhook_app


def send(dsn: str, kind: str, ref: str, payload: str, signal_id: str | None) -> None:
    with DurableClient(dsn) as client:
        woke = client.signal(kind, ref, json.loads(payload), signal_id=signal_id)
    print(json.dumps(woke), flush=True)


class CountingDurable(Durable):
    """A Durable that counts the statements issued through it."""

    statements = 0

    async def fetchone(self, sql: str, params: tuple[Any, ...], *,
                       prepare: bool | None = True) -> tuple[Any, ...] | None:
        CountingDurable.statements += 1
        return await super().fetchone(sql, params, prepare=prepare)

    async def fetchall(self, sql: str, params: tuple[Any, ...], *,
                       prepare: bool | None = True) -> list[tuple[Any, ...]]:
        CountingDurable.statements += 1
        return await super().fetchall(sql, params, prepare=prepare)


def idle(dsn: str, poll: float, warmup: float, window: float) -> None:
    app = CountingDurable(dsn)

    @app.task("parked", revision="1")
    async def parked(ctx: RunContext, state: Any) -> Any:
        if ctx.wake is None:
            return Wait(signal=("never", str(ctx.run_id)))
        return Done(None)

    async def main() -> dict[str, float]:
        worker = app.worker(poll_interval=poll)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(warmup)
        s0, c0, t0 = CountingDurable.statements, time.process_time(), time.monotonic()
        await asyncio.sleep(window)
        s1, c1, t1 = CountingDurable.statements, time.process_time(), time.monotonic()
        await worker.stop(grace=1)
        await task
        await app.close()
        return {"statements": s1 - s0, "cpu": c1 - c0, "wall": t1 - t0,
                "claims": worker.claim_count}

    print(json.dumps(asyncio.run(main())), flush=True)


def webhook_app() -> WebhookApp:
    """The webhook ASGI app under test (uvicorn --factory)."""
    durable = Durable(os.environ["PGDURABLE_DSN"])
    max_payload = int(os.environ.get("PGDURABLE_WEBHOOK_MAX", str(1024 * 1024)))
    return make_webhook_app(durable, secret=os.environ["PGDURABLE_WEBHOOK_SECRET"],
                            kinds=["ci"], max_payload=max_payload)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "send":
        send(args[0], args[1], args[2], args[3], args[4] if len(args) > 4 else None)
    elif cmd == "idle":
        idle(args[0], float(args[1]), float(args[2]), float(args[3]))
    else:
        raise SystemExit(f"unknown command {cmd!r}")
