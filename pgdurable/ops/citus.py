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
* :func:`migrate_cell`: ``pgdurable migrate`` through the coordinator of a
  distributed schema. Citus forwards some DDL (triggers on a distributed
  table) to the worker node with the whole query string it was given, over
  the extended protocol, which refuses several commands: a definitions file
  sent whole fails ("cannot insert multiple commands into a prepared
  statement"). The migration runs on a connection whose cursor sends a
  parameterless multi-statement text one statement at a time
  (:class:`StatementCursor`, :func:`split_statements`), in the same
  transaction. The first migration of a fresh database is the same as on a
  plain server (the tables are local until :func:`distribute_schema`).
* :func:`distribute_schema`: after ``pgdurable migrate`` on the coordinator,
  distribute the migrated schema (idempotent: a distributed schema is left as
  it is) and let its tables keep their triggers (``citus.enable_unsafe_triggers``
  for the database on every node: the engine's triggers only touch rows of the
  same colocated schema, on the same node, which is what makes them safe here);
  distribute the functions Citus did not copy with the schema (those taking a
  table's row type, created while the table was local); and set
  ``pgdurable.cell = on`` for the database on every node.

``pgdurable.cell = on`` selects, in the hot path's SQL, the forms Citus plans
well: ``write_steps`` and ``claim_runs`` then run ``_write_steps_cell`` and
``_claim_cell`` (statements on one table each, which Citus plans on its fast
path, and no non-IMMUTABLE call inside the CASE/COALESCE of an UPDATE); on one
server (the setting unset) they run their one-statement forms, unchanged.

What works where (tests/test_citus.py, tests/test_citus_workflows_crash.py):
the engine's functions, the fleet, ``result()`` and the examples with every
connection on the cell's node; ``pgdurable migrate`` (:func:`migrate_cell`)
through the coordinator; partition maintenance and retention given the cell's
node go through the coordinator by themselves ("cannot create tables in a
distributed schema from a worker node" there), and a running fleet follows a
shard move by itself (both :mod:`pgdurable.foundation.cells`). A NOTIFY sent by a trigger is sent on the node where the
trigger ran (the cell's node): listeners connected to the coordinator do not
hear it.

From psql on the coordinator, what :func:`distribute_schema` does::

    ALTER DATABASE app SET citus.enable_unsafe_triggers = on;  -- and on each worker
    ALTER DATABASE app SET pgdurable.cell = on;                -- and on each worker
    SET citus.enable_unsafe_triggers = on;
    SELECT citus_schema_distribute('pgdurable');
    SELECT create_distributed_function(f) ...  -- each pgdurable function not in pg_dist_object
    SELECT * FROM citus_schemas;          -- where it went: citus_shards.nodename/nodeport
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..foundation.cells import replace_host
from ..foundation.errors import PgDurableError
from ..foundation.migrations import migrate
from ..foundation.queries import citus as cq
from ..foundation.queries.core import first_sync, many, many_sync, one, one_sync
from ..foundation.schemas import cursor_in_schema, resolve_schema

__all__ = [
    "CellNode",
    "CitusError",
    "NotCitus",
    "SchemaNotDistributed",
    "acell_dsn",
    "cell_dsn",
    "cell_node",
    "StatementCursor",
    "distribute_schema",
    "migrate_cell",
    "split_statements",
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


def _node_from_rows(schema: str, has_citus: bool, rows: list[cq.NodeRow]) -> CellNode:
    if not has_citus:
        raise NotCitus("the database has no citus extension (pg_dist_schema is missing): "
                       "connect to the Citus coordinator's database")
    if not rows:
        raise SchemaNotDistributed(
            f"schema {schema!r} is not a distributed schema with tables (run "
            f"SELECT citus_schema_distribute('{schema}') on the coordinator after migrating)")
    if len(rows) > 1:
        where = ", ".join(f"{r.host}:{r.port}" for r in rows)
        raise CitusError(f"schema {schema!r} has placements on several nodes ({where}): "
                         "a shard move in progress? try again")
    row = rows[0]
    return CellNode(schema=schema, node_id=int(row.node_id), group_id=int(row.group_id),
                    host=str(row.host), port=int(row.port))


def cell_node(conn: psycopg.Connection[Any], schema: str = "pgdurable") -> CellNode:
    """The node holding ``schema``, read on ``conn`` (the coordinator, or any node with metadata)."""
    has_citus = one_sync(conn, cq.HAS_CITUS)
    rows = many_sync(conn, cq.NODE, (schema,)) if has_citus else []
    return _node_from_rows(schema, has_citus, rows)


def _replace_host(dsn: str, node: CellNode) -> str:
    return replace_host(dsn, node.host, node.port)


def cell_dsn(coordinator_dsn: str, schema: str = "pgdurable") -> str:
    """The DSN of the node holding ``schema`` (see the module docstring).

    Same database, user and options as ``coordinator_dsn``; that node's host
    and port. Re-call it after a shard move. Raises :class:`NotCitus`,
    :class:`SchemaNotDistributed` or :class:`CitusError`."""
    with psycopg.connect(coordinator_dsn, autocommit=True) as conn:
        node = cell_node(conn, schema)
    return _replace_host(coordinator_dsn, node)


async def acell_dsn(coordinator_dsn: str, schema: str = "pgdurable") -> str:
    """:func:`cell_dsn`, async."""
    async with await psycopg.AsyncConnection.connect(coordinator_dsn, autocommit=True) as conn:
        has_citus = await one(conn, cq.HAS_CITUS)
        rows = await many(conn, cq.NODE, (schema,)) if has_citus else []
    return _replace_host(coordinator_dsn, _node_from_rows(schema, has_citus, rows))


def distribute_schema(coordinator_dsn: str, schema: str = "pgdurable") -> CellNode:
    """Distribute the migrated ``schema`` (idempotent); returns the node holding it.

    Run it on the coordinator after ``pgdurable migrate`` (there, with the
    tables local). Sets ``citus.enable_unsafe_triggers`` for the database on
    the coordinator and every worker (the engine's tables have triggers, which
    Citus refuses to distribute without it, and later migrations create
    triggers through the coordinator), distributes the schema's functions
    Citus has not, and sets ``pgdurable.cell = on`` (module docstring)."""
    with psycopg.connect(coordinator_dsn, autocommit=True) as conn:
        if not one_sync(conn, cq.HAS_CITUS):
            raise NotCitus("the database has no citus extension: CREATE EXTENSION citus first")
        dbname = conn.info.dbname
        setting = sql.SQL("ALTER DATABASE {} SET citus.enable_unsafe_triggers = on").format(
            sql.Identifier(dbname))
        conn.execute(setting)
        first_sync(conn, cq.ON_WORKERS, (setting.as_string(conn),))
        conn.execute(cq.UNSAFE_TRIGGERS)
        if not one_sync(conn, cq.DISTRIBUTED, (schema,)):
            if not one_sync(conn, cq.SCHEMA_EXISTS, (schema,)):
                raise SchemaNotDistributed(f"schema {schema!r} does not exist: migrate first")
            first_sync(conn, cq.DISTRIBUTE_SCHEMA, (schema,))
        # functions whose signature names a table's row type were created
        # while the table was local and are not propagated with the schema:
        # distribute every function of the schema that is not yet
        for sig in many_sync(conn, cq.UNDISTRIBUTED, (schema,)):
            first_sync(conn, cq.DISTRIBUTE_FUNCTION, (sig,))
        # the engine's functions take the forms a cell needs (write_steps)
        cell = sql.SQL("ALTER DATABASE {} SET pgdurable.cell = on").format(
            sql.Identifier(dbname))
        conn.execute(cell)
        first_sync(conn, cq.ON_WORKERS, (cell.as_string(conn),))
        return cell_node(conn, schema)


# A token of SQL text that may hold a ';' that does not end a statement.
_TOKEN = re.compile(
    r"""--[^\n]*"""                      # line comment
    r"""|/\*.*?\*/"""                   # block comment (not nested: none in our files)
    r"""|[Ee]'(?:[^'\\]|\\.|'')*'"""  # E'...' with backslash escapes
    r"""|'(?:[^']|'')*'"""             # '...'
    r'|"(?:[^"]|"")*"'                 # "identifier"
    r"""|\$([A-Za-z_][A-Za-z_0-9]*)?\$"""  # a dollar-quote opening tag
    r"""|;""",
    re.S)


def split_statements(text: str) -> list[str]:
    """``text`` cut into its statements (comments, strings and dollar quotes respected).

    Statements holding only comments or blanks are dropped."""
    out: list[str] = []
    start = pos = 0
    while True:
        m = _TOKEN.search(text, pos)
        if m is None:
            break
        tok = m.group(0)
        if tok == ";":
            out.append(text[start:m.end()])
            start = pos = m.end()
        elif tok.startswith("$"):
            end = text.find(tok, m.end())
            if end < 0:
                raise ValueError(f"unterminated dollar quote {tok} at offset {m.start()}")
            pos = end + len(tok)
        else:
            pos = m.end()
    out.append(text[start:])
    return [st for st in out if _has_code(st)]


def _has_code(statement: str) -> bool:
    rest = re.sub(r"--[^\n]*|/\*.*?\*/", "", statement, flags=re.S)
    return rest.strip(" \t\r\n;") != ""


class StatementCursor(psycopg.Cursor[Any]):
    """A cursor that sends a parameterless text of several statements one by one."""

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                binary: bool | None = None) -> StatementCursor:
        if params is None and isinstance(query, (bytes, str)):
            text = query.decode() if isinstance(query, bytes) else query
            parts = split_statements(text)
            if len(parts) > 1:
                for part in parts:
                    super().execute(part.encode(), prepare=prepare, binary=binary)
                return self
        super().execute(query, params, prepare=prepare, binary=binary)
        return self


def migrate_cell(coordinator_dsn: str, schema: str | None = None, **options: Any) -> list[Any]:
    """``pgdurable migrate`` of ``schema`` (else ``PGDURABLE_SCHEMA``, else ``pgdurable``)
    on the coordinator, a statement at a time (module docstring).

    ``options`` are :func:`pgdurable.foundation.migrations.migrate`'s.
    Returns the migrations it applied."""
    in_schema = resolve_schema(schema)
    # a statement at a time, each for the schema
    cursor = cursor_in_schema(StatementCursor, in_schema)
    with psycopg.connect(coordinator_dsn, cursor_factory=cursor) as conn:
        # the engine's tables keep their triggers (see distribute_schema)
        if one_sync(conn, cq.HAS_CITUS):
            conn.execute(cq.UNSAFE_TRIGGERS)
        conn.commit()
        return migrate(conn, schema=in_schema, **options)
