"""Idempotent side effects: many concurrent callers, one execution.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/idempotency.py
"""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import timedelta
from typing import Any

from pgdurable import EffectFailed, with_idempotency

executions: list[str] = []


async def send_invoice() -> dict[str, Any]:
    executions.append("sent")
    await asyncio.sleep(0.1)  # the slow external call
    return {"invoice": "inv_123", "status": "sent"}


async def flaky() -> None:
    raise ConnectionError("gateway timeout")


async def main() -> None:
    dsn = os.environ["PGDURABLE_DSN"]
    key = f"invoice:{uuid.uuid4()}"
    results = await asyncio.gather(
        *(with_idempotency(dsn, key, send_invoice, ttl=timedelta(days=1)) for _ in range(5))
    )
    print(results[0], "executions:", len(executions))  # {... 'sent'} executions: 1

    bad_key = f"refund:{uuid.uuid4()}"
    try:
        await with_idempotency(dsn, bad_key, flaky)
    except ConnectionError as exc:
        print("first caller:", repr(exc))
    try:
        await with_idempotency(dsn, bad_key, flaky)
    except EffectFailed as exc:
        print("later caller:", exc.error)


if __name__ == "__main__":
    asyncio.run(main())
