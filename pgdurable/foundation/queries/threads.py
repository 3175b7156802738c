"""Threads (``sql/functions/threads.sql``): the ownership decision of a send, the fenced
drain of a thread's inbox, a run's thread key (:mod:`pgdurable.runs.threads`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ..thread_keys import decode_thread_key
from .core import Query, Row, nullable

__all__ = ["RUN_THREAD", "SEND", "SEND_V2", "SET_DOUBLE_TEXT", "TAKE", "Message", "Sent"]


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
