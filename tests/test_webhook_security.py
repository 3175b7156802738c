"""The webhook's trust boundary, attacked over real HTTP (uvicorn in this process).

Each test replays what an attacker on the network (or a sender holding one
kind's secret) can do with a captured request; each passed on the app that
signed only the body (issue 12)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from _pgnet import open_server
from psycopg.conninfo import make_conninfo

from pgdurable import Durable
from pgdurable.ops.webhooks import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookApp,
    app,
    canonical_string,
    request_path,
    sign_request,
    signature,
)
from tests.test_webhooks import call, http_scope, park_one, signals

CI = "ci-secret-" + "c" * 32
APPROVAL = "approval-secret-" + "a" * 32


@asynccontextmanager
async def serving(hooks: WebhookApp) -> AsyncIterator[httpx.AsyncClient]:
    """``hooks`` served by uvicorn on a free port; an HTTP client for it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(hooks, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    serve = asyncio.create_task(server.serve())
    while not server.started:
        if serve.done():
            serve.result()
        await asyncio.sleep(0.01)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        await serve
        await hooks.durable.close()


def status_of(conn: psycopg.Connection[Any], rid: Any) -> str:
    row = conn.execute("SELECT status FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone()
    assert row is not None
    return str(row[0])


async def post(client: httpx.AsyncClient, kind: str, ref: str, body: bytes,
               headers: dict[str, str]) -> httpx.Response:
    return await client.post(request_path(kind, ref), content=body, headers=headers)


async def test_a_captured_ci_callback_cannot_approve(dsn: str, conn: psycopg.Connection[Any]) -> None:
    # one secret for both kinds: the signature itself must bind kind and ref
    approval = park_one(conn, "approval", "prod-deploy")
    build = park_one(conn, "ci", "build-7")
    body = b'{"conclusion": "success"}'
    captured = sign_request(CI, "ci", "build-7", body, signal_id="gh-1")
    async with serving(app(Durable(dsn), secret=CI, kinds=["ci", "approval"])) as client:
        for kind, ref in (("approval", "prod-deploy"), ("ci", "build-8"), ("ci", "build-7x")):
            r = await post(client, kind, ref, body, captured)
            assert r.status_code == 401 and "does not match" in r.json()["error"]
        assert signals(conn) == 0 and status_of(conn, approval) == "waiting"
        r = await post(client, "ci", "build-7", body, captured)  # where it was meant to go
        assert (r.status_code, r.json()["woken"]) == (200, [str(build)])
    assert status_of(conn, approval) == "waiting"


async def test_another_idempotency_key_is_another_request(dsn: str,
                                                          conn: psycopg.Connection[Any]) -> None:
    body = b'{"n": 1}'
    captured = sign_request(CI, "ci", "b", body, signal_id="gh-1")
    async with serving(app(Durable(dsn), secret=CI, kinds=["ci"])) as client:
        assert (await post(client, "ci", "b", body, captured)).status_code == 202
        for forged in ({**captured, "Idempotency-Key": "gh-2"},
                       {k: v for k, v in captured.items() if k != "Idempotency-Key"}):
            r = await post(client, "ci", "b", body, forged)
            assert r.status_code == 401
    assert signals(conn) == 1


async def test_a_ci_secret_cannot_take_an_approvals_idempotency_key(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """The CI sender learns (or guesses) the Idempotency-Key the approval will be
    sent with and uses it first: signal ids are scoped by kind, so the real
    approval is still delivered (issue 36: it got 409)."""
    approval = park_one(conn, "approval", "invoice-7")
    hooks = app(Durable(dsn), secrets={"ci": CI, "approval": APPROVAL})
    async with serving(hooks) as client:
        squat = sign_request(CI, "ci", "build-1", b'{"ok": true}', signal_id="approve-7")
        assert (await post(client, "ci", "build-1", b'{"ok": true}', squat)).status_code == 202
        real = sign_request(APPROVAL, "approval", "invoice-7", b'{"amount": 10}',
                            signal_id="approve-7")
        r = await post(client, "approval", "invoice-7", b'{"amount": 10}', real)
        assert (r.status_code, r.json()["woken"]) == (200, [str(approval)])
        # the approval's own key still deduplicates and conflicts within its kind
        r = await post(client, "approval", "invoice-7", b'{"amount": 10}', real)
        assert (r.status_code, r.json()["woken"]) == (200, [str(approval)])
        other = sign_request(APPROVAL, "approval", "invoice-7", b'{"amount": 1000000}',
                             signal_id="approve-7")
        r = await post(client, "approval", "invoice-7", b'{"amount": 1000000}', other)
        assert r.status_code == 409
    row = conn.execute("SELECT wake -> 'payload' FROM pgdurable.runs WHERE id = %s",
                       (approval,)).fetchone()
    assert row == ({"amount": 10},)


async def test_an_empty_body_signature_is_not_a_master_key(dsn: str,
                                                           conn: psycopg.Connection[Any]) -> None:
    rid = park_one(conn, "ci", "other")
    empty = sign_request(CI, "ci", "a", b"")
    async with serving(app(Durable(dsn), secret=CI, kinds=["ci"])) as client:
        r = await post(client, "ci", "other", b"", empty)
        assert r.status_code == 401
        # and the old body-only signature (HMAC of b"") is no signature at all
        r = await post(client, "ci", "other", b"", {**empty, SIGNATURE_HEADER: signature(CI, b"")})
        assert r.status_code == 401
    assert signals(conn) == 0 and status_of(conn, rid) == "waiting"


async def test_timestamps_outside_the_window_are_refused(dsn: str,
                                                         conn: psycopg.Connection[Any]) -> None:
    rid = park_one(conn, "ci", "t")
    hooks = app(Durable(dsn), secret=CI, kinds=["ci"], tolerance=timedelta(minutes=5))
    now = int(time.time())
    async with serving(hooks) as client:
        for ts in (now - 400, now + 3600, now - 86_400, 0):  # expired, future, old, absurd
            r = await post(client, "ci", "t", b"{}", sign_request(CI, "ci", "t", b"{}", timestamp=ts))
            assert r.status_code == 401 and TIMESTAMP_HEADER in r.json()["error"]
        no_ts = {k: v for k, v in sign_request(CI, "ci", "t", b"{}").items() if k != TIMESTAMP_HEADER}
        assert (await post(client, "ci", "t", b"{}", no_ts)).status_code == 401
        # a wrong timestamp header under a right signature: the signature covers it
        signed = sign_request(CI, "ci", "t", b"{}", timestamp=now - 60)
        r = await post(client, "ci", "t", b"{}", {**signed, TIMESTAMP_HEADER: str(now)})
        assert r.status_code == 401
        assert signals(conn) == 0
        r = await post(client, "ci", "t", b"{}", signed)  # inside the window
        assert (r.status_code, r.json()["woken"]) == (200, [str(rid)])


async def test_a_replay_inside_the_window_is_deduplicated(dsn: str,
                                                          conn: psycopg.Connection[Any]) -> None:
    first = park_one(conn, "ci", "r")
    body = b'{"conclusion": "success"}'
    captured = sign_request(CI, "ci", "r", body)  # no Idempotency-Key
    async with serving(app(Durable(dsn), secret=CI, kinds=["ci"])) as client:
        r = await post(client, "ci", "r", body, captured)
        assert (r.status_code, r.json()["woken"]) == (200, [str(first)])
        second = park_one(conn, "ci", "r")  # a later run parks on the same (kind, ref)
        r = await post(client, "ci", "r", body, captured)  # the replay
        assert (r.status_code, r.json()["woken"]) == (200, [str(first)])  # the first answer
        assert status_of(conn, second) == "waiting" and signals(conn) == 1
        # a fresh delivery (signed again) is a new signal and wakes the new waiter
        r = await post(client, "ci", "r", body, sign_request(CI, "ci", "r", body,
                                                             timestamp=int(time.time()) + 1))
        assert (r.status_code, r.json()["woken"]) == (200, [str(second)])
    ids = [row[0] for row in conn.execute("SELECT signal_id FROM pgdurable.signals ORDER BY id")]
    assert len(ids) == 2 and all(i.startswith("v1:") for i in ids)


async def test_the_ci_secret_cannot_sign_approvals(dsn: str, conn: psycopg.Connection[Any]) -> None:
    approval = park_one(conn, "approval", "pr-9")
    body = b'{"approved": true}'
    hooks = app(Durable(dsn), secrets={"ci": CI, "approval": APPROVAL})
    async with serving(hooks) as client:
        r = await post(client, "approval", "pr-9", body, sign_request(CI, "approval", "pr-9", body))
        assert r.status_code == 401
        r = await post(client, "deploy", "x", body, sign_request(CI, "deploy", "x", body))
        assert r.status_code == 403  # a kind with no secret
        assert signals(conn) == 0 and status_of(conn, approval) == "waiting"
        r = await post(client, "approval", "pr-9", body,
                       sign_request(APPROVAL, "approval", "pr-9", body))
        assert (r.status_code, r.json()["woken"]) == (200, [str(approval)])
    # an allow-list: one secret, the listed kinds only
    async with serving(app(Durable(dsn), secret=CI, kinds=["ci"])) as client:
        r = await post(client, "approval", "pr-9", body, sign_request(CI, "approval", "pr-9", body))
        assert r.status_code == 403


def test_secrets_shorter_than_32_bytes_are_refused() -> None:
    durable = Durable("postgresql://localhost/none")
    for weak in ("", "s3cret", "x" * 31, b"y" * 31, "é" * 15):  # "é" * 15 is 30 bytes
        with pytest.raises(ValueError, match="at least 32 bytes"):
            app(durable, secret=weak, kinds=["ci"])
        with pytest.raises(ValueError, match="at least 32 bytes"):
            app(durable, secrets={"ci": CI, "approval": weak})
        with pytest.raises(ValueError, match="at least 32 bytes"):
            sign_request(weak, "ci", "x")
    with pytest.raises(ValueError, match="at least 32 bytes"):
        app(durable, secret=[CI, "short"], kinds=["ci"])  # a rotation list too
    with pytest.raises(TypeError, match="kinds"):
        app(durable, secret=CI)  # which kinds may this secret send?
    with pytest.raises(TypeError):
        app(durable, secret=CI, secrets={"ci": CI})
    app(durable, secret="x" * 32, kinds=["ci"])
    app(durable, secret="é" * 16, kinds=["ci"])  # 32 bytes of UTF-8


def test_bad_arguments_are_typed_errors() -> None:
    durable = Durable("postgresql://localhost/none")
    for kw, error in (
        ({"secret": CI, "kinds": "ci"}, TypeError),            # a str is not a list of kinds
        ({"secret": CI, "kinds": []}, ValueError),
        ({"secret": CI, "kinds": [""]}, ValueError),
        ({"secrets": {}}, TypeError),
        ({"secrets": [("ci", CI)]}, TypeError),
        ({"secrets": {"ci": []}}, TypeError),
        ({"secrets": {"ci": 42}}, TypeError),
        ({"secrets": {"ci": CI}, "kinds": ["ci"]}, TypeError),
        ({"secret": CI, "kinds": ["ci"], "tolerance": timedelta(0)}, ValueError),
        ({"secret": CI, "kinds": ["ci"], "tolerance": 300}, ValueError),
    ):
        with pytest.raises(error):
            app(durable, **kw)
    for args, kw, error in (
        (("ci", "x", "not bytes"), {}, TypeError),
        (("ci", "x", b""), {"signal_id": "a\r\nX-Evil: 1"}, ValueError),  # header injection
        (("ci", "x", b""), {"signal_id": ""}, ValueError),
        (("", "x", b""), {}, ValueError),
        (("ci", "\ud800", b""), {}, ValueError),
        (("ci", "x", b""), {"timestamp": 1.5}, TypeError),
    ):
        with pytest.raises(error):
            sign_request(CI, *args, **kw)


async def test_a_rotation_accepts_either_secret(dsn: str, conn: psycopg.Connection[Any]) -> None:
    new = "new-" + "n" * 32
    async with serving(app(Durable(dsn), secrets={"ci": [new, CI]})) as client:
        for secret, ref in ((CI, "old"), (new, "new")):
            r = await post(client, "ci", ref, b"", sign_request(secret, "ci", ref, b""))
            assert r.status_code == 202
    assert signals(conn) == 2


async def test_the_raw_path_is_decoded_as_utf8(dsn: str, conn: psycopg.Connection[Any]) -> None:
    # some ASGI servers pass non-ASCII bytes of the request line through in
    # raw_path (uvicorn's h11 refuses them): the app read them as Latin-1, so
    # ref "café" became "cafÃ©"
    rid = park_one(conn, "ci", "café/ü")
    hooks = app(Durable(dsn), secret=CI, kinds=["ci"])
    try:
        body = b'{"ok": 1}'
        headers = [(k.lower().encode(), v.encode())
                   for k, v in sign_request(CI, "ci", "café/ü", body, signal_id="u-1").items()]
        scope = http_scope("/signals/ci/caf\u00e9%2F\u00fc", headers=headers)
        scope["raw_path"] = "/signals/ci/café%2Fü".encode()  # UTF-8 bytes, unescaped
        status, answer = await call(hooks, scope, body)
        assert (status, answer) == (200, {"woken": [str(rid)], "pending": False})
        scope["raw_path"] = b"/signals/ci/caf\xe9"  # Latin-1 bytes: not UTF-8
        status, answer = await call(hooks, scope, body)
        assert status == 400 and "UTF-8" in answer["error"]
        # percent-encoded, as httpx and browsers send it
        async with serving(hooks) as client:
            r = await post(client, "ci", "café/ü", body,
                           sign_request(CI, "ci", "café/ü", body, signal_id="u-1"))
            assert r.json() == {"woken": [str(rid)], "pending": False}  # the same signal id
    finally:
        await hooks.durable.close()


def test_the_canonical_string_is_documented() -> None:
    # the exact bytes docs/webhooks.md tells a sender to sign
    canonical = canonical_string(timestamp=1700000000, method="post", kind="ci",
                                 ref="feature/ü x", signal_id="gh-1", body=b'{"a": 1}')
    assert canonical == (b"v1\n1700000000\nPOST\n/signals/ci/feature%2F%C3%BC%20x\ngh-1\n"
                         b'{"a": 1}')
    assert request_path("a-b.c_d~e", "!*'()") == "/signals/a-b.c_d~e/%21%2A%27%28%29"
    headers = sign_request(CI, "ci", "feature/ü x", b'{"a": 1}', signal_id="gh-1",
                           timestamp=1700000000)
    assert headers == {TIMESTAMP_HEADER: "1700000000",
                       SIGNATURE_HEADER: signature(CI, canonical), "Idempotency-Key": "gh-1"}
    assert headers[SIGNATURE_HEADER].startswith("v1=") and len(headers[SIGNATURE_HEADER]) == 67


# -- 5xx: generic bodies, details logged; a 503 says the outcome is unknown -----------


class _CutAfterCommit:
    """A TCP proxy to PostgreSQL that, once armed, lets the client message
    holding ``marker`` (psycopg's Parse of the statement) through, forwards the
    next one (its Bind/Execute/Sync), waits for the server's ReadyForQuery
    (the statement has committed), then closes both sides without relaying
    the answer: a write whose outcome the client cannot know."""

    def __init__(self, host: str, port: int, marker: bytes) -> None:
        self.target = (host, port)
        self.marker = marker
        self.armed = False
        self.cuts = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await open_server(*self.target)
        cut = asyncio.Event()

        async def upstream() -> None:
            marked = False
            while data := await cr.read(65536):
                if marked:  # before the server can answer it
                    cut.set()
                sw.write(data)
                await sw.drain()
                if marked:
                    return
                if self.armed and self.marker in data:
                    self.armed, marked = False, True

        async def downstream() -> None:
            tail = b""
            while data := await sr.read(65536):
                if cut.is_set():  # swallow the answer until the server is idle again
                    tail = (tail + data)[-6:]
                    if tail.endswith(b"Z\x00\x00\x00\x05I"):
                        self.cuts += 1
                        return
                    continue
                cw.write(data)
                await cw.drain()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if cut.is_set():
                await tasks[1]
        finally:
            for t in tasks:
                t.cancel()
            for w in (cw, sw):
                w.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_a_503_after_a_commit_says_the_outcome_is_unknown(
    dsn: str, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture,
) -> None:
    info = conn.info
    proxy = _CutAfterCommit(info.host, info.port, b"send_signal")
    port = await proxy.start()
    proxied = make_conninfo(dsn, host="127.0.0.1", port=str(port), sslmode="disable")
    rid = park_one(conn, "ci", "lost")
    body = b'{"conclusion": "success"}'
    headers = sign_request(CI, "ci", "lost", body, signal_id="gh-lost")
    try:
        async with serving(app(Durable(proxied, pool_size=1), secret=CI, kinds=["ci"])) as client:
            proxy.armed = True
            with caplog.at_level(logging.WARNING, logger="pgdurable.webhooks"):
                r = await post(client, "ci", "lost", body, headers)
            assert proxy.cuts == 1
            assert r.status_code == 503
            error = r.json()["error"]
            # the signal WAS stored and the run woken: "changes nothing" would be a lie
            assert signals(conn) == 1 and status_of(conn, rid) == "runnable"
            assert "outcome is unknown" in error and "same Idempotency-Key" in error
            assert str(port) not in error and "127.0.0.1" not in error  # generic body
            assert "gh-lost" in caplog.text  # the details are logged
            r = await post(client, "ci", "lost", body, headers)  # the advised retry
            assert (r.status_code, r.json()["woken"]) == (200, [str(rid)])
            assert signals(conn) == 1
    finally:
        await proxy.close()


async def test_a_500_is_generic_and_logged(dsn: str, conn: psycopg.Connection[Any],
                                           caplog: pytest.LogCaptureFixture) -> None:
    # a role that may not use the schema: PermissionDenied inside the app
    role = f"pgd_hooks_{uuid.uuid4().hex[:12]}"
    conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        hooks = app(Durable(make_conninfo(dsn, user=role)), secret=CI, kinds=["ci"])
        body = b"{}"
        headers = [(k.lower().encode(), v.encode())
                   for k, v in sign_request(CI, "ci", "x", body).items()]
        with caplog.at_level(logging.ERROR, logger="pgdurable.webhooks"):
            status, answer = await call(hooks, http_scope("/signals/ci/x", headers=headers), body)
        await hooks.durable.close()
        assert status == 500
        assert answer["error"].startswith("internal error") and "permission" not in answer["error"]
        assert "outcome is unknown" in answer["error"]
        assert "permission denied" in caplog.text
    finally:
        conn.execute(f"DROP ROLE {role}")
