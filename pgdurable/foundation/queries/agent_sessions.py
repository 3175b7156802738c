"""OpenAI Agents SDK sessions (``sql/functions/agent_sessions.sql``; the session of
:mod:`pgdurable.contrib.openai_agents`)."""

from __future__ import annotations

from typing import Any

from .core import Query, column, statement

__all__ = ["ADD", "CLEAR", "GET", "POP"]

# -- append items in order (under the session's advisory lock); idempotent per key
ADD = statement("SELECT pgdurable.session_add_items(%s, %s::jsonb[], %s)")
# -- the last n items (NULL: all), oldest first; one item (JSON) per row
GET: Query[Any] = column("SELECT item FROM pgdurable.session_get_items(%s, %s)")
# -- remove and return the newest item (NULL: the session is empty)
POP: Query[Any] = column("SELECT pgdurable.session_pop_item(%s)")
# -- remove every item
CLEAR = statement("SELECT pgdurable.session_clear(%s)")
