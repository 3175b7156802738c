"""The process's one LISTEN connection, fanned out to every subscriber in it.

A process that runs a worker, follows streams, awaits results and serves the
dashboard needs notifications on five channels (``pgdurable_wake``,
``pgdurable_cancel``, ``pgdurable_events``, ``pgdurable_done``,
``pgdurable_steps``). It holds ONE connection for all of them per conninfo
(and event loop): :func:`notifier_for` returns the running loop's
:class:`Notifier` for a conninfo, made on first use (``Durable.notifier()``
hands out its app's; the dashboard asks for its DSN's). Each subscriber
:meth:`Notifier.subscribe`\\ s to channels, optionally to one payload only
(a run id); the notifier LISTENs on a channel while at least one subscriber
wants it and UNLISTENs when the last one leaves (a reference count per
channel), and closes its connection when nobody is subscribed.

Everything that can go wrong with a LISTEN connection is handled here, once:

* **Its own connection**, autocommit, never used for work (pitfall 5: a
  listening session inside a transaction pins the notification queue). It
  runs only LISTEN, UNLISTEN, presence announcements and health checks.
* **Reconnect** with jittered exponential backoff (0.2 s to 5 s) after any
  loss, and LISTEN again on every wanted channel.
* **Notifications sent while it was disconnected are gone** (pitfall 3): every
  subscriber's ``on_recheck`` is called when its channels are listened, on the
  first connection and after every reconnect ("look again: you may have
  missed something"). The worker claims and reads its cancel requests, a
  stream re-reads from its cursor, a result waiter reads its run, a dashboard
  page refreshes.
* **Presence** (:mod:`pgdurable.foundation.presence`): on the watch-only
  channels (``pgdurable_steps``, ``pgdurable_done``) the database sends only
  while a listener is present; the notifier announces itself on each after its
  LISTEN and before its subscribers are told they listen, renews every
  :data:`~pgdurable.foundation.presence.RENEW` seconds, and calls
  ``on_recheck`` again at each :data:`~pgdurable.foundation.presence.RECHECK`
  delay after an announcement that began one (the race with transactions that
  looked for listeners just before it).
* **Health check**: a renewal, or after :data:`HEALTH` seconds with neither a
  notification nor a statement a ``SELECT 1``; any statement on the
  connection unanswered within :data:`STATEMENT_TIMEOUT` counts as a lost
  connection (a socket that went quiet), which is then made again.
* **A NOTIFY is a hint, never an order**: anyone who can connect may NOTIFY
  any channel. The notifier hands a notification only to the subscribers of
  its channel (or of its payload), and subscribers only *look again* at the
  database: :class:`Wakeup`, what streams and result waiters use, is an event
  that says "read again", never what to believe; the worker's handlers rate-limit
  claims and confirm cancels in the database (:mod:`pgdurable.foundation.hints`).
  Each subscriber also polls on its own, slowly.
* **Fan-out never blocks**: ``on_notify`` and ``on_recheck`` are plain
  functions called in the loop as notifications are read; they must only
  note what happened (set an event, put on a bounded queue). One that raises
  is logged (once) and the others still get every notification.

Behind a transaction-mode pooler without ``listen_dsn`` there is no notifier
(``Durable.notifier()`` is ``None``): LISTEN does not work through it, and
everything polls.

**The accepted exception**: the sync client's ``result()``
(:func:`pgdurable.runs.results.result_sync`) opens a LISTEN connection of its
own for each call and closes it when the call returns. It runs in a thread with
no event loop, so it cannot subscribe here (the notifier lives in a loop and
fans out in it); it does by itself, on that one connection, what this module
does for its subscribers: LISTEN ``pgdurable_done``, announce its presence and
renew it, read again at each recheck delay, poll. A process that waits on many
runs at once through the sync client therefore holds one listening connection
per waiting thread; the async ``await app.result()`` shares this notifier.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import psycopg
from psycopg import conninfo as _conninfo

from . import presence
from .aio import wait_set
from .cells import current_conninfo
from .errors import DatabaseUnavailable, ReadOnlyDatabase, translate
from .notifications import receive
from .pooler import aconnect, masked_conninfo
from .schemas import DEFAULT, canonical_channel, check_schema_name, resolve_schema

__all__ = ["HEALTH", "STATEMENT_TIMEOUT", "Notifier", "Subscription", "Wakeup", "notifier_for"]

log = logging.getLogger("pgdurable.notifier")

#: Seconds without a notification or a statement after which the connection is checked.
HEALTH = 60.0
#: Seconds a statement on the listening connection may take before it counts as lost.
STATEMENT_TIMEOUT = 30.0
#: First and longest wait (seconds, jittered ±50 %) between two connection attempts.
BACKOFF = (0.2, 5.0)

K = TypeVar("K")
NotifyHandler = Callable[[psycopg.Notify], None]
Recheck = Callable[[], None]

# a channel name goes into LISTEN as written (tests and operators read it in
# pg_stat_activity): only plain lower-case identifiers of at most 63 bytes
_CHANNEL = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class Subscription:
    """One subscriber of a :class:`Notifier` (from :meth:`Notifier.subscribe`).

    ``ready`` is set while its channels are listened on the live connection
    (and announced, for watch-only channels); cleared when it is lost.
    :meth:`close` (or :meth:`cancel`, without waiting) ends it.
    """

    __slots__ = ("_failed", "_notifier", "_on_notify", "_on_recheck", "channels", "closed",
                 "key", "ready")

    def __init__(self, notifier: Notifier, channels: tuple[str, ...], key: str | None,
                 on_notify: NotifyHandler | None, on_recheck: Recheck | None) -> None:
        self.channels = channels
        self.key = key
        self.ready = asyncio.Event()
        self.closed = False
        self._notifier = notifier
        self._on_notify = on_notify
        self._on_recheck = on_recheck
        self._failed = False

    def _notified(self, n: psycopg.Notify) -> None:
        if self._on_notify is not None and not self.closed:
            self._call(self._on_notify, n)

    def _recheck(self) -> None:
        if self._on_recheck is not None and not self.closed:
            self._call(self._on_recheck)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # one subscriber's bug never silences the others
            if not self._failed:
                self._failed = True
                log.exception("a subscriber of %s raised (logged once; it is still called)",
                              ", ".join(self.channels))

    async def close(self) -> None:
        """Unsubscribe; if it was the last subscriber, wait for the connection to close."""
        task = self._notifier._discard(self)
        if task is not None:
            await asyncio.wait({task})

    def cancel(self) -> None:
        """Unsubscribe without waiting (from synchronous code)."""
        self._notifier._discard(self)


class Notifier:
    """One LISTEN connection to ``conninfo``, shared by every subscriber of an
    event loop (get it with :func:`notifier_for`; see the module docstring).

    ``connects`` counts the connections it made, ``received`` the
    notifications it read; ``backend_pid`` is the server process of the
    current connection (None while there is none).
    """

    def __init__(self, conninfo: str, schema: str = DEFAULT) -> None:
        self.conninfo = conninfo
        #: The schema whose channels it LISTENs on (``<schema>_wake`` ...); its
        #: subscribers get the shipped names (``pgdurable_wake`` ...).
        self.schema = check_schema_name(schema)
        self.connects = 0
        self.received = 0
        self.backend_pid: int | None = None
        self._subs: set[Subscription] = set()
        self._by_channel: dict[str, set[Subscription]] = {}  # subscribers of every payload
        self._by_key: dict[tuple[str, str], set[Subscription]] = {}  # of one payload
        self._wanted: dict[str, int] = {}  # channel -> subscribers (LISTEN while > 0), in order
        self._listening: set[str] = set()  # LISTENed (and announced) on the live connection
        self._changed: asyncio.Future[None] | None = None  # ends the connection's read window
        self._task: asyncio.Task[None] | None = None
        self._rechecks: list[asyncio.TimerHandle] = []
        self._moves = 0  # the cell route's moves when the live connection was made
        self._follow = False  # reconnect where the route points now (a cell moved)

    @property
    def channels(self) -> list[str]:
        """The channels LISTENed on the live connection (tests, diagnostics)."""
        return [ch for ch in self._wanted if ch in self._listening]

    @property
    def subscribers(self) -> int:
        """How many subscriptions are open."""
        return len(self._subs)

    def subscribe(self, channels: Iterable[str], on_notify: NotifyHandler | None = None,
                  on_recheck: Recheck | None = None, *, key: str | None = None) -> Subscription:
        """Subscribe to ``channels`` (only to notifications whose payload is ``key``,
        if given): ``on_notify(n)`` for each notification, ``on_recheck()``
        whenever notifications may have been missed (see the module docstring).

        Both are called in the event loop and must not block. If the channels
        are listened already, the subscription is ready at once (and
        ``on_recheck`` is called before this returns).
        """
        chans = tuple(dict.fromkeys(channels))
        if not chans:
            raise ValueError("subscribe to at least one channel")
        for ch in chans:
            if not isinstance(ch, str) or not _CHANNEL.fullmatch(ch):
                raise ValueError(f"not a channel name: {ch!r}")
        sub = Subscription(self, chans, key, on_notify, on_recheck)
        self._subs.add(sub)
        for ch in chans:
            if key is None:
                self._by_channel.setdefault(ch, set()).add(sub)
            else:
                self._by_key.setdefault((ch, key), set()).add(sub)
            self._wanted[ch] = self._wanted.get(ch, 0) + 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="pgdurable-notifier")
        if all(ch in self._listening for ch in chans):
            sub.ready.set()
            sub._recheck()
        else:
            self._change()
        return sub

    def _discard(self, sub: Subscription) -> asyncio.Task[None] | None:
        """Drop ``sub``; the connection task if this ended it (to be awaited)."""
        if sub.closed:
            return None
        sub.closed = True
        sub.ready.clear()
        self._subs.discard(sub)
        unwanted = False
        for ch in sub.channels:
            if sub.key is None:
                _drop(self._by_channel, ch, sub)
            else:
                _drop(self._by_key, (ch, sub.key), sub)
            left = self._wanted.get(ch, 0) - 1
            if left > 0:
                self._wanted[ch] = left
            else:
                self._wanted.pop(ch, None)
                unwanted = True
        if not self._subs and self._task is not None:
            task, self._task = self._task, None
            task.cancel()  # nobody listens: close the connection
            self._reset()  # now: a subscriber that comes next waits for a new one
            return task
        if unwanted:
            self._change()  # UNLISTEN what nobody wants
        return None

    def _change(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    # -- what a notification and a (re)connection do ---------------------------
    def _dispatch(self, n: psycopg.Notify) -> None:
        """psycopg's notify handler: hand ``n`` to the subscribers of its channel
        and of its payload (also while a statement runs on the connection)."""
        self.received += 1
        if self.schema != DEFAULT:  # its subscribers know the shipped names only
            n = psycopg.Notify(canonical_channel(n.channel, self.schema), n.payload, n.pid)
        every = self._by_channel.get(n.channel)
        if every:
            for sub in tuple(every):
                sub._notified(n)
        keyed = self._by_key.get((n.channel, n.payload))
        if keyed:
            for sub in tuple(keyed):
                sub._notified(n)

    def _mark_ready(self) -> None:
        """Every subscription whose channels are all listened now is ready: tell it."""
        for sub in tuple(self._subs):
            if not sub.ready.is_set() and all(ch in self._listening for ch in sub.channels):
                sub.ready.set()
                sub._recheck()

    def _schedule_rechecks(self, channels: set[str]) -> None:
        """After an announcement on ``channels`` began: their subscribers look
        again at each RECHECK delay (what raced the announcement)."""
        loop = asyncio.get_running_loop()
        self._rechecks = [h for h in self._rechecks if h.when() > loop.time()]  # the past ones
        for delay in presence.RECHECK:
            self._rechecks.append(loop.call_later(delay, self._recheck_channels, channels))

    def _recheck_channels(self, channels: set[str]) -> None:
        for sub in tuple(self._subs):
            if sub.ready.is_set() and not channels.isdisjoint(sub.channels):
                sub._recheck()

    def reconnect(self) -> None:
        """Make the connection again where its cell's route points now
        (:mod:`pgdurable.foundation.cells`: the schema moved to another node).
        Subscribers read again once listening there, as after any reconnect.
        Nothing happens if the connection was made after the move."""
        if current_conninfo(self.conninfo, self.schema)[1] != self._moves:
            self._follow = True
            self._change()

    def _lost(self) -> None:
        """The connection task's connection is gone. (Only the current task says
        so: one that was cancelled because the last subscriber left may end
        after a new one started.)"""
        if self._task is None or self._task is asyncio.current_task():
            self._reset()

    def _reset(self) -> None:
        """No connection: nothing is listened, nobody is ready."""
        self._listening.clear()
        self._changed = None
        self.backend_pid = None
        for sub in self._subs:
            sub.ready.clear()
        for h in self._rechecks:
            h.cancel()
        self._rechecks.clear()

    # -- the connection ---------------------------------------------------------
    async def _run(self) -> None:
        backoff = BACKOFF[0]
        try:
            while True:
                conn: psycopg.AsyncConnection[Any] | None = None
                try:
                    self._follow = False
                    conninfo, self._moves = current_conninfo(self.conninfo, self.schema)
                    conn = await aconnect(conninfo, schema=self.schema)
                    self.connects += 1
                    self.backend_pid = conn.info.backend_pid
                    conn.add_notify_handler(self._dispatch)  # also while a statement runs
                    await self._serve(conn)
                except asyncio.CancelledError:
                    raise
                except _Follow:
                    log.info("listener follows its cell to %s",
                             masked_conninfo(current_conninfo(self.conninfo, self.schema)[0]))
                    self._lost()
                    backoff = BACKOFF[0]
                    continue
                except Exception as exc:
                    why = str(exc).strip() or type(exc).__name__
                    if not isinstance(exc, psycopg.Error | OSError | DatabaseUnavailable):
                        # a bug, not the network: say so, but keep the process listening
                        log.error("listener failed; reconnecting", exc_info=True)
                    elif conn is not None:
                        log.warning("listener connection lost: %s; reconnecting", why)
                    else:
                        log.warning("listener cannot connect: %s; retrying", why)
                    if conn is not None and not isinstance(translate(exc), ReadOnlyDatabase):
                        backoff = BACKOFF[0]  # it was up: the first retry comes soon
                    # (a server in recovery refuses LISTEN: 25006, not a lost connection;
                    # it backs off as if it could not connect, up to BACKOFF[1])
                    self._lost()
                    await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
                    backoff = min(backoff * 2, BACKOFF[1])
                finally:
                    if conn is not None:
                        with contextlib.suppress(Exception):
                            await conn.close()
        finally:
            self._lost()
            if self._task is asyncio.current_task():
                self._task = None  # (a subscriber that comes next starts another)

    async def _serve(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """LISTEN and UNLISTEN as subscribers come and go, announce, renew and
        health-check, and read notifications in between; raises when the
        connection is lost."""
        listened: dict[str, None] = {}  # on this connection, in order
        announced: dict[str, float] = {}  # watch-only channel -> when (monotonic)
        heard = time.monotonic()  # the last notification or answered statement

        async def statement(sql: str) -> None:
            nonlocal heard
            async with asyncio.timeout(STATEMENT_TIMEOUT):
                await conn.execute(sql)
            heard = time.monotonic()

        async def announce(channels: Iterable[str]) -> None:
            nonlocal heard
            for ch in channels:
                async with asyncio.timeout(STATEMENT_TIMEOUT):
                    await presence.announce(conn, ch)
                announced[ch] = heard = time.monotonic()

        while True:
            if self._follow:
                raise _Follow  # the cell moved: _run connects where it is now
            changed = self._changed = asyncio.get_running_loop().create_future()
            for ch in [c for c in listened if c not in self._wanted]:
                self._listening.discard(ch)
                announced.pop(ch, None)
                await statement(f"UNLISTEN {ch}")
                del listened[ch]
            new = [c for c in self._wanted if c not in listened]
            for ch in new:
                await statement(f"LISTEN {ch}")
                listened[ch] = None
            watched = [c for c in listened if c in presence.CHANNELS]
            fresh = {c for c in watched if c not in announced}
            now = time.monotonic()
            await announce(c for c in watched if c in fresh or now - announced[c] >= presence.RENEW)
            if fresh:
                self._schedule_rechecks(fresh)
            self._listening.update(listened)
            self._mark_ready()  # the subscribers of what is listened now look again
            if changed.done():
                continue  # a subscriber came or went meanwhile
            now = time.monotonic()
            window = heard + HEALTH - now
            if watched:
                window = min(window, min(announced[c] for c in watched) + presence.RENEW - now)
            if await receive(conn, max(0.0, window), changed):
                heard = time.monotonic()
            if changed.done():
                continue
            if watched and time.monotonic() - min(announced[c] for c in watched) >= presence.RENEW:
                continue  # the renewal, at the top, is also the health check
            if time.monotonic() - heard >= HEALTH:
                await statement("SELECT 1")  # a quiet socket: is it still there?


class _Follow(Exception):
    """The connection's cell moved: make it again (:meth:`Notifier.reconnect`)."""


def _drop(index: dict[K, set[Subscription]], k: K, sub: Subscription) -> None:
    """Take ``sub`` out of ``index[k]`` (and the key out when it is left empty)."""
    members = index.get(k)
    if members is not None:
        members.discard(sub)
        if not members:
            del index[k]


class Wakeup:
    """What a reader of the database waits on: an event set by a notification on
    ``channel`` (for payload ``key`` only, if given) and whenever one may have
    been missed. It never says what to read or believe, only to read again.

    With ``notifier=None`` (no LISTEN possible) nothing sets it: the reader's
    own poll is all there is.
    """

    def __init__(self, notifier: Notifier | None, channel: str, key: str | None = None) -> None:
        self._event = asyncio.Event()
        self._sub = None if notifier is None else notifier.subscribe(
            (channel,), self._notified, self._event.set, key=key)

    def _notified(self, _: psycopg.Notify) -> None:
        self._event.set()

    async def listening(self, timeout: float) -> None:  # noqa: ASYNC109
        """Wait (at most ``timeout`` seconds) until the LISTEN is in place: a
        read after this misses nothing a later notification would tell."""
        if self._sub is not None:
            await wait_set(self._sub.ready, timeout)
        self._event.clear()

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait at most ``timeout`` seconds for a reason to read again; whether one came."""
        woken = await wait_set(self._event, timeout)
        self._event.clear()  # before the read: a later notification sets it again
        return woken

    async def close(self) -> None:
        """Unsubscribe."""
        if self._sub is not None:
            await self._sub.close()


_shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Notifier]] = (
    weakref.WeakKeyDictionary())
_shared_lock = threading.Lock()


def _key(conninfo: str) -> str:
    """The same server, database and role however the conninfo is written."""
    try:
        params = _conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return conninfo
    return _conninfo.make_conninfo(**{k: str(v) for k, v in sorted(params.items())})


def notifier_for(conninfo: str, schema: str | None = None) -> Notifier:
    """The running event loop's :class:`Notifier` for ``conninfo`` and ``schema`` (else
    ``PGDURABLE_SCHEMA``, else ``pgdurable``), made on first use."""
    loop = asyncio.get_running_loop()
    schema = resolve_schema(schema)
    key = f"{schema} {_key(conninfo)}"
    with _shared_lock:
        per_loop = _shared.get(loop)
        if per_loop is None:
            per_loop = _shared[loop] = {}
        notifier = per_loop.get(key)
        if notifier is None:
            notifier = per_loop[key] = Notifier(conninfo, schema)
    return notifier

