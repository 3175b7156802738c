"""Presence on the watch-only channels: NOTIFY only while somebody listens.

Two NOTIFY channels exist only for watchers: ``pgdurable_steps`` (a statement
wrote checkpoints: the dashboard's live timeline) and ``pgdurable_done`` (a run
ended: ``result()`` waiters and the dashboard). The database sends them only
while a listener has announced itself with ``pgdurable.listen_presence(channel,
ttl)`` (``sql/0023_listener_presence.sql``): a transaction that NOTIFYs holds a
cluster-wide lock from its commit until its commit record is flushed, so
notifications nobody reads would slow every ``start()`` and every worker batch.

A listener LISTENs first, then announces itself, then reads what it waits for
(so nothing that ends after the announcement is missed), and announces itself
again every :data:`RENEW` seconds while it listens; an announcement lasts
:data:`TTL` seconds. An announcement races the transactions already under
way: a run that ends in a transaction that looked for listeners just before
the announcement committed, and commits just after the listener's first read,
sends nothing. So after its first announcement a listener also reads again at
each :data:`RECHECK` delay, not only after its slow safety poll.

The process's notifier (:mod:`pgdurable.foundation.notifier`) does all this for
its subscribers (result waiters, the dashboard); the sync result waiter, which
has no event loop to share it in, does it by itself.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import psycopg.errors

from .queries import presence as _q
from .queries.core import first, first_sync

__all__ = ["CHANNELS", "RECHECK", "RENEW", "TTL", "announce", "announce_sync"]

log = logging.getLogger("pgdurable")

#: The channels sent only while a listener is present.
CHANNELS = frozenset({"pgdurable_steps", "pgdurable_done"})
#: Seconds an announcement lasts.
TTL = 60
#: Seconds between two announcements of a listener that keeps listening.
RENEW = 20.0
#: Delays (seconds after a listener's first announcement) at which it reads again.
RECHECK = (0.1, 0.5, 2.0)


#: A role that may not announce (set up by hand, without ``pgdurable grant``) still
#: listens: it hears what others' announcements make the database send, and reads again
#: at its safety poll.
_REFUSED = (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedFunction)


_warned: list[bool] = []  # the refusal is logged once per process, not every RENEW seconds


def _refused(exc: psycopg.Error) -> None:
    if _warned:
        log.debug("cannot announce a listener: %s", exc)
        return
    _warned.append(True)
    log.warning("cannot announce a listener (%s): watch-only notifications are sent only "
                "while another listener is present; waiting falls back to polling", exc)


async def announce(conn: psycopg.AsyncConnection[Any], channel: str) -> None:
    """Announce a listener on ``channel`` for :data:`TTL` seconds (autocommit ``conn``)."""
    try:
        await first(conn, _q.ANNOUNCE, (channel, TTL))
    except _REFUSED as exc:
        _refused(exc)


def announce_sync(conn: psycopg.Connection[Any], channel: str) -> None:
    """Sync twin of :func:`announce`."""
    try:
        first_sync(conn, _q.ANNOUNCE, (channel, TTL))
    except _REFUSED as exc:
        _refused(exc)
