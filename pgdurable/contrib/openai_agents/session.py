"""An OpenAI Agents SDK session on Postgres (the SDK's ``Session`` protocol).

``PgDurableSession(session_id, dsn_or_pool)`` stores the conversation items of
a session in ``pgdurable.agent_session_items``. Each call is one SQL function
(``sql/*_agent_sessions.sql``): ``add_items`` appends a call's items
atomically and in order under the session's advisory lock, so concurrent calls
from several processes never interleave or lose items; ``pop_item`` removes the
newest; ``clear_session`` removes all. ``add_items(items, key=...)`` is
idempotent per ``key`` (the durable runner uses it to save a run's turn once).
"""

from __future__ import annotations

from typing import Any, TypeVar

from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings, resolve_session_limit
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from ...foundation.db import acheck_connection, translated
from ...foundation.pooler import aconfigure, connect_kwargs, connect_timeout
from ...foundation.queries import agent_sessions as sq
from ...foundation.queries.core import Query, many

__all__ = ["PgDurableSession"]

R = TypeVar("R")

# (its statements: pgdurable.foundation.queries.agent_sessions, imported as ``sq``)


class PgDurableSession(SessionABC):
    """The SDK's session protocol on pgdurable's tables (see the module docstring).

    ``conn`` is a DSN (the session owns a small pool: ``await session.close()``)
    or an ``AsyncConnectionPool`` of autocommit connections (shared, not closed).
    """

    def __init__(self, session_id: str, conn: str | AsyncConnectionPool[Any], *,
                 session_settings: SessionSettings | None = None) -> None:
        if not isinstance(session_id, str) or not session_id or "\x00" in session_id:
            raise ValueError("session_id must be a non-empty str without NUL")
        self.session_id = session_id
        self.session_settings = session_settings or SessionSettings()
        if isinstance(conn, str):
            self._pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                conn, min_size=1, max_size=2, open=False,
                kwargs={**connect_kwargs(), **connect_timeout(conn)}, configure=aconfigure(),
                check=acheck_connection)
            self._owned = True
        elif isinstance(conn, AsyncConnectionPool):
            self._pool, self._owned = conn, False
        else:
            raise TypeError("PgDurableSession needs a DSN or an AsyncConnectionPool")
        self._opened = False

    async def _fetch(self, query: Query[R], params: tuple[Any, ...]) -> list[R]:
        if self._owned and not self._opened:
            self._opened = True
            await self._pool.open(wait=True)
        with translated():
            async with self._pool.connection() as conn:
                return await many(conn, query, params)

    async def close(self) -> None:
        """Close the owned pool."""
        if self._owned and self._opened:
            await self._pool.close()

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The session's items, oldest first (the last ``limit`` when given)."""
        n = resolve_session_limit(limit, self.session_settings)
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ValueError("limit must be an int >= 0 or None")
        return await self._fetch(sq.GET, (self.session_id, n))

    async def add_items(self, items: list[Any], *, key: str | None = None) -> None:
        """Append ``items`` in order, atomically (a repeated ``key`` adds nothing)."""
        if not isinstance(items, list):
            raise TypeError("items must be a list of input items")
        if items:
            await self._fetch(sq.ADD, (self.session_id, [Jsonb(i) for i in items], key))

    async def pop_item(self) -> Any:
        """Remove and return the newest item (None when the session is empty)."""
        popped = await self._fetch(sq.POP, (self.session_id,))
        return popped[0] if popped else None

    async def clear_session(self) -> None:
        """Remove every item of the session."""
        await self._fetch(sq.CLEAR, (self.session_id,))
