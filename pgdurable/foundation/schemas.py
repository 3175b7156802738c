"""The schema pgdurable lives in: ``pgdurable`` unless told otherwise.

Several apps or tenants can share one database, each in its own schema
(``Durable(schema="billing")``, ``pgdurable --schema billing migrate``, or
``PGDURABLE_SCHEMA``): every table, function, view, NOTIFY channel and
advisory-lock text of one is its own, and a worker of one never claims
another's runs.

The SQL the package ships names the schema ``pgdurable``, as users read it
(``pgdurable.runs``, ``pgdurable.claim_runs(...)``, the channel
``pgdurable_wake``). For another schema the name is substituted in ONE place
per direction:

* **into the database**: ``migrate`` applies each migration and definition
  file with the name replaced (:func:`in_schema`; the recorded sha256 is the
  shipped file's, so drift is detected the same way in every schema);
* **on a connection**: library connections to another schema get a cursor
  class (:func:`cursor_factories`) that replaces the name in every statement
  they send: ``execute``, ``executemany``, ``stream`` and ``COPY`` all pass
  through psycopg's ``_convert_query``, the one method the class overrides.
  Each statement's text is rewritten once (a cache of the last 4,096), so a
  hot statement costs a dictionary lookup. Connections to ``pgdurable`` get
  psycopg's own cursors: the default path is unchanged.
* **NOTIFY channels**: the notifier LISTENs on the schema's channels
  (``billing_wake``) and hands its subscribers the shipped names
  (``pgdurable_wake``), so no subscriber knows about schemas.

What is replaced: the word ``pgdurable`` (schema-qualified names, ``SCHEMA
pgdurable``, ``'pgdurable'::regnamespace``, lock texts, messages) and the prefix of
the channels in :data:`CHANNELS` (``pgdurable_wake`` ...); not other names that
begin with ``pgdurable_`` (a table of yours), and not the names of :data:`KEPT`:
the session settings ``pgdurable.now`` (the test clock), ``pgdurable.live_steps``
and ``pgdurable.cell``, which stay global (a session's test clock moves every
schema's ``now()``), and the wake kinds ``pgdurable.budget`` and
``pgdurable.acquire``, which are data. Parameters are never touched.

A schema name is a plain lower-case identifier (``[a-z_][a-z0-9_]*``), at most
:data:`MAX_LENGTH` characters so that its channels fit PostgreSQL's 63, and not
``public`` or a system schema (the role model's grants cover every table in the
schema): anything else is :class:`~pgdurable.foundation.errors.InvalidInput`
before any SQL runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TypeVar

import psycopg

from .errors import InvalidInput

__all__ = ["CHANNELS", "DEFAULT", "KEPT", "MAX_LENGTH", "araw_cursor", "caller_schema",
           "canonical_channel", "check_schema_name", "cursor_in_schema",
           "cursor_factories", "in_schema", "resolve_schema", "raw_cursor",
           "schema_of", "statement_in_schema", "use_schema"]

#: The schema of the shipped SQL, and of every deployment that names none.
DEFAULT = "pgdurable"
#: The longest schema name: its longest channel (``<schema>_threads``) must fit 63 bytes.
MAX_LENGTH = 48

_VALID = re.compile(r"^[a-z_][a-z0-9_]*$")
_RESERVED = re.compile(r"^(public|information_schema|pg_.*)$")
#: The NOTIFY channels of the shipped SQL (``pgdurable_<name>``).
CHANNELS = ("wake", "cancel", "events", "steps", "done", "text", "mcp", "threads", "pubsub")
#: Names after ``pgdurable.`` that are not the schema's (when not called as a function):
#: the session settings ``pgdurable.now`` (the test clock), ``pgdurable.live_steps`` and
#: ``pgdurable.cell`` (a Citus database's: pgdurable/ops/citus.py), and the wake kinds
#: ``pgdurable.budget`` and ``pgdurable.acquire`` (data that runs, their steps and the
#: Python code read).
KEPT = ("now", "live_steps", "cell", "budget", "acquire")
# ``pgdurable`` as a whole word or a channel's prefix, but not the names of KEPT
_WORD = re.compile(
    r"(?<![A-Za-z0-9_$])pgdurable"
    r"(?![A-Za-z0-9$])(?!_(?!(?:" + "|".join(CHANNELS) + r")\b))"
    r"(?!\.(?:" + "|".join(KEPT) + r")\b(?!\s*\())")
_CHANNEL = re.compile(r"^pgdurable_(" + "|".join(CHANNELS) + r")$")


def check_schema_name(schema: object) -> str:
    """``schema`` if it is a usable schema name; else a typed error (nothing runs)."""
    if not isinstance(schema, str):
        raise TypeError(f"schema must be a str, not {type(schema).__name__}")
    if not _VALID.match(schema):
        raise InvalidInput(
            f"schema must be a lower-case identifier ([a-z_][a-z0-9_]*), not {schema!r}")
    if len(schema) > MAX_LENGTH:
        raise InvalidInput(f"schema name {schema!r} is longer than {MAX_LENGTH} characters "
                           "(its NOTIFY channels must fit PostgreSQL's 63)")
    if _RESERVED.match(schema):
        raise InvalidInput(f"schema {schema!r} is not allowed: pgdurable needs a schema of "
                           "its own (its roles' grants cover every table in it)")
    return schema


def resolve_schema(schema: object = None) -> str:
    """``schema``, else ``PGDURABLE_SCHEMA``, else ``pgdurable``; checked."""
    if schema is None:
        schema = os.environ.get("PGDURABLE_SCHEMA") or DEFAULT
    return check_schema_name(schema)


@lru_cache(maxsize=4096)
def in_schema(sql: str, schema: str) -> str:
    """``sql`` (shipped text naming ``pgdurable``) for ``schema``."""
    if schema == DEFAULT:
        return sql
    return _WORD.sub(schema, sql)


def canonical_channel(name: str, schema: str) -> str:
    """The shipped name of ``schema``'s channel ``name`` (``billing_wake`` ->
    ``pgdurable_wake``); a channel that is not the schema's is returned as it is."""
    if schema == DEFAULT or not name.startswith(schema + "_"):
        return name
    canonical = DEFAULT + name[len(schema):]
    return canonical if _CHANNEL.match(canonical) else name


def statement_in_schema(query: Any, schema: str, conn: Any = None) -> Any:
    """A psycopg query (``str``, ``bytes`` or ``sql.Composable``) for ``schema``."""
    if schema == DEFAULT:
        return query
    if isinstance(query, str):
        return in_schema(query, schema)
    if isinstance(query, bytes):
        return in_schema(query.decode(), schema).encode()
    if isinstance(query, psycopg.sql.Composable):
        return in_schema(query.as_string(conn), schema)
    return query


class _InSchema:
    """Mixed into a psycopg cursor class: every statement is rewritten for ``schema``."""

    schema: str = DEFAULT

    def _convert_query(self, query: Any, params: Any = None) -> Any:
        rewritten = statement_in_schema(query, self.schema, getattr(self, "_conn", None))
        return super()._convert_query(rewritten, params)  # type: ignore[misc]


C = TypeVar("C")


def _subclass(base: type[C], schema: str) -> type[C]:
    return type(f"{base.__name__}In_{schema}", (_InSchema, base), {"schema": schema})


def cursor_in_schema(base: type[C], schema: str) -> type[C]:
    """``base`` (a psycopg cursor class of yours) rewriting its statements for ``schema``
    (``base`` itself for ``pgdurable``)."""
    return base if check_schema_name(schema) == DEFAULT else _subclass(base, schema)


@lru_cache(maxsize=64)
def cursor_factories(schema: str, asynchronous: bool) -> dict[str, Any]:
    """The connection attributes (``cursor_factory``, ``server_cursor_factory``) that make
    a connection speak to ``schema`` ({} for ``pgdurable``: psycopg's own cursors)."""
    if check_schema_name(schema) == DEFAULT:
        return {}
    if asynchronous:
        return {"cursor_factory": _subclass(psycopg.AsyncCursor, schema),
                "server_cursor_factory": _subclass(psycopg.AsyncServerCursor, schema)}
    return {"cursor_factory": _subclass(psycopg.Cursor, schema),
            "server_cursor_factory": _subclass(psycopg.ServerCursor, schema)}


def schema_of(conn: Any) -> str:
    """The schema a library connection speaks to (its cursors' ``schema``)."""
    return getattr(getattr(conn, "cursor_factory", None), "schema", DEFAULT)


def use_schema(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
               schema: str) -> None:
    """Make ``conn`` send its statements to ``schema`` (a pool's ``configure`` does this);
    a name that is not a schema's (:func:`check_schema_name`) is refused first."""
    asynchronous = isinstance(conn, psycopg.AsyncConnection)
    check_schema_name(schema)  # the name goes into SQL text: never an unchecked one
    factories = cursor_factories(schema, asynchronous) or (
        {"cursor_factory": psycopg.AsyncCursor, "server_cursor_factory": psycopg.AsyncServerCursor}
        if asynchronous else
        {"cursor_factory": psycopg.Cursor, "server_cursor_factory": psycopg.ServerCursor})
    for attr, factory in factories.items():
        setattr(conn, attr, factory)


@contextmanager
def caller_schema(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None,
                  schema: str) -> Iterator[None]:
    """While it lasts, the caller's ``conn`` (``start(conn=...)``: the caller's
    transaction) speaks to ``schema``; its own cursors come back after. None: nothing."""
    if conn is None or schema_of(conn) == schema:
        yield
        return
    saved = conn.cursor_factory, conn.server_cursor_factory
    use_schema(conn, schema)
    try:
        yield
    finally:
        conn.cursor_factory, conn.server_cursor_factory = saved


@lru_cache(maxsize=64)
def _raw(schema: str, asynchronous: bool) -> type[Any]:
    base: type[Any] = psycopg.AsyncRawCursor if asynchronous else psycopg.RawCursor
    return base if schema == DEFAULT else _subclass(base, schema)


def araw_cursor(conn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncRawCursor[Any]:
    """A raw (``$1``) cursor on ``conn`` that speaks to ``conn``'s schema."""
    cursor: psycopg.AsyncRawCursor[Any] = _raw(schema_of(conn), True)(conn)
    return cursor


def raw_cursor(conn: psycopg.Connection[Any]) -> psycopg.RawCursor[Any]:
    """A raw (``$1``) cursor on ``conn`` that speaks to ``conn``'s schema."""
    cursor: psycopg.RawCursor[Any] = _raw(schema_of(conn), False)(conn)
    return cursor
