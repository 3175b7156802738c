"""Threads: one owning run per thread key, follow-up messages routed to it.

This is the seed's *signal layer* (Mastra) on PostgreSQL: a thread key such
as ``"chat:42"`` has at most one owning run across all processes. The first
:meth:`Durable.send <pgdurable.Durable.send>` to an idle thread starts a run
(of the task chosen with :meth:`Durable.thread_task
<pgdurable.Durable.thread_task>`) holding the thread's lease; every other
send appends to that run's inbox instead of starting a competing run.

Contract (each point is a test in ``tests/test_threads.py``):

* ``send`` makes ONE call to ``pgdurable.send_message``: the ownership
  decision (acquire the thread lease + start a run, or append to the owner's
  inbox) is one transaction under the thread's row lock, and the message is
  durable when ``send`` returns. It returns :class:`Delivery`
  (``action="wake"``: a run was started for it; ``"deliver"``: appended to the
  inbox of ``run_id``, which is woken if parked on its inbox).
* The same ``message_id`` twice is stored once (the second send returns the
  first delivery with ``duplicate=True``); the same id with another payload
  raises :class:`~pgdurable.SignalConflict`.
* In a step, ``await ctx.inbox()`` drains the thread's unconsumed messages in
  order. They are consumed in the same transaction as the step's checkpoint:
  a retried step sees them again, a checkpointed one never again. Within one
  attempt of a step each message is returned once (a second ``inbox()``
  returns only the messages sent since the first).
* The thread lease's owner is the run's current attempt, ``"<run id>:<lease
  token>"``, never the bare run id: a stale attempt cannot release its
  successor's lease. The lease follows the run (renewed with the worker's
  heartbeat; a parked owner keeps it for ``idle_ttl``, renewed by sends, and a
  send re-acquires it for the same unfinished run should it lapse).
* When the owner ends (completed, failed, cancelled) with unconsumed
  messages, the follow-up run is started and the lease handed over by
  ``transfer_lease`` in the same transaction (no gap); if the transfer fails
  and the fallback acquire loses, the messages go to the winner.
* A run whose thread was taken by someone else gets :class:`~pgdurable.LeaseLost`
  from ``ctx.inbox()`` (the step fails; its messages stay for the owner).

Poison messages: a message whose processing fails every attempt ends its run
``failed`` and the follow-up run receives it again, but after
``threads.max_unproductive_runs`` (3) consecutive runs that failed, were
cancelled or consumed nothing, no follow-up is started: the messages stay
pending (``thread_owners.inbox_depth``) and the next send starts a run. There
is no per-message attempt limit or dead-letter state.

Sync step functions use ``ctx.inbox_sync()`` / ``ctx.emit_sync()``.

Thread keys are any non-empty ``str`` (NUL, backslashes, quotes, ``%``,
emoji, any length; Mastra's keys are ``resource + "\\x00" + thread``).
PostgreSQL ``text`` cannot hold NUL, so the ``thread_key`` columns store an
escaped form: :func:`encode_thread_key` turns ``\\`` into ``\\\\`` and NUL
into ``\\0`` (nothing else changes, so ``'chat:42'`` reads as itself in psql),
and :func:`decode_thread_key` reverses it. They are the only conversion, used
at every boundary (send, inbox, ``ctx.thread_key``, ``ctx.wait_inbox()``,
:func:`thread_lease_key`, ``stream_thread``). Prefix routing
(``thread_task``) compares the original, decoded keys, in Python.
"""

from __future__ import annotations

import reprlib
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from ..foundation import run_queries as q
from ..foundation.errors import UnknownTask
from ..foundation.jsonb import dumps
from ..foundation.queries import threads as tq
from ..foundation.queries.core import first, many
from ..foundation.queries.threads import Message
from ..foundation.thread_keys import decode_thread_key, encode_thread_key

if TYPE_CHECKING:
    from ..foundation.ports import StepContext

__all__ = [
    "Delivery", "Message", "ThreadRoute", "decode_thread_key", "encode_thread_key",
    "thread_lease_key",
]

#: The SQL of a send (``send_message``); its row is decoded with :func:`parse_delivery`.
SEND = tq.SEND.sql
#: The SQL of a send with double-texting (``send_message_v2``), which the run API
#: (:mod:`pgdurable.app.run_api`, and its generated sync twin) sends, decoded by
#: :func:`parse_delivery` too; :data:`SET_DOUBLE_TEXT` sets a thread's strategy.
SEND_V2 = tq.SEND_V2.sql
SET_DOUBLE_TEXT = tq.SET_DOUBLE_TEXT.sql
#: What a message sent while its thread is answering does (see ``send_message_v2``).
DoubleText = Literal["reject", "enqueue", "interrupt", "rollback"]
DOUBLE_TEXTS = ("reject", "enqueue", "interrupt", "rollback")


def check_double_text(value: object, what: str = "double_text") -> str | None:
    """A double-texting strategy or None; ValueError otherwise."""
    if value is not None and value not in DOUBLE_TEXTS:
        raise ValueError(f"{what} must be one of {', '.join(DOUBLE_TEXTS)} or None, not {value!r}")
    return value

_PREFIX = "pgdurable.thread:"


def thread_lease_key(thread_key: str) -> str:
    """The lease key of a thread (for :class:`~pgdurable.PostgresLeaseProvider` calls).

    ``"pgdurable.thread:"`` + the escaped key, as the SQL function
    ``pgdurable.thread_lease_key(stored key)`` computes it.
    """
    return _PREFIX + encode_thread_key(thread_key)


@dataclass(frozen=True)
class Delivery:
    """What :meth:`Durable.send <pgdurable.Durable.send>` did with a message.

    ``action`` is ``"wake"`` (a run was started for it) or ``"deliver"``
    (appended to the inbox of the run owning the thread); ``run_id`` is that
    run; ``seq`` the message's position in the thread; ``duplicate`` is True
    when this ``message_id`` had been sent before (nothing was written).
    ``cursor`` is the thread stream's position before the message
    (``"thread_no:seq"``): its answer follows.
    """

    action: Literal["wake", "deliver"]
    run_id: str
    seq: int
    message_id: str
    duplicate: bool = False
    cursor: str | None = None


@dataclass(frozen=True)
class ThreadRoute:
    """Which task runs the threads whose key starts with ``prefix`` (original keys, NUL allowed)."""

    prefix: str
    task: str
    queue: str = "default"
    priority: int = 0
    idle_ttl: timedelta | None = None
    revision: str | None = None  # None: the registered task's revision
    double_text: str | None = None  # the default strategy of its threads (None: enqueue)


class ThreadRoutes:
    """Thread-key prefix -> :class:`ThreadRoute`; the longest prefix wins, ``""`` is the default."""

    def __init__(self) -> None:
        self.routes: dict[str, ThreadRoute] = {}

    def add(
        self,
        prefix: str,
        task: str,
        queue: str,
        priority: int,
        idle_ttl: timedelta | None,
        revision: str | None = None,
        double_text: str | None = None,
    ) -> ThreadRoute:
        """Validate and register a route (replacing one with the same prefix)."""
        check_double_text(double_text)
        if not isinstance(prefix, str):
            raise TypeError("thread prefix must be a str ('' = every thread)")
        q.check_name(task, "task")
        q.check_name(queue, "queue")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError("priority must be an int")
        if idle_ttl is not None and (
            not isinstance(idle_ttl, timedelta) or idle_ttl.total_seconds() <= 0
        ):
            raise ValueError("idle_ttl must be a positive timedelta or None")
        if revision is not None:
            q.check_name(revision, "revision")
        route = ThreadRoute(prefix, task, queue, priority, idle_ttl, revision, double_text)
        self.routes[prefix] = route
        return route

    def resolve(self, thread_key: str) -> ThreadRoute:
        """The route of ``thread_key`` (the original key; :class:`UnknownTask` if none matches)."""
        best: ThreadRoute | None = None
        for prefix, route in self.routes.items():
            if thread_key.startswith(prefix) and (best is None or len(prefix) > len(best.prefix)):
                best = route
        if best is None:
            raise UnknownTask(
                f"no thread task for {reprlib.repr(thread_key)}: register one with "
                "app.thread_task(prefix, task_name)"
            )
        return best


def routes_of(registry: Any) -> ThreadRoutes:
    """The :class:`ThreadRoutes` of an app's task registry (created on first use)."""
    routes = getattr(registry, "thread_routes", None)
    if not isinstance(routes, ThreadRoutes):
        routes = ThreadRoutes()
        registry.thread_routes = routes
    return routes


def send_params(
    registry: Any,
    thread_key: object,
    message: object,
    message_id: object,
    sender: object,
    state: object,
    double_text: object = None,
) -> tuple[tuple[Any, ...], str]:
    """Validate a send (before any SQL); return the parameters of
    :data:`~pgdurable.foundation.queries.threads.SEND_V2` (the first eleven are
    :data:`~pgdurable.foundation.queries.threads.SEND`'s) and the message id."""
    check_double_text(double_text)
    stored_key = encode_thread_key(thread_key)
    assert isinstance(thread_key, str)
    if message_id is None:
        message_id = uuid.uuid4().hex
    q.check_name(message_id, "message_id")
    assert isinstance(message_id, str)
    if sender is not None:
        q.check_name(sender, "sender")
    payload = dumps(message, "message")
    state_json = None if state is None else dumps(state, "state")
    route = routes_of(registry).resolve(thread_key)
    revision = registry.revision_for(route.task, route.revision)
    attempts = registry.max_attempts_for(route.task)
    params = (
        stored_key, message_id, payload, sender, route.task, revision, route.queue,
        route.priority, attempts, state_json, route.idle_ttl, double_text, route.double_text,
    )
    return params, message_id


def parse_delivery(row: tuple[Any, ...] | None, message_id: str) -> Delivery:
    """A :data:`SEND` or :data:`SEND_V2` row as :class:`Delivery`."""
    sent = (tq.SEND_V2 if row is not None and len(row) > 4 else tq.SEND).one(row)
    return Delivery(action=sent.action, run_id=sent.run_id, seq=sent.seq,
                    message_id=message_id, duplicate=sent.duplicate, cursor=sent.cursor)


async def take(ctx: StepContext) -> list[Message]:
    """``ctx.inbox()``: drain the thread inbox for this step (fenced, one round trip).

    Each message once per attempt: a second ``inbox()`` in the same step
    returns only what arrived since (see ``pgdurable.take_messages``).
    """
    app, owner = ctx._attached()
    rid = q.check_run_id(ctx.run_id)
    messages = await many(app, tq.TAKE, (rid, ctx.token, owner))
    if messages:
        ctx.thread_key = messages[0].thread_key
    elif ctx.thread_key is None:
        ctx.thread_key = await first(app, tq.RUN_THREAD, (rid,))
    return messages
