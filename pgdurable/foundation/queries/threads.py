"""Threads (``sql/functions/threads.sql``): the ownership decision of a send, the fenced
drain of a thread's inbox, a run's thread key (:mod:`pgdurable.runs.threads`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ..thread_keys import decode_thread_key
from .core import Query, Row, nullable

__all__ = ["LATEST_MESSAGE", "MESSAGE_ANSWER", "RUN_THREAD", "SEND", "SEND_V2", "SET_DOUBLE_TEXT",
           "TAKE", "THREAD_HEAD", "Answer", "Head", "Latest", "Message", "Sent"]


@dataclass(frozen=True)
class Message:
    """One inbox message, as ``ctx.inbox()`` returns it."""

    seq: int
    message_id: str
    payload: Any
    sender: str | None
    created_at: datetime
    thread_key: str  # the original key (decoded)


def _message(r: Row) -> Message:
    seq, message_id, payload, sender, created_at, stored_key = r
    return Message(int(seq), message_id, payload, sender, created_at,
                   decode_thread_key(stored_key))


@dataclass(frozen=True, slots=True)
class Sent:
    """What ``send_message`` decided: ``action`` (``"wake"``: a run was started for the
    message; ``"deliver"``: appended to the inbox of ``run_id``), the message's ``seq`` in
    the thread, and whether its id had been sent before."""

    action: Literal["wake", "deliver"]
    run_id: str
    seq: int
    duplicate: bool
    #: where the thread's stream stood before the message (``"no:seq"``; SEND_V2 only):
    #: a reader of the answer to this message starts there
    cursor: str | None = None


def _sent(r: Row) -> Sent:
    action, run_id, seq, duplicate = r
    return Sent(action, str(run_id), int(seq), bool(duplicate))


def _sent_v2(r: Row) -> Sent:
    action, run_id, seq, duplicate, stream_no, stream_seq = r
    return Sent(action, str(run_id), int(seq), bool(duplicate), f"{stream_no}:{stream_seq}")


# -- the ownership decision; one Sent (action, run_id, seq, duplicate)
SEND = Query(
    "SELECT action, run_id, seq, duplicate FROM pgdurable.send_message("
    "%s::text, %s::text, %s::jsonb, %s::text, %s::text, %s::text, %s::text, %s::integer, "
    "%s::integer, %s::jsonb, %s::interval)", _sent)
# -- the ownership decision with double-texting; one Sent with the thread stream's position
# -- before the message
SEND_V2 = Query(
    "SELECT action, run_id, seq, duplicate, stream_no, stream_seq FROM pgdurable.send_message_v2("
    "%s::text, %s::text, %s::jsonb, %s::text, %s::text, %s::text, %s::text, %s::integer, "
    "%s::integer, %s::jsonb, %s::interval, %s::text, %s::text)", _sent_v2)
# -- a thread's double-texting strategy (NULL: the sender's default)
SET_DOUBLE_TEXT = Query("SELECT pgdurable.set_double_text(%s::text, %s::text)", lambda r: None)
# -- fenced drain of the thread inbox for the current step; one Message per row, in order
TAKE = Query(
    "SELECT seq, message_id, payload, sender, created_at, thread_key "
    "FROM pgdurable.take_messages(%s::uuid, %s::bigint, %s::text)", _message)
# -- the thread key of a run, decoded (NULL: not a thread run; no row: no such run)
RUN_THREAD = nullable("SELECT thread_key FROM pgdurable.runs WHERE id = %s::uuid",
                      decode_thread_key)


@dataclass(frozen=True, slots=True)
class Head:
    """A thread's newest run, its place in the thread, and whether it is idle (parked on
    its inbox, or ended)."""

    run_id: str
    thread_no: int
    idle: bool


def _head(r: Row) -> Head:
    run_id, thread_no, idle = r
    return Head(str(run_id), int(thread_no), bool(idle))


@dataclass(frozen=True, slots=True)
class Answer:
    """Whether a thread message was answered (consumed or discarded), and where its
    answer starts in the thread's stream (thread_no, seq; 0 when not known yet)."""

    answered: bool
    stream_no: int
    stream_seq: int


def _answer(r: Row) -> Answer:
    answered, stream_no, stream_seq = r
    return Answer(bool(answered), int(stream_no or 0), int(stream_seq or 0))


@dataclass(frozen=True, slots=True)
class Latest:
    """A thread's last message and whether it was answered."""

    message_id: str
    answered: bool


def _latest(r: Row) -> Latest:
    message_id, answered = r
    return Latest(str(message_id), bool(answered))


# -- a thread's newest run (stored key): its Head, no row for a thread without runs
THREAD_HEAD = Query("""
SELECT r.id, r.thread_no,
       r.status IN ('completed', 'failed', 'cancelled', 'incompatible')
       OR (r.status = 'waiting' AND r.wait_kind = 'inbox')
  FROM pgdurable.runs r WHERE r.thread_key = %s::text ORDER BY r.thread_no DESC LIMIT 1
""", _head)
# -- a thread message (stored key, message id): its Answer, no row if there is none
MESSAGE_ANSWER = Query("""
SELECT m.consumed_at IS NOT NULL, m.stream_no, m.stream_seq
  FROM pgdurable.thread_messages m WHERE m.thread_key = %s::text AND m.message_id = %s
""", _answer)
# -- a thread's last message (stored key): Latest, no row for a thread without messages
LATEST_MESSAGE = Query("""
SELECT m.message_id, m.consumed_at IS NOT NULL
  FROM pgdurable.thread_messages m WHERE m.thread_key = %s::text ORDER BY m.seq DESC LIMIT 1
""", _latest)
