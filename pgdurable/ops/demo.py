"""``pgdurable demo``: a durable research agent, end to end, as a timeline.

What it shows, on an embedded PostgreSQL (pgserver) or on ``--dsn``:

1. a research agent written as straight-line code (``@app.workflow``), driven
   by a deterministic fake model: every model call is a recorded step (its
   result checkpointed under the lease's fence);
2. a tool call with a side effect as a ``reconcile`` step: it goes through the
   run's effect records, so it is never run twice blindly;
3. worker-1, a real ``python -m pgdurable.worker`` process, is SIGKILLed in the
   middle of the slow ``summarize`` step, after the tool call was recorded;
   worker-2 takes the run over when the lease (2 s) lapses, runs the function
   again from the top -- every recorded step returns its recorded result at
   once -- and runs only ``summarize`` again: the tool ran exactly once;
4. a CI wait (``ctx.wait_signal("ci", build)``) resolved by a simulated webhook
   and a human approval (``ctx.approval``) resolved by a signal: the run parks
   (no worker holds it) and resumes by replay;
5. completion, and the run's history read back with SQL.

The worker processes import :data:`app` from this module
(``python -m pgdurable.worker pgdurable.ops.demo:app``); its DSN comes from
``PGDURABLE_DSN``. The driver is :func:`run_demo`.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..app.durable import Durable, DurableClient
from ..foundation import migrations
from ..foundation.db import connect, validate_dsn
from ..foundation.pooler import masked_conninfo
from ..foundation.queries import demo as dq
from ..foundation.queries.core import first_sync, many_sync, one_sync
from ..models.durable_runs import NOT_PERFORMED
from ..models.workflows import StepPolicy, WaitTimeout, WorkflowContext

__all__ = ["TASK", "build_app", "run_demo"]

TASK = "demo.research_agent"
REVISION = "1"
LEASE_TTL = 2.0
TOOL_LOG_ENV = "PGDURABLE_DEMO_DIR"
WORKER_NAME_ENV = "PGDURABLE_DEMO_WORKER"


# -- the agent (runs inside worker processes) -------------------------------------------
class FakeModel:
    """A deterministic stand-in for an LLM: same prompt, same answer, a little latency."""

    FACTS = (
        "leases with fencing tokens stop zombie writers",
        "SKIP LOCKED lets many workers claim without blocking each other",
        "a parked run holds no worker, thread or connection",
        "checkpoints after every step bound the work lost in a crash",
        "LISTEN/NOTIFY wakes workers in milliseconds; polling is the safety net",
    )

    def _pick(self, prompt: str, n: int = 1) -> list[str]:
        h = int(hashlib.sha256(prompt.encode()).hexdigest(), 16)
        return [self.FACTS[(h >> (8 * i)) % len(self.FACTS)] for i in range(n)]

    async def plan(self, topic: str) -> list[str]:
        await asyncio.sleep(0.15)
        questions = [f"How do durable agents handle {part}?"
                     for part in ("crashes", "waiting", "scale")]
        say(f"model planned {len(questions)} questions")
        return questions

    async def answer(self, question: str, i: int, n: int) -> str:
        await asyncio.sleep(0.2)
        fact = self._pick(question)[0]
        say(f"model answered question {i}/{n}: {fact}")
        return fact

    async def summarize(self, findings: list[str], sources: list[str]) -> str:
        say("model is summarizing (slow call) ...")
        await asyncio.sleep(2.0)  # the slow call: the demo kills worker-1 during it
        return f"{len(findings)} findings from {len(sources)} sources: " + "; ".join(findings[:2])


model = FakeModel()


def say(message: str) -> None:
    """A progress line (the demo driver relays worker stdout)."""
    print(message, flush=True)


def note(ctx: WorkflowContext, message: str) -> None:
    """A progress line from the workflow's own code: printed when the code first
    gets there, not again when a resumed run replays past it."""
    if not ctx.replaying:
        say(message)


def _tool_log() -> Path | None:
    folder = os.environ.get(TOOL_LOG_ENV)
    return Path(folder) / "tool_calls.log" if folder else None


def _search_result(topic: str) -> dict[str, Any]:
    return {"query": topic, "sources": ["pgdurable README", "PostgreSQL docs: SKIP LOCKED",
                                        "Agents Should Be Durable, Not Long-Lived"]}


def web_search(topic: str) -> dict[str, Any]:
    """The external tool: appends to a log so the demo can count executions."""
    say(f"calling the web_search API for {topic!r} (a real side effect)")
    log = _tool_log()
    if log is not None:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{os.environ.get(WORKER_NAME_ENV, os.getpid())}\n")
    return _search_result(topic)


def find_search(topic: str) -> Any:
    """Reconcile: a web_search found started and never finished (a crash during
    the call) asks the API's own record (here its call log) what happened."""
    log = _tool_log()
    if log is not None and log.exists() and log.read_text(encoding="utf-8").strip():
        return _search_result(topic)
    return NOT_PERFORMED  # provably never happened: web_search runs now


async def research_agent(ctx: WorkflowContext, request: dict[str, Any]) -> dict[str, Any]:
    """The agent, top to bottom: each ``ctx.step`` runs once per run and is
    checkpointed; a wait parks the run; a resumed run replays the recorded steps."""
    if ctx.replaying:
        say(f"resumed under fencing token {ctx.run.token}: the code runs from the top and "
            f"its {ctx.run.step} recorded entries return at once")
    topic = request["topic"]
    questions = await ctx.step("plan", model.plan, topic)
    findings = [await ctx.step(f"answer:{i}", model.answer, q, i, len(questions))
                for i, q in enumerate(questions, 1)]
    search = await ctx.step("web_search", web_search, topic,
                            policy=StepPolicy(replay="reconcile", reconcile=find_search))
    note(ctx, f"web_search result: {len(search['sources'])} sources (recorded)")
    summary = await ctx.step("summarize", model.summarize, findings, search["sources"])
    build = f"build-{ctx.run_id[:8]}"
    note(ctx, f"pushed the report branch; parking until CI {build} reports")
    try:
        ci = await ctx.wait_signal("ci", build, timeout=600)
    except WaitTimeout:
        return {"ok": False, "reason": "CI timed out"}
    note(ctx, f"CI {build} finished: {ci.get('conclusion')}")
    note(ctx, "asking a human to approve the report; parking")
    try:
        decision = await ctx.approval(f"report-{ctx.run_id[:8]}", timeout=600)
    except WaitTimeout:
        decision = {}
    note(ctx, f"approval: {decision.get('approved')} by {decision.get('by')}")
    return {"ok": bool(decision.get("approved")), "summary": summary,
            "ci": ci.get("conclusion"), "approved_by": decision.get("by")}


def build_app(dsn: str | None = None) -> Durable:
    """The demo's :class:`Durable` app with its one workflow registered."""
    durable = Durable(dsn, pool_size=2)
    durable.workflow(TASK, revision=REVISION, max_attempts=5, retry_base=0.1)(research_agent)
    return durable


_app: Durable | None = None


def __getattr__(name: str) -> Any:
    # ``pgdurable.ops.demo:app`` for workers: built on first access (PGDURABLE_DSN must be set).
    global _app
    if name == "app":
        if _app is None:
            _app = build_app()
        return _app
    raise AttributeError(name)


# -- the driver ---------------------------------------------------------------------------
# (its statements: pgdurable.foundation.queries.demo, imported as ``dq``)


class _Timeline:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.t0 = time.monotonic()

    def log(self, who: str, message: str, style: str = "") -> None:
        colour = {"driver": "cyan", "postgres": "magenta", "worker-1": "green",
                  "worker-2": "yellow", "webhook": "blue", "human": "bright_blue"}.get(who, "white")
        t = time.monotonic() - self.t0
        self.console.print(  # one line per event, however narrow (the terminal wraps it)
            f"[dim]{t:6.2f}s[/] [{colour}]{who:>9}[/] │ " + (f"[{style}]{message}[/]" if style else message),
            highlight=False, soft_wrap=True,
        )


class _WorkerProc:
    """A real ``python -m pgdurable.worker pgdurable.ops.demo:app`` process, stdout relayed."""

    def __init__(self, name: str, dsn: str, queue_name: str, folder: str,
                 lines: queue.Queue[tuple[str, str]]) -> None:
        self.name = name
        env = {**os.environ, "PGDURABLE_DSN": dsn, TOOL_LOG_ENV: folder, WORKER_NAME_ENV: name,
               "PYTHONUNBUFFERED": "1"}
        self.stderr_path = Path(folder) / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgdurable.worker", "pgdurable.ops.demo:app", "--queues", queue_name,
             "--concurrency", "1", "--lease-ttl", str(LEASE_TTL), "--poll", "0.5", "--grace", "5",
             "--worker-id", f"{name}:{uuid.uuid4().hex[:6]}"],
            stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env,
        )
        self._reader = threading.Thread(target=self._relay, args=(lines,), daemon=True)
        self._reader.start()

    def _relay(self, lines: queue.Queue[tuple[str, str]]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            lines.put((self.name, line.rstrip()))

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._reader.join(timeout=2)
        self._stderr.close()

    def stderr_tail(self) -> str:
        text = self.stderr_path.read_text(encoding="utf-8", errors="replace").strip()
        return "\n".join(text.splitlines()[-5:])


def _deliver_webhook(client: DurableClient, dsn: str, kind: str, ref: str,
                     payload: dict[str, Any]) -> tuple[str, list[str]]:
    """Simulated webhook: a CI system POSTs ``/signals/{kind}/{ref}``, signed
    (``webhooks.sign_request``: HMAC-SHA256 over timestamp, path, signal id and body).

    The request goes through the ASGI app of :mod:`pgdurable.ops.webhooks` (called
    in process, no HTTP server needed); where that module is not available the
    signal is sent with ``client.signal``. Returns (how, woken run ids).
    """
    try:
        webhooks: Any = importlib.import_module("pgdurable.ops.webhooks")
    except ImportError:
        return "app.signal", client.signal(kind, ref, payload, signal_id=f"{kind}:{ref}")
    return "ASGI webhook app, signed v1", asyncio.run(_asgi_post(webhooks, dsn, kind, ref, payload))


async def _asgi_post(webhooks: Any, dsn: str, kind: str, ref: str,
                     payload: dict[str, Any]) -> list[str]:
    secret = uuid.uuid4().hex + uuid.uuid4().hex  # 64 bytes; the app needs >= 32
    body = json.dumps(payload).encode()
    path = webhooks.request_path(kind, ref)  # the canonical path the sender signs
    signed = webhooks.sign_request(secret, kind, ref, body, signal_id=f"{kind}:{ref}")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "server": ("demo", 80), "client": ("ci", 0),
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *((k.lower().encode(), v.encode()) for k, v in signed.items())],
    }
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:
            await asyncio.sleep(3600)
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    async with Durable(dsn, pool_size=2) as durable:
        await webhooks.app(durable, secret=secret, kinds=[kind])(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    answer = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    if status >= 400:
        raise RuntimeError(f"webhook answered {status}: {answer}")
    return [str(r) for r in answer.get("woken", [])]


def run_demo(*, dsn: str | None = None, data_dir: str | None = None,
             console: Console | None = None, timeout: float = 60.0,
             dsn_from_env: bool = False) -> bool:
    """Run the demo; print the timeline; return True when every check passed.

    With no ``dsn`` an embedded PostgreSQL is started in ``data_dir``
    (default ``.pgdurable/pgdata``) and stopped at the end. The closing line
    says how to inspect the run afterwards: ``pgdurable embedded run ID`` (it
    starts that server again for the command), else ``pgdurable run ID`` with
    ``--dsn`` (password masked) unless ``dsn_from_env`` (the CLI found the
    DSN in ``PGDURABLE_DSN`` / ``DATABASE_URL``, where the command finds it too).
    """
    console = console or Console()
    tl = _Timeline(console)
    console.rule("[bold]pgdurable demo: a durable research agent[/]")
    server = None
    if dsn is None:
        from .embedded import start_embedded

        tl.log("postgres", f"starting an embedded PostgreSQL in {data_dir or '.pgdurable/pgdata'}")
        server, dsn = start_embedded(data_dir)
    validate_dsn(dsn)
    applied = migrations.migrate(dsn)
    tl.log("postgres", f"schema ready (version {migrations.required_version()}, "
                       f"{len(applied)} migration(s) applied now)")
    folder = tempfile.mkdtemp(prefix="pgdurable-demo-")
    queue_name = f"demo-{uuid.uuid4().hex[:8]}"
    lines: queue.Queue[tuple[str, str]] = queue.Queue()
    workers: list[_WorkerProc] = []
    client = DurableClient(dsn)
    ok = False
    try:
        with client, connect(dsn) as conn:
            run_id = client.start(TASK, {"topic": "durable AI agents on Postgres"},
                                  queue=queue_name, revision=REVISION, max_attempts=5)
            tl.log("driver", f"started run {run_id} (workflow {TASK}, queue {queue_name})")
            workers.append(_WorkerProc("worker-1", dsn, queue_name, folder, lines))
            tl.log("driver", f"spawned worker-1 (pid {workers[0].proc.pid}, lease TTL {LEASE_TTL:g} s)")
            ok = _drive(tl, conn, client, run_id, workers, dsn, queue_name, folder, lines, timeout)
            ok = _summary(console, conn, run_id, folder, ok,
                          inspect_command(run_id, dsn, embedded=server is not None,
                                          data_dir=data_dir, dsn_from_env=dsn_from_env))
    finally:
        for w in workers:
            w.stop()
        while not lines.empty():
            who, line = lines.get()
            tl.log(who, line)
        shutil.rmtree(folder, ignore_errors=True)
        if server is not None:
            tl.log("postgres", "stopping the embedded PostgreSQL")
            server.cleanup()
    return ok


def _drive(tl: _Timeline, conn: Any, client: DurableClient, run_id: str,
           workers: list[_WorkerProc], dsn: str, queue_name: str, folder: str,
           lines: queue.Queue[tuple[str, str]], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    killed = False
    last: tuple[Any, ...] | None = None  # what the timeline showed last
    acted: set[str] = set()
    while time.monotonic() < deadline:
        while not lines.empty():
            who, line = lines.get()
            tl.log(who, line)
        run = one_sync(conn, dq.RUN, (run_id,))
        status, step, token, wait_kind = run.status, run.step, run.lease_token, run.wait_kind
        view = (status, step, token, wait_kind)
        if view != last:
            if status == "leased":
                who = (run.lease_owner or "").split(":")[0]
                tl.log("postgres", f"run {status} by {who} (fencing token {token}), step {step}")
            elif status == "waiting":
                tl.log("postgres", f"run parked at step {step}, waiting on "
                                   f"({wait_kind}, {run.wait_ref}); no worker holds it", "bold")
            else:
                tl.log("postgres", f"run {status} at step {step}")
            last = view
        if not killed:
            if (first_sync(conn, dq.TOOL, (run_id,)) is not None
                    and workers[0].proc.poll() is None):
                time.sleep(0.1)  # summarize (2 s) is in flight
                workers[0].kill()
                killed = True
                tl.log("driver", f"SIGKILL worker-1 (pid {workers[0].proc.pid}) mid-step: summarize "
                                 "is in flight; web_search and the model calls are recorded",
                       "bold red")
                workers.append(_WorkerProc("worker-2", dsn, queue_name, folder, lines))
                tl.log("driver", f"spawned worker-2 (pid {workers[1].proc.pid}); it takes over "
                                 f"when worker-1's lease lapses (≤ {LEASE_TTL:g} s)")
        if status == "waiting" and wait_kind == "ci" and "ci" not in acted:
            acted.add("ci")
            time.sleep(0.3)
            how, woke = _deliver_webhook(client, dsn, "ci", str(run.wait_ref),
                                         {"conclusion": "success", "checks": 12})
            tl.log("webhook", f"POST /signals/ci/{run.wait_ref} {{conclusion: success}} ({how}) "
                              f"-> woke {len(woke)} run(s)")
        if status == "waiting" and wait_kind == "approval" and "approval" not in acted:
            acted.add("approval")
            time.sleep(0.3)
            woke = client.signal("approval", str(run.wait_ref), {"approved": True, "by": "alice"})
            tl.log("human", f"alice approves {run.wait_ref} -> woke {len(woke)} run(s)")
        if status in ("completed", "failed", "cancelled", "incompatible"):
            if status == "completed":
                tl.log("postgres", f"result: {json.dumps(run.result)[:110]}", "bold green")
            else:
                tl.log("postgres", f"error: {json.dumps(run.error)[:200]}", "bold red")
            return status == "completed" and killed and bool((run.result or {}).get("ok"))
        for w in workers:
            if w.proc.poll() is not None and not (killed and w is workers[0]):
                tl.log("driver", f"{w.name} exited with {w.proc.returncode}: {w.stderr_tail()}", "red")
                return False
        time.sleep(0.05)
    tl.log("driver", f"timed out after {timeout:g} s", "bold red")
    return False


def inspect_command(run_id: str, dsn: str, *, embedded: bool, data_dir: str | None = None,
                    dsn_from_env: bool = False) -> str:
    """The command that shows the demo's run after the demo has ended (when its
    embedded server is stopped: ``pgdurable embedded`` starts it for the command)."""
    if embedded:
        where = "" if data_dir is None else f" --data-dir {shlex.quote(data_dir)}"
        return f"pgdurable embedded{where} run {run_id}"
    if dsn_from_env:
        return f"pgdurable run {run_id}"
    return f"pgdurable run {run_id} --dsn {shlex.quote(masked_conninfo(dsn))}"


def _summary(console: Console, conn: Any, run_id: str, folder: str, ok: bool,
             inspect: str) -> bool:
    calls_file = Path(folder) / "tool_calls.log"
    calls = calls_file.read_text(encoding="utf-8").split() if calls_file.exists() else []
    table = Table("step", "fencing token", "recorded entry", "woken by",
                  title="checkpoints (SQL: pgdurable.checkpoints)")
    tokens = set()
    for s in many_sync(conn, dq.STEPS, (run_id,)):
        tokens.add(s.token)
        table.add_row(str(s.step), str(s.token), s.entry or "", s.woken_by.strip())
    console.print(table)
    console.print(f"tool web_search executed [bold]{len(calls)}[/] time(s) "
                  f"({', '.join(calls) or 'never'}); steps checkpointed under {len(tokens)} "
                  "lease token(s)", highlight=False, soft_wrap=True)
    console.print("inspect it: ", Text(inspect, style="bold"), sep="", highlight=False,
                  soft_wrap=True)
    good = ok and len(calls) == 1
    console.rule("[bold green]demo passed[/]" if good else "[bold red]demo failed[/]")
    return good
