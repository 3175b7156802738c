"""Webhooks: CI calls back over HTTP, the parked run wakes.

Serve the ASGI app (e.g. behind your reverse proxy)::

    PGDURABLE_DSN=postgresql://... \\
    PGDURABLE_CI_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))') \\
    PGDURABLE_APPROVAL_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))') \\
        uvicorn examples.webhook_app:hooks --host 127.0.0.1 --port 8080

or mount it in FastAPI / Starlette: ``api.mount("/hooks", hooks)``. Each kind
has its own secret (the CI system cannot sign approvals). A sender signs
timestamp, path, signal id and body: ``webhooks.sign_request(secret, kind,
ref, body, signal_id=...)`` returns the headers (``docs/webhooks.md``;
``examples/webhook_sender.py`` computes them by hand).

Run as a script, it serves the app with uvicorn on a free port of 127.0.0.1,
starts a run that waits for CI, and plays the CI system: an unsigned request
(401), a request signed with the CI secret for an approval (401), then the
signed CI callback (200: the run wakes and completes).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn

import pgdurable
from pgdurable import Done, RunContext, Wait, webhooks

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL
# at least 32 bytes each; a fresh random secret when none is configured (the demo)
CI_SECRET = os.environ.get("PGDURABLE_CI_SECRET") or secrets.token_hex(32)
APPROVAL_SECRET = os.environ.get("PGDURABLE_APPROVAL_SECRET") or secrets.token_hex(32)
# the ASGI app: POST /signals/{kind}/{ref}, one secret per kind
hooks = webhooks.app(app, secrets={"ci": CI_SECRET, "approval": APPROVAL_SECRET})


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


@asynccontextmanager
async def serving() -> AsyncIterator[str]:
    """Serve :data:`hooks` with uvicorn and run a worker; yield the base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(hooks, host="127.0.0.1", port=port, log_level="warning"))
    serve = asyncio.create_task(server.serve())
    worker = app.worker()
    working = asyncio.create_task(worker.run())
    try:
        async def started() -> bool:
            return server.started

        await eventually(started)
        yield f"http://127.0.0.1:{port}"
    finally:
        await worker.stop()
        await working
        server.should_exit = True
        await serve
        await app.close()


async def deploy_and_wait(post: Callable[[str], Awaitable[None]]) -> None:
    """Start a deploy of build ``build/42``, let ``post(run_id)`` deliver the CI
    callback, and check that the run completes with it."""
    run_id = await app.start("deploy", {"build": "build/42"})

    async def parked() -> bool:
        return (await app.get_run(run_id)).status == "waiting"

    await eventually(parked)
    await post(run_id)

    async def finished() -> bool:
        return (await app.get_run(run_id)).terminal

    await eventually(finished)
    info = await app.get_run(run_id)
    print("result:", info.result)
    assert info.result == {"build": "build/42", "ci": {"conclusion": "success"}}


async def main() -> None:
    async with serving() as base, httpx.AsyncClient(base_url=base, timeout=30) as http:
        async def post(run_id: str) -> None:
            body = json.dumps({"conclusion": "success"}).encode()
            path = webhooks.request_path("ci", "build/42")  # /signals/ci/build%2F42
            unsigned = await http.post(path, content=body)
            print("unsigned:", unsigned.status_code, unsigned.json())
            assert unsigned.status_code == 401
            forged = await http.post(webhooks.request_path("approval", "build/42"), content=body,
                                     headers=webhooks.sign_request(CI_SECRET, "approval",
                                                                   "build/42", body))
            print("CI secret on an approval:", forged.status_code, forged.json())
            assert forged.status_code == 401
            signed = await http.post(path, content=body, headers=webhooks.sign_request(
                CI_SECRET, "ci", "build/42", body, signal_id="ci-delivery-1"))
            print("signed:", signed.status_code, signed.json())
            assert signed.status_code == 200 and signed.json()["woken"] == [run_id]

        await deploy_and_wait(post)


if __name__ == "__main__":
    asyncio.run(main())
