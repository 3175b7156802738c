"""Threads (``sql/functions/threads.sql``): the ownership decision of a send, the fenced
drain of a thread's inbox, a run's thread key (:mod:`pgdurable.runs.threads`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ..thread_keys import decode_thread_key
from .core import Query, Row, nullable

__all__ = ["RUN_THREAD", "SEND", "TAKE", "Message", "Sent"]


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


def _sent(r: Row) -> Sent:
    action, run_id, seq, duplicate = r
    return Sent(action, str(run_id), int(seq), bool(duplicate))


# -- the ownership decision; one Sent (action, run_id, seq, duplicate)
SEND = Query(
    "SELECT action, run_id, seq, duplicate FROM pgdurable.send_message("
    "%s::text, %s::text, %s::jsonb, %s::text, %s::text, %s::text, %s::text, %s::integer, "
    "%s::integer, %s::jsonb, %s::interval)", _sent)
# -- fenced drain of the thread inbox for the current step; one Message per row, in order
TAKE = Query(
    "SELECT seq, message_id, payload, sender, created_at, thread_key "
    "FROM pgdurable.take_messages(%s::uuid, %s::bigint, %s::text)", _message)
# -- the thread key of a run, decoded (NULL: not a thread run; no row: no such run)
RUN_THREAD = nullable("SELECT thread_key FROM pgdurable.runs WHERE id = %s::uuid",
                      decode_thread_key)
