"""A named query: its SQL text and how one of its rows decodes into a typed record.

A :class:`Query` pairs a statement with its decoder; the decoder is the only
code that reads the row by position, and it lives next to the SQL (a column
that moves is one edit, in one file). Decoding is sans-IO, so the same query
serves a pool, a sync client, a raw psycopg connection or a SQLAlchemy session:
``Q.one(row)``, ``Q.first(row)``, ``Q.all(rows)``; :func:`one`, :func:`first`
and :func:`many` also run it on a :class:`~pgdurable.foundation.ports.Database`
(the app's pool; errors translated) or an open async connection (the caller
translates), :func:`one_sync`, :func:`first_sync` and :func:`many_sync` on the
sync client or a sync connection (the command line's): those, and
:func:`listing_sync`, are generated from the async ones by ``tools/async_to_sync.py``
(the section at the end of this module; edit the async source). ``params`` None (their
default) sends the SQL as it is, as ``cursor.execute(sql)`` does: a statement
without parameters may then hold a literal ``%`` (``format('%s', ...)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import psycopg
from psycopg.rows import dict_row

__all__ = ["Listing", "Query", "Row", "column", "first", "first_sync", "lead", "listing",
           "listing_sync", "many", "many_sync", "nullable", "one", "one_sync", "record",
           "scalar", "statement"]

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
T = TypeVar("T")

#: A row as the driver returns it (a tuple, in the statement's column order).
Row = Sequence[Any]


class Database(Protocol):
    """:class:`pgdurable.foundation.ports.Database` (restated: this package imports no
    module that could import it back)."""

    async def fetchone(self, sql: str, params: tuple[Any, ...], *,
                       prepare: bool | None = True) -> tuple[Any, ...] | None: ...

    async def fetchall(self, sql: str, params: tuple[Any, ...], *,
                       prepare: bool | None = True) -> list[tuple[Any, ...]]: ...


class SyncDatabase(Protocol):
    """:class:`pgdurable.foundation.ports.SyncDatabase` (the sync client)."""

    def fetchone(self, sql: str, params: tuple[Any, ...], *,
                 prepare: bool | None = True) -> tuple[Any, ...] | None: ...

    def fetchall(self, sql: str, params: tuple[Any, ...], *,
                 prepare: bool | None = True) -> list[tuple[Any, ...]]: ...


#: Where a query runs: the app's pool (errors translated), or an open connection or
#: cursor (the caller translates errors).
AsyncTarget = Database | psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]
#: Where a query runs synchronously: the sync client, or an open connection or cursor.
SyncTarget = SyncDatabase | psycopg.Connection[Any] | psycopg.Cursor[Any]


@dataclass(frozen=True, slots=True)
class Query(Generic[R_co]):
    """A statement (``sql``) and the decoder of one of its rows into ``R_co``."""

    sql: str
    decode: Callable[[Row], R_co]

    def one(self, row: Row | None) -> R_co:
        """The record of a statement that always returns a row (a missing one is a bug)."""
        if row is None:
            raise AssertionError(f"no row from: {' '.join(self.sql.split())[:80]}")
        return self.decode(row)

    def first(self, row: Row | None) -> R_co | None:
        """The record of the row, or None when the statement returned none."""
        return None if row is None else self.decode(row)

    def all(self, rows: Iterable[Row]) -> list[R_co]:
        """The records of every row, in order."""
        return [self.decode(r) for r in rows]


@dataclass(frozen=True, slots=True)
class Listing:
    """A statement whose rows are shown, not computed with (the CLI's tables and JSON,
    the dashboard's pages): read by column name, as dicts (:func:`listing`,
    :func:`listing_sync`), never by position; what a row holds is its SELECT list."""

    sql: str


def _only(row: Row) -> Any:
    (value,) = row  # a single-column statement: a second column is a bug, not ignored
    return value


def lead(row: Row | None) -> Any:
    """The first column of a one-row answer: the value of a one-column call, the run id of
    a start's ``(run_id, created)`` (a missing row is a bug)."""
    if row is None:
        raise AssertionError("no row from a statement that always answers one")
    return row[0]


def scalar(sql: str, convert: Callable[[Any], T]) -> Query[T]:
    """A single-column statement whose value is ``convert(value)`` (``str``, ``int``, ...)."""
    return Query(sql, lambda row: convert(_only(row)))


def nullable(sql: str, convert: Callable[[Any], T]) -> Query[T | None]:
    """A single-column statement whose value may be NULL: None, else ``convert(value)``."""

    def decode(row: Row) -> T | None:
        value = _only(row)
        return None if value is None else convert(value)

    return Query(sql, decode)


def column(sql: str) -> Query[Any]:
    """A single-column statement whose value is used as the driver decodes it."""
    return Query(sql, _only)


def statement(sql: str) -> Query[None]:
    """A statement called for its effect: whatever it returns is not read."""
    return Query(sql, lambda row: None)


def record(sql: str, cls: Callable[..., R]) -> Query[R]:
    """A statement whose columns are, in order, the fields of dataclass ``cls``."""
    width = len(dataclasses.fields(cls))  # type: ignore[arg-type]

    def decode(row: Row) -> R:
        if len(row) != width:
            raise AssertionError(f"{getattr(cls, '__name__', cls)}: {len(row)} columns, "
                                 f"{width} fields")
        return cls(*row)

    return Query(sql, decode)


# async-to-sync: source
async def _fetchone(db: AsyncTarget, sql: str,
                    params: tuple[Any, ...] | None, prepare: bool | None) -> Row | None:
    if isinstance(db, psycopg.AsyncConnection | psycopg.AsyncCursor):
        return await (await db.execute(sql, params)).fetchone()
    return await db.fetchone(sql, params or (), prepare=prepare)


async def one(db: AsyncTarget, q: Query[R],
              params: tuple[Any, ...] | None = None, *, prepare: bool | None = True) -> R:
    """Run ``q`` on ``db`` (``prepare``: a Database's); the record of its one row."""
    return q.one(await _fetchone(db, q.sql, params, prepare))


async def first(db: AsyncTarget, q: Query[R],
                params: tuple[Any, ...] | None = None, *, prepare: bool | None = True) -> R | None:
    """Run ``q`` on ``db``; the record of its row, None without one."""
    return q.first(await _fetchone(db, q.sql, params, prepare))


async def many(db: AsyncTarget, q: Query[R],
               params: tuple[Any, ...] | None = None, *, prepare: bool | None = True) -> list[R]:
    """Run ``q`` on ``db``; the records of all its rows."""
    if isinstance(db, psycopg.AsyncConnection | psycopg.AsyncCursor):
        return q.all(await (await db.execute(q.sql, params)).fetchall())
    return q.all(await db.fetchall(q.sql, params or (), prepare=prepare))


async def listing(conn: psycopg.AsyncConnection[Any], q: Listing,
                  params: tuple[Any, ...] | None = None) -> list[dict[str, Any]]:
    """The rows of ``q`` on an open connection, as dicts by column name."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(q.sql, params)
    return await cur.fetchall()
# async-to-sync: generated by tools/async_to_sync.py from the source above; do not edit
def _fetchone_sync(db: SyncTarget, sql: str,
                   params: tuple[Any, ...] | None, prepare: bool | None) -> Row | None:
    if isinstance(db, psycopg.Connection | psycopg.Cursor):
        return db.execute(sql, params).fetchone()
    return db.fetchone(sql, params or (), prepare=prepare)


def one_sync(db: SyncTarget, q: Query[R],
             params: tuple[Any, ...] | None = None, *, prepare: bool | None = True) -> R:
    """Run ``q`` on ``db`` (``prepare``: a Database's); the record of its one row."""
    return q.one(_fetchone_sync(db, q.sql, params, prepare))


def first_sync(db: SyncTarget, q: Query[R],
               params: tuple[Any, ...] | None = None, *, prepare: bool | None = True) -> R | None:
    """Run ``q`` on ``db``; the record of its row, None without one."""
    return q.first(_fetchone_sync(db, q.sql, params, prepare))


def many_sync(db: SyncTarget, q: Query[R],
              params: tuple[Any, ...] | None = None, *, prepare: bool | None = True) -> list[R]:
    """Run ``q`` on ``db``; the records of all its rows."""
    if isinstance(db, psycopg.Connection | psycopg.Cursor):
        return q.all(db.execute(q.sql, params).fetchall())
    return q.all(db.fetchall(q.sql, params or (), prepare=prepare))


def listing_sync(conn: psycopg.Connection[Any], q: Listing,
                 params: tuple[Any, ...] | None = None) -> list[dict[str, Any]]:
    """The rows of ``q`` on an open connection, as dicts by column name."""
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(q.sql, params)
    return cur.fetchall()
# async-to-sync: end
