"""The dashboard's ASGI app: pages, the SSE stream, actions and /metrics.

Pages read the views only (``queue_stats``, ``queue_limits``, ``queue_keys``,
``bucket_levels``, ``run_list``, ``run_detail``, ``run_steps``, ``run_effects``,
``run_lineage``, ``schedule_list``, ``schedule_run_list``, ``active_leases``,
``run_overview``, ``thread_owners``), so the read-only role of ``pgdurable
grant`` is enough. When the role may also read the tables, the run page adds
each step's state change and the output stream.

Actions (cancel, retry, signal a waiting run, fork a run from a step; pause,
resume and trigger a schedule) are off unless
``actions=True``; each POST must then pass ``authorize(request)`` (your hook:
sessions, SSO...) and/or carry ``token`` (compared in constant time), and is
CSRF-safe: a form token (HMAC of the action and its subject with a per-process
secret, unreadable cross-site) plus an ``Origin``/``Sec-Fetch-Site`` check.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote

import jinja2
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import _runs_sql as rq
from .. import metrics
from .._db import translated, validate_dsn
from ..errors import PgDurableError, RunNotFound, ScheduleNotFound
from ..fork import FORK, FORKED_AT, fork_params
from ..runs import RETRY
from ..schedules import PAUSE, TRIGGER, check_schedule_name, resume_schedule_on
from ..search import STATUSES, list_runs_query, make_page
from ..signals import parse_payload, signal_run_params
from . import _queries as Q
from ._live import Broadcaster

__all__ = ["Authorize", "create_app", "serve"]

#: ``authorize(request) -> bool`` (or awaitable): may this request act?
Authorize = Callable[[Request], "bool | Awaitable[bool]"]

_ACTIONS = ("cancel", "retry", "signal", "fork")
_SCHEDULE_ACTIONS = ("pause", "resume", "trigger")


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pgdurable.dashboard", "templates"),
        autoescape=True, trim_blocks=True, lstrip_blocks=True,
    )
    env.filters["age"] = _human_age
    env.filters["ts"] = lambda v: "" if v is None else v.strftime("%Y-%m-%d %H:%M:%S")
    env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=1, sort_keys=True, default=str)
    return env


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


def _state_change(before: Any, after: Any) -> dict[str, Any]:
    """Top-level keys whose value changed (new value), or the whole value."""
    if isinstance(before, dict) and isinstance(after, dict):
        return {k: after.get(k) for k in sorted(set(before) | set(after))
                if before.get(k) != after.get(k)}
    return {} if before == after else {"value": after}


class _Dashboard:
    def __init__(self, dsn: str, *, actions: bool, token: str | None,
                 authorize: Authorize | None, title: str) -> None:
        self.dsn = validate_dsn(dsn)
        self.actions = actions
        self.token = token
        self.authorize = authorize
        self.title = title
        self.secret = secrets.token_bytes(32)
        self.pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            self.dsn, min_size=1, max_size=4, open=False, name="pgdurable-dashboard",
            kwargs={"autocommit": True},
        )
        self.live = Broadcaster(self.dsn)
        self.env = _env()
        self.full: bool | None = None

    # -- plumbing -------------------------------------------------------------
    async def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        with translated():
            async with self.pool.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(sql, params)
                rows: list[dict[str, Any]] = await cur.fetchall()
                return rows

    async def can_read_tables(self) -> bool:
        if self.full is None:
            self.full = bool((await self.rows(Q.CAN_READ_TABLES))[0]["has_table_privilege"])
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
            csrf=self.csrf, schedule_csrf=self.schedule_csrf, statuses=STATUSES, path=request.url.path, **ctx)
        return HTMLResponse(html, status_code=status_code,
                            headers={"Cache-Control": "no-store",
                                     "Content-Security-Policy": "default-src 'self'; "
                                     "frame-ancestors 'none'",
                                     "X-Content-Type-Options": "nosniff"})

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
        with translated():
            async with self.pool.connection() as conn:
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
        steps = await self.rows(Q.STEPS, (rid,))
        prev = run["created_at"]
        for s in steps:
            s["duration"] = (s["created_at"] - prev).total_seconds()
            prev = s["created_at"]
        effects = await self.rows(Q.EFFECTS, (rid,))
        running = _effects_by_step(steps, effects)
        events: list[dict[str, Any]] | None = None
        if await self.can_read_tables():
            states = {r["step"]: r["state"] for r in await self.rows(Q.FULL_STATES, (rid,))}
            for s in steps:
                s["change"] = _state_change(states.get(s["step"] - 1, {}), states.get(s["step"]))
            events = await self.rows(Q.FULL_EVENTS, (rid,))
        lineage = await self.rows(Q.LINEAGE, (rid,))
        return self.page(
            request, "run.html", run=run, steps=steps, events=events, effects=effects,
            running=running, lineage=lineage[0] if lineage else None,
            forks=await self.rows(Q.FORKS, (rid,)) if lineage and lineage[0]["forks"] else [],
            children=await self.rows(Q.CHILDREN, (rid,)), live=rid,
            message=request.query_params.get("done"))

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

    # -- actions --------------------------------------------------------------
    async def _guarded(self, request: Request, action: str, subject: str,
                       form: dict[str, str]) -> Response | None:
        """None when this POST may act; else the refusal page (403)."""
        site = request.headers.get("sec-fetch-site")
        origin = request.headers.get("origin")
        own = f"{request.url.scheme}://{request.url.netloc}"
        if (site is not None and site not in ("same-origin", "none")) or (
            origin is not None and origin != own
        ) or not hmac.compare_digest(str(form.get("csrf", "")), self.csrf(action, subject)):
            return self.page(request, "error.html", status_code=403,
                             message="refused: cross-site request (CSRF check failed)")
        if self.token is not None and not hmac.compare_digest(
            str(form.get("token", "")).encode(), self.token.encode()
        ):
            return self.page(request, "error.html", status_code=403,
                             message="refused: wrong or missing action token")
        if self.authorize is not None:
            ok = self.authorize(request)
            if inspect.isawaitable(ok):
                ok = await ok
            if not ok:
                return self.page(request, "error.html", status_code=403,
                                 message="refused by the authorize hook")
        return None

    async def _form(self, request: Request) -> dict[str, str] | Response:
        body = await request.body()
        if len(body) > 65536:
            return self.page(request, "error.html", status_code=413, message="form too large")
        return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}

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
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        refused = await self._guarded(request, action, rid, form)
        if refused is not None:
            return refused
        target = rid
        try:
            if action == "cancel":
                done = (await self.rows_tuples(rq.CANCEL, (rid,)))[0][0]
            elif action == "retry":
                done = (await self.rows_tuples(RETRY, (rid,)))[0][0]
            elif action == "fork":  # no step: where a retry would continue (sql/0030)
                step = int(form["step"]) if form.get("step", "").strip() else None
                patch = json.loads(form["state"]) if form.get("state", "").strip() else None
                target = str((await self.rows_tuples(
                    FORK, fork_params(rid, step, patch, "merge", None, False)))[0][0])
                at = (await self.rows_tuples(FORKED_AT, (target,)))[0][0]
                done = f"forked from {rid} at step {at}"
            else:
                params = signal_run_params(
                    rid, str(form.get("kind", "")) or "approval",
                    parse_payload(str(form.get("payload", ""))), None, None)
                woke = (await self.rows_tuples(rq.SIGNAL_RUN, params))[0][0]
                done = "signalled (woke the run)" if woke else "signalled (kept pending)"
        except RunNotFound as exc:
            return self.page(request, "error.html", status_code=404, message=str(exc))
        except (PgDurableError, TypeError, ValueError) as exc:
            return self.page(request, "error.html", status_code=409, message=str(exc))
        root = request.scope.get("root_path", "")
        return RedirectResponse(f"{root}/runs/{target}?done={_quote(f'{action}: {done}')}", 303)

    async def act_schedule(self, request: Request) -> Response:
        action = request.path_params["action"]
        if not self.actions or action not in _SCHEDULE_ACTIONS:
            return self._disabled(request)
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        try:
            name = check_schedule_name(form.get("name"))
        except (TypeError, ValueError) as exc:
            return self.page(request, "error.html", status_code=404, message=str(exc))
        refused = await self._guarded(request, action, _schedule_subject(name), form)
        if refused is not None:
            return refused
        try:
            if action == "pause":
                done = "paused" if (await self.rows_tuples(PAUSE, (name,)))[0][0] else \
                    "was paused already"
            elif action == "resume":
                with translated():
                    async with self.pool.connection() as conn:
                        resumed = await resume_schedule_on(conn, name)
                done = "resumed" if resumed else "was not paused"
            else:
                done = f"started run {(await self.rows_tuples(TRIGGER, (name,)))[0][0]}"
        except ScheduleNotFound as exc:
            return self.page(request, "error.html", status_code=404, message=str(exc))
        except (PgDurableError, ValueError) as exc:
            return self.page(request, "error.html", status_code=409, message=str(exc))
        root = request.scope.get("root_path", "")
        return RedirectResponse(
            f"{root}/schedules?done={_quote(f'{action} {name}: {done}')}", 303)

    async def metrics(self, request: Request) -> Response:
        try:
            registry = metrics.enable(self.dsn)
        except ImportError as exc:
            return Response(str(exc), status_code=501, media_type="text/plain")
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        body = await asyncio.to_thread(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)


def _quote(value: str) -> str:
    return quote(value, safe="")


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
) -> Starlette:
    """The dashboard as an ASGI app (mount it anywhere, e.g. ``app.mount("/ops", ...)``).

    ``actions`` enables cancel/retry/signal/fork of runs and pause/resume/
    trigger of schedules; with ``token`` an action needs
    that token, with ``authorize`` your hook must return True (both, if both
    are given). ``actions=True`` with neither is refused (ValueError): an
    action must be authorized somehow.
    """
    if actions and token is None and authorize is None:
        raise ValueError("actions=True needs token= or authorize= (who may act?)")
    if token is not None and (not isinstance(token, str) or len(token) < 8):
        raise ValueError("token must be a str of at least 8 characters")
    d = _Dashboard(dsn, actions=actions, token=token, authorize=authorize, title=title)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await d.pool.open(wait=True, timeout=30)
        try:
            yield
        finally:
            await d.live.close()
            await d.pool.close()

    static = str(resources.files("pgdurable.dashboard") / "static")
    app = Starlette(
        routes=[
            Route("/", d.queues), Route("/runs", d.runs), Route("/runs/{run_id}", d.run),
            Route("/runs/{run_id}/{action}", d.act, methods=["POST"]),
            Route("/schedules", d.schedules),
            Route("/schedules/{action}", d.act_schedule, methods=["POST"]),
            Route("/leases", d.leases), Route("/events", d.events),
            Route("/metrics", d.metrics), Mount("/static", StaticFiles(directory=static)),
        ],
        lifespan=lifespan,
    )
    app.state.dashboard = d
    return app


def serve(dsn: str, *, host: str = "127.0.0.1", port: int = 8080, **options: Any) -> None:
    """Serve :func:`create_app` with uvicorn until interrupted."""
    import uvicorn

    # SSE streams never end by themselves: give them 3 s on shutdown, then close
    uvicorn.run(create_app(dsn, **options), host=host, port=port, log_level="warning",
                timeout_graceful_shutdown=3)
