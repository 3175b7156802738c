"""Where a Citus cell's connections go, followed across shard moves.

A cell (docs/scaling.md, :mod:`pgdurable.ops.citus`) is a pgdurable schema that
Citus placed whole on one worker node; its fleet connects to that node. A shard
move (``citus_move_shard_placement``, the rebalancer) puts the schema on
another node while the fleet runs. Statements sent to the old node still work
(every node has the cluster's metadata and routes them), but each pays a hop,
and a NOTIFY sent by the engine's triggers is sent on the node that holds the
schema: listeners left on the old node hear nothing and fall back to polling.

So a :class:`~pgdurable.Durable` app whose connections are in a cell (the
session setting ``pgdurable.cell = on``, set by ``distribute_schema``) follows
its schema by itself:

* its pool's conninfo is its :class:`CellRoute`'s :meth:`~CellRoute.conninfo`
  (psycopg_pool calls it for each new connection): the DSN the app was given
  until a move, then the same DSN with the new node's host and port;
* every :data:`FOLLOW_EVERY` seconds :func:`afollow` reads, on a pooled
  connection, where the schema's placements are (Citus' metadata, readable by
  any role on any node: ``pg_dist_schema`` -> ``pg_dist_placement`` ->
  ``pg_dist_node``) and which node the connection is on
  (``pg_dist_local_group``). When they differ the route takes the new node,
  the pool is drained (idle connections closed now, busy ones when they come
  back, new ones made to the new node) and the notifier reconnects there
  (:meth:`pgdurable.foundation.notifier.Notifier.reconnect`; its subscribers
  read again, as after any reconnect).

The same look is made once when the app opens: an app given the coordinator's
DSN goes to the cell's node before its first statement of work. The dashboard
follows the same way; the sync :class:`~pgdurable.DurableClient`, which has no
loop to run a task in, looks when it is used (at most every :data:`FOLLOW_EVERY`
seconds, :func:`refresh`) and drains its pool the same way.

A lease is unaffected: it lives in the cell's tables, fenced by its token, and
whichever connection carries the next statement writes it.

Routes are process-wide, one per (schema, DSN) (:func:`route_for`), so two
apps on one DSN and the notifier they share agree on where the cell is.

DDL (history and event partitions) must go through the coordinator ("cannot
create tables in a distributed schema from a worker node"):
:func:`acoordinator_dsn` / :func:`coordinator_dsn` name it for a connection on
a cell's node, which partition maintenance uses (:mod:`pgdurable.ops.partitions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from .pooler import aconnect, connect
from .queries import citus as cq
from .queries.core import first, first_sync, many, many_sync, one, one_sync
from .schemas import schema_of

__all__ = ["FOLLOW_EVERY", "CellRoute", "acoordinator_dsn", "afollow", "ain_cell",
           "aon_coordinator", "arefresh", "astart_following", "astop_following", "in_cell",
           "refresh", "coordinator_dsn", "on_coordinator", "current_conninfo", "replace_host", "route_for"]

log = logging.getLogger("pgdurable.cells")

#: Seconds between two looks at where a followed cell's schema is.
FOLLOW_EVERY = 5.0


def replace_host(dsn: str, host: str, port: int) -> str:
    """``dsn`` with one node's ``host`` and ``port`` (same database, user, options).

    A multi-host DSN's read-write choice and load balancing mean nothing for
    one node and are dropped; ``hostaddr`` too (it would win over ``host``)."""
    params = conninfo_to_dict(dsn)
    for key in ("hostaddr", "target_session_attrs", "load_balance_hosts"):
        params.pop(key, None)
    params["host"] = host
    params["port"] = str(port)
    return make_conninfo("", **params)


class CellRoute:
    """Where the connections of one cell (a schema reached through a DSN) go now."""

    def __init__(self, conninfo: str, schema: str) -> None:
        #: the DSN the app was given
        self.base = conninfo
        self.schema = schema
        #: the node it follows after a move, ``(host, port)``; None: ``base`` as given
        self.node: tuple[str, int] | None = None
        #: how many moves it followed (the pool and the notifier compare it)
        self.moves = 0
        self._current = conninfo

    def conninfo(self) -> str:
        """The DSN of the node that holds the schema, as last seen."""
        return self._current

    def point(self, rows: list[cq.NodeRow], local_group: int | None) -> bool:
        """Point the route at the node of ``rows`` (:data:`cq.NODE` read on a connection
        on the node of group ``local_group``); whether it moved."""
        if len(rows) != 1:
            return False  # not distributed, or a move half-way: look again later
        row = rows[0]
        target = (row.host, row.port)
        if self.node == target or (self.node is None and local_group == row.group_id):
            return False
        self.node = target
        self._current = replace_host(self.base, row.host, row.port)
        self.moves += 1
        return True


_routes: dict[tuple[str, str], CellRoute] = {}
_routes_lock = threading.Lock()


def _key(conninfo: str) -> str:
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return conninfo
    return make_conninfo("", **{k: str(v) for k, v in sorted(params.items())})


def route_for(conninfo: str, schema: str) -> CellRoute:
    """The process's route of ``schema`` through ``conninfo``, made on first use."""
    key = (schema, _key(conninfo))
    with _routes_lock:
        route = _routes.get(key)
        if route is None:
            route = _routes[key] = CellRoute(conninfo, schema)
        return route


def current_conninfo(conninfo: str, schema: str) -> tuple[str, int]:
    """Where a connection for ``schema`` through ``conninfo`` goes now, and the
    route's move count (``(conninfo, 0)`` where no route was made)."""
    with _routes_lock:
        route = _routes.get((schema, _key(conninfo)))
    return (conninfo, 0) if route is None else (route.conninfo(), route.moves)


async def astart_following(route: CellRoute, pool: AsyncConnectionPool[Any],
                           reconnect: Callable[[], None],
                           timeout: float) -> asyncio.Task[None] | None:  # noqa: ASYNC109
    """If ``pool``'s connections are in a cell (``pgdurable.cell = on``), a task that
    follows ``route`` (:func:`afollow`); else None. The caller cancels it on close.

    It looks once at once: an app given another node's DSN (the coordinator's)
    goes to the cell's node before its first statement of work."""
    async with pool.connection(timeout=timeout) as conn:
        if not await ain_cell(conn):
            return None
        moved = await arefresh(route, conn)
    if moved:
        await _moved(route, pool, reconnect)
    return asyncio.create_task(afollow(route, pool, reconnect),
                               name=f"pgdurable-follow-{route.schema}")


async def _moved(route: CellRoute, pool: AsyncConnectionPool[Any],
                 reconnect: Callable[[], None]) -> None:
    host, port = route.node or ("?", 0)
    log.warning("cell %s is on %s:%s: following it", route.schema, host, port)
    with contextlib.suppress(Exception):
        await pool.drain()
    reconnect()


async def astop_following(task: asyncio.Task[None] | None) -> None:
    """Cancel a task of :func:`astart_following` (None: nothing) and wait for it."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def afollow(route: CellRoute, pool: AsyncConnectionPool[Any], reconnect: Callable[[], None],
                  every: float = FOLLOW_EVERY) -> None:
    """Follow ``route``'s schema until cancelled (module docstring): every
    ``every`` seconds look where it is on a connection of ``pool``; when the
    route has moved since this pool last followed it, drain the pool and call
    ``reconnect`` (the notifier's). Errors are logged and looked at again."""
    seen = route.moves
    while True:
        await asyncio.sleep(every)
        try:
            async with pool.connection() as conn:
                await arefresh(route, conn)
        except (psycopg.Error, OSError) as exc:
            log.debug("looking where cell %s is failed: %s", route.schema, exc)
            continue
        except Exception:
            # (the pool's timeout is not a psycopg error)
            log.debug("looking where cell %s is failed", route.schema, exc_info=True)
            continue
        if route.moves != seen:
            seen = route.moves
            await _moved(route, pool, reconnect)


# async-to-sync: source (aname -> name)
async def arefresh(route: CellRoute, conn: psycopg.AsyncConnection[Any]) -> bool:
    """Read where ``route``'s schema is on ``conn``; whether the route moved."""
    return route.point(await many(conn, cq.NODE, (route.schema,)),
                       await one(conn, cq.LOCAL_GROUP))


async def ain_cell(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether ``conn``'s session is in a cell (``pgdurable.cell = on``)."""
    return await one(conn, cq.IN_CELL)


async def acoordinator_dsn(conn: psycopg.AsyncConnection[Any], dsn: str) -> str | None:
    """The coordinator's DSN if ``conn`` is on a Citus worker node in a cell (``dsn``,
    the one ``conn`` was opened with, with the coordinator's host and port), else None."""
    if not await one(conn, cq.IN_CELL) or not await one(conn, cq.HAS_CITUS):
        return None
    if await one(conn, cq.LOCAL_GROUP) in (None, 0):
        return None  # on the coordinator already (or no group: not a cluster node)
    node = await first(conn, cq.COORDINATOR)
    return None if node is None else replace_host(dsn, node.host, node.port)


@contextlib.asynccontextmanager
async def aon_coordinator(
    conn: psycopg.AsyncConnection[Any], dsn: str | None,
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """Where DDL and maintenance of ``conn``'s schema go: ``conn`` itself, or, when
    ``conn`` is on a cell's node, a connection to the coordinator (closed on exit)
    made from ``dsn`` (``conn``'s DSN; None: ``conn``)."""
    coordinator = None if dsn is None else await acoordinator_dsn(conn, dsn)
    if coordinator is None:
        yield conn
        return
    log.info("maintenance of cell %s goes through the coordinator", schema_of(conn))
    async with await aconnect(coordinator, schema=schema_of(conn)) as other:
        yield other
# async-to-sync: generated by tools/async_to_sync.py from the source above; do not edit
def refresh(route: CellRoute, conn: psycopg.Connection[Any]) -> bool:
    """Read where ``route``'s schema is on ``conn``; whether the route moved."""
    return route.point(many_sync(conn, cq.NODE, (route.schema,)),
                       one_sync(conn, cq.LOCAL_GROUP))


def in_cell(conn: psycopg.Connection[Any]) -> bool:
    """Whether ``conn``'s session is in a cell (``pgdurable.cell = on``)."""
    return one_sync(conn, cq.IN_CELL)


def coordinator_dsn(conn: psycopg.Connection[Any], dsn: str) -> str | None:
    """The coordinator's DSN if ``conn`` is on a Citus worker node in a cell (``dsn``,
    the one ``conn`` was opened with, with the coordinator's host and port), else None."""
    if not one_sync(conn, cq.IN_CELL) or not one_sync(conn, cq.HAS_CITUS):
        return None
    if one_sync(conn, cq.LOCAL_GROUP) in (None, 0):
        return None  # on the coordinator already (or no group: not a cluster node)
    node = first_sync(conn, cq.COORDINATOR)
    return None if node is None else replace_host(dsn, node.host, node.port)


@contextlib.contextmanager
def on_coordinator(
    conn: psycopg.Connection[Any], dsn: str | None,
) -> Iterator[psycopg.Connection[Any]]:
    """Where DDL and maintenance of ``conn``'s schema go: ``conn`` itself, or, when
    ``conn`` is on a cell's node, a connection to the coordinator (closed on exit)
    made from ``dsn`` (``conn``'s DSN; None: ``conn``)."""
    coordinator = None if dsn is None else coordinator_dsn(conn, dsn)
    if coordinator is None:
        yield conn
        return
    log.info("maintenance of cell %s goes through the coordinator", schema_of(conn))
    with connect(coordinator, schema=schema_of(conn)) as other:
        yield other
# async-to-sync: end
