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

from typing import Any

from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings, resolve_session_limit
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from ...foundation.db import acheck_connection, translated
from ...foundation.pooler import aconfigure, connect_kwargs, connect_timeout

__all__ = ["PgDurableSession"]

# -- append items in order (under the session's advisory lock); idempotent per key
ADD = "SELECT pgdurable.session_add_items(%s, %s::jsonb[], %s)"
# -- the last n items (NULL: all), oldest first
GET = "SELECT item FROM pgdurable.session_get_items(%s, %s)"
# -- remove and return the newest item
POP = "SELECT pgdurable.session_pop_item(%s)"
# -- remove every item
CLEAR = "SELECT pgdurable.session_clear(%s)"


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

    async def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if self._owned and not self._opened:
            self._opened = True
            await self._pool.open(wait=True)
        with translated():
            async with self._pool.connection() as conn:
                cur = await conn.execute(sql, params)
                rows: list[tuple[Any, ...]] = await cur.fetchall()
                return rows

    async def close(self) -> None:
        """Close the owned pool."""
        if self._owned and self._opened:
            await self._pool.close()

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The session's items, oldest first (the last ``limit`` when given)."""
        n = resolve_session_limit(limit, self.session_settings)
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ValueError("limit must be an int >= 0 or None")
        return [r[0] for r in await self._fetch(GET, (self.session_id, n))]

    async def add_items(self, items: list[Any], *, key: str | None = None) -> None:
        """Append ``items`` in order, atomically (a repeated ``key`` adds nothing)."""
        if not isinstance(items, list):
            raise TypeError("items must be a list of input items")
        if items:
            await self._fetch(ADD, (self.session_id, [Jsonb(i) for i in items], key))

    async def pop_item(self) -> Any:
        """Remove and return the newest item (None when the session is empty)."""
        rows = await self._fetch(POP, (self.session_id,))
        return rows[0][0] if rows else None

    async def clear_session(self) -> None:
        """Remove every item of the session."""
        await self._fetch(CLEAR, (self.session_id,))
