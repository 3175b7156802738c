"""Fork, rewind, bulk fork, step timeouts and hung-step detection (issue 19).

Steps run in real worker subprocesses (``python -m pgdurable.worker
_fork_app:app``, the ``fleet`` fixture of tests/fix_fleet.py); every assertion is on
database state (ledger rows, run status, attempts, error type), never on elapsed time.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fix_fleet import Fleet, Proc, WorkerProc

from pgdurable import (
    Durable,
    DurableClient,
    InvalidInput,
    RevisionNotServed,
    RunNotFound,
    StepNotRecorded,
)

sys.path.insert(0, os.path.join(os.path.dirname(__file__)))
import _fork_app as fa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAIT_LIMIT = 120.0  # a hang guard only, never a pass/fail threshold


@pytest.fixture
def scratch(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(fa.SCRATCH)
    return conn


#: The workers' options (as before the fleet fixture: the worker's own grace, 30 s).
pytestmark = pytest.mark.fleet("_fork_app:app", ttl=5.0, poll=0.2, concurrency=8)


@contextmanager
def worker_proc(fleet: Fleet, dsn: str) -> Iterator[WorkerProc]:
    """A worker of ``_fork_app`` while the block runs, then a clean stop (SIGTERM: it
    unregisters its revisions)."""
    proc = fleet.start(f"w{len(fleet.all) + 1}", env={"PGD_FORK_DSN": dsn})
    try:
        yield proc
    finally:
        proc.terminate()


@asynccontextmanager
async def app_for(dsn: str) -> AsyncIterator[Durable]:
    app = fa.make_app(dsn)
    try:
        yield app
    finally:
        await app.close()


async def until(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...],
                proc: Proc | None = None) -> None:
    """Wait until ``sql`` returns true (hang guard: WAIT_LIMIT)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + WAIT_LIMIT
    while True:
        row = conn.execute(sql, params).fetchone()
        if row is not None and row[0]:
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"worker exited ({proc.returncode})")
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for: {sql} {params}")
        await asyncio.sleep(0.05)


async def wait_status(conn: psycopg.Connection[Any], rid: str, statuses: list[str],
                      proc: Proc | None = None) -> None:
    await until(conn, "SELECT status = ANY(%s) FROM pgdurable.runs WHERE id = %s::uuid",
                (statuses, rid), proc)


def ledger(conn: psycopg.Connection[Any], rid: str) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT step FROM public.ledger WHERE run_id = %s ORDER BY id", (rid,)).fetchall()]


def run_row(conn: psycopg.Connection[Any], rid: str) -> dict[str, Any]:
    row = conn.execute("SELECT to_jsonb(r) FROM pgdurable.runs r WHERE id = %s::uuid",
                       (rid,)).fetchone()
    assert row is not None
    d: dict[str, Any] = row[0]
    return d


def snapshot(conn: psycopg.Connection[Any], rid: str) -> tuple[Any, ...]:
    """Everything a fork must leave untouched about the source run."""
    run = run_row(conn, rid)
    cps = conn.execute("SELECT step, token, state, created_at FROM pgdurable.checkpoints "
                       "WHERE run_id = %s ORDER BY step", (rid,)).fetchall()
    effs = conn.execute("SELECT key, status, token, result, step FROM pgdurable.effects "
                        "WHERE run_id = %s ORDER BY key", (rid,)).fetchall()
    return run, cps, effs


def counts(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    row = conn.execute("SELECT (SELECT count(*) FROM pgdurable.runs), "
                       "(SELECT count(*) FROM pgdurable.checkpoints), "
                       "(SELECT count(*) FROM pgdurable.effects), "
                       "(SELECT count(*) FROM pgdurable.run_rewinds)").fetchone()
    assert row is not None
    return tuple(row)


async def test_fork_at_step_3_repeats_only_effects_4_to_6(dsn: str, scratch: Any,
                                                         fleet: Fleet) -> None:
    conn = scratch
    async with app_for(dsn) as app:
        with worker_proc(fleet, dsn) as proc:
            src = await app.start("six", {})
            await wait_status(conn, src, ["completed"], proc)
            assert ledger(conn, src) == [1, 2, 3, 4, 5, 6]
            before = snapshot(conn, src)
            fork = await app.fork(src, from_step=3, state={"patched": True})
            assert fork != src
            await wait_status(conn, fork, ["completed"], proc)
        # effects 1-3 were not performed again; 4-6 ran again in the fork
        assert ledger(conn, fork) == [4, 5, 6]
        assert ledger(conn, src) == [1, 2, 3, 4, 5, 6]
        assert snapshot(conn, src) == before  # the source is untouched
        f = run_row(conn, fork)
        assert f["forked_from"] == src and f["forked_from_step"] == 3
        assert f["status"] == "completed" and f["step"] == 6
        assert f["state"]["patched"] is True
        # the fork's history: checkpoints 1..3 copied, then its own 4..6
        cps = conn.execute("SELECT step, token FROM pgdurable.checkpoints WHERE run_id = %s "
                           "ORDER BY step", (fork,)).fetchall()
        assert [c[0] for c in cps] == [1, 2, 3, 4, 5, 6]
        assert [c[1] for c in cps[:3]] == [0, 0, 0] and all(c[1] > 0 for c in cps[3:])
        src_cps = conn.execute("SELECT state FROM pgdurable.checkpoints WHERE run_id = %s "
                               "AND step <= 3 ORDER BY step", (src,)).fetchall()
        fork_cps = conn.execute("SELECT state FROM pgdurable.checkpoints WHERE run_id = %s "
                                "AND step <= 3 ORDER BY step", (fork,)).fetchall()
        assert src_cps == fork_cps
        # effects of steps 1..3 carried over with their recorded results
        effs = dict(conn.execute("SELECT key, result FROM pgdurable.effects WHERE run_id = %s",
                                 (fork,)).fetchall())
        src_effs = dict(conn.execute("SELECT key, result FROM pgdurable.effects "
                                     "WHERE run_id = %s", (src,)).fetchall())
        assert {k: effs[k] for k in ("e1", "e2", "e3")} == {
            k: src_effs[k] for k in ("e1", "e2", "e3")}
        assert effs["e4"] != src_effs["e4"]  # performed again: a new ledger entry
        # the CLI shows the lineage
        rc, text = run_cli(["run", fork, "--dsn", dsn])
        assert rc == 0 and f"{src} at step 3" in text


def run_cli(argv: list[str]) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "pgdurable", *argv], cwd=ROOT,
                          capture_output=True, text=True, env=dict(os.environ, COLUMNS="200"))
    return proc.returncode, proc.stdout + proc.stderr


async def test_rewind_in_place_and_bulk_fork(dsn: str, scratch: Any, fleet: Fleet) -> None:
    conn = scratch
    since = datetime.now(UTC) - timedelta(minutes=5)
    conn.execute("INSERT INTO public.switches VALUES ('fail', 3)")  # step 4 fails
    async with app_for(dsn) as app:
        with worker_proc(fleet, dsn) as proc:
            a = await app.start("six", {})
            b = await app.start("six", {})
            c = await app.start("six", {})
            for rid in (a, b, c):
                await wait_status(conn, rid, ["failed"], proc)
            assert run_row(conn, a)["error"]["type"] == "ValueError"
            assert ledger(conn, a) == [1, 2, 3]
            conn.execute("DELETE FROM public.switches")
            # rewind a to step 2 in place: step 3 (and its effect) runs again
            assert await app.rewind(a, to_step=2, state={"rewound": True}) == "runnable"
            await wait_status(conn, a, ["completed"], proc)
            assert ledger(conn, a) == [1, 2, 3, 3, 4, 5, 6]
            r = run_row(conn, a)
            assert r["state"]["rewound"] is True and r["forked_from"] is None
            rw = conn.execute("SELECT from_step, to_step, status, error->>'type', "
                              "jsonb_array_length(checkpoints), effects->0->>'key' "
                              "FROM pgdurable.run_rewinds WHERE run_id = %s", (a,)).fetchall()
            assert rw == [(3, 2, "failed", "ValueError", 1, "e3")]
            rc, text = run_cli(["run", a, "--dsn", dsn])
            assert rc == 0 and "from step 3 to step 2 (was failed)" in text
            assert conn.execute("SELECT rewinds, forks FROM pgdurable.run_lineage "
                                "WHERE id = %s", (a,)).fetchone() == (1, 0)
            # bulk fork: b and c (a is completed now), from their last checkpoint
            forks = await app.fork_failed("six", error="ValueError", since=since)
            assert sorted(f.source for f in forks) == sorted([b, c])
            for f in forks:
                await wait_status(conn, f.fork, ["completed"], proc)
                assert ledger(conn, f.fork) == [4, 5, 6]
                assert run_row(conn, f.fork)["forked_from_step"] == 3
            # again: nothing new to fork; another error type: nothing
            assert await app.fork_failed("six", error="ValueError", since=since) == []
        assert run_row(conn, b)["status"] == "failed"  # sources untouched
        assert conn.execute("SELECT forks FROM pgdurable.run_lineage WHERE id = %s",
                            (b,)).fetchone() == (1,)


async def test_fork_bad_input_writes_nothing(dsn: str, scratch: Any, fleet: Fleet) -> None:
    conn = scratch
    async with app_for(dsn) as app:
        with worker_proc(fleet, dsn) as proc:
            src = await app.start("six", {})
            await wait_status(conn, src, ["completed"], proc)
            # a started worker registered revision "1" of its tasks
            assert conn.execute("SELECT count(*) FROM pgdurable.worker_revisions "
                                "WHERE task = 'six' AND revision = '1'").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM pgdurable.worker_revisions").fetchone() == (0,)
        before = counts(conn)
        with pytest.raises(RunNotFound):
            await app.fork("00000000-0000-0000-0000-000000000000", from_step=1)
        with pytest.raises(StepNotRecorded):
            await app.fork(src, from_step=7)
        with pytest.raises(StepNotRecorded):
            await app.fork(src, from_step=0)
        with pytest.raises(InvalidInput):
            await app.fork(src, from_step=-1)
        with pytest.raises(InvalidInput):
            await app.fork(src, from_step=3, state={1, 2})  # not JSON
        with pytest.raises(InvalidInput):
            await app.fork(src, from_step=3, state={"x": 1}, state_mode="append")  # type: ignore[arg-type]
        with pytest.raises(RevisionNotServed):
            await app.fork(src, from_step=3, revision="2")
        with pytest.raises(InvalidInput):  # only failed/cancelled runs are rewound
            await app.rewind(src, to_step=3)
        with pytest.raises(InvalidInput):
            await app.fork_failed("six", error="ValueError", since=datetime(2020, 1, 1))
        assert counts(conn) == before
        # CLI: not JSON -> exit 2; unknown run -> exit 3; nothing written
        rc, text = run_cli(["fork", src, "--step", "3", "--state", "{not json", "--dsn", dsn])
        assert rc == 2 and "not JSON" in text
        rc, _ = run_cli(["fork", "00000000-0000-0000-0000-000000000000", "--step", "1",
                         "--dsn", dsn])
        assert rc == 3
        rc, text = run_cli(["fork", src, "--step", "9", "--dsn", dsn])
        assert rc == 2 and "no recorded step 9" in text
        assert counts(conn) == before
        # forced revision; sync twin; merge patch semantics (RFC 7396)
        forced = await app.fork(src, from_step=3, revision="2", force=True,
                                state={"entries": None, "x": {"y": 1}})
        f = run_row(conn, forced)
        assert f["revision"] == "2" and f["state"] == {"x": {"y": 1}}
        with DurableClient(dsn) as client:
            sync_fork = client.fork(src, 2, {"z": 1}, state_mode="replace")
            assert run_row(conn, sync_fork)["state"] == {"z": 1}
            with pytest.raises(StepNotRecorded):
                client.fork(src, 8)
        rc, text = run_cli(["fork", src, "--step", "2", "--dsn", dsn])
        assert rc == 0 and "forked from" in text


def test_negative_or_zero_timeouts_are_refused(dsn: str) -> None:
    app = Durable(dsn)
    for kw in ({"step_timeout": timedelta(seconds=-1)}, {"heartbeat_timeout": -0.5},
               {"step_timeout": 0}):
        with pytest.raises(InvalidInput):
            app.task("t", **kw)(lambda ctx, s: None)  # type: ignore[arg-type]
    assert app.tasks == {}


async def test_step_timeout_retries_then_fails(dsn: str, scratch: Any, fleet: Fleet) -> None:
    conn = scratch
    async with app_for(dsn) as app:
        with worker_proc(fleet, dsn) as proc:
            rid = await app.start("slow", {})
            sync_rid = await app.start("slow_sync", {})
            await wait_status(conn, rid, ["failed"], proc)
            await wait_status(conn, sync_rid, ["failed"], proc)
            r = run_row(conn, rid)
            assert r["attempts"] == 3 and r["error"]["type"] == "StepTimeout"
            assert r["claims"] == 3  # each attempt was a claim: retried, not stuck
            s = run_row(conn, sync_rid)
            assert s["attempts"] == 2 and s["error"]["type"] == "StepTimeout"
            assert s["result"] is None  # the thread's late Done("late") was refused


async def test_hung_step_cancelled_beating_step_completes(dsn: str, scratch: Any,
                                                         fleet: Fleet) -> None:
    conn = scratch
    async with app_for(dsn) as app:
        with worker_proc(fleet, dsn) as proc:
            hung = await app.start("hangs", {})
            ok = await app.start("beats", {})
            ok_sync = await app.start("beats_sync", {})
            await wait_status(conn, hung, ["failed"], proc)
            await wait_status(conn, ok, ["completed", "failed"], proc)
            await wait_status(conn, ok_sync, ["completed", "failed"], proc)
        h = run_row(conn, hung)
        assert h["attempts"] == 2 and h["error"]["type"] == "StepHung"
        assert h["progress"] == {"phase": "wedged", "attempt": 2}
        assert h["heartbeat_at"] is not None
        for rid in (ok, ok_sync):
            r = run_row(conn, rid)
            assert (r["status"], r["attempts"], r["result"]) == ("completed", 0, "done")
            assert r["progress"]["i"] >= 0 and r["heartbeat_at"] is not None


async def test_rewind_of_a_cancelled_run_and_its_errors(dsn: str, conn: psycopg.Connection[Any]) -> None:
    async with app_for(dsn) as app:
        rid = await app.start("six", {"a": 1})
        assert await app.cancel(rid) == "cancelled"  # never claimed: step 0
        before = counts(conn)
        with pytest.raises(StepNotRecorded):
            await app.rewind(rid, to_step=1)
        with pytest.raises(RunNotFound):
            await app.rewind("00000000-0000-0000-0000-000000000000", to_step=0)
        with pytest.raises(InvalidInput):
            await app.rewind(rid, to_step=0, state=float("nan"))  # not JSON
        with pytest.raises(RevisionNotServed):
            await app.rewind(rid, to_step=0, revision="9")
        assert counts(conn) == before and run_row(conn, rid)["status"] == "cancelled"
        assert await app.rewind(rid, to_step=0, state={"b": 2}) == "runnable"
        r = run_row(conn, rid)
        assert (r["status"], r["step"], r["state"], r["error"]) == (
            "runnable", 0, {"a": 1, "b": 2}, None)
        with DurableClient(dsn) as client:  # sync twins share the SQL
            with pytest.raises(InvalidInput):
                client.rewind(rid, 0)  # runnable now: not failed/cancelled
            assert client.fork_failed("six", error=None, since=datetime.now(UTC)) == []


@pytest.mark.parametrize(("target", "patch", "merged"), [
    # RFC 7396, appendix A
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
])
def test_json_merge_patch_follows_rfc_7396(conn: psycopg.Connection[Any], target: Any,
                                           patch: Any, merged: Any) -> None:
    row = conn.execute("SELECT pgdurable.json_merge_patch(%s::jsonb, %s::jsonb)",
                       (json.dumps(target), json.dumps(patch))).fetchone()
    assert row == (merged,)
