"""The dashboard's ASGI app: pages, the SSE stream, actions and /metrics.

Pages read the views only (``queue_stats``, ``queue_limits``, ``queue_keys``,
``bucket_levels``, ``run_list``, ``run_detail``, ``run_steps``, ``run_effects``,
``run_lineage``, ``schedule_list``, ``schedule_run_list``, ``active_leases``,
``run_overview``, ``thread_owners``), so the read-only role of ``pgdurable
grant`` is enough. When the role may also read the tables, the run page adds
each step's state change (computed in SQL, cut to what is shown) and the
output stream. A run page shows at most :data:`STEP_PAGE` checkpoints (the
latest; ``?steps_to=N`` pages back), so what a view fetches does not grow
with the run's history.

Who may read: with ``token`` (a session cookie from the login form, or a
bearer header) and/or ``authorize`` (your hook, asked on every request),
every route is guarded; without either, anyone who reaches the server reads
everything, so it then belongs on loopback only (the CLI and :func:`serve`
warn otherwise). Every request's ``Host`` must name a trusted host
(loopback unless ``trusted_hosts`` says more): see :mod:`._auth`.

Actions (cancel, retry, signal a waiting run, fork a run from a step; pause,
resume and trigger a schedule) are off unless ``actions=True``; each POST
must then carry ``token`` (compared in constant time; wrong ones are counted
per client and lock it out) when one is set, pass the hook, and is CSRF-safe:
a form token (HMAC of the action and its subject with a per-process secret,
unreadable cross-site) plus an ``Origin`` (compared with the trusted hosts)
and ``Sec-Fetch-Site`` check. The form is read streamed, at most 64 KiB.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import quote

import jinja2
import psycopg
from markupsafe import Markup
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ...foundation import metrics
from ...foundation import run_queries as rq
from ...foundation.cells import astart_following, astop_following, route_for
from ...foundation.db import acheck_connection, translated, validate_dsn
from ...foundation.errors import (
    DatabaseUnavailable,
    MigrationError,
    PgDurableError,
    RunNotFound,
    ScheduleNotFound,
    SchemaVersionMismatch,
    first_line,
)
from ...foundation.migrations import acheck_pool_schema
from ...foundation.pooler import aprobe
from ...foundation.queries import dashboard as Q
from ...foundation.queries.core import Listing, Query, first, listing, one
from ...foundation.schemas import resolve_schema, use_schema
from ...foundation.signals import parse_payload, signal_run_params
from ...runs.fork import fork_params
from ...runs.schedules import check_schedule_name, resume_schedule_on
from ...runs.search import STATUSES, list_runs_query, make_page
from . import _auth
from ._auth import COOKIE, MAX_FORM_BYTES, Attempts, Authorize, FormTooLarge, Sessions
from ._live import Broadcaster

__all__ = ["Authorize", "create_app", "exposure_warnings", "serve"]

log = logging.getLogger("pgdurable.dashboard")

T = TypeVar("T")

#: Seconds the dashboard waits for its first connection and schema check.
OPEN_TIMEOUT = 30.0
#: Checkpoints a run page shows (the latest; ``?steps_to=N`` pages back).
STEP_PAGE = 50
#: How long a login lasts (seconds), unless ``session_ttl`` says otherwise.
SESSION_TTL = 12 * 3600.0
_INT4_MAX = 2**31 - 1

_ACTIONS = ("cancel", "retry", "signal", "fork")
_SCHEDULE_ACTIONS = ("pause", "resume", "trigger")


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pgdurable.ops.dashboard", "templates"),
        autoescape=True, trim_blocks=True, lstrip_blocks=True,
    )
    env.filters["age"] = _human_age
    env.filters["ts"] = lambda v: "" if v is None else v.strftime("%Y-%m-%d %H:%M:%S")
    env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=1, sort_keys=True, default=str)
    env.filters["jsontext"] = _json_text
    return env


def _json_text(text: str) -> Markup:
    """JSON text (computed and cut in SQL) shown as ``tojson`` shows a value: the
    characters HTML gives a meaning to written as JSON escapes, never as markup."""
    return Markup(text.replace("&", "\\u0026").replace("<", "\\u003c")
                  .replace(">", "\\u003e").replace("'", "\\u0027"))


def _human_age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = float(seconds)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} m {int(s % 60):02d} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} m"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


class _Dashboard:
    def __init__(self, dsn: str, *, actions: bool, token: str | None,
                 authorize: Authorize | None, title: str, hosts: list[str],
                 session_ttl: float, schema: str) -> None:
        self.dsn = validate_dsn(dsn)
        self.schema = schema
        self.actions = actions
        self.token = token
        self.authorize = authorize
        self.title = title
        self.hosts = hosts
        self.secret = secrets.token_bytes(32)
        self.sessions = Sessions(token, session_ttl) if token is not None else None
        self.attempts = Attempts()
        #: where the pool connects: the DSN, or the node a Citus cell moved to
        self.route = route_for(self.dsn, schema)
        self._following: asyncio.Task[None] | None = None
        self.pool: AsyncConnectionPool[Any] = self._new_pool()
        self._opened = False
        self._opening: asyncio.Lock | None = None
        self.live = Broadcaster(self.dsn, schema)
        self.env = _env()
        self.full: bool | None = None

    # -- plumbing -------------------------------------------------------------
    def _new_pool(self) -> AsyncConnectionPool[Any]:
        return AsyncConnectionPool(
            self.route.conninfo, min_size=1, max_size=4, open=False, name="pgdurable-dashboard",
            kwargs={"autocommit": True}, configure=self._configure,
            # a connection the server closed while it sat idle (a restart, a
            # failover to a standby) is replaced, not handed to a page
            check=acheck_connection,
        )

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        use_schema(conn, self.schema)

    async def open(self) -> None:
        """Open the pool and check the schema (at startup, or on first use: a
        mounted app gets no lifespan). Nothing answering at the DSN, a refusal
        and a missing or older schema raise at once (DatabaseUnavailable,
        SchemaVersionMismatch: "run `pgdurable migrate`"); the next request
        tries again with a fresh pool."""
        if self._opened:
            return
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._opened:
                return
            try:
                with translated():
                    await aprobe(self.dsn)  # what does not answer, said at once
                    await self.pool.open(wait=True, timeout=OPEN_TIMEOUT)
                    await acheck_pool_schema(self.pool, OPEN_TIMEOUT)
                    if self._following is None:  # a Citus cell: follow its moves
                        self._following = await astart_following(
                            self.route, self.pool, self.live.reconnect, OPEN_TIMEOUT)
            except BaseException:
                failed, self.pool = self.pool, self._new_pool()  # a failed pool stays closed
                await failed.close()
                raise
            self._opened = True

    async def aclose(self) -> None:
        """Stop the listener and close the pool (a mounted app: call it at shutdown)."""
        await astop_following(self._following)
        self._following = None
        await self.live.close()
        if self._opened:
            await self.pool.close()
            self._opened = False

    async def _pool(self) -> AsyncConnectionPool[Any]:
        if not self._opened:
            await self.open()
        return self.pool

    async def rows(self, query: Listing, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        pool = await self._pool()
        with translated():
            async with pool.connection() as conn:
                return await listing(conn, query, params)

    async def one(self, query: Query[T], params: tuple[Any, ...] | None = None) -> T:
        """The answer of ``query`` (one row), on a pooled connection."""
        pool = await self._pool()
        with translated():
            async with pool.connection() as conn:
                return await one(conn, query, params)

    async def first(self, query: Query[T], params: tuple[Any, ...]) -> T | None:
        """The answer of ``query``, None when it returns no row, on a pooled connection."""
        pool = await self._pool()
        with translated():
            async with pool.connection() as conn:
                return await first(conn, query, params)

    async def can_read_tables(self) -> bool:
        if self.full is None:
            self.full = await self.one(Q.CAN_READ_TABLES)
        return self.full

    def csrf(self, action: str, run_id: str) -> str:
        return hmac.new(self.secret, f"{action}:{run_id}".encode(), hashlib.sha256).hexdigest()

    def schedule_csrf(self, action: str, name: str) -> str:
        return self.csrf(action, _schedule_subject(name))

    def page(self, request: Request, template: str, status_code: int = 200,
             **ctx: Any) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        html = self.env.get_template(template).render(
            root=root, title=self.title, actions=self.actions, need_token=self.token is not None,
            logged_in=self.sessions is not None and self.sessions.valid(
                request.cookies.get(COOKIE)),
            csrf=self.csrf, schedule_csrf=self.schedule_csrf, statuses=STATUSES, path=request.url.path, **ctx)
        return HTMLResponse(html, status_code=status_code, headers=dict(_HEADERS))

    def refuse(self, request: Request, status_code: int, message: str) -> Response:
        """The error page with ``message``."""
        return self.page(request, "error.html", status_code=status_code, message=message)

    # -- pages ----------------------------------------------------------------
    async def queues(self, request: Request) -> Response:
        return self.page(request, "queues.html", queues=await self.rows(Q.QUEUES),
                         limits=await self.rows(Q.QUEUE_LIMITS),
                         keys=await self.rows(Q.QUEUE_KEYS), buckets=await self.rows(Q.BUCKETS),
                         live="all")

    async def schedules(self, request: Request) -> Response:
        schedules = await self.rows(Q.SCHEDULES)
        recent: dict[str, list[dict[str, Any]]] = {}
        for r in await self.rows(Q.SCHEDULE_RUNS, ([s["name"] for s in schedules],)):
            recent.setdefault(r["schedule"], []).append(r)
        for s in schedules:
            s["runs"] = recent.get(s["name"], [])
            s["next_in"] = (s["next_fire_at"] - s["db_now"]).total_seconds()
        return self.page(request, "schedules.html", schedules=schedules, live="all",
                         message=request.query_params.get("done"))

    async def event_log(self, request: Request) -> Response:
        """The newest events and the trigger runs each joined (docs/events.md)."""
        name = request.query_params.get("name") or None
        events = await self.rows(Q.EVENTS, (name, name))
        return self.page(request, "events.html", events=events, name=name or "")

    async def runs(self, request: Request) -> Response:
        p = request.query_params
        form = {k: p.get(k, "") for k in ("status", "task", "queue", "metadata", "since",
                                          "until", "id_prefix", "cursor")}
        filters: dict[str, Any] = {}
        error = None
        try:
            for key in ("status", "task", "queue", "id_prefix", "cursor"):
                if form[key]:
                    filters[key] = form[key]
            if form["metadata"]:
                filters["metadata"] = json.loads(form["metadata"])
            for key in ("since", "until"):
                if form[key]:
                    when = datetime.fromisoformat(form[key])
                    if when.tzinfo is None:
                        raise ValueError(f"{key} needs a time zone offset (e.g. +00:00)")
                    filters[key] = when
            sql, params = list_runs_query(**filters)
        except (TypeError, ValueError) as exc:
            error = str(exc)
            sql, params = list_runs_query()
        page = make_page(await self.rows_tuples(sql, params), int(params[-1]) - 1)
        nxt = None
        if page.next_cursor is not None:
            q = {k: v for k, v in form.items() if v and k != "cursor"}
            q["cursor"] = page.next_cursor
            nxt = "?" + "&".join(f"{k}={_quote(v)}" for k, v in q.items())
        return self.page(request, "runs.html", page=page, form=form, error=error, next=nxt,
                         live="all", status_code=400 if error else 200)

    async def rows_tuples(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        pool = await self._pool()
        with translated():
            async with pool.connection() as conn:
                cur = await conn.execute(sql, params)
                rows: list[tuple[Any, ...]] = await cur.fetchall()
                return rows

    async def run(self, request: Request) -> Response:
        try:
            rid = str(rq.check_run_id(request.path_params["run_id"]))
        except (TypeError, ValueError) as exc:
            return self.page(request, "error.html", status_code=404, message=str(exc))
        found = await self.rows(Q.RUN, (rid,))
        if not found:
            return self.page(request, "error.html", status_code=404, message=f"no run {rid}")
        run = found[0]
        last = int(run["step"])
        asked = request.query_params.get("steps_to", "")
        if asked and not (asked.isdigit() and 1 <= int(asked) <= _INT4_MAX):
            return self.page(request, "error.html", status_code=400,
                             message=f"steps_to must be a step number, not {asked!r}")
        # the shown window: STEP_PAGE checkpoints ending at steps_to (default: the last)
        hi = min(int(asked), last) if asked else last
        lo = max(1, hi - STEP_PAGE + 1)
        steps = await self.rows(Q.STEPS, (rid, lo - 1, hi))
        lineage = await self.rows(Q.LINEAGE, (rid,))
        source = lineage[0] if lineage and lineage[0]["forked_from"] else None
        prev: datetime | None = run["created_at"]
        if source is not None and lo <= 1:  # its first steps were the source's
            prev = source["source_created_at"]  # None: the source was pruned
        if steps and steps[0]["step"] == lo - 1:  # only for the first shown step's duration
            prev = steps.pop(0)["created_at"]
        since = prev if lo > 1 else None
        copied = int(source["forked_from_step"]) if source is not None else 0
        for s in steps:
            if s["step"] > copied and prev is not None:  # this run's own: not before it began
                prev = max(prev, run["created_at"])
            s["duration"] = None if prev is None else (s["created_at"] - prev).total_seconds()
            prev = s["created_at"]
        latest = hi >= last  # the running step's effects are shown with the last page
        until = None if latest or not steps else steps[-1]["created_at"]
        effects = await self.rows(Q.EFFECTS, (
            rid, lo - 1, _INT4_MAX if latest else hi - 1, since, until))
        running = _effects_by_step(steps, effects)
        events: list[dict[str, Any]] | None = None
        result: dict[str, Any] | None = None  # None: this role may not read it
        if await self.can_read_tables():
            changes = {r["step"]: r["change"] for r in await self.rows(Q.FULL_CHANGES,
                                                                        (rid, lo, hi, lo))}
            for s in steps:
                s["change"] = changes.get(s["step"], "{}")
            events = await self.rows(Q.FULL_EVENTS, (rid,))
            result = (await self.rows(Q.FULL_RESULT, (rid,)) or [{"result": None}])[0]
        pages = {"lo": lo, "hi": hi, "earlier": lo - 1 if lo > 1 else None,
                 "later": min(hi + STEP_PAGE, last) if hi < last else None}
        return self.page(
            request, "run.html", run=run, steps=steps, events=events, effects=effects,
            result=result,
            running=running, lineage=lineage[0] if lineage else None, pages=pages,
            forks=await self.rows(Q.FORKS, (rid,)) if lineage and lineage[0]["forks"] else [],
            children=await self.rows(Q.CHILDREN, (rid,)), live=rid,
            spend=await self.rows(Q.RUN_SPEND, (rid,)),
            message=request.query_params.get("done"))

    async def budgets(self, request: Request) -> Response:
        return self.page(request, "budgets.html", budgets=await self.rows(Q.BUDGETS), live="all")

    async def workers(self, request: Request) -> Response:
        return self.page(request, "workers.html", workers=await self.rows(Q.WORKERS), live="all")

    async def leases(self, request: Request) -> Response:
        return self.page(request, "leases.html", leases=await self.rows(Q.LEASES),
                         runs=await self.rows(Q.LEASED_RUNS), threads=await self.rows(Q.THREADS),
                         live="all")

    # -- live -----------------------------------------------------------------
    async def events(self, request: Request) -> Response:
        q = self.live.subscribe()

        async def stream() -> AsyncIterator[str]:
            try:
                yield "retry: 1000\n\n"
                while True:
                    try:
                        async with asyncio.timeout(15.0):
                            msg = await q.get()
                    except TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    yield f"data: {json.dumps(msg)}\n\n"
            finally:
                self.live.unsubscribe(q)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    # -- login ----------------------------------------------------------------
    async def login_form(self, request: Request) -> Response:
        return self._login_page(request, 200, None)

    def _login_page(self, request: Request, status_code: int, message: str | None) -> Response:
        html = self.env.get_template("login.html").render(
            root=request.scope.get("root_path", ""), title=self.title, message=message,
            next=_local_path(request.query_params.get("next", "/")))
        return HTMLResponse(html, status_code=status_code, headers=dict(_HEADERS))

    async def login(self, request: Request) -> Response:
        """Check the token of the login form; on success set the session cookie."""
        assert self.token is not None and self.sessions is not None
        if not _auth.origin_allowed(request, self.hosts):
            return self._login_page(request, 403, "refused: cross-site request")
        form = await self._token_form(request)
        if isinstance(form, Response):
            return form
        if not self._right_token(request, form, "login"):
            return self._login_page(request, 403, "wrong token")
        root = request.scope.get("root_path", "")
        response = RedirectResponse(root + _local_path(form.get("next", "/")), 303)
        response.set_cookie(COOKIE, self.sessions.issue(), max_age=int(self.sessions.ttl),
                            path=root or "/", secure=request.url.scheme == "https",
                            httponly=True, samesite="strict")
        return response

    async def logout(self, request: Request) -> Response:
        root = request.scope.get("root_path", "")
        if not _auth.origin_allowed(request, self.hosts):
            return self.refuse(request, 403, "refused: cross-site request (CSRF check failed)")
        response = RedirectResponse(f"{root}/login", 303)
        response.delete_cookie(COOKIE, path=root or "/", secure=request.url.scheme == "https",
                               httponly=True, samesite="strict")
        return response

    async def _token_form(self, request: Request) -> dict[str, str] | Response:
        """The form of a POST that carries the token: refused (429) while this
        client is locked out, before the form is read (streamed, 64 KiB)."""
        wait = self.attempts.locked(_auth.client_of(request)) if self.token is not None else 0.0
        if wait > 0:
            return self._locked(request, wait)
        try:
            return await _auth.read_form(request)
        except FormTooLarge:
            return self.refuse(request, 413, "form too large")

    def _right_token(self, request: Request, form: dict[str, str], what: str) -> bool:
        """Whether ``form`` carries the token (no token configured: True); a
        wrong one counts against the client."""
        if self.token is None or _auth.same_token(form.get("token", ""), self.token):
            return True
        client = _auth.client_of(request)
        self.attempts.failed(client)
        log.warning("dashboard: wrong %s token from %s", what, client)
        return False

    def _locked(self, request: Request, wait: float) -> Response:
        seconds = max(1, int(wait + 0.999))
        response = self.refuse(request, 429, "refused: too many wrong tokens from this "
                                             f"address; try again in {seconds} s")
        response.headers["Retry-After"] = str(seconds)
        return response

    # -- actions --------------------------------------------------------------
    async def _act_form(self, request: Request, action: str,
                        subject: str | None) -> dict[str, str] | Response:
        """The form of an action POST, when it may act; else the refusal page.

        Checked in this order: the origin (headers only), the client's lockout,
        the form (read streamed, at most 64 KiB), its CSRF token (bound to
        ``action`` and ``subject``; a schedule's subject is in the form: None),
        then the action token (a wrong one counts against the client)."""
        if not _auth.origin_allowed(request, self.hosts):
            return self.refuse(request, 403, "refused: cross-site request (CSRF check failed)")
        form = await self._token_form(request)
        if isinstance(form, Response):
            return form
        if subject is None:
            try:
                subject = _schedule_subject(check_schedule_name(form.get("name")))
            except (TypeError, ValueError) as exc:
                return self.refuse(request, 404, str(exc))
        if not hmac.compare_digest(form.get("csrf", ""), self.csrf(action, subject)):
            return self.refuse(request, 403, "refused: cross-site request (CSRF check failed)")
        if not self._right_token(request, form, "action"):
            return self.refuse(request, 403, "refused: wrong or missing action token")
        return form

    def _disabled(self, request: Request) -> Response:
        return self.page(request, "error.html", status_code=403,
                         message="actions are disabled on this dashboard")

    async def act(self, request: Request) -> Response:
        action = request.path_params["action"]
        if not self.actions or action not in _ACTIONS:
            return self._disabled(request)
        try:
            rid = str(rq.check_run_id(request.path_params["run_id"]))
        except (TypeError, ValueError) as exc:
            return self.page(request, "error.html", status_code=404, message=str(exc))
        form = await self._act_form(request, action, rid)
        if isinstance(form, Response):
            return form
        target = rid
        query: Query[str | None]
        params: tuple[Any, ...]
        try:  # bad input: 400, before any SQL
            if action == "cancel":
                query, params = Q.CANCEL, (rid,)
            elif action == "retry":
                query, params = Q.RETRY, (rid,)
            elif action == "fork":  # no step: where a retry would continue (sql/0030)
                step = (_form_int(form["step"], "step") if form.get("step", "").strip()
                        else None)
                try:
                    patch = json.loads(form["state"]) if form.get("state", "").strip() else None
                except ValueError as exc:
                    raise ValueError(f"the state patch is not JSON: {exc}") from None
                query, params = Q.FORK, fork_params(rid, step, patch, "merge", None, False)
            else:
                query, params = Q.SIGNAL_RUN, signal_run_params(
                    rid, str(form.get("kind", "")) or "approval",
                    parse_payload(str(form.get("payload", ""))), None, None)
        except (TypeError, ValueError) as exc:
            return self.page(request, "error.html", status_code=400, message=str(exc))
        try:
            # (no row: signal_run kept the signal pending for the run)
            answer = await self.first(query, params)
        except RunNotFound as exc:
            return self.page(request, "error.html", status_code=404, message=str(exc))
        except (PgDurableError, TypeError, ValueError) as exc:
            return self.page(request, "error.html", status_code=409, message=str(exc))
        if action == "fork":
            target = str(answer)
            at = await self.one(Q.FORKED_AT, (target,))
            done = f"forked from {rid} at step {at}"
        elif action == "signal":
            done = "signalled (woke the run)" if answer else "signalled (kept pending)"
        else:
            done = str(answer)
        root = request.scope.get("root_path", "")
        return RedirectResponse(f"{root}/runs/{target}?done={_quote(f'{action}: {done}')}", 303)

    async def act_schedule(self, request: Request) -> Response:
        action = request.path_params["action"]
        if not self.actions or action not in _SCHEDULE_ACTIONS:
            return self._disabled(request)
        form = await self._act_form(request, action, None)
        if isinstance(form, Response):
            return form
        name = check_schedule_name(form.get("name"))
        try:
            if action == "pause":
                done = "paused" if await self.one(Q.PAUSE, (name,)) else "was paused already"
            elif action == "resume":
                pool = await self._pool()
                with translated():
                    async with pool.connection() as conn:
                        resumed = await resume_schedule_on(conn, name)
                done = "resumed" if resumed else "was not paused"
            else:
                done = f"started run {await self.one(Q.TRIGGER, (name,))}"
        except ScheduleNotFound as exc:
            return self.page(request, "error.html", status_code=404, message=str(exc))
        except (PgDurableError, ValueError) as exc:
            return self.page(request, "error.html", status_code=409, message=str(exc))
        root = request.scope.get("root_path", "")
        return RedirectResponse(
            f"{root}/schedules?done={_quote(f'{action} {name}: {done}')}", 303)

    async def metrics(self, request: Request) -> Response:
        try:
            registry = metrics.enable(self.dsn, schema=self.schema)
        except ImportError as exc:
            return Response(str(exc), status_code=501, media_type="text/plain")
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        body = await asyncio.to_thread(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)


_HEADERS = {"Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}


async def _favicon(request: Request) -> Response:
    """``/favicon.ico``, which browsers ask for by themselves: the dashboard's icon
    (pages link it as ``/static/favicon.svg``; this answers the ones that guess)."""
    icon = resources.files("pgdurable.ops.dashboard") / "static" / "favicon.svg"
    return Response(icon.read_bytes(), media_type="image/svg+xml",
                    headers={"Cache-Control": "max-age=86400"})


def _quote(value: str) -> str:
    return quote(value, safe="")


def _local_path(value: str) -> str:
    """``value`` if it is a path of this app (no scheme, host or ``//``), else ``/``:
    the login form never redirects elsewhere."""
    if not value.startswith("/") or value.startswith("//") or "\\" in value or any(
            c in value for c in "\r\n"):
        return "/"
    return value


def _form_int(value: str, name: str) -> int:
    text = value.strip()
    if not text.lstrip("-").isdigit() or len(text) > 40:
        raise ValueError(f"{name} must be an integer, not {value[:40]!r}")
    return int(text)


def _schedule_subject(name: str) -> str:
    """What a schedule action's CSRF token is bound to (never a run id)."""
    return f"schedule:{name}"


def _effects_by_step(steps: list[dict[str, Any]],
                     effects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Put each effect under the checkpoint that followed it (``s["effects"]``);
    return those of the step still running (no checkpoint yet).

    ``effects.step`` is the 0-based index of the running step, so an effect
    with step k belongs to checkpoint k + 1; one recorded before 0017 (step
    NULL) to the first checkpoint written after it settled."""
    by_number = {s["step"]: s for s in steps}
    for s in steps:
        s["effects"] = []
    running: list[dict[str, Any]] = []
    for e in effects:
        if e["step"] is not None:
            owner = by_number.get(e["step"] + 1)
        else:
            owner = next((s for s in steps if s["created_at"] >= e["updated_at"]), None)
        (owner["effects"] if owner is not None else running).append(e)
    return running


def create_app(
    dsn: str,
    *,
    actions: bool = False,
    token: str | None = None,
    authorize: Authorize | None = None,
    title: str = "pgdurable",
    trusted_hosts: Sequence[str] | None = None,
    session_ttl: timedelta | float = SESSION_TTL,
    schema: str | None = None,
) -> Starlette:
    """The dashboard as an ASGI app (mount it anywhere, e.g. ``app.mount("/ops", ...)``).

    Who may read: with ``token`` (at least 32 bytes), every route needs a
    session from the login form (``/login``; an HttpOnly, SameSite=Strict
    cookie, signed, valid ``session_ttl``) or ``Authorization: Bearer
    <token>``; with ``authorize``, your hook must return True for every
    request (pages, ``/events``, ``/metrics``, POSTs; both, if both are
    given). With neither, anyone who reaches the server reads everything.

    ``schema`` (else ``PGDURABLE_SCHEMA``, else ``pgdurable``): whose runs it shows
    (:mod:`pgdurable.foundation.schemas`).

    ``trusted_hosts``: the host names the ``Host`` header may name, also the
    only origins a POST is accepted from (default: ``localhost``,
    ``127.0.0.1``, ``[::1]``; ``*.example.com`` for subdomains; ``*``: any).

    ``actions`` enables cancel/retry/signal/fork of runs and pause/resume/
    trigger of schedules; with ``token`` each action's form needs it again.
    ``actions=True`` with neither ``token`` nor ``authorize`` is refused
    (ValueError): an action must be authorized somehow.

    Mounted in another app (which runs no lifespan of a sub-app), the pool
    opens on the first request; close it with ``await
    app.state.dashboard.aclose()`` at shutdown (or run the sub-app's lifespan:
    ``app.router.lifespan_context(app)``).
    """
    if actions and token is None and authorize is None:
        raise ValueError("actions=True needs token= or authorize= (who may act?)")
    token = _auth.check_token(token)
    ttl = session_ttl.total_seconds() if isinstance(session_ttl, timedelta) else session_ttl
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 60 <= ttl <= 366 * 86400:
        raise ValueError("session_ttl must be between 1 minute and 366 days")
    hosts = _auth.trusted_hosts(trusted_hosts)
    d = _Dashboard(dsn, actions=actions, token=token, authorize=authorize, title=title,
                   hosts=hosts, session_ttl=float(ttl), schema=resolve_schema(schema))

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            await d.open()
        except (DatabaseUnavailable, SchemaVersionMismatch, MigrationError) as exc:
            # served anyway: every page says what is wrong, and tries again
            log.warning("pgdurable dashboard: %s", exc)
        try:
            yield
        finally:
            await d.aclose()

    async def unusable(request: Request, exc: Exception) -> Response:
        """A page asked of a database the dashboard cannot use: say why (503)."""
        if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedFunction
                      | psycopg.errors.InvalidSchemaName):
            d._opened = False  # the schema went away under it: check it again next time
            message = (f"the pgdurable schema is missing or incomplete ({first_line(str(exc))}); "
                       "run `pgdurable migrate`")
        else:
            message = str(exc)
        return d.refuse(request, 503, message)

    static = str(resources.files("pgdurable.ops.dashboard") / "static")
    login = [Route("/login", d.login_form), Route("/login", d.login, methods=["POST"]),
             Route("/logout", d.logout, methods=["POST"])] if token is not None else []
    app = Starlette(
        routes=[
            *login,
            Route("/", d.queues), Route("/runs", d.runs), Route("/runs/{run_id}", d.run),
            Route("/runs/{run_id}/{action}", d.act, methods=["POST"]),
            Route("/schedules", d.schedules), Route("/event-log", d.event_log),
            Route("/schedules/{action}", d.act_schedule, methods=["POST"]),
            Route("/workers", d.workers), Route("/leases", d.leases), Route("/budgets", d.budgets), Route("/events", d.events),
            Route("/favicon.ico", _favicon),
            Route("/metrics", d.metrics), Mount("/static", StaticFiles(directory=static)),
        ],
        middleware=[  # outermost first: Host, size, then who is asking
            Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False),
            Middleware(_auth.BodyLimit, cap=MAX_FORM_BYTES),
            Middleware(_auth.Authenticate, sessions=d.sessions, token=token,
                       authorize=authorize, attempts=d.attempts, refuse=d.refuse),
        ],
        lifespan=lifespan,
        exception_handlers={
            DatabaseUnavailable: unusable, SchemaVersionMismatch: unusable,
            MigrationError: unusable, psycopg.errors.UndefinedTable: unusable,
            psycopg.errors.UndefinedFunction: unusable, psycopg.errors.InvalidSchemaName: unusable,
        },
    )
    app.state.dashboard = d
    return app


def exposure_warnings(host: str, *, token: str | None = None,
                      authorize: Authorize | None = None,
                      trusted_hosts: Sequence[str] | None = None) -> list[str]:
    """What is unsafe or surprising about serving the dashboard on ``host`` with
    these options (a bad ``token`` or ``trusted_hosts`` is a ValueError)."""
    _auth.check_token(token)
    _auth.trusted_hosts(trusted_hosts)
    if _auth.is_loopback(host):
        return []
    out = []
    if token is None and authorize is None:
        out.append(
            f"the pgdurable dashboard is served on {host} (not loopback) with no token and no "
            "authorize hook: anyone who can reach it reads every run, error, metadata and "
            "lease. Set --token (token=/authorize=), or serve it on 127.0.0.1 behind a proxy "
            "that authenticates.")
    if trusted_hosts is None:
        out.append(
            f"only the Host names {', '.join(_auth.LOOPBACK_HOSTS)} are trusted: a request "
            "naming this machine otherwise is refused (400). Add --trusted-host NAME "
            "(trusted_hosts=[...]) for each name it is reached by.")
    return out


def serve(dsn: str, *, host: str = "127.0.0.1", port: int = 8080, warn: bool = True,
          **options: Any) -> None:
    """Serve :func:`create_app` with uvicorn until interrupted (``options`` go to
    it). Served on a non-loopback address without a token or hook, it logs a
    warning (``warn=False``: the caller already said it)."""
    import uvicorn

    app = create_app(dsn, **options)
    if warn:
        for message in exposure_warnings(host, token=options.get("token"),
                                         authorize=options.get("authorize"),
                                         trusted_hosts=options.get("trusted_hosts")):
            log.warning("%s", message)
    # SSE streams never end by themselves: give them 3 s on shutdown, then close
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3)
