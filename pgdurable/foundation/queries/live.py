"""The live readers of token streams (:mod:`pgdurable.runs.live`) and the HTTP streams
(:mod:`pgdurable.ops.http.app`): a run's events after a seq, a thread's events each with
the message whose answer it is, a thread's newest run, where a message's answer stands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .core import nullable, record

__all__ = ["LATEST_MESSAGE", "LIVE_RUN", "MESSAGE_STATE", "NEXT_MESSAGE", "PENDING_MESSAGE",
           "THREAD_ANSWERS", "THREAD_HEAD", "LatestMessage", "LiveRunEvent", "MessageState",
           "ThreadAnswerEvent", "ThreadHead"]


@dataclass(frozen=True, slots=True)
class LiveRunEvent:
    """One row of a live reader's snapshot of a run: its status and one of its events
    after the cursor (``seq`` None, and no event, when it has none after it)."""

    status: str
    seq: int | None
    event: Any
    final: bool | None


@dataclass(frozen=True, slots=True)
class ThreadAnswerEvent:
    """One event of a thread after a cursor, with the thread seq of the message whose
    answer it is (``owner``; None: none) and whether that is not known yet
    (``unknown``: its step has taken nothing while messages wait for it)."""

    run_id: Any
    thread_no: int
    seq: int
    event: Any
    owner: int | None
    unknown: bool | None


@dataclass(frozen=True, slots=True)
class ThreadHead:
    """A thread's newest run, its place in the thread, and whether the thread is idle
    (that run parked on its inbox, or ended)."""

    run_id: Any
    thread_no: int
    idle: bool


@dataclass(frozen=True, slots=True)
class MessageState:
    """Where a thread message's answer stands: answered (consumed or discarded), where
    the answer starts in the thread's stream, discarded (a rollback), the message's
    thread seq, and whether a later message was taken since (the next answer began)."""

    answered: bool
    stream_no: int | None
    stream_seq: int | None
    discarded: bool
    seq: int
    later_taken: bool


@dataclass(frozen=True, slots=True)
class LatestMessage:
    """A thread's last message and whether it was answered."""

    message_id: str
    answered: bool


# -- a run's snapshot (seq, limit, run id): its status and its events after seq, a
# -- LiveRunEvent each (one with seq None when it has none); no row for no such run
LIVE_RUN = record("""
SELECT r.status, e.seq, e.event, e.final
  FROM pgdurable.runs r
  LEFT JOIN LATERAL (
    SELECT x.seq, x.event, x.final FROM pgdurable.run_events x
     WHERE x.run_id = r.id AND x.seq > %s ORDER BY x.seq LIMIT %s) e ON true
 WHERE r.id = %s::uuid
 ORDER BY e.seq
""", LiveRunEvent)
# -- a thread's events after (thread_no, seq) (stored key, thread_no, seq, limit, then the
# -- stored key three times), in thread order: a ThreadAnswerEvent each
THREAD_ANSWERS = record("""
WITH ev AS MATERIALIZED (
  SELECT r.id, r.thread_no, e.seq, e.step, e.event, r.step AS at_step,
         r.status IN ('completed', 'failed', 'cancelled', 'incompatible') AS done
    FROM pgdurable.runs r JOIN pgdurable.run_events e ON e.run_id = r.id
   WHERE r.thread_key = %s::text AND (r.thread_no, e.seq) > (%s, %s)
   ORDER BY r.thread_no, e.seq
   LIMIT %s),
st AS (SELECT DISTINCT ev.id, ev.step, ev.at_step, ev.done FROM ev),
own AS (
  SELECT st.id, st.step,
         (SELECT max(m.seq) FROM pgdurable.thread_messages m
           WHERE m.thread_key = %s::text AND m.discarded_at IS NULL AND st.step IS NOT NULL
             AND ((m.consumed_by = st.id AND m.consumed_step = st.step)
                  OR (m.taken_by = st.id AND m.taken_step = st.step AND m.consumed_at IS NULL))
         ) AS took,
         (SELECT max(m.seq) FROM pgdurable.thread_messages m
           WHERE m.thread_key = %s::text AND m.discarded_at IS NULL AND m.consumed_by = st.id
             AND (st.step IS NULL OR m.consumed_step < st.step)) AS before,
         NOT st.done AND st.step = st.at_step AND EXISTS (
           SELECT FROM pgdurable.thread_messages m
            WHERE m.thread_key = %s::text AND m.run_id = st.id AND m.consumed_at IS NULL
              AND m.taken_by IS NULL) AS pending
    FROM st),
mk AS (
  SELECT x.run_id, x.step, x.seq, (x.event->>'answering')::bigint AS answering
    FROM pgdurable.run_events x
    JOIN (SELECT DISTINCT st.id, st.step FROM st WHERE st.step IS NOT NULL) s
      ON x.run_id = s.id AND x.step = s.step
   WHERE x.idx IS NULL AND x.event->>'type' IN ('interrupted', 'rollback'))
SELECT ev.id, ev.thread_no, ev.seq, ev.event,
       CASE WHEN k.seq IS NOT NULL THEN coalesce(k.answering, own.before)
            ELSE coalesce(own.took, CASE WHEN own.pending THEN NULL ELSE own.before END)
       END AS owner,
       k.seq IS NULL AND own.took IS NULL AND own.pending AS unknown
  FROM ev
  JOIN own ON own.id = ev.id AND own.step IS NOT DISTINCT FROM ev.step
  LEFT JOIN LATERAL (
    SELECT mk.seq, mk.answering FROM mk
     WHERE mk.run_id = ev.id AND mk.step = ev.step AND mk.seq >= ev.seq
     ORDER BY mk.seq LIMIT 1) k ON true
 ORDER BY ev.thread_no, ev.seq
""", ThreadAnswerEvent)
# -- a thread's newest run (stored key): its ThreadHead, no row for a thread without runs
THREAD_HEAD = record("""
SELECT r.id, r.thread_no,
       r.status IN ('completed', 'failed', 'cancelled', 'incompatible')
       OR (r.status = 'waiting' AND r.wait_kind = 'inbox')
  FROM pgdurable.runs r WHERE r.thread_key = %s::text ORDER BY r.thread_no DESC LIMIT 1
""", ThreadHead)
# -- a thread message (stored key, message id): its MessageState, no row if there is none
MESSAGE_STATE = record("""
SELECT m.consumed_at IS NOT NULL, m.stream_no, m.stream_seq, m.discarded_at IS NOT NULL, m.seq,
       EXISTS (SELECT FROM pgdurable.thread_messages n
                WHERE n.thread_key = m.thread_key AND n.seq > m.seq AND n.discarded_at IS NULL
                  AND (n.taken_by IS NOT NULL OR n.consumed_at IS NOT NULL))
  FROM pgdurable.thread_messages m WHERE m.thread_key = %s::text AND m.message_id = %s
""", MessageState)
# -- a thread's last message (stored key): a LatestMessage, no row for a thread without any
LATEST_MESSAGE = record("""
SELECT m.message_id, m.consumed_at IS NOT NULL
  FROM pgdurable.thread_messages m WHERE m.thread_key = %s::text ORDER BY m.seq DESC LIMIT 1
""", LatestMessage)
# -- the id of the message before a thread's first unanswered one, or of that one if it is
# -- the first (stored key twice); no row when every message was answered
PENDING_MESSAGE = nullable("""
SELECT m.message_id FROM pgdurable.thread_messages m
 WHERE m.thread_key = %s::text AND m.seq >= (
   SELECT min(u.seq) FROM pgdurable.thread_messages u
    WHERE u.thread_key = %s::text AND u.consumed_at IS NULL) - 1
 ORDER BY m.seq LIMIT 1
""", str)
# -- the id of the message sent after a thread's message (stored key, message id); no row
# -- when none was
NEXT_MESSAGE = nullable("""
SELECT n.message_id FROM pgdurable.thread_messages m JOIN pgdurable.thread_messages n
    ON n.thread_key = m.thread_key AND n.seq > m.seq
 WHERE m.thread_key = %s::text AND m.message_id = %s ORDER BY n.seq LIMIT 1
""", str)
