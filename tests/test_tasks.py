"""define_durable_task: the seed's examples, rejections, replay policies, stores.

Every behaviour runs on MemoryDurableStore and PostgresDurableStore (real
database); the crash and exclusivity tests use real processes.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _waiting import until_sync as wait_until
from psycopg_pool import AsyncConnectionPool

import pgdurable
from pgdurable import (
    AttemptsExhausted,
    CancelSignal,
    CorruptCheckpoint,
    DeadlineExceeded,
    DurableCheckpoint,
    DurableContext,
    DurableStep,
    DurableStore,
    IncompatibleCheckpoint,
    InvalidInput,
    MemoryDurableStore,
    PostgresDurableStore,
    ReconcileFailed,
    RunCancelled,
    define_durable_task,
)
from pgdurable.models.durable_tasks import CHECKPOINT_VERSION, KIT_CHECKPOINT_VERSION

ROOT = Path(__file__).resolve().parent.parent
HELPER = str(ROOT / "tests" / "_effect_procs.py")

# pg_locks spans the whole cluster: count this test database's advisory locks only
_THIS_DB = "database = (SELECT oid FROM pg_database WHERE datname = current_database())"


def is_count(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("count"), int)


def seed_record(*, definition_id: str = "count", revision: str = "1", count: Any = 0,
                **over: Any) -> dict[str, Any]:
    rec = {
        "version": CHECKPOINT_VERSION, "definition_id": definition_id, "revision": revision,
        "next_step_index": 0, "attempt_count": 0, "max_attempts": 3,
        "deadline_at_ms": int(time.time() * 1000) + 60_000, "status": "ready",
        "state": {"count": count}, "in_flight_step": None, "error": None,
    }
    rec.update(over)
    return rec


@pytest.fixture(params=["memory", "postgres"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[DurableStore]:
    if request.param == "memory":
        yield MemoryDurableStore()
        return
    dsn = request.getfixturevalue("dsn")
    async with PostgresDurableStore(dsn) as s:
        yield s


async def stored(store: DurableStore, task_id: str) -> dict[str, Any] | None:
    rec = await store.load(task_id)
    return None if rec is None else dict(rec)




def spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, HELPER, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# ------------------------------------------------------------------ seed examples
async def test_seed_count_example(store: DurableStore) -> None:
    await store.save("demo-task", seed_record())
    task = define_durable_task(
        id="count", revision="1", is_state=is_count,
        steps=[DurableStep(id="increment", replay="safe",
                           run=lambda state, _ctx: {"count": state["count"] + 1})],
    )
    context = DurableContext(app=None, signal=asyncio.Event())
    assert await task.run(task_id="demo-task", store=store, context=context) == {"count": 1}
    rec = await stored(store, "demo-task")
    assert rec is not None
    assert rec["attempt_count"] == 1
    assert rec["status"] == "completed" and rec["next_step_index"] == 1


async def test_seed_reconcile_example(store: DurableStore) -> None:
    await store.save("demo-task", seed_record())
    committed: dict[str, int] = {}
    runs: list[str] = []

    async def run(state: Any, ctx: DurableContext[dict[str, str]]) -> Any:
        runs.append("run")
        value = committed.get(ctx.app["key"], state["count"] + 1)
        committed[ctx.app["key"]] = value
        return {"count": value}

    async def reconcile(state: Any, ctx: DurableContext[dict[str, str]]) -> Any:
        if ctx.app["key"] not in committed:
            raise RuntimeError("no verifiable commit; the app must decide")
        return {"count": committed[ctx.app["key"]]}

    task = define_durable_task(
        id="count", revision="1", is_state=is_count,
        steps=[DurableStep(id="commit", replay="reconcile", run=run, reconcile=reconcile)],
    )
    context = DurableContext(app={"key": "demo-task"})
    assert await task.run(task_id="demo-task", store=store, context=context) == {"count": 1}
    assert await task.run(task_id="demo-task", store=store, context=context) == {"count": 1}
    assert len(committed) == 1
    assert runs == ["run"]  # the completed record runs no step again
    rec = await stored(store, "demo-task")
    assert rec is not None and rec["attempt_count"] == 1 and rec["in_flight_step"] is None


async def test_fresh_task_id_starts_from_initial_state(store: DurableStore) -> None:
    task = define_durable_task(
        id="count", revision="1", is_state=is_count, initial_state={"count": 10},
        steps=[DurableStep(id=f"s{i}", run=lambda s, _c: {"count": s["count"] + 1})
               for i in range(3)],
    )
    assert await task.run(task_id="fresh", store=store) == {"count": 13}
    assert await task.run(task_id="other", store=store, state={"count": 0}) == {"count": 3}
    with pytest.raises(ValueError, match="no record and no valid initial state"):
        await define_durable_task(
            id="count", revision="1", is_state=is_count,
            steps=[DurableStep(id="s", run=lambda s, _c: s)],
        ).run(task_id="none", store=store)
    assert await stored(store, "none") is None


# ------------------------------------------------------------------ the kit's own records
#: The fields of the kit's checkpoint record (the seed's DurableCheckpoint), in its order.
KIT_FIELDS = ["version", "definitionId", "revision", "nextStepIndex", "attemptCount",
              "maxAttempts", "deadlineAtMs", "status", "state"]


def kit_record(**over: Any) -> dict[str, Any]:
    rec = {"version": 2, "definitionId": "count", "revision": "1", "nextStepIndex": 0,
           "attemptCount": 0, "maxAttempts": 3, "deadlineAtMs": int(time.time() * 1000) + 60_000,
           "status": "ready", "state": {"count": 0}}
    rec.update(over)
    return rec


def _kit_example() -> Any:
    spec = importlib.util.spec_from_file_location("durable_task_kit",
                                                  ROOT / "examples" / "durable_task_kit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What the seed's two examples print, as its code says: console.log of the state that
# task.run returns, then of the record's attemptCount (the first); of the state of two
# runs, the second of a completed record running no step, then committed.size (the second).
KIT_OUTPUT = {
    "count_example": "{ count: 1 }\n1\n",
    "reconcile_example": "{ count: 1 }\n{ count: 1 }\n1\n",
}


@pytest.mark.parametrize("example", sorted(KIT_OUTPUT))
async def test_the_kits_examples_print_the_kits_output_on_the_kits_records(
    example: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """examples/durable_task_kit.py is the seed's two examples, fed the kit's own
    records (camelCase, version 2) in the kit's store: they print what the kit
    prints, and the records they leave are the kit's again (so the kit resumes
    them): before, run refused them ("checkpoint record has no 'definition_id'")."""
    records = await getattr(_kit_example(), example)()
    assert capsys.readouterr().out == KIT_OUTPUT[example]
    rec = records["demo-task"]
    assert list(rec) == KIT_FIELDS
    assert rec["version"] == KIT_CHECKPOINT_VERSION and rec["definitionId"] == "count"
    assert (rec["status"], rec["nextStepIndex"], rec["attemptCount"], rec["state"]) == (
        "completed", 1, 1, {"count": 1})


async def test_a_kit_record_resumes_here_and_is_saved_for_the_kit(store: DurableStore) -> None:
    """A kit record in the middle of its steps (no deadline: the kit leaves the
    field out) resumes at nextStepIndex; with record_format="kit" every save is
    the kit's record, exactly its fields; by default the first save converts it
    to pgdurable's, and a kit-format task converts pgdurable's back."""
    ran: list[str] = []
    seen: list[dict[str, Any]] = []

    def make(step_id: str) -> DurableStep:
        async def run(state: Any, _ctx: Any) -> Any:
            ran.append(step_id)
            rec = await stored(store, "t")  # what the store holds while the step runs
            assert rec is not None
            seen.append(rec)
            return {"count": state["count"] + 1}

        return DurableStep(id=step_id, run=run)

    steps = [make(f"s{i}") for i in range(3)]
    started = kit_record(nextStepIndex=1, attemptCount=1, status="ready", state={"count": 1})
    del started["deadlineAtMs"]
    await store.save("t", started)
    task = define_durable_task(id="count", revision="1", is_state=is_count, steps=steps,
                               record_format="kit")
    assert await task.run(task_id="t", store=store) == {"count": 3}
    assert ran == ["s1", "s2"]
    assert [r["status"] for r in seen] == ["ready", "ready"]  # between steps: resumable
    assert all(set(r) == set(KIT_FIELDS) - {"deadlineAtMs"} for r in seen)  # (jsonb: any order)
    assert await stored(store, "t") == {
        "version": 2, "definitionId": "count", "revision": "1", "nextStepIndex": 3,
        "attemptCount": 2, "maxAttempts": 3, "status": "completed", "state": {"count": 3}}

    await store.save("u", kit_record())
    plain = define_durable_task(id="count", revision="1", is_state=is_count, steps=steps)
    assert await plain.run(task_id="u", store=store) == {"count": 3}
    rec = await stored(store, "u")
    assert rec is not None and rec["version"] == CHECKPOINT_VERSION
    assert rec["definition_id"] == "count" and rec["attempt_count"] == 1

    await store.save("v", seed_record(next_step_index=2, attempt_count=1, status="running"))
    assert await task.run(task_id="v", store=store) == {"count": 1}
    rec = await stored(store, "v")
    assert rec is not None and set(rec) == set(KIT_FIELDS) and rec["attemptCount"] == 2


async def test_a_kit_record_running_at_a_reconcile_step_is_reconciled(
    store: DurableStore
) -> None:
    """The kit's record has no in-flight field: a reconcile step started and not
    confirmed is saved "running" at its index, and such a record, the kit's or
    ours, is read as that step in flight: reconciled, never re-run."""
    calls: list[str] = []
    marks: list[dict[str, Any]] = []

    async def commit(state: Any, _ctx: Any) -> Any:
        calls.append("run")
        rec = await stored(store, "t")
        assert rec is not None
        marks.append(rec)
        return {"count": state["count"] + 1}

    def reconcile(state: Any, _ctx: Any) -> Any:
        calls.append("reconcile")
        return {"count": 41}

    task = define_durable_task(
        id="count", revision="1", is_state=is_count, record_format="kit",
        steps=[DurableStep(id="commit", run=commit, replay="reconcile", reconcile=reconcile)],
    )
    await store.save("t", kit_record())
    assert await task.run(task_id="t", store=store) == {"count": 1}
    assert [(m["status"], m["nextStepIndex"]) for m in marks] == [("running", 0)]

    await store.save("k", kit_record(status="running", attemptCount=1))  # the kit's, unconfirmed
    assert await task.run(task_id="k", store=store) == {"count": 41}
    assert calls == ["run", "reconcile"]
    rec = await stored(store, "k")
    assert rec is not None and (rec["status"], rec["attemptCount"]) == ("completed", 2)


@pytest.mark.parametrize("record, exc, match", [
    (kit_record(definitionId="other"), IncompatibleCheckpoint, "'other'"),
    (kit_record(revision="0"), IncompatibleCheckpoint, "revision '0'"),
    (kit_record(version=3), IncompatibleCheckpoint, "kit's checkpoint record version 3"),
    ({k: v for k, v in kit_record().items() if k != "nextStepIndex"}, CorruptCheckpoint,
     "no 'nextStepIndex'"),
    (kit_record(attemptCount="1"), CorruptCheckpoint, "'attemptCount'"),
    (kit_record(deadlineAtMs="soon"), CorruptCheckpoint, "'deadlineAtMs'"),
    (kit_record(status="paused"), CorruptCheckpoint, "unknown status"),
    ({"version": 2, "state": {"count": 0}}, CorruptCheckpoint, "no 'definition_id'.*'definitionId'"),
])
async def test_a_bad_kit_record_is_rejected_and_left_alone(
    store: DurableStore, record: dict[str, Any], exc: type[Exception], match: str
) -> None:
    await store.save("t", record)
    task = define_durable_task(id="count", revision="1", is_state=is_count, record_format="kit",
                               steps=[DurableStep(id="s", run=_never)])
    with pytest.raises(exc, match=match):
        await task.run(task_id="t", store=store)
    assert await stored(store, "t") == record


def test_the_record_converter_round_trips_both_formats() -> None:
    """DurableCheckpoint.from_json reads both formats, to_json writes either: a
    record converted to the kit's and back is the same record (but for what the
    kit's cannot hold: error, and "running" between steps reads as "ready")."""
    steps = [DurableStep(id="a", run=_never),
             DurableStep(id="b", run=_never, replay="reconcile", reconcile=_never)]
    rec = DurableCheckpoint(version=CHECKPOINT_VERSION, definition_id="count", revision="1",
                            next_step_index=1, attempt_count=2, max_attempts=3,
                            deadline_at_ms=123, status="running", state={"count": 1},
                            in_flight_step="b")
    kit = rec.to_json("kit")
    assert list(kit) == KIT_FIELDS and kit["status"] == "running"
    assert DurableCheckpoint.from_json(kit, steps=steps) == rec
    assert DurableCheckpoint.from_json(rec.to_json(), steps=steps) == rec
    between = replace(rec, in_flight_step=None, error={"type": "E", "message": "m"})
    assert between.to_json("kit")["status"] == "ready"
    assert DurableCheckpoint.from_json(between.to_json("kit"), steps=steps) == replace(
        between, status="ready", error=None)
    with pytest.raises(ValueError, match="record_format"):
        rec.to_json("camel")  # type: ignore[arg-type]
    # the kit's numbers are JavaScript's (doubles): an integral float deadline reads as ms
    assert DurableCheckpoint.from_json(kit_record(deadlineAtMs=1.7e12)).deadline_at_ms == (
        1_700_000_000_000)


# ------------------------------------------------------------------ rejections
def _never(*_a: Any) -> Any:
    raise AssertionError("no step may run")


@pytest.mark.parametrize("field, value", [("revision", "0"), ("definition_id", "other")])
async def test_checkpoint_of_another_definition_is_rejected(
    store: DurableStore, field: str, value: str
) -> None:
    seeded = seed_record(**{field: value})
    await store.save("t", seeded)
    task = define_durable_task(id="count", revision="1", is_state=is_count,
                               steps=[DurableStep(id="s", run=_never)])
    with pytest.raises(IncompatibleCheckpoint, match=repr(value)):
        await task.run(task_id="t", store=store)
    assert await stored(store, "t") == seeded  # untouched


@pytest.mark.parametrize("mutate", [
    lambda r: r.update(state={"count": "one"}),        # fails is_state
    lambda r: r.pop("attempt_count"),                  # malformed record
    lambda r: r.update(status="exploded"),             # unknown status
    lambda r: r.update(next_step_index=5),             # past the end
    lambda r: r.update(in_flight_step="s"),            # a safe step marked in flight
])
async def test_corrupt_checkpoint_is_rejected(
    store: DurableStore, mutate: Callable[[dict[str, Any]], Any]
) -> None:
    seeded = seed_record()
    mutate(seeded)
    await store.save("t", seeded)
    task = define_durable_task(id="count", revision="1", is_state=is_count,
                               steps=[DurableStep(id="s", run=_never)])
    with pytest.raises(CorruptCheckpoint):
        await task.run(task_id="t", store=store)
    assert await stored(store, "t") == seeded


async def test_authorize_denial_stops_before_any_step(store: DurableStore) -> None:
    await store.save("t", seed_record())
    seen: list[DurableCheckpoint] = []

    class Denied(Exception):
        pass

    async def authorize(checkpoint: DurableCheckpoint, ctx: Any) -> None:
        seen.append(checkpoint)
        if ctx.app != "alice":
            raise Denied("bob may not resume")

    task = define_durable_task(id="count", revision="1", is_state=is_count, authorize=authorize,
                               steps=[DurableStep(id="s", run=lambda s, _c: {"count": 7})])
    before = await stored(store, "t")
    with pytest.raises(Denied):
        await task.run(task_id="t", store=store, context=DurableContext(app="bob"))
    assert await stored(store, "t") == before  # nothing counted, nothing saved
    deny_false = define_durable_task(id="count", revision="1", is_state=is_count,
                                     authorize=lambda _c, _x: False,
                                     steps=[DurableStep(id="s", run=_never)])
    with pytest.raises(PermissionError):
        await deny_false.run(task_id="t", store=store)
    assert await stored(store, "t") == before
    assert await task.run(task_id="t", store=store, context=DurableContext(app="alice")) == {
        "count": 7}
    assert [c.attempt_count for c in seen] == [0, 0]
    assert isinstance(seen[0], DurableCheckpoint) and seen[0].state == {"count": 0}


async def test_authorize_is_rechecked_on_every_resume(store: DurableStore) -> None:
    calls: list[int] = []
    fail = {"s2": True}

    def s2(state: Any, _c: Any) -> Any:
        if fail["s2"]:
            raise RuntimeError("transient")
        return {"count": state["count"] + 1}

    task = define_durable_task(
        id="count", revision="1", is_state=is_count, initial_state={"count": 0},
        authorize=lambda cp, _c: calls.append(cp.next_step_index),
        steps=[DurableStep(id="s1", run=lambda s, _c: {"count": s["count"] + 1}),
               DurableStep(id="s2", run=s2)],
    )
    with pytest.raises(RuntimeError, match="transient"):
        await task.run(task_id="t", store=store)
    rec = await stored(store, "t")
    assert rec is not None and rec["next_step_index"] == 1
    assert rec["error"] == {"type": "RuntimeError", "message": "transient", "step": "s2"}
    fail["s2"] = False
    assert await task.run(task_id="t", store=store) == {"count": 2}
    assert calls == [0, 1]
    assert await task.run(task_id="t", store=store) == {"count": 2}  # completed: no authorize
    assert calls == [0, 1]


async def test_max_attempts_exceeded_fails_the_record(store: DurableStore) -> None:
    runs: list[int] = []

    def boom(_s: Any, _c: Any) -> Any:
        runs.append(1)
        raise ValueError("always")

    task = define_durable_task(id="count", revision="1", is_state=is_count, max_attempts=2,
                               initial_state={"count": 0}, steps=[DurableStep(id="s", run=boom)])
    for _ in range(2):
        with pytest.raises(ValueError, match="always"):
            await task.run(task_id="t", store=store)
    with pytest.raises(AttemptsExhausted, match="attempt 3 exceeds max_attempts 2"):
        await task.run(task_id="t", store=store)
    rec = await stored(store, "t")
    assert rec is not None
    assert (rec["status"], rec["attempt_count"]) == ("failed", 3)
    assert rec["error"]["type"] == "AttemptsExhausted"
    with pytest.raises(AttemptsExhausted):  # terminal: raised again, nothing counted
        await task.run(task_id="t", store=store)
    assert await stored(store, "t") == rec
    assert len(runs) == 2


async def test_deadline_exceeded_is_recorded(store: DurableStore) -> None:
    clock = {"ms": 1_000_000.0}
    fail = {"s2": True}

    def s2(state: Any, _c: Any) -> Any:
        if fail["s2"]:
            raise RuntimeError("not yet")
        raise AssertionError("must not run after the deadline")

    task = define_durable_task(
        id="count", revision="1", is_state=is_count, initial_state={"count": 0},
        deadline=timedelta(seconds=5), now=lambda: clock["ms"], max_attempts=10,
        steps=[DurableStep(id="s1", run=lambda s, _c: {"count": 1}), DurableStep(id="s2", run=s2)],
    )
    with pytest.raises(RuntimeError):
        await task.run(task_id="t", store=store)
    rec = await stored(store, "t")
    assert rec is not None and rec["deadline_at_ms"] == 1_005_000
    clock["ms"] = 1_004_999.0
    with pytest.raises(RuntimeError):
        await task.run(task_id="t", store=store)  # one ms before: still runs
    clock["ms"] = 1_005_000.0
    fail["s2"] = False
    with pytest.raises(DeadlineExceeded):
        await task.run(task_id="t", store=store)
    rec = await stored(store, "t")
    assert rec is not None
    assert rec["status"] == "failed" and rec["error"]["type"] == "DeadlineExceeded"
    assert rec["next_step_index"] == 1 and rec["state"] == {"count": 1}
    with pytest.raises(DeadlineExceeded):
        await task.run(task_id="t", store=store)


async def test_deadline_in_ms_and_postgres_clock(dsn: str) -> None:
    """Without ``now``, PostgresDurableStore judges deadlines by pgdurable.now()."""
    async with PostgresDurableStore(dsn) as store:
        task = define_durable_task(id="count", revision="1", is_state=is_count,
                                   initial_state={"count": 0}, deadline=60_000,
                                   steps=[DurableStep(id="s", run=lambda s, _c: {"count": 1})])
        assert await task.run(task_id="t", store=store) == {"count": 1}
        rec = await stored(store, "t")
        with psycopg.connect(dsn) as c:
            row = c.execute("SELECT (extract(epoch FROM now()) * 1000)::bigint").fetchone()
        assert rec is not None and row is not None
        assert 0 < rec["deadline_at_ms"] - row[0] <= 60_000


# ------------------------------------------------------------------ reconcile
def _reconcile_task(runs: list[str], reconcile: Callable[[Any, Any], Any]) -> Any:
    def run(state: Any, _c: Any) -> Any:
        runs.append("run")
        return {"count": state["count"] + 1}

    return define_durable_task(
        id="count", revision="1", is_state=is_count,
        steps=[DurableStep(id="prep", run=lambda s, _c: s),
               DurableStep(id="commit", run=run, replay="reconcile", reconcile=reconcile)],
    )


async def test_reconcile_step_is_marked_in_flight_before_it_runs(store: DurableStore) -> None:
    seen: list[Any] = []

    async def run(state: Any, _c: Any) -> Any:
        seen.append(await stored(store, "t"))
        return {"count": 1}

    task = define_durable_task(
        id="count", revision="1", is_state=is_count, initial_state={"count": 0},
        steps=[DurableStep(id="commit", run=run, replay="reconcile",
                           reconcile=lambda s, _c: s)],
    )
    assert await task.run(task_id="t", store=store) == {"count": 1}
    assert seen[0]["in_flight_step"] == "commit" and seen[0]["next_step_index"] == 0
    rec = await stored(store, "t")
    assert rec is not None and rec["in_flight_step"] is None


async def test_in_flight_step_is_reconciled_not_rerun(store: DurableStore) -> None:
    await store.save("t", seed_record(next_step_index=1, in_flight_step="commit",
                                      status="running", attempt_count=1))
    runs: list[str] = []
    task = _reconcile_task(runs, lambda _s, _c: {"count": 41})
    assert await task.run(task_id="t", store=store) == {"count": 41}
    assert runs == []
    rec = await stored(store, "t")
    assert rec is not None
    assert (rec["status"], rec["in_flight_step"], rec["attempt_count"]) == ("completed", None, 2)


async def test_reconcile_failure_stops_and_stays_in_flight(store: DurableStore) -> None:
    await store.save("t", seed_record(next_step_index=1, in_flight_step="commit",
                                      status="running", attempt_count=1))
    runs: list[str] = []

    def reconcile(_s: Any, _c: Any) -> Any:
        raise LookupError("the ledger has no entry")

    task = _reconcile_task(runs, reconcile)
    for attempt in (2, 3):
        with pytest.raises(ReconcileFailed, match="ledger") as info:
            await task.run(task_id="t", store=store)
        assert isinstance(info.value.__cause__, LookupError)
        rec = await stored(store, "t")
        assert rec is not None
        assert rec["in_flight_step"] == "commit" and rec["next_step_index"] == 1
        assert rec["status"] == "running" and rec["attempt_count"] == attempt
    assert runs == []  # never re-run blindly


async def test_reconcile_step_whose_run_raised_is_reconciled(store: DurableStore) -> None:
    """run() raising after an unknown amount of work leaves the step in flight."""
    effects: list[int] = []
    runs: list[str] = []

    def run(state: Any, _c: Any) -> Any:
        runs.append("run")
        effects.append(1)
        raise ConnectionError("response lost after the effect")

    task = define_durable_task(
        id="count", revision="1", is_state=is_count, initial_state={"count": 0},
        steps=[DurableStep(id="commit", run=run, replay="reconcile",
                           reconcile=lambda _s, _c: {"count": len(effects)})],
    )
    with pytest.raises(ConnectionError):
        await task.run(task_id="t", store=store)
    assert await task.run(task_id="t", store=store) == {"count": 1}
    assert runs == ["run"] and len(effects) == 1


@pytest.mark.crash
async def test_sigkill_mid_reconcile_step_then_reconcile_on_resume(dsn: str) -> None:
    """A real process commits the effect and is SIGKILLed before its checkpoint."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE committed (key text PRIMARY KEY, value int NOT NULL)")
    proc = spawn("reconcile-crash", dsn, "crash-task")
    try:
        def committed() -> bool:
            with psycopg.connect(dsn) as c:
                return c.execute("SELECT count(*) FROM committed").fetchone() == (1,)

        wait_until(lambda: committed() or proc.poll() is not None, "the effect")
        assert proc.poll() is None, proc.communicate()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    runs: list[str] = []

    def reconcile(_state: Any, _c: Any) -> Any:
        with psycopg.connect(dsn) as c:
            row = c.execute("SELECT value FROM committed WHERE key = 'crash-task'").fetchone()
        if row is None:
            raise LookupError("not committed")
        return {"count": row[0]}

    def run(_s: Any, _c: Any) -> Any:
        runs.append("run")
        raise AssertionError("run must not be re-run")

    task = define_durable_task(
        id="count", revision="1", is_state=is_count, initial_state={"count": 0},
        steps=[DurableStep(id="commit", run=run, replay="reconcile", reconcile=reconcile)],
    )
    async with PostgresDurableStore(dsn) as store:
        before = await stored(store, "crash-task")
        assert before is not None and before["in_flight_step"] == "commit"
        # the dead process's advisory lock went with its connection
        assert await task.run(task_id="crash-task", store=store) == {"count": 1}
        rec = await stored(store, "crash-task")
    assert runs == []
    assert rec is not None and rec["status"] == "completed" and rec["attempt_count"] == 2
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT count(*) FROM committed").fetchone() == (1,)


# ------------------------------------------------------------------ other behaviour
async def test_cancellation_stops_before_the_next_step(store: DurableStore) -> None:
    cancel = asyncio.Event()

    def s1(state: Any, _c: Any) -> Any:
        cancel.set()
        return {"count": 1}

    task = define_durable_task(
        id="count", revision="1", is_state=is_count, initial_state={"count": 0},
        steps=[DurableStep(id="s1", run=s1), DurableStep(id="s2", run=_never)],
    )
    with pytest.raises(RunCancelled, match="s2"):
        await task.run(task_id="t", store=store, context=DurableContext(app=None, signal=cancel))
    rec = await stored(store, "t")
    assert rec is not None and rec["next_step_index"] == 1 and rec["state"] == {"count": 1}


class AbortSignalLike:
    """An AbortSignal's shape, and nothing else (no is_set)."""

    def __init__(self) -> None:
        self.aborted = False
        self.reason: Any = None


@pytest.mark.parametrize("context_kind", ["DurableContext", "mapping"])
async def test_an_abort_signal_shaped_object_cancels(store: DurableStore, context_kind: str
                                                     ) -> None:
    """An object with .aborted (and .reason), as the kit's context holds, set
    during a step, stops the task before the next one with RunCancelled
    carrying the reason (before, it was ignored and the steps ran on)."""
    signal = AbortSignalLike()

    def s1(state: Any, _c: Any) -> Any:
        signal.aborted, signal.reason = True, "the user closed the tab"
        return {"count": 1}

    task = define_durable_task(
        id="count", revision="1", is_state=is_count, initial_state={"count": 0},
        steps=[DurableStep(id="s1", run=s1), DurableStep(id="s2", run=_never)],
    )
    context: Any = (DurableContext(app=None, signal=signal) if context_kind == "DurableContext"
                    else {"app": None, "signal": signal})
    with pytest.raises(RunCancelled, match="'s2': the user closed the tab") as info:
        await task.run(task_id="t", store=store, context=context)
    assert info.value.reason == "the user closed the tab"
    rec = await stored(store, "t")
    assert rec is not None and rec["next_step_index"] == 1 and rec["state"] == {"count": 1}
    signal.aborted = False  # resumable
    task2 = replace(task, steps=(task.steps[0], DurableStep(id="s2", run=lambda s, _c: s)))
    assert await task2.run(task_id="t", store=store, context=context) == {"count": 1}


async def test_the_context_signal_has_aborted_and_reason(store: DurableStore) -> None:
    """DurableContext's default signal is a CancelSignal: the kit's aborted and
    reason next to is_set(); a step aborts it with a reason, the task stops
    with RunCancelled caused by that reason."""
    signal = CancelSignal()
    assert (signal.aborted, signal.reason, signal.is_set()) == (False, None, False)
    signal.throw_if_aborted()  # not aborted: nothing
    seen: list[Any] = []

    def s1(state: Any, ctx: DurableContext[None]) -> Any:
        seen.append((ctx.signal.aborted, ctx.signal.reason))
        ctx.signal.abort(TimeoutError("budget spent"))
        ctx.signal.abort(ValueError("later"))  # once: changes nothing
        return {"count": 1}

    task = define_durable_task(
        id="count", revision="1", is_state=is_count, initial_state={"count": 0},
        steps=[DurableStep(id="s1", run=s1), DurableStep(id="s2", run=_never)],
    )
    ctx: DurableContext[None] = DurableContext(app=None)
    assert isinstance(ctx.signal, CancelSignal)
    with pytest.raises(RunCancelled, match="budget spent") as info:
        await task.run(task_id="t", store=store, context=ctx)
    assert seen == [(False, None)]
    assert isinstance(info.value.__cause__, TimeoutError) and info.value.reason is ctx.signal.reason
    assert ctx.signal.aborted and ctx.signal.is_set()
    with pytest.raises(TimeoutError, match="budget spent"):
        ctx.signal.throw_if_aborted()
    plain = CancelSignal()
    plain.set()  # the Event spelling: aborted, with the default reason
    assert plain.aborted and isinstance(plain.reason, RunCancelled)
    worded = CancelSignal()
    worded.abort("closed")
    with pytest.raises(RunCancelled, match="'closed'") as again:
        worded.throw_if_aborted()
    assert again.value.reason == "closed"


@pytest.mark.parametrize("bad_state, exc", [
    ({"count": "x"}, TypeError),          # fails is_state
    ({"count": 1, "s": {1, 2}}, TypeError),  # not JSON
    ({"count": 1, "f": float("nan")}, ValueError),
])
async def test_step_returning_a_bad_state_does_not_advance(
    store: DurableStore, bad_state: Any, exc: type[Exception]
) -> None:
    task = define_durable_task(
        id="count", revision="1", is_state=is_count, initial_state={"count": 0},
        steps=[DurableStep(id="s", run=lambda _s, _c: bad_state)],
    )
    with pytest.raises(exc):
        await task.run(task_id="t", store=store)
    rec = await stored(store, "t")
    assert rec is not None and rec["next_step_index"] == 0 and rec["state"] == {"count": 0}


async def test_memory_store_serialises_one_task_id() -> None:
    store = MemoryDurableStore()
    log: list[str] = []

    async def step(state: Any, _c: Any) -> Any:
        log.append("start")
        await asyncio.sleep(0)
        log.append("end")
        return {"count": state["count"] + 1}

    task = define_durable_task(id="count", revision="1", is_state=is_count,
                               initial_state={"count": 0},
                               steps=[DurableStep(id=f"s{i}", run=step) for i in range(3)])
    results = await asyncio.gather(*(task.run(task_id="t", store=store) for _ in range(5)))
    assert results == [{"count": 3}] * 5
    assert log == ["start", "end"] * 3


@pytest.mark.crash
def test_postgres_store_is_exclusive_across_processes(dsn: str) -> None:
    """A's s1 waits on a gate while B waits on the task lock; B resumes where A failed."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE step_log (seq bigserial PRIMARY KEY, who text, step text, "
                  "phase text)")
        c.execute("SELECT pg_advisory_lock(777)")

        def waiting() -> int:
            row = c.execute(f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                            f"AND NOT granted AND {_THIS_DB}").fetchone()
            return int(row[0]) if row else 0

        a = spawn("exclusive", dsn, "t", "A", "s2", "gate")
        wait_until(lambda: waiting() == 1 or a.poll() is not None, "A at the gate")
        b = spawn("exclusive", dsn, "t", "B", "none", "nogate")
        wait_until(lambda: waiting() == 2 or b.poll() is not None, "B at the task lock")
        c.execute("SELECT pg_advisory_unlock(777)")
        _out_a, err_a = a.communicate(timeout=120)
        out_b, err_b = b.communicate(timeout=120)
        assert a.returncode == 3, err_a
        assert b.returncode == 0, err_b
        log = c.execute("SELECT who, step, phase FROM step_log ORDER BY seq").fetchall()
    assert log == [
        ("A", "s1", "start"), ("A", "s1", "end"), ("A", "s2", "start"),
        ("B", "s2", "start"), ("B", "s2", "end"), ("B", "s3", "start"), ("B", "s3", "end"),
    ]
    assert json.loads(out_b) == {"count": 3, "by": ["A", "B", "B"]}


# ------------------------------------------------------------------ bad input
def _step() -> DurableStep:
    return DurableStep(id="s", run=lambda s, _c: s)


@pytest.mark.parametrize("kwargs, exc", [
    ({"id": ""}, ValueError),
    ({"id": 3}, TypeError),
    ({"id": "a\x00b"}, ValueError),
    ({"revision": ""}, ValueError),
    ({"steps": []}, ValueError),
    ({"steps": "abc"}, TypeError),
    ({"steps": [object()]}, TypeError),
    ({"steps": [_step(), _step()]}, ValueError),
    ({"is_state": None}, TypeError),
    ({"authorize": 5}, TypeError),
    ({"max_attempts": 0}, ValueError),
    ({"max_attempts": 2.5}, TypeError),
    ({"max_attempts": True}, TypeError),
    ({"deadline": timedelta(0)}, ValueError),
    ({"deadline": -5}, ValueError),
    ({"deadline": "soon"}, TypeError),
    ({"now": 5}, TypeError),
    ({"store": object()}, TypeError),
    ({"initial_state": {"count": "x"}}, ValueError),
    ({"record_format": "camelCase"}, ValueError),
])
def test_define_rejects_bad_input(kwargs: dict[str, Any], exc: type[Exception]) -> None:
    args: dict[str, Any] = {"id": "count", "revision": "1", "is_state": is_count,
                            "steps": [_step()]}
    args.update(kwargs)
    with pytest.raises(exc):
        define_durable_task(**args)


@pytest.mark.parametrize("kwargs, exc", [
    ({"id": ""}, ValueError),
    ({"run": None}, TypeError),
    ({"replay": "maybe"}, ValueError),
    ({"replay": "reconcile"}, TypeError),  # no reconcile function
    ({"reconcile": lambda s, _c: s}, ValueError),  # reconcile on a safe step
])
def test_step_rejects_bad_input(kwargs: dict[str, Any], exc: type[Exception]) -> None:
    args: dict[str, Any] = {"id": "s", "run": lambda s, _c: s}
    args.update(kwargs)
    with pytest.raises(exc):
        DurableStep(**args)


async def test_run_rejects_bad_input(store: DurableStore) -> None:
    task = define_durable_task(id="count", revision="1", is_state=is_count,
                               initial_state={"count": 0}, steps=[_step()])
    for bad, exc in (("", ValueError), (5, TypeError), ("a\x00", ValueError)):
        with pytest.raises(exc):
            await task.run(task_id=bad, store=store)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no store"):
        await task.run(task_id="t")
    with pytest.raises(ValueError, match="fails is_state"):
        await task.run(task_id="t", store=store, state={"count": None})
    assert await stored(store, "t") is None


def test_postgres_store_rejects_bad_targets() -> None:
    with pytest.raises(TypeError):
        PostgresDurableStore(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        PostgresDurableStore("mysql://x/y")


def test_sql_save_rejects_bad_records(conn: psycopg.Connection[Any]) -> None:
    for args in (("", "{}"), ("t", "[1]"), ("t", None)):
        with pytest.raises(InvalidInput), pgdurable.foundation.db.translated():
            conn.execute("SELECT pgdurable.task_checkpoint_save(%s, %s::jsonb)", args)
    assert conn.execute("SELECT count(*) FROM pgdurable.task_checkpoints").fetchone() == (0,)


async def test_store_default_and_definition_exposed(dsn: str) -> None:
    """What the run engine needs to drive a DurableTask is on the object."""
    store = MemoryDurableStore()
    task = define_durable_task(id="count", revision="7", is_state=is_count, max_attempts=4,
                               initial_state={"count": 0}, store=store,
                               steps=[DurableStep(id="s", run=lambda s, _c: {"count": 2})])
    assert (task.id, task.revision, task.max_attempts, [s.id for s in task.steps]) == (
        "count", "7", 4, ["s"])
    assert task.authorize is None and task.is_state({"count": 1})
    assert await task.run(task_id="t") == {"count": 2}
    assert store.get("t") is not None


def count_to_one() -> Any:
    """Task count/1 (the lock tests'): one step that sets the count to 1."""
    return define_durable_task(id="count", revision="1", is_state=is_count,
                               initial_state={"count": 0},
                               steps=[DurableStep(id="s", run=lambda s, _c: {"count": 1})])


async def test_cancelled_while_waiting_for_the_lock_leaves_no_lock(dsn: str) -> None:
    """A caller cancelled while blocked in pg_advisory_lock must not hold it later."""
    task = count_to_one()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_advisory_lock(pgdurable.task_lock_key('t'))")
        async with PostgresDurableStore(dsn) as store:
            waiter = asyncio.create_task(task.run(task_id="t", store=store))

            def blocked() -> bool:
                row = c.execute(f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                f"AND NOT granted AND {_THIS_DB}").fetchone()
                return row == (1,)

            await asyncio.to_thread(wait_until, blocked, "the waiter at the task lock")
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            c.execute("SELECT pg_advisory_unlock(pgdurable.task_lock_key('t'))")
            # nobody may hold or wait for the task lock now
            for _ in range(500):
                row = c.execute(f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                f"AND {_THIS_DB}").fetchone()
                if row == (0,):
                    break
                await asyncio.sleep(0.02)
            assert row == (0,)
            assert await task.run(task_id="t", store=store) == {"count": 1}
            assert await stored(store, "t") is not None


def advisory_locks(c: psycopg.Connection[Any], *, granted: bool) -> int:
    """Advisory locks of this database held (``granted``) or waited for by other sessions."""
    row = c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted = %s "
                    f"AND pid <> pg_backend_pid() AND {_THIS_DB}", (granted,)).fetchone()
    return int(row[0]) if row else 0


async def test_cancel_landing_after_the_task_lock_was_granted_leaks_no_lock(dsn: str) -> None:
    """The task lock is granted by the server, then the caller is cancelled before it
    reads the answer: psycopg waits for the statement and raises CancelledError, so the
    pooled session would keep the advisory lock and every later run of that task id
    (from any other session) would block forever."""
    task = count_to_one()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_advisory_lock(pgdurable.task_lock_key('t'))")
        async with PostgresDurableStore(dsn) as store:
            waiter = asyncio.create_task(task.run(task_id="t", store=store))
            await asyncio.to_thread(wait_until, lambda: advisory_locks(c, granted=False) == 1,
                                    "the waiter blocked at the task lock")
            # Without yielding to the event loop: hand the lock over, wait until the
            # server granted it to the waiter, then cancel the waiter.
            c.execute("SELECT pg_advisory_unlock(pgdurable.task_lock_key('t'))")
            wait_until(lambda: advisory_locks(c, granted=True) == 1, "the lock granted")
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            # nobody may hold the task lock now (the closing session lets go of it)
            for _ in range(500):
                if advisory_locks(c, granted=True) == 0:
                    break
                await asyncio.sleep(0.02)
            assert advisory_locks(c, granted=True) == 0
        # a store with its own pool (other sessions) can run the task
        async with PostgresDurableStore(dsn) as other:
            assert await task.run(task_id="t", store=other) == {"count": 1}


async def test_store_on_a_callers_pool_leaves_its_connections_transactional(dsn: str
                                                                            ) -> None:
    """PostgresDurableStore switches the lock connection to autocommit; on a pool the
    application shares, it must hand the connection back as it found it, or the
    application's later `async with pool.connection()` blocks silently autocommit
    (an exception no longer rolls its writes back)."""
    task = count_to_one()
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as pool:
        async with pool.connection() as c:
            await c.execute("CREATE TABLE app_rows (n int)")
        async with PostgresDurableStore(pool) as store:
            assert await task.run(task_id="t", store=store) == {"count": 1}
        with pytest.raises(ZeroDivisionError):
            async with pool.connection() as c:
                await c.execute("INSERT INTO app_rows VALUES (1)")
                1 / 0  # noqa: B018 - the application's failure: its insert must roll back
        async with pool.connection() as c:
            cur = await c.execute("SELECT count(*) FROM app_rows")
            assert await cur.fetchone() == (0,)
            assert not c.autocommit


async def test_save_needs_the_lock_connection(dsn: str) -> None:
    """Saves go through the lock's session: once it dies, no step result is written."""

    def kill_lock_session(state: Any, _c: Any) -> Any:
        with psycopg.connect(dsn, autocommit=True) as c:
            # this database's advisory locks only: pg_locks spans the whole cluster
            c.execute(f"SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = "
                      f"'advisory' AND granted AND pid <> pg_backend_pid() AND {_THIS_DB}")
        return {"count": state["count"] + 1}

    task = define_durable_task(
        id="count", revision="1", is_state=is_count, initial_state={"count": 0},
        steps=[DurableStep(id="s1", run=lambda s, _c: {"count": 1}),
               DurableStep(id="s2", run=kill_lock_session)],
    )
    async with PostgresDurableStore(dsn) as store:
        with pytest.raises(pgdurable.DatabaseUnavailable):
            await task.run(task_id="t", store=store)
        rec = await stored(store, "t")
        assert rec is not None and rec["next_step_index"] == 1 and rec["state"] == {"count": 1}
        # the lock died with its session: the next call resumes at s2
        ok = define_durable_task(
            id="count", revision="1", is_state=is_count,
            steps=[DurableStep(id="s1", run=_never),
                   DurableStep(id="s2", run=lambda s, _c: {"count": s["count"] + 1})],
        )
        assert await ok.run(task_id="t", store=store) == {"count": 2}


async def test_closed_store_and_bad_ids(dsn: str) -> None:
    store = PostgresDurableStore(dsn)
    for bad, exc in (("", ValueError), ("a\x00", ValueError), (1, TypeError)):
        with pytest.raises(exc):
            await store.load(bad)  # type: ignore[arg-type]
        with pytest.raises(exc):
            await store.save(bad, seed_record())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await store.save("t", seed_record(state={"count": {1}}))
    await store.open()
    await store.close()
    with pytest.raises(pgdurable.ProviderClosed):
        await store.load("t")
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT count(*) FROM pgdurable.task_checkpoints").fetchone() == (0,)
