"""Cells on Citus: pgdurable's schema distributed as a unit, the fleet on its node.

With Citus' schema-based sharding, ``citus_schema_distribute('pgdurable')``
moves every table of the schema (partitions included) to ONE worker node as a
colocated unit: a claim, a fence and a NOTIFY stay on one node. A second schema
(a second app, tenant or "cell") lands on another node. The fleet (worker pool
and LISTEN) then connects straight to the node holding its schema, not through
the coordinator: a statement there is planned by Citus and executed locally,
without a network hop, and the NOTIFYs sent by the engine's functions are
heard by listeners on that same node. DDL (``pgdurable migrate``, partition
maintenance) goes through the coordinator, which propagates it.

* :func:`cell_dsn` / :func:`acell_dsn`: given the coordinator's DSN and a
  schema, the DSN of the node that holds the schema now (same database, user
  and options; that node's host and port), found in Citus' metadata
  (``pg_dist_schema`` -> ``pg_dist_partition`` -> ``pg_dist_placement`` ->
  ``pg_dist_node``). Call it again after a shard move
  (``citus_move_shard_placement``): the answer follows the placement.
* :func:`distribute_schema`: after ``pgdurable migrate`` on the coordinator,
  distribute the migrated schema (idempotent: a distributed schema is left as
  it is) and let its tables keep their triggers (``citus.enable_unsafe_triggers``
  for the database on every node: the engine's triggers only touch rows of the
  same colocated schema, on the same node, which is what makes them safe here).

From psql on the coordinator, what :func:`distribute_schema` does::

    ALTER DATABASE app SET citus.enable_unsafe_triggers = on;  -- and on each worker
    SET citus.enable_unsafe_triggers = on;
    SELECT citus_schema_distribute('pgdurable');
    SELECT * FROM citus_schemas;          -- where it went: citus_shards.nodename/nodeport
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..foundation.errors import PgDurableError

__all__ = [
    "CellNode",
    "CitusError",
    "NotCitus",
    "SchemaNotDistributed",
    "acell_dsn",
    "cell_dsn",
    "cell_node",
    "distribute_schema",
]


class CitusError(PgDurableError):
    """A Citus cell could not be found or set up."""


class NotCitus(CitusError):
    """The database has no ``citus`` extension (or this is not its coordinator)."""


class SchemaNotDistributed(CitusError, LookupError):
    """The schema is not a distributed schema (``citus_schema_distribute`` not run)."""


@dataclass(frozen=True)
class CellNode:
    """The node holding a distributed schema's shards (a row of ``pg_dist_node``)."""

    schema: str
    node_id: int
    group_id: int
    host: str
    port: int


# The node holding every placement of the schema's tables. Schema-based
# sharding colocates them (one colocation group per schema), so every row
# names the same node; two nodes means a move is half-way or the metadata is
# not what this module expects, and is reported rather than guessed.
_NODE_SQL = """
SELECT DISTINCT n.nodeid, n.groupid, n.nodename, n.nodeport
  FROM pg_catalog.pg_dist_schema s
  JOIN pg_catalog.pg_dist_partition p ON p.colocationid = s.colocationid
  JOIN pg_catalog.pg_dist_shard sh ON sh.logicalrelid = p.logicalrelid
  JOIN pg_catalog.pg_dist_placement pl ON pl.shardid = sh.shardid
  JOIN pg_catalog.pg_dist_node n ON n.groupid = pl.groupid
 WHERE s.schemaid = pg_catalog.to_regnamespace(%s)
   AND n.noderole = 'primary' AND n.isactive
 ORDER BY n.nodeid
"""

_HAS_CITUS_SQL = "SELECT to_regclass('pg_catalog.pg_dist_schema') IS NOT NULL"


def _node_from_rows(schema: str, has_citus: bool, rows: list[tuple[int, int, str, int]]) -> CellNode:
    if not has_citus:
        raise NotCitus("the database has no citus extension (pg_dist_schema is missing): "
                       "connect to the Citus coordinator's database")
    if not rows:
        raise SchemaNotDistributed(
            f"schema {schema!r} is not a distributed schema with tables (run "
            f"SELECT citus_schema_distribute('{schema}') on the coordinator after migrating)")
    if len(rows) > 1:
        where = ", ".join(f"{h}:{p}" for _, _, h, p in rows)
        raise CitusError(f"schema {schema!r} has placements on several nodes ({where}): "
                         "a shard move in progress? try again")
    node_id, group_id, host, port = rows[0]
    return CellNode(schema=schema, node_id=int(node_id), group_id=int(group_id), host=str(host),
                    port=int(port))


def cell_node(conn: psycopg.Connection[object], schema: str = "pgdurable") -> CellNode:
    """The node holding ``schema``, read on ``conn`` (the coordinator, or any node with metadata)."""
    has = conn.execute(_HAS_CITUS_SQL).fetchone()
    has_citus = bool(has and has[0])
    rows = [tuple(r) for r in conn.execute(_NODE_SQL, (schema,)).fetchall()] if has_citus else []
    return _node_from_rows(schema, has_citus, rows)  # type: ignore[arg-type]


def _replace_host(dsn: str, node: CellNode) -> str:
    params = conninfo_to_dict(dsn)
    params.pop("hostaddr", None)
    params["host"] = node.host
    params["port"] = str(node.port)
    # a multi-host DSN's read-write choice means nothing for one node
    params.pop("target_session_attrs", None)
    params.pop("load_balance_hosts", None)
    return make_conninfo(**params)


def cell_dsn(coordinator_dsn: str, schema: str = "pgdurable") -> str:
    """The DSN of the node holding ``schema`` (see the module docstring).

    Same database, user and options as ``coordinator_dsn``; that node's host
    and port. Re-call it after a shard move. Raises :class:`NotCitus`,
    :class:`SchemaNotDistributed` or :class:`CitusError`."""
    with psycopg.connect(coordinator_dsn, autocommit=True) as conn:
        node = cell_node(conn, schema)  # type: ignore[arg-type]
    return _replace_host(coordinator_dsn, node)


async def acell_dsn(coordinator_dsn: str, schema: str = "pgdurable") -> str:
    """:func:`cell_dsn`, async."""
    async with await psycopg.AsyncConnection.connect(coordinator_dsn, autocommit=True) as conn:
        cur = await conn.execute(_HAS_CITUS_SQL)
        has = await cur.fetchone()
        has_citus = bool(has and has[0])
        rows: list[tuple[int, int, str, int]] = []
        if has_citus:
            cur = await conn.execute(_NODE_SQL, (schema,))
            rows = [(int(a), int(b), str(c), int(d)) for a, b, c, d in await cur.fetchall()]
    return _replace_host(coordinator_dsn, _node_from_rows(schema, has_citus, rows))


def distribute_schema(coordinator_dsn: str, schema: str = "pgdurable") -> CellNode:
    """Distribute the migrated ``schema`` (idempotent); returns the node holding it.

    Run it on the coordinator after ``pgdurable migrate`` (there, with the
    tables local). Sets ``citus.enable_unsafe_triggers`` for the database on
    the coordinator and every worker (the engine's tables have triggers, which
    Citus refuses to distribute without it, and later migrations create
    triggers through the coordinator)."""
    with psycopg.connect(coordinator_dsn, autocommit=True) as conn:
        has = conn.execute(_HAS_CITUS_SQL).fetchone()
        if not (has and has[0]):
            raise NotCitus("the database has no citus extension: CREATE EXTENSION citus first")
        dbname = conn.info.dbname
        setting = sql.SQL("ALTER DATABASE {} SET citus.enable_unsafe_triggers = on").format(
            sql.Identifier(dbname))
        conn.execute(setting)
        conn.execute("SELECT run_command_on_workers(%s)", (setting.as_string(conn),))
        conn.execute("SET citus.enable_unsafe_triggers = on")
        done = conn.execute("SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_schema "
                            "WHERE schemaid = pg_catalog.to_regnamespace(%s))",
                            (schema,)).fetchone()
        if not (done and done[0]):
            if conn.execute("SELECT pg_catalog.to_regnamespace(%s)", (schema,)).fetchone() == (None,):
                raise SchemaNotDistributed(f"schema {schema!r} does not exist: migrate first")
            conn.execute("SELECT citus_schema_distribute(%s)", (schema,))
        return cell_node(conn, schema)  # type: ignore[arg-type]
