"""One LISTEN connection per dashboard server, fanned out to every browser tab.

:class:`Broadcaster` holds a single autocommit connection that LISTENs on the
engine's channels (a finished step, a run's end, a new event, a cancel, a
wake-up) and puts each notification, as a small dict, on the queue of every
subscriber (one per open SSE stream). Tabs never poll the database; the
number of database connections does not grow with the number of tabs.
The connection is opened with the first subscriber, re-opened after a loss,
and closed by :meth:`close`. A subscriber gets ``{"channel": "reconnect"}``
("refresh everything; every later event will reach you") as soon as the
connection listens: when it subscribes, or when the connection is (re)made.
While it listens, the connection announces the dashboard on the watch-only
channels (``pgdurable_steps``, ``pgdurable_done``: the database sends them only
while somebody listens, see :mod:`pgdurable.foundation.presence`) and renews that every
:data:`~pgdurable.foundation.presence.RENEW` seconds; after its first announcement the
subscribers also get ``reconnect`` at each :data:`~pgdurable.foundation.presence.RECHECK`
delay (a step or a run's end that raced the announcement is read then).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg

from ...foundation.notifications import receive
from ...foundation.presence import CHANNELS as PRESENCE_CHANNELS
from ...foundation.presence import RECHECK, RENEW, announce

log = logging.getLogger("pgdurable.dashboard")

CHANNELS = ("pgdurable_steps", "pgdurable_done", "pgdurable_events", "pgdurable_cancel",
            "pgdurable_wake")
_QUEUE_SIZE = 256


class Broadcaster:
    """Fan-out of one LISTEN connection to many subscriber queues."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._subs: set[asyncio.Queue[dict[str, Any]]] = set()
        self._task: asyncio.Task[None] | None = None
        self.connections = 0  # LISTEN connections opened (tests: one per server)
        self.ready = asyncio.Event()

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        """A new subscriber queue (starts the listener if needed)."""
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(_QUEUE_SIZE)
        self._subs.add(q)
        if self.ready.is_set():
            # already listening: from now on this subscriber gets every event;
            # what happened before it subscribed, it must re-read (refresh)
            q.put_nowait({"channel": "reconnect"})
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen())
        return q

    def unsubscribe(self, q: asyncio.Queue[dict[str, Any]]) -> None:
        """Drop a subscriber queue."""
        self._subs.discard(q)

    def _publish(self, message: dict[str, Any]) -> None:
        for q in list(self._subs):
            try:
                q.put_nowait(message)
            except asyncio.QueueFull:  # a stalled tab: it gets a full refresh instead
                with contextlib.suppress(asyncio.QueueEmpty):
                    while True:
                        q.get_nowait()
                q.put_nowait({"channel": "reconnect"})

    async def _listen(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True
                ) as conn:
                    self.connections += 1
                    conn.add_notify_handler(  # also while a statement runs
                        lambda n: self._publish(_message(n.channel, n.payload)))
                    for ch in CHANNELS:
                        await conn.execute(f"LISTEN {ch}")
                    await self._announce(conn)
                    self.ready.set()
                    self._publish({"channel": "reconnect"})
                    loop = asyncio.get_running_loop()
                    for delay in RECHECK:  # what raced the announcement
                        loop.call_later(delay, self._publish, {"channel": "reconnect"})
                    while True:
                        await receive(conn, RENEW)
                        await self._announce(conn)
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError) as exc:
                self.ready.clear()
                log.warning("dashboard listener lost: %s; reconnecting", exc)
                await asyncio.sleep(1.0)

    @staticmethod
    async def _announce(conn: psycopg.AsyncConnection[Any]) -> None:
        """Announce the dashboard on the watch-only channels (renewed every RENEW s)."""
        for ch in sorted(PRESENCE_CHANNELS):
            await announce(conn, ch)

    async def close(self) -> None:
        """Stop the listener."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def _message(channel: str, payload: str) -> dict[str, Any]:
    name = channel.removeprefix("pgdurable_")
    if name == "steps":
        return {"channel": name, "runs": [p for p in payload.split(",") if p]}
    if name in ("done", "events", "cancel"):
        return {"channel": name, "runs": [payload]}
    return {"channel": name, "queue": payload}
