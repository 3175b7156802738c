"""Retry and fork of failed runs run the failure again instead of replaying it (issue 37).

Runs fail in real worker processes (``python -m pgdurable.worker
_recover_app:app``, tests/_recover_app.py, the ``fleet`` fixture) while a backend is down; the test
"fixes the backend" and recovers each run through the CLI (real
subprocesses), the Python API and the dashboard's actions (HTTP, with the
action token). Every call of a tool, reconcile or effect is a row of the
ledger, so what ran again is read from the database. The rules are in
docs/fork.md ("Retry and fork of a failed run").
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _dashboard_server import form_csrf, login, serving
from _waiting import until_sync
from fix_fleet import Fleet

import pgdurable
from pgdurable import InvalidInput
from pgdurable.ops.dashboard import create_app

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "recover-token-" + "x" * 32  # the dashboard refuses tokens under 32 bytes
SURFACES = ("cli", "api", "dashboard")
TERMINAL = ("completed", "failed", "cancelled")
pytestmark = pytest.mark.fleet("_recover_app:app", ttl=10.0, poll=0.2, concurrency=16)
SCRATCH = """
CREATE TABLE rc_ledger (id serial PRIMARY KEY, run_id text NOT NULL, name text NOT NULL);
CREATE TABLE rc_down (backend text PRIMARY KEY);
CREATE TABLE rc_remote (order_id text PRIMARY KEY, ref text NOT NULL);
"""


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(SCRATCH)
    return conn


@pytest.fixture
def worker(db: psycopg.Connection[Any], fleet: Fleet) -> None:
    """One worker process (queue default) for the whole test."""
    fleet.start("w")


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[pgdurable.Durable]:
    a = pgdurable.Durable(dsn)
    await a.open()
    try:
        yield a
    finally:
        await a.close()


@pytest.fixture
def base(dsn: str) -> Iterator[str]:
    """The dashboard with actions, behind its action token."""
    with serving(create_app(dsn, actions=True, token=TOKEN)) as url:
        yield url


# -- helpers --------------------------------------------------------------------------

def cli(dsn: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``pgdurable ARGV --dsn DSN`` in a subprocess."""
    return subprocess.run([sys.executable, "-m", "pgdurable", *argv, "--dsn", dsn],
                          cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"})


def run_row(db: psycopg.Connection[Any], rid: str) -> dict[str, Any]:
    row = db.execute("SELECT to_jsonb(r) FROM pgdurable.runs r WHERE id = %s", (rid,)).fetchone()
    assert row is not None
    out: dict[str, Any] = row[0]
    return out


def wait_for(db: psycopg.Connection[Any], rid: str, *statuses: str) -> dict[str, Any]:
    until_sync(lambda: run_row(db, rid)["status"] in statuses, f"run {rid} {statuses}")
    return run_row(db, rid)


def calls(db: psycopg.Connection[Any], rid: str) -> dict[str, int]:
    rows = db.execute("SELECT name, count(*) FROM rc_ledger WHERE run_id = %s GROUP BY name",
                      (rid,)).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def names(db: psycopg.Connection[Any], rid: str) -> list[str]:
    rows = db.execute("SELECT state->'workflow'->>'name' FROM pgdurable.checkpoints "
                      "WHERE run_id = %s ORDER BY step", (rid,)).fetchall()
    return [r[0] for r in rows]


def break_backend(db: psycopg.Connection[Any]) -> None:
    db.execute("INSERT INTO rc_down VALUES ('tool') ON CONFLICT DO NOTHING")


def fix_backend(db: psycopg.Connection[Any]) -> None:
    db.execute("DELETE FROM rc_down")


def dashboard_act(base: str, rid: str, action: str, **form: str) -> tuple[str, str]:
    """POST the run page's ``action`` form (CSRF token from the page, the action
    token); (the run the dashboard redirected to, its confirmation text)."""
    with login(base, TOKEN) as client:  # every page needs the session (issue 36)
        page = client.get(f"/runs/{rid}").text
        r = client.post(f"/runs/{rid}/{action}",
                        data={"csrf": form_csrf(page, action), "token": TOKEN, **form},
                        follow_redirects=True)
    assert r.status_code == 200, r.text
    target = str(r.url).rsplit("/runs/", 1)[1].split("?")[0]
    m = re.search(rf"{action}: [^<]*", r.text)
    assert m, r.text
    return target, m.group(0)


def dashboard_refused(base: str, rid: str, action: str) -> tuple[int, str]:
    """POST the run page's ``action`` form expecting a refusal: (status, page text)."""
    with login(base, TOKEN) as client:
        page = client.get(f"/runs/{rid}").text
        r = client.post(f"/runs/{rid}/{action}",
                        data={"csrf": form_csrf(page, action), "token": TOKEN})
    return r.status_code, html.unescape(r.text)


async def retry_via(surface: str, app: pgdurable.Durable, dsn: str, base: str,
                    rid: str) -> str:
    """Retry ``rid`` through ``surface``; its new status."""
    if surface == "cli":
        r = cli(dsn, "retry", rid)
        assert r.returncode == 0, r.stderr
        return "waiting" if "waits again" in r.stdout else "runnable"
    if surface == "api":
        return await app.retry(rid)
    target, done = dashboard_act(base, rid, "retry")
    assert target == rid
    return done.removeprefix("retry: ")


async def fork_via(surface: str, app: pgdurable.Durable, dsn: str, base: str, rid: str) -> str:
    """Fork ``rid`` at the default step through ``surface``; the fork's id."""
    if surface == "cli":
        r = cli(dsn, "fork", rid)
        assert r.returncode == 0, r.stderr
        m = re.search(r"run (\S+) forked from", r.stdout)
        assert m, r.stdout
        return m.group(1)
    if surface == "api":
        return await app.fork(rid)
    target, done = dashboard_act(base, rid, "fork", step="", state="")
    assert target != rid and f"forked from {rid} at step" in done
    return target


@dataclass(frozen=True)
class Recovered:
    """One failed run (``source``) and the run that recovers it (itself or a fork)."""

    how: str          # "retry" | "fork" | "fork-failed"
    surface: str      # "cli" | "api" | "dashboard"
    source: str
    run: str


async def fail_and_recover(db: psycopg.Connection[Any], app: pgdurable.Durable, dsn: str,
                           base: str, task: str, spec: dict[str, Any],
                           after_start: Callable[[str], None] | None = None,
                           ) -> list[Recovered]:
    """Runs of ``task`` failed while the backend is down, then recovered after
    the fix by every surface: retry and fork at the default step by the CLI,
    the API and the dashboard, and bulk fork-failed by the CLI and the API."""
    started = datetime.now(UTC) - timedelta(minutes=1)
    orders = iter(range(1000))

    async def failed_runs(n: int) -> list[str]:
        break_backend(db)
        ids = [await app.start(task, {**spec, "order": f"o{next(orders)}"}, revision="1")
               for _ in range(n)]
        for rid in ids:
            if after_start is not None:
                after_start(rid)
        for rid in ids:
            assert wait_for(db, rid, *TERMINAL)["status"] == "failed"
        fix_backend(db)
        return ids

    out: list[Recovered] = []
    sources = iter(await failed_runs(2 * len(SURFACES)))
    for surface in SURFACES:
        rid = next(sources)
        assert await retry_via(surface, app, dsn, base, rid) == "runnable"
        out.append(Recovered("retry", surface, rid, rid))
        rid = next(sources)
        out.append(Recovered("fork", surface, rid, await fork_via(surface, app, dsn, base, rid)))
    for rec in out:  # before the backend goes down again
        wait_for(db, rec.run, *TERMINAL, "waiting")
    # bulk: one run at a time (limit 1), so each surface forks its own
    for surface in ("cli", "api"):
        (rid,) = await failed_runs(1)
        if surface == "cli":
            r = cli(dsn, "fork-failed", task, "--limit", "1", "--json")
            assert r.returncode == 0, r.stderr
            forks = [(f["source"], f["fork"]) for f in json.loads(r.stdout)]
        else:
            forks = [(f.source, f.fork) for f in
                     await app.fork_failed(task, error=None, since=started, limit=1)]
        assert [s for s, _ in forks] == [rid]
        out.append(Recovered("fork-failed", surface, rid, forks[0][1]))
        wait_for(db, forks[0][1], *TERMINAL, "waiting")
    return out


def finished(db: psycopg.Connection[Any], rec: Recovered) -> dict[str, Any]:
    """The recovering run once it is terminal (or waiting: a hang would be a bug)."""
    return wait_for(db, rec.run, *TERMINAL, "waiting")


# -- (a) an uncaught step error -------------------------------------------------------

def answer(db: psycopg.Connection[Any]) -> Callable[[str], None]:
    """Send each started run the signal ``answer`` (kept until it waits, then consumed)."""
    def send(rid: str) -> None:
        db.execute("SELECT pgdurable.signal_run(%s, 'answer', '\"forty-two\"', NULL, NULL)",
                   (rid,))
    return send


@pytest.mark.parametrize("shape", ["second-step", "first-step", "after-signal"])
async def test_uncaught_step_error_runs_the_step_again(
        db: psycopg.Connection[Any], app: pgdurable.Durable, dsn: str, base: str,
        worker: None, shape: str) -> None:
    """(a) The step's recorded error failed the run: retry, fork (default step)
    and fork-failed drop that record and call the step again; the run completes.
    As the first step, its record is checkpoint 1: the run starts over from its
    input (step 0). After a signal wait, the signal's payload (the wake that
    started the step) is kept: the run does not wait for it again."""
    first, ask = shape == "first-step", shape == "after-signal"
    spec = {"topic": "pg", "first": first, "ask": ask}
    recovered = await fail_and_recover(db, app, dsn, base, "uncaught", spec,
                                       answer(db) if ask else None)
    before = [] if first else ["prepare"]
    at = len(before) + ask + 1  # the checkpoint that records fetch's error
    for rec in recovered:
        src = run_row(db, rec.source)
        if rec.how == "retry":
            assert src["status"] == "completed"
        else:  # a fork reads its source only
            assert src["status"] == "failed" and src["error"]["type"] == "StepFailed"
            assert src["error"]["checkpoint"] == src["step"] == at
        done = finished(db, rec)
        assert done["status"] == "completed", (rec, done["error"])
        assert done["result"] == [*before, *(["forty-two"] if ask else []), "pg"]
        assert names(db, rec.run) == [*before, *(["signal:answer#1"] if ask else []),
                                      "fetch", "return"]
        # two attempts in place before the fix, then one more: called again, once
        fetches = calls(db, rec.source).get("fetch", 0) + (
            0 if rec.run == rec.source else calls(db, rec.run).get("fetch", 0))
        assert fetches == 3, rec
        assert calls(db, rec.source).get("prepare", 0) == (0 if first else 1), rec
        assert calls(db, rec.run).get("prepare", 0) == (0 if first or rec.run != rec.source
                                                        else 1), rec
        if rec.how != "retry":
            assert done["forked_from"] == rec.source
            assert done["forked_from_step"] == at - 1
    # the retry kept what it dropped: the failed step's record
    retried = next(r for r in recovered if r.how == "retry").run
    rw = db.execute("SELECT kind, from_step, to_step, status, error->>'type', "
                    "checkpoints->0->'state'->'workflow'->>'name' FROM pgdurable.run_rewinds "
                    "WHERE run_id = %s", (retried,)).fetchall()
    assert rw == [("retry", at, at - 1, "failed", "StepFailed", "fetch")]
    r = cli(dsn, "run", retried)
    assert r.returncode == 0 and f"from step {at} to step {at - 1} (was failed)" in r.stdout
    assert "retried" in r.stdout


@pytest.mark.parametrize("how", ["reraise", "wrap-from", "wrap-inside"])
async def test_a_handler_that_raises_from_the_step_error_runs_the_step_again(
        db: psycopg.Connection[Any], app: pgdurable.Durable, dsn: str, base: str,
        worker: None, how: str) -> None:
    """(a) A handler of ``StepFailed`` that re-raises it or raises its own error
    from it (explicitly, or inside the ``except``) did not handle the failure:
    the run's error names the step's record, and recovery calls the step again."""
    recovered = await fail_and_recover(db, app, dsn, base, "wrapped",
                                       {"topic": "pg", "how": how})
    for rec in recovered:
        if rec.how != "retry":  # a fork reads its source only: its error as it failed
            src = run_row(db, rec.source)
            assert src["error"]["type"] == ("StepFailed" if how == "reraise" else "LookupError")
            assert src["error"]["checkpoint"] == src["step"] == 1, src["error"]
        done = finished(db, rec)
        assert done["status"] == "completed", (rec, done["error"])
        assert done["result"] == ["pg"]
        assert names(db, rec.run) == ["fetch", "return"]
        fetches = calls(db, rec.source).get("fetch", 0) + (
            0 if rec.run == rec.source else calls(db, rec.run).get("fetch", 0))
        assert fetches == 3, rec  # two attempts before the fix, then once more


async def test_an_explicit_fork_at_the_failed_record_replays_it(
        db: psycopg.Connection[Any], app: pgdurable.Durable, worker: None) -> None:
    """A fork at the step that holds the failed step's record keeps it: asked
    for explicitly (e.g. with a new revision that handles the error), the same
    revision replays the error. The default step is the one before."""
    break_backend(db)
    rid = await app.start("uncaught", {"topic": "pg"}, revision="1")
    wait_for(db, rid, *TERMINAL)
    fix_backend(db)
    fork = await app.fork(rid, from_step=2)
    done = wait_for(db, fork, *TERMINAL)
    assert done["status"] == "failed" and done["error"]["type"] == "StepFailed"
    assert "_recorded" in done["error"]["traceback"]
    assert calls(db, rid) == {"prepare": 1, "fetch": 2} and calls(db, fork) == {}


# -- (b) a step error the workflow caught ---------------------------------------------

async def test_caught_step_error_stays_history(
        db: psycopg.Connection[Any], app: pgdurable.Durable, dsn: str, base: str,
        worker: None) -> None:
    """(b) The step ``optional`` failed and the workflow took a fallback; then
    ``fetch`` failed uncaught. Recovery runs ``fetch`` again only: ``optional``
    is not called again and replays its recorded error into the same fallback."""
    recovered = await fail_and_recover(db, app, dsn, base, "caught", {"topic": "pg"})
    for rec in recovered:
        done = finished(db, rec)
        assert done["status"] == "completed", (rec, done["error"])
        assert done["result"] == ["fallback after ConnectionError", "pg"]
        assert names(db, rec.run) == ["optional", "fetch", "return"]
        err = db.execute("SELECT state->'workflow'->'error'->>'type' FROM pgdurable.checkpoints "
                         "WHERE run_id = %s AND step = 1", (rec.run,)).fetchone()
        assert err == ("ConnectionError",)  # the caught error is still recorded
        total = calls(db, rec.source)
        if rec.run != rec.source:
            assert calls(db, rec.run) == {"fetch": 1}, rec
            total = {k: v + calls(db, rec.run).get(k, 0) for k, v in total.items()}
        assert total == {"optional": 2, "fetch": 3}, rec


# -- (c) a failure after the last step ------------------------------------------------

async def test_failure_after_the_last_step_replays_every_step(
        db: psycopg.Connection[Any], app: pgdurable.Durable, dsn: str, base: str,
        worker: None) -> None:
    """(c) Every step and the signal wait were recorded, then the body raised.
    Recovery runs the body again with everything replayed: the step is not
    called again and the signal's payload (consumed) is kept, not waited for."""
    recovered = await fail_and_recover(db, app, dsn, base, "after_last", {}, answer(db))
    for rec in recovered:
        src = run_row(db, rec.source)
        if rec.source != rec.run:
            assert src["error"]["type"] == "RuntimeError" and "checkpoint" not in src["error"]
        done = finished(db, rec)
        assert done["status"] == "completed", (rec, done["status"], done["error"])
        assert done["result"] == ["prepare", "forty-two"]
        assert names(db, rec.run) == ["prepare", "signal:answer#1", "return"]
        assert calls(db, rec.source)["prepare"] == 1
        assert rec.run == rec.source or "prepare" not in calls(db, rec.run)
        # three attempts of the run while down, then one that completes
        bodies = calls(db, rec.source)["body"] + (
            0 if rec.run == rec.source else calls(db, rec.run)["body"])
        assert bodies == 4, rec


async def test_a_wait_that_timed_out_waits_again(
        db: psycopg.Connection[Any], app: pgdurable.Durable, worker: None) -> None:
    """A run failed by its wait's timeout is retried into the same wait (the
    timeout was the failure); a signal then completes it."""
    rid = await app.start("after_last", {}, revision="1")
    wait_for(db, rid, "waiting")
    db.execute("UPDATE pgdurable.runs SET wake_at = now() WHERE id = %s", (rid,))  # time out
    failed = wait_for(db, rid, *TERMINAL)
    assert failed["status"] == "failed" and failed["error"]["type"] == "WaitTimeout"
    assert await app.retry(rid) == "runnable"
    assert wait_for(db, rid, *TERMINAL, "waiting")["status"] == "waiting"
    db.execute("SELECT pgdurable.signal_run(%s, 'answer', '\"late\"', NULL, NULL)", (rid,))
    assert wait_for(db, rid, *TERMINAL)["result"] == ["prepare", "late"]


# -- (d) a reconcile step -------------------------------------------------------------

@pytest.mark.parametrize("lost_before", [False, True], ids=["performed", "not-performed"])
async def test_a_failed_reconcile_step_is_reconciled_not_re_run(
        db: psycopg.Connection[Any], app: pgdurable.Durable, dsn: str, base: str,
        worker: None, lost_before: bool) -> None:
    """(d) The reconcile step ``push`` failed (the backend timed out): recovery
    asks its reconcile first. Performed on the remote side: its outcome is the
    step's result and push is never called again. Not performed: push runs now."""
    recovered = await fail_and_recover(db, app, dsn, base, "reconciled",
                                       {"lost_before": lost_before})
    for rec in recovered:
        done = finished(db, rec)
        assert done["status"] == "completed", (rec, done["error"])
        order = db.execute("SELECT state->'input'->>'order' FROM pgdurable.checkpoints "
                           "WHERE run_id = %s AND step = 1", (rec.source,)).fetchone()
        assert order is not None and done["result"] == {"ref": f"push-{order[0]}"}
        mine = calls(db, rec.run) if rec.run != rec.source else {}
        src = calls(db, rec.source)
        assert src.get("push") == (2 if lost_before and rec.run == rec.source else 1), rec
        assert (src if rec.run == rec.source else mine)["reconcile:push"] == 1, rec
        if rec.run != rec.source:
            assert mine == {"reconcile:push": 1, **({"push": 1} if lost_before else {})}, rec


# -- tasks and durable tasks: a failed effect -----------------------------------------

@pytest.mark.parametrize(("task", "effect"), [("charge_task", "charge"), ("durable_send", "send")])
async def test_a_failed_effect_is_performed_again(
        db: psycopg.Connection[Any], app: pgdurable.Durable, dsn: str, base: str,
        worker: None, task: str, effect: str) -> None:
    """An ``@app.task`` step and a durable task step whose effect failed (the
    run then fails with EffectFailed, the failure recorded): recovery performs
    the effect again (replay policy "safe") and the run completes; the step
    before it is not run again."""
    recovered = await fail_and_recover(db, app, dsn, base, task, {})
    for rec in recovered:
        if rec.how != "retry":
            assert run_row(db, rec.source)["error"]["type"] == "EffectFailed"
        done = finished(db, rec)
        assert done["status"] == "completed", (rec, done["error"])
        total = calls(db, rec.source).get(effect, 0) + (
            0 if rec.run == rec.source else calls(db, rec.run).get(effect, 0))
        assert total == 2, rec  # once failed, once again after the fix
        assert done["step"] == 2 and (done["forked_from_step"] in (None, 1)), rec


# -- (e) a child's failure seen by its parent -----------------------------------------

async def test_retrying_a_parent_retries_its_failed_children(
        db: psycopg.Connection[Any], app: pgdurable.Durable, dsn: str, base: str,
        worker: None) -> None:
    """(e) A parent failed because its child failed. The child alone cannot be
    retried (its parent has ended: it would be cancelled at once); retrying the
    parent retries the child (its failed step runs again) and waits for it, then
    sees its new result. A fork of the parent keeps the outcome it recorded."""
    spec = {"children": [{}]}
    break_backend(db)
    parents = [await app.start("parent", spec, revision="1") for _ in (*SURFACES, *SURFACES)]
    for pid in parents:
        failed = wait_for(db, pid, *TERMINAL)
        assert failed["status"] == "failed" and failed["error"]["type"] == "RuntimeError"
    fix_backend(db)
    kids = {pid: (await app.get_run(pid)).children[0] for pid in parents}
    # the child alone: refused by every surface, naming the parent; nothing changes
    kid = kids[parents[0]]
    before = run_row(db, kid)
    r = cli(dsn, "retry", kid)
    assert r.returncode == 2 and f"retry run {parents[0]} instead" in r.stderr
    with pytest.raises(InvalidInput, match="has ended"):
        await app.retry(kid)
    status, text = dashboard_refused(base, kid, "retry")
    assert status == 409 and "has ended" in text and parents[0] in text, text
    assert run_row(db, kid) == before
    for surface, pid in zip(SURFACES, parents, strict=False):
        assert await retry_via(surface, app, dsn, base, pid) == "waiting"
    for surface, pid in zip(SURFACES, parents, strict=False):
        done = wait_for(db, pid, *TERMINAL)
        assert done["status"] == "completed", (surface, done["error"])
        assert done["result"] == ["child-0"]
        assert wait_for(db, kids[pid], *TERMINAL)["status"] == "completed"
        assert calls(db, kids[pid])["child:work"] == 3  # 2 attempts, then once more
    # a fork of the parent (each surface) has no children of its own: it sees what
    # the source saw
    for surface, pid in zip(SURFACES, parents[len(SURFACES):], strict=True):
        fork = await fork_via(surface, app, dsn, base, pid)
        done = wait_for(db, fork, *TERMINAL)
        assert done["status"] == "failed", (surface, done)
        assert "1 child run(s) failed" in done["error"]["message"], (surface, done["error"])
        assert not (await app.get_run(fork)).children, surface


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_parent_whose_step_after_the_gather_failed_retries_its_children(
        db: psycopg.Connection[Any], app: pgdurable.Durable, dsn: str, base: str,
        worker: None, surface: str) -> None:
    """(e) with (a): the step right after the gather failed uncaught. The retry
    drops its record, so the gather's outcome is the one it continues with: the
    failed child is retried, the parent waits for it, then runs the step again."""
    break_backend(db)
    pid = await app.start("parent", {"children": [{}], "combine": True}, revision="1")
    failed = wait_for(db, pid, *TERMINAL)
    assert failed["error"]["type"] == "StepFailed" and failed["error"]["checkpoint"] == 3
    kid = (await app.get_run(pid)).children[0]
    fix_backend(db)
    assert await retry_via(surface, app, dsn, base, pid) == "waiting"
    done = wait_for(db, pid, *TERMINAL)
    assert done["status"] == "completed", done["error"]
    assert done["result"] == ["child-0"]
    assert names(db, pid) == ["child:1", "children#1", "combine", "return"]
    assert calls(db, kid) == {"child:work": 3} and calls(db, pid) == {"combine": 3}


async def test_a_child_retried_while_its_parent_waits_is_waited_for(
        db: psycopg.Connection[Any], app: pgdurable.Durable, dsn: str, base: str,
        fleet: Fleet) -> None:
    """(e) The parent waits on two children; one failed, the other still waits
    for a signal. Retrying the failed child (each surface) makes the parent
    wait for its new outcome too: when the other child finishes first, the
    parent keeps waiting instead of waking with a child that is still running."""
    fleet.start("default")
    kids0 = fleet.start("kids0", queues="kids0")  # serves the children that fail
    break_backend(db)
    spec = {"children": [{"queue": "kids0"}, {"hold": True, "ok": True}]}
    parents = [await app.start("parent", spec, revision="1") for _ in SURFACES]
    kids: dict[str, list[str]] = {}
    for pid in parents:
        wait_for(db, pid, "waiting")
        kids[pid] = (await app.get_run(pid)).children
        wait_for(db, kids[pid][0], "failed")
        wait_for(db, kids[pid][1], "waiting")
    kids0.terminate()  # nobody serves the failed children's queue for now
    fix_backend(db)
    for surface, pid in zip(SURFACES, parents, strict=True):
        assert await retry_via(surface, app, dsn, base, kids[pid][0]) == "runnable"
        db.execute("SELECT pgdurable.signal_run(%s, 'go', 'true', NULL, NULL)", (kids[pid][1],))
    for pid in parents:
        wait_for(db, kids[pid][1], "completed")
        # the fan-in ran in that child's completing transaction: the parent's
        # state is settled, and it still waits for the retried child
        assert run_row(db, pid)["status"] == "waiting"
        assert db.execute("SELECT remaining FROM pgdurable.child_wait_sets "
                          "WHERE parent_run_id = %s", (pid,)).fetchone() == (1,)
    fleet.start("kids0-again", queues="kids0")
    for pid in parents:
        done = wait_for(db, pid, *TERMINAL)
        assert done["status"] == "completed", done["error"]
        assert done["result"] == ["child-0", "child:work"]
