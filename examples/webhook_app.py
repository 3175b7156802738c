"""Webhooks: CI calls back over HTTP, the parked run wakes.

Serve the ASGI app (e.g. behind your reverse proxy)::

    PGDURABLE_DSN=postgresql://... PGDURABLE_WEBHOOK_SECRET=... \\
        uvicorn examples.webhook_app:hooks --host 127.0.0.1 --port 8080

or mount it in FastAPI / Starlette: ``api.mount("/hooks", hooks)``. A sender
signs the raw body: ``X-Pgdurable-Signature: sha256=<HMAC-SHA256(secret, body)>``
and may set ``Idempotency-Key`` (retries are then delivered once).

Run as a script, it serves the app with uvicorn on a free port of 127.0.0.1,
starts a run that waits for CI, and plays the CI system: one unsigned request
(401) and one signed request (200, the run wakes and completes).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import uvicorn

import pgdurable
from pgdurable import Done, RunContext, Wait, webhooks

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL
SECRET = os.environ.get("PGDURABLE_WEBHOOK_SECRET", "change-me")
hooks = webhooks.app(app, secret=SECRET)  # the ASGI app: POST /signals/{kind}/{ref}


@app.task("deploy", revision="1")
async def deploy(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Wait for the CI build, then finish with its conclusion."""
    if ctx.wake is None:
        return Wait(signal=("ci", state["build"]))
    return Done({"build": state["build"], "ci": ctx.wake["payload"]})


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Poll ``check`` until it holds (a demo; real code reacts to events)."""
    for _ in range(1500):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("condition not reached")


async def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(hooks, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    worker = app.worker()
    working = asyncio.create_task(worker.run())
    try:
        async def started() -> bool:
            return server.started

        await eventually(started)
        run_id = await app.start("deploy", {"build": "build/42"})
        async def parked() -> bool:
            return (await app.get_run(run_id)).status == "waiting"

        await eventually(parked)
        body = json.dumps({"conclusion": "success"}).encode()
        url = f"http://127.0.0.1:{port}/signals/ci/build%2F42"  # ref "build/42"
        async with httpx.AsyncClient(timeout=30) as http:
            unsigned = await http.post(url, content=body)
            print("unsigned:", unsigned.status_code, unsigned.json())
            assert unsigned.status_code == 401
            signed = await http.post(url, content=body, headers={
                webhooks.SIGNATURE_HEADER: webhooks.sign(SECRET, body),
                "Idempotency-Key": "ci-delivery-1"})
            print("signed:", signed.status_code, signed.json())
            assert signed.status_code == 200 and signed.json()["woken"] == [run_id]
        async def finished() -> bool:
            return (await app.get_run(run_id)).terminal

        await eventually(finished)
        info = await app.get_run(run_id)
        print("result:", info.result)
        assert info.result == {"build": "build/42", "ci": {"conclusion": "success"}}
    finally:
        await worker.stop()
        await working
        server.should_exit = True
        await serving
        await app.close()


if __name__ == "__main__":
    asyncio.run(main())
