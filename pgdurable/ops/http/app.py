"""The HTTP endpoints of runs and threads: an ASGI app on Starlette.

``api = pgdurable.http.create_app(app, authorize=my_auth)``; mount it
(``Mount("/agent", api)`` in Starlette, ``fastapi_app.mount("/agent", api)``)
or serve it (``uvicorn mymodule:api``). Paths (thread keys percent-encoded):

=========================================  ======================================================
``POST /runs``                              start a run: ``{"task", "state"?, "queue"?}`` ->
                                            ``{"run_id", "token"}`` (a read token, if secrets)
``GET /runs/{id}``                          ``{"run_id", "status", "result", "error"}``
``GET /runs/{id}/stream``                   the run's stream as Server-Sent Events
``POST /threads/{key}/messages``            ``{"message", "message_id"?, "double_text"?}`` ->
                                            ``{"action", "run_id", "seq", "message_id",
                                            "duplicate", "cursor", "token"}``
``GET /threads/{key}/stream``               the thread's stream as SSE; ``?message=ID``:
                                            exactly that message's answer, until it is
                                            answered (:mod:`pgdurable.runs.live`;
                                            ``?message=latest``: the thread's last
                                            message; 204 when it is answered already).
                                            ``X-PgDurable-Message``: the message followed
                                            (on a 204: the answered one); ``?message=pending``:
                                            the message before the first unanswered one
                                            (the last one when all are answered). Its
                                            ``done`` names the next message: ``{"next"}``.
                                            ``&rollback=end`` (earlier clients): accepted,
                                            a message's stream always ends so now
=========================================  ======================================================

**Who may do what.** Every request is allowed by a **stream token**
(``Authorization: Bearer <token>`` or ``?token=``; ``app.stream_token(...)``,
:mod:`pgdurable.foundation.stream_tokens`) for exactly its run or thread,
``read`` for the GETs, ``write`` for a send (write may read), or else by
``authorize(request, access)``, your hook (sync or async) that returns true
to allow the :class:`Access` (``action``: ``"start"``, ``"read"``,
``"send"``; ``run_id`` / ``thread`` / ``task``), e.g. from your session
cookie. A request neither allows gets ``401`` (no or bad token) or ``403``
(a token for another run, thread or scope; or ``authorize`` said no),
and changes nothing. Starting a run needs ``authorize``. No database role per
browser: the endpoints use the app's pool.

**SSE.** Each event is ``id: <cursor>``, ``event: text | event | done``,
``data: <JSON>``: ``text`` ``{"run_id", "text"}`` (a delta of streamed text),
``event`` ``{"run_id", "seq", "event"}`` (any other stored event: markers
``{"type": "interrupted" | "rollback"}``, the final ``{"type": "end",
"status", "result", "error"}``), ``done`` (a message's answer is
complete: ``{"next": id | null}``, the message sent after it; or the run
ended: ``{}``), ``error`` ``{"error", "terminal"}`` (the stream
cannot go on: ``terminal`` when the run or message does not exist or the cursor
is bad; else transient, e.g. the database unreachable: reconnect from the
cursor). A reconnect with ``Last-Event-ID`` (or
``?after=``) resumes exactly after the last delivered text (cursors:
:mod:`pgdurable.runs.live`). A comment line every ``heartbeat`` seconds
(15) keeps proxies from closing an idle stream. Every stream of this process
follows its run through the process's ONE LISTEN connection
(:mod:`pgdurable.foundation.notifier`), never one connection per browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ...foundation import run_queries as q
from ...foundation.errors import (
    DatabaseUnavailable,
    InvalidInput,
    PgDurableError,
    RunNotFound,
    SignalConflict,
    ThreadBusy,
    UnknownTask,
)
from ...foundation.ports import App
from ...foundation.queries import live as lq
from ...foundation.queries import runs as rq
from ...foundation.queries.core import first
from ...foundation.stream_tokens import Grant, TokenRefused, check_token, make_token, secrets_of
from ...runs.live import Item, follow_run, follow_thread
from ...runs.threads import check_double_text, encode_thread_key

__all__ = ["Access", "create_app"]

log = logging.getLogger("pgdurable.http")



@dataclass(frozen=True)
class Access:
    """What a request asks to do (given to ``authorize``)."""

    action: str  # "start" | "read" | "send"
    run_id: str | None = None
    thread: str | None = None
    task: str | None = None


Authorize = Callable[[Request, Access], bool | Awaitable[bool]]


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class _Api:
    def __init__(self, app: Any, authorize: Authorize | None, heartbeat: float,
                 token_ttl: float) -> None:
        self.app: App = app
        self.durable = app
        self.authorize = authorize
        self.heartbeat = heartbeat
        self.token_ttl = token_ttl

    # -- who may ---------------------------------------------------------------
    def _keys(self) -> tuple[bytes, ...]:
        return secrets_of(getattr(self.durable, "stream_secrets", None))

    def _token(self, request: Request) -> str | None:
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return request.query_params.get("token")

    async def _allow(self, request: Request, access: Access) -> Grant | None:
        token = self._token(request)
        if token is not None:
            grant = check_token(self._keys(), token)  # TokenRefused: 401
            if access.action == "start":
                raise TokenRefused("a stream token cannot start runs", 403)
            if (access.run_id is not None and grant.run_id != access.run_id) or (
                    access.thread is not None and grant.thread != access.thread):
                raise TokenRefused("this stream token is for another run or thread", 403)
            if access.action == "send" and grant.scope != "write":
                raise TokenRefused("this stream token is read-only", 403)
            return grant
        if self.authorize is not None:
            ok = self.authorize(request, access)
            if inspect.isawaitable(ok):
                ok = await ok
            if ok:
                return None
            raise TokenRefused("not allowed", 403)
        raise TokenRefused("a stream token is required (Authorization: Bearer ...)", 401)

    def _new_token(self, **target: Any) -> str | None:
        keys = self._keys()
        if not keys:
            return None
        return make_token(keys, ttl=self.token_ttl, **target)

    # -- endpoints --------------------------------------------------------------
    async def start(self, request: Request) -> Response:
        body = await _json(request)
        task = body.get("task")
        if not isinstance(task, str):
            raise _Refused(400, "task (a str) is required")
        await self._allow(request, Access("start", task=task))
        queue = body.get("queue", "default")
        rid = await self.durable.start(task, body.get("state"), queue=queue)
        return JSONResponse({"run_id": rid, "token": self._new_token(run_id=rid)}, 201)

    async def run(self, request: Request) -> Response:
        rid = _run_id(request)
        await self._allow(request, Access("read", run_id=rid))
        found = await first(self.app, rq.OUTCOME, (rid,))
        if found is None:
            raise RunNotFound(f"no run {rid}")
        error = found.error
        if isinstance(error, dict):
            error = {k: v for k, v in error.items() if k != "traceback"}
        return JSONResponse({"run_id": rid, "status": found.status, "result": found.result,
                             "error": error})

    async def run_stream(self, request: Request) -> Response:
        rid = _run_id(request)
        await self._allow(request, Access("read", run_id=rid))
        after = _after(request)
        if await first(self.app, rq.OUTCOME, (rid,)) is None:
            raise RunNotFound(f"no run {rid}")
        return self._sse(follow_run(self.app, rid, after), done_on_final=True)

    async def send(self, request: Request) -> Response:
        key = request.path_params["key"]
        body = await _json(request)
        await self._allow(request, Access("send", thread=key))
        if "message" not in body:
            raise _Refused(400, "message is required")
        double_text = check_double_text(body.get("double_text"))
        d = await self.durable.send(key, body["message"], message_id=body.get("message_id"),
                                    sender=body.get("sender"), double_text=double_text)
        return JSONResponse({
            "action": d.action, "run_id": d.run_id, "seq": d.seq, "message_id": d.message_id,
            "duplicate": d.duplicate, "cursor": d.cursor,
            "token": self._new_token(thread=key, scope="read")}, 200 if d.duplicate else 201)

    async def thread_stream(self, request: Request) -> Response:
        key = request.path_params["key"]
        await self._allow(request, Access("read", thread=key))
        after = _after(request)
        message = request.query_params.get("message")
        stored = encode_thread_key(key)
        if message == "pending":  # every answer from the one before the first unanswered
            pending = await first(self.app, lq.PENDING_MESSAGE, (stored, stored))
            message = "latest" if pending is None else pending
        if message == "latest":
            latest = await first(self.app, lq.LATEST_MESSAGE, (stored,))
            if latest is None or (latest.answered and after is None):  # nothing to resume
                return Response(status_code=204, headers={} if latest is None else {
                    "X-PgDurable-Message": latest.message_id})
            message = latest.message_id
        headers = {"X-PgDurable-Message": message} if message is not None else {}
        followed = message

        async def done() -> dict[str, Any]:  # the next message's id: its answer follows
            if followed is None:
                return {}
            return {"next": await first(self.app, lq.NEXT_MESSAGE, (stored, followed))}

        return self._sse(follow_thread(self.app, key, after, until=message),
                         done_on_final=False, headers=headers, done=done)

    # -- SSE --------------------------------------------------------------------
    def _sse(self, items: AsyncIterator[Item], *, done_on_final: bool,
             headers: dict[str, str] | None = None,
             done: Callable[[], Awaitable[dict[str, Any]]] | None = None) -> StreamingResponse:
        heartbeat = self.heartbeat

        async def body() -> AsyncIterator[bytes]:
            queue: asyncio.Queue[Item | BaseException | None] = asyncio.Queue(maxsize=256)

            async def pump() -> None:
                try:
                    async for item in items:
                        await queue.put(item)
                    await queue.put(None)
                except Exception as exc:
                    await queue.put(exc)

            task = asyncio.create_task(pump())
            try:
                yield b"retry: 1000\n\n"
                while True:
                    try:
                        async with asyncio.timeout(heartbeat):
                            got = await queue.get()
                    except TimeoutError:
                        yield b": heartbeat\n\n"
                        continue
                    if got is None:
                        yield _frame("done", None, {} if done is None else await done())
                        return
                    if isinstance(got, BaseException):
                        log.warning("stream ended by an error: %s", got)
                        yield _frame("error", None, {"error": _message(got),
                                                     "terminal": _terminal(got)})
                        return
                    yield _item_frame(got)
                    if got.final and done_on_final:
                        yield b"event: done\ndata: {}\n\n"
                        return
            finally:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                with contextlib.suppress(BaseException):
                    await items.aclose()  # type: ignore[attr-defined]

        return StreamingResponse(body(), media_type="text/event-stream", headers={
            "Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})


def _frame(event: str, cursor: str | None, data: Any) -> bytes:
    head = f"id: {cursor}\n" if cursor is not None else ""
    return (head + f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n").encode()


def _item_frame(item: Item) -> bytes:
    if item.kind == "text":
        return _frame("text", item.cursor, {"run_id": item.run_id, "text": item.text})
    return _frame("event", item.cursor, {"run_id": item.run_id, "seq": item.seq,
                                         "event": item.event})


def _terminal(exc: BaseException) -> bool:
    """Whether a stream's error is the request's own (no such run or message, a bad
    cursor): reconnecting cannot help. Anything else (the database unreachable, a
    statement that failed) is transient: the client reconnects from its cursor."""
    return isinstance(exc, RunNotFound | LookupError | InvalidInput | ValueError | TypeError)


def _message(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _run_id(request: Request) -> str:
    try:
        return str(q.check_run_id(request.path_params["run_id"]))
    except (TypeError, ValueError):
        raise _Refused(404, "no such run") from None


def _after(request: Request) -> str | None:
    return request.headers.get("last-event-id") or request.query_params.get("after") or None


async def _json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > 1 << 20:
        raise _Refused(413, "body over 1 MiB")
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        raise _Refused(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise _Refused(400, "the body must be a JSON object")
    return body


def _guard(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def call(request: Request) -> Response:
        try:
            return await handler(request)
        except TokenRefused as exc:
            return _error(exc.status, str(exc))
        except _Refused as exc:
            return _error(exc.status, str(exc))
        except ThreadBusy as exc:
            return _error(409, _message(exc))
        except SignalConflict as exc:
            return _error(409, _message(exc))
        except (RunNotFound, UnknownTask, LookupError) as exc:
            return _error(404, _message(exc))
        except (InvalidInput, ValueError, TypeError) as exc:
            return _error(400, _message(exc))
        except DatabaseUnavailable:
            return _error(503, "database unavailable; the outcome of a write is unknown")
        except PgDurableError as exc:
            log.exception("request failed")
            return _error(500, type(exc).__name__)
    return call


def create_app(app: Any, *, authorize: Authorize | None = None, heartbeat: float = 15.0,
               token_ttl: float = 600.0) -> Starlette:
    """The ASGI app of ``app`` (a :class:`~pgdurable.Durable`): see the module docstring.

    ``heartbeat``: seconds between two SSE comment lines on a quiet stream;
    ``token_ttl``: seconds the read tokens handed out by a start or a send
    last (when the app has stream secrets).
    """
    if not (isinstance(heartbeat, int | float) and heartbeat > 0):
        raise ValueError("heartbeat must be > 0 seconds")
    api = _Api(app, authorize, float(heartbeat), float(token_ttl))
    return Starlette(routes=[
        Route("/runs", _guard(api.start), methods=["POST"]),
        Route("/runs/{run_id}", _guard(api.run), methods=["GET"]),
        Route("/runs/{run_id}/stream", _guard(api.run_stream), methods=["GET"]),
        Route("/threads/{key:path}/messages", _guard(api.send), methods=["POST"]),
        Route("/threads/{key:path}/stream", _guard(api.thread_stream), methods=["GET"]),
    ])
