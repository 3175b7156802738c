"""The webhook ASGI app: end to end through uvicorn in a subprocess, plus the
ASGI protocol details (lifespan, mounting under a root path) in process."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from _waiting import WAIT_LIMIT
from psycopg import sql

from pgdurable import Durable, ProviderClosed
from pgdurable.ops.webhooks import app, request_path, sign_request

SECRET = "s3cret-for-tests-" + "x" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(dsn: str) -> Iterator[str]:
    port = free_port()
    env = dict(os.environ, PGDURABLE_DSN=dsn, PGDURABLE_WEBHOOK_SECRET=SECRET,
               PGDURABLE_WEBHOOK_MAX="1000")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "tests._signal_procs:webhook_app",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > end:
                    out = proc.stdout.read() if proc.stdout else b""
                    raise AssertionError(f"uvicorn did not start: {out!r}") from None
                time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def park_one(conn: psycopg.Connection[Any], kind: str, ref: str) -> uuid.UUID:
    rid = conn.execute("INSERT INTO pgdurable.runs (task, revision, status, lease_owner, "
                       "lease_token, lease_expires_at) VALUES ('t', '1', 'leased', 'w', 1, "
                       "pgdurable.now() + interval '1 hour') RETURNING id").fetchone()[0]  # type: ignore[index]
    conn.execute("SELECT * FROM pgdurable.park_run(%s, 1, 'w', '{}', 0, %s, %s, NULL, NULL)",
                 (rid, kind, ref))
    return rid  # type: ignore[no-any-return]


def post(client: httpx.Client, kind: str, ref: str, body: bytes, *, signed: bool = True,
         signal_id: str | None = None, secret: str = SECRET) -> httpx.Response:
    """POST ``body`` to ``request_path(kind, ref)``, signed with ``secret`` unless not ``signed``."""
    h = sign_request(secret, kind, ref, body, signal_id=signal_id) if signed else {}
    return client.post(request_path(kind, ref), content=body, headers=h)


def signals(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute("SELECT count(*) FROM pgdurable.signals").fetchone()[0])  # type: ignore[index]


def test_webhook_end_to_end(server: str, conn: psycopg.Connection[Any]) -> None:
    rid = park_one(conn, "ci", "build-7")
    slash = park_one(conn, "ci", "feature/x")
    with httpx.Client(base_url=server, timeout=30) as client:
        # errors first: each changes nothing
        body = b'{"conclusion": "success"}'
        r = post(client, "ci", "build-7", body, signed=False)
        assert r.status_code == 401 and "missing" in r.json()["error"]
        r = post(client, "ci", "build-7", body, secret="wrong-" + "y" * 32)
        assert r.status_code == 401 and "does not match" in r.json()["error"]
        r = client.post("/signals/ci/build-7", content=body + b" ",
                        headers=sign_request(SECRET, "ci", "build-7", body))  # body tampered
        assert r.status_code == 401
        assert post(client, "ci", "build-7", b"{not json").status_code == 400
        assert post(client, "ci", "build-7", b'"nul \\u0000"').status_code == 400
        assert post(client, "ci", "build-7", b'"lone \\ud800"').status_code == 400
        assert post(client, "ci", "build-7", b"[NaN]").status_code == 400
        big = json.dumps({"x": "y" * 2000}).encode()
        assert post(client, "ci", "build-7", big).status_code == 413
        assert client.get("/signals/ci/build-7").status_code == 405
        assert client.get("/signals/ci/build-7").headers["allow"] == "POST"
        assert client.post("/nope", content=body).status_code == 404
        assert client.post("/signals/ci", content=body).status_code == 404
        r = client.post("/signals//build-7", content=body)
        assert r.status_code == 400 and r.json()["error"]
        r = client.post("/signals/ci/build-7", content=body,
                        headers={**sign_request(SECRET, "ci", "build-7", body),
                                 "Idempotency-Key": ""})
        assert r.status_code == 400 and "empty" in r.json()["error"]
        r = post(client, "approval", "build-7", body)  # a kind this secret may not send
        assert r.status_code == 403
        assert signals(conn) == 0
        assert conn.execute("SELECT status FROM pgdurable.runs WHERE id = %s",
                            (rid,)).fetchone() == ("waiting",)
        # a signed signal wakes the run; a retry with the same key gets the same answer
        r = post(client, "ci", "build-7", body, signal_id="gh-1")
        assert r.status_code == 200 and r.json() == {"woken": [str(rid)], "pending": False}
        r = post(client, "ci", "build-7", body, signal_id="gh-1")
        assert r.status_code == 200 and r.json()["woken"] == [str(rid)]
        r = client.post("/signals/ci/build-7", content=b"{}", headers={
            **{k: v for k, v in sign_request(SECRET, "ci", "build-7", b"{}",
                                             signal_id="gh-1").items()
               if k != "Idempotency-Key"}, "X-Signal-Id": "gh-1"})
        assert r.status_code == 409
        assert signals(conn) == 1
        # percent-encoded ref; no waiting run -> 202, kept pending
        r = post(client, "ci", "feature/x", b"")
        assert r.status_code == 200 and r.json()["woken"] == [str(slash)]
        r = post(client, "ci", "not-yet", b'{"early": true}')
        assert r.status_code == 202 and r.json() == {"woken": [], "pending": True}
    wake = conn.execute("SELECT wake FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone()[0]  # type: ignore[index]
    assert wake["payload"] == {"conclusion": "success"} and wake["kind"] == "ci"
    assert conn.execute("SELECT count(*) FROM pgdurable.signals WHERE consumed_at IS NULL "
                        "AND ref = 'not-yet'").fetchone() == (1,)


async def call(asgi: Any, scope: dict[str, Any], body: bytes = b"") -> tuple[int, Any]:
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asgi(scope, receive, send)
    status = sent[0]["status"]
    return status, json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def http_scope(path: str, root_path: str = "", headers: list[tuple[bytes, bytes]] | None = None,
               method: str = "POST") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
            "root_path": root_path, "headers": headers or [], "query_string": b""}


async def test_lifespan_and_mounting(dsn: str, conn: psycopg.Connection[Any]) -> None:
    durable = Durable(dsn)
    hooks = app(durable, secret=SECRET, kinds=["approval"], close_on_shutdown=True)
    inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    out: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return inbox.pop(0)

    async def send(message: dict[str, Any]) -> None:
        out.append(message)
        if message["type"] == "lifespan.startup.complete":
            # mounted under /hooks (Starlette keeps the full path and sets root_path)
            rid = park_one(conn, "approval", "pr-5")
            body = b'{"approved": true}'
            status, answer = await call(hooks, http_scope(
                "/hooks/signals/approval/pr-5", "/hooks",
                signed_headers("approval", "pr-5", body)), body)
            assert (status, answer) == (200, {"woken": [str(rid)], "pending": False})

    await hooks({"type": "lifespan"}, receive, send)
    assert [m["type"] for m in out] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    with pytest.raises(ProviderClosed):  # closed on shutdown
        await durable.signal("k", "r")


def signed_headers(kind: str, ref: str, body: bytes, secret: str = SECRET,
                   **kw: Any) -> list[tuple[bytes, bytes]]:
    """ASGI headers of a request signed by :func:`sign_request`."""
    return [(k.lower().encode(), v.encode())
            for k, v in sign_request(secret, kind, ref, body, **kw).items()]


def test_app_arguments() -> None:
    with pytest.raises(TypeError):
        app(object(), secret=SECRET, kinds=["ci"])  # type: ignore[arg-type]
    durable = Durable("postgresql://localhost/none")
    with pytest.raises(ValueError):
        app(durable, secret="", kinds=["ci"])
    with pytest.raises(ValueError):
        app(durable, secret=SECRET, kinds=["ci"], max_payload=0)


async def test_streamed_body_over_limit_is_refused(dsn: str, conn: psycopg.Connection[Any]) -> None:
    hooks = app(Durable(dsn), secret=SECRET, kinds=["ci"], max_payload=100,
                close_on_shutdown=True)
    chunks = [b"[" + b"1," * 30, b"1," * 30, b"1]"]  # no Content-Length, 125 bytes in 3 parts
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    body = b"".join(chunks)
    await hooks(http_scope("/signals/ci/x", headers=signed_headers("ci", "x", body)),
                receive, send)
    assert sent[0]["status"] == 413
    assert conn.execute("SELECT count(*) FROM pgdurable.signals").fetchone() == (0,)
    await hooks.durable.close()

# -- a review: a deeply nested body and a server-side timeout were plain-text 500s


def run_status(conn: psycopg.Connection[Any], rid: uuid.UUID) -> str:
    return str(conn.execute("SELECT status FROM pgdurable.runs WHERE id = %s",
                            (rid,)).fetchone()[0])  # type: ignore[index]


async def asgi_call(hooks: Any, path: str, body: bytes) -> tuple[int, Any]:
    """POST a signed ``body`` to ``path`` (``/signals/KIND/REF``) through the ASGI interface."""
    kind, ref = path.split("/")[2:4]
    return await call(hooks, http_scope(path, headers=signed_headers(kind, ref, body)), body)


async def test_webhook_deeply_nested_body_is_a_400(dsn: str, conn: psycopg.Connection[Any]) -> None:
    rid = park_one(conn, "ci", "deep")
    hooks = app(Durable(dsn), secret=SECRET, kinds=["ci"])
    try:
        # a signed, well-formed JSON body of 10 kB: the app raised RecursionError
        # (the server's plain-text 500) instead of answering 400 in JSON
        status_code, answer = await asgi_call(hooks, "/signals/ci/deep",
                                              b"[" * 5000 + b"]" * 5000)
        assert status_code == 400 and "nested too deeply" in answer["error"]
        assert signals(conn) == 0 and run_status(conn, rid) == "waiting"
        status_code, answer = await asgi_call(hooks, "/signals/ci/deep", b"[[[]]]")
        assert (status_code, answer) == (200, {"woken": [str(rid)], "pending": False})
    finally:
        await hooks.durable.close()


async def test_webhook_lock_timeout_is_a_503_json(dsn: str, conn: psycopg.Connection[Any]) -> None:
    # a server-side timeout the operator configured (lock_timeout here; also
    # statement_timeout, a deadlock or serialization failure) is not translated
    # by pgdurable: the app let the raw psycopg error escape (the server's
    # plain-text 500) instead of its documented JSON 503 "retry later"
    rid = park_one(conn, "ci", "busy")
    db = conn.info.dbname
    conn.execute(sql.SQL("ALTER DATABASE {} SET lock_timeout = 50").format(sql.Identifier(db)))
    hooks = app(Durable(dsn), secret=SECRET, kinds=["ci"])
    try:
        with psycopg.connect(dsn) as holder:  # another sender of (ci, busy), mid-transaction
            holder.execute("SELECT pg_advisory_xact_lock(pgdurable.wait_lock_key('ci', 'busy'))")
            async with asyncio.timeout(WAIT_LIMIT):  # a bound against a hang, not a measure
                status_code, answer = await asgi_call(hooks, "/signals/ci/busy", b'{"n": 1}')
            holder.rollback()
        # a generic body that tells the sender what to do (the details are logged)
        assert status_code == 503 and "retry with the same Idempotency-Key" in answer["error"]
        assert signals(conn) == 0 and run_status(conn, rid) == "waiting"
        status_code, answer = await asgi_call(hooks, "/signals/ci/busy", b'{"n": 1}')
        assert (status_code, answer) == (200, {"woken": [str(rid)], "pending": False})
    finally:
        await hooks.durable.close()
