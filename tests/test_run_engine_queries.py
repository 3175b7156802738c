"""The run engine's named queries (pgdurable/foundation/queries/: start, claim, steps,
signals, cancel, run_end, effects, runs) decode what the database really answers.

Each statement is sent on a real database, through a run's whole life (start, claim,
renew, checkpoint, effect, park, signal, batched write, fail, release, cancel), and its
record is checked field by field: a column that moves or changes type in the SQL fails
here, not in a worker. The statements are the same text the engine sends today through
``foundation/run_queries.py``'s old names (checked too).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from pgdurable.foundation import run_queries as rq
from pgdurable.foundation.errors import RunNotFound
from pgdurable.foundation.queries import (
    cancel,
    claim,
    effects,
    run_end,
    runs,
    signals,
    start,
    steps,
)
from pgdurable.foundation.queries.core import first_sync, many_sync, one_sync

OWNER = "w1"
TTL = timedelta(seconds=30)


def _start(conn: psycopg.Connection[Any], state: str = '{"a": 1}', *, task: str = "t",
           key: str | None = None, max_attempts: int = 3) -> start.Started:
    return one_sync(conn, start.START,
                    (task, "1", state, "default", 0, max_attempts, key, None, None, None))


def _claim(conn: psycopg.Connection[Any], task: str = "t") -> list[claim.ClaimedRun]:
    return many_sync(conn, claim.CLAIM, (OWNER, ["default"], [task], ["1"], 10, TTL, None))


def test_a_run_through_its_life(conn: psycopg.Connection[Any]) -> None:
    first = _start(conn, key="k1")
    assert first.created and uuid.UUID(first.run_id)
    again = _start(conn, key="k1")
    assert again == start.Started(first.run_id, False)  # the same idempotency key

    (c,) = _claim(conn)
    assert isinstance(c, claim.ClaimedRun)
    assert (c.id, c.task, c.revision, c.queue, c.status) == (
        uuid.UUID(first.run_id), "t", "1", "default", "leased")
    assert (c.state, c.step, c.attempts, c.max_attempts) == ({"a": 1}, 0, 0, 3)
    assert isinstance(c.lease_token, int) and isinstance(c.lease_expires_at, datetime)
    assert isinstance(c.db_now, datetime) and c.lease_expires_at > c.db_now
    assert (c.wake, c.deadline_at, c.budget, c.affinity) == (None, None, None, None)
    assert c.spent == Decimal(0)
    ident = (c.id, c.lease_token, OWNER)

    (renewed,) = many_sync(conn, steps.RENEW, (OWNER, [c.id], [c.lease_token], TTL))
    assert renewed.run_id == first.run_id and renewed.cancel_requested is False
    assert renewed.lease_expires_at >= c.lease_expires_at

    assert one_sync(conn, steps.CHECKPOINT, (*ident, '{"a": 2}', 0)) == "leased"
    assert one_sync(conn, steps.RUN_STEP, (c.id,)) == steps.RunStep(
        1, "leased", c.lease_token, OWNER)

    begun = one_sync(conn, effects.EFFECT_BEGIN, (*ident, "charge"))
    assert begun == effects.EffectBegun("started", None, None, False)
    assert one_sync(conn, effects.EFFECT_FINISH, (*ident, "charge", True, '{"id": 7}',
                                                  None)) is None
    assert one_sync(conn, effects.EFFECT_BEGIN, (*ident, "charge")) == effects.EffectBegun(
        "succeeded", {"id": 7}, None, False)

    parked = one_sync(conn, signals.PARK, (*ident, '{"a": 3}', 0, "approval", "r1", None,
                                           timedelta(hours=1)))
    assert parked.status == "waiting" and isinstance(parked.wake_at, datetime)
    assert parked.wake_in is not None and 0 < parked.wake_in <= 3600
    wakeups = one_sync(conn, claim.NEXT_WAKEUP, (["default"], ["t"], ["1"], OWNER,
                                                 ["default"]))
    assert wakeups.work_in is not None and 0 < wakeups.work_in <= 3600  # the timer
    assert wakeups.probes == (None,)  # the schedule ticker's probe: no schedule

    assert many_sync(conn, signals.SIGNAL, ("approval", "r1", '{"ok": true}', None,
                                            None)) == [first.run_id]
    (c2,) = _claim(conn)
    assert c2.wake is not None and c2.step == 2
    done = many_sync(conn, steps.WRITE_STEPS, (
        OWNER, f"{{{c2.id}}}", f"{{{c2.lease_token}}}", '[{"a": 4}]', [0], "{t}",
        '[{"done": true}]'))
    assert done == [steps.StepWritten(first.run_id, "completed")]
    stale = many_sync(conn, steps.WRITE_STEPS, (
        OWNER, f"{{{c2.id}}}", f"{{{c2.lease_token}}}", '[{"a": 5}]', [0], "{f}", "[null]"))
    assert stale == [steps.StepWritten(first.run_id, "lost")]  # the fence refused it

    info = one_sync(conn, runs.GET_RUN, (c.id,))
    assert isinstance(info, runs.RunInfo) and info.terminal
    assert (info.id, info.status, info.state, info.result, info.step) == (
        first.run_id, "completed", {"a": 4}, {"done": True}, 3)
    assert (info.children, info.parent_run_id, info.affinity) == ((), None, None)
    assert isinstance(info.spent, float) and info.budget is None
    assert one_sync(conn, runs.OUTCOME, (c.id,)) == runs.Outcome("completed", {"done": True},
                                                                 None)
    assert first_sync(conn, runs.GET_RUN, (uuid.uuid4(),)) is None
    assert first_sync(conn, runs.OUTCOME, (uuid.uuid4(),)) is None


def test_failure_release_cancel_and_its_acknowledgement(conn: psycopg.Connection[Any]) -> None:
    failing = _start(conn, task="f", max_attempts=2)
    (c,) = _claim(conn, "f")
    error = '{"type": "ValueError", "message": "no"}'
    assert one_sync(conn, run_end.FAIL, (c.id, c.lease_token, OWNER, error, 0,
                                         timedelta(0), False)) == "runnable"
    (c,) = _claim(conn, "f")
    assert one_sync(conn, run_end.RELEASE, (c.id, c.lease_token, OWNER)) == "runnable"
    (c,) = _claim(conn, "f")
    assert one_sync(conn, run_end.FAIL, (c.id, c.lease_token, OWNER, error, 0,
                                         timedelta(0), True)) == "failed"
    assert one_sync(conn, runs.OUTCOME, (c.id,)).error["type"] == "ValueError"  # type: ignore[index]
    assert failing.created

    waiting = _start(conn, task="c")
    assert one_sync(conn, cancel.CANCEL, (waiting.run_id,)) == "cancelled"
    leased = _start(conn, task="c")
    (c,) = _claim(conn, "c")
    assert one_sync(conn, cancel.CANCEL, (leased.run_id,)) == "leased"  # requested
    (renewed,) = many_sync(conn, steps.RENEW, (OWNER, [c.id], [c.lease_token], TTL))
    assert renewed.cancel_requested is True
    assert one_sync(conn, cancel.ACK_CANCEL, (c.id, c.lease_token, OWNER, 0)) == "cancelled"

    finishing = _start(conn, task="d")
    (c,) = _claim(conn, "d")
    assert one_sync(conn, run_end.COMPLETE, (c.id, c.lease_token, OWNER, "{}", '"ok"',
                                             0)) == "completed"
    assert finishing.created
    _start(conn, task="old")
    assert one_sync(conn, run_end.MARK_INCOMPATIBLE, ("old", "1", "gone")) == 1
    assert one_sync(conn, claim.NOTIFY_QUEUES, (["default"],)) is None


def test_signal_one_run_answers_its_id_or_nothing(conn: psycopg.Connection[Any]) -> None:
    s = _start(conn, task="s")
    (c,) = _claim(conn, "s")
    one_sync(conn, signals.PARK, (c.id, c.lease_token, OWNER, "{}", 0, "inbox", "x", None,
                                  None))
    assert many_sync(conn, signals.SIGNAL_RUN, (s.run_id, "inbox", '"hi"', None,
                                                None)) == [s.run_id]
    assert many_sync(conn, signals.SIGNAL_RUN, (s.run_id, "later", '"kept"', None,
                                                None)) == []  # kept pending for it


def test_the_old_names_are_the_same_text_and_records() -> None:
    """The engine and the app still send ``run_queries``' names: the same SQL."""
    for old, new in [(rq.START, start.START), (rq.GET_RUN, runs.GET_RUN),
                     (rq.CLAIM, claim.CLAIM), (rq.NEXT_WAKEUP, claim.NEXT_WAKEUP),
                     (rq.NOTIFY_QUEUES, claim.NOTIFY_QUEUES), (rq.RENEW, steps.RENEW),
                     (rq.CHECKPOINT, steps.CHECKPOINT), (rq.WRITE_STEPS, steps.WRITE_STEPS),
                     (rq.RUN_STEP, steps.RUN_STEP), (rq.PARK, signals.PARK),
                     (rq.SIGNAL, signals.SIGNAL), (rq.SIGNAL_RUN, signals.SIGNAL_RUN),
                     (rq.CANCEL, cancel.CANCEL), (rq.ACK_CANCEL, cancel.ACK_CANCEL),
                     (rq.COMPLETE, run_end.COMPLETE), (rq.RELEASE, run_end.RELEASE),
                     (rq.FAIL, run_end.FAIL), (rq.MARK_INCOMPATIBLE, run_end.MARK_INCOMPATIBLE),
                     (rq.EFFECT_BEGIN, effects.EFFECT_BEGIN),
                     (rq.EFFECT_FINISH, effects.EFFECT_FINISH)]:
        assert old == new.sql
    assert rq.ClaimedRun is claim.ClaimedRun and rq.RunInfo is runs.RunInfo
    assert rq.TERMINAL is runs.TERMINAL


def test_parse_run_decodes_through_the_named_query(conn: psycopg.Connection[Any]) -> None:
    s = _start(conn)
    rid = uuid.UUID(s.run_id)
    row = conn.execute(rq.GET_RUN, (rid,)).fetchone()
    assert rq.parse_run(row, rid) == one_sync(conn, runs.GET_RUN, (rid,))
    with pytest.raises(RunNotFound):
        rq.parse_run(None, rid)


def test_a_claim_row_of_another_width_is_a_bug_not_a_shifted_record() -> None:
    with pytest.raises(AssertionError, match="ClaimedRun: 16 columns"):
        claim.CLAIM.decode(tuple(range(16)))
