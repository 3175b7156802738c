"""Cells on Citus (:mod:`pgdurable.ops.citus`): where a distributed schema lives, and
the statements that distribute one. Citus' catalogs are read schema-qualified
(``pg_catalog.pg_dist_*``); nothing here names pgdurable's own schema."""

from __future__ import annotations

from dataclasses import dataclass

from .core import Query, column, nullable, record, scalar, statement

__all__ = ["COORDINATOR", "DISTRIBUTE_FUNCTION", "DISTRIBUTE_SCHEMA", "DISTRIBUTED", "HAS_CITUS",
           "IN_CELL", "LOCAL_GROUP", "NODE", "ON_WORKERS", "SCHEMA_EXISTS", "UNDISTRIBUTED",
           "NodeRow", "UNSAFE_TRIGGERS"]


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One row of :data:`NODE`: a node holding placements of the schema's tables."""

    node_id: int
    group_id: int
    host: str
    port: int


# -- is this a Citus database (its metadata catalog exists)? answers a bool
HAS_CITUS: Query[bool] = scalar(
    "SELECT pg_catalog.to_regclass('pg_catalog.pg_dist_schema') IS NOT NULL", bool)
# -- the nodes holding placements of (schema)'s tables: schema-based sharding colocates
# -- them (one colocation group per schema), so one row unless a move is half-way
NODE: Query[NodeRow] = record("""
SELECT DISTINCT n.nodeid, n.groupid, n.nodename, n.nodeport
  FROM pg_catalog.pg_dist_schema s
  JOIN pg_catalog.pg_dist_partition p ON p.colocationid = s.colocationid
  JOIN pg_catalog.pg_dist_shard sh ON sh.logicalrelid = p.logicalrelid
  JOIN pg_catalog.pg_dist_placement pl ON pl.shardid = sh.shardid
  JOIN pg_catalog.pg_dist_node n ON n.groupid = pl.groupid
 WHERE s.schemaid = pg_catalog.to_regnamespace(%s)
   AND n.noderole = 'primary' AND n.isactive
 ORDER BY n.nodeid""", NodeRow)
# -- is this session in a cell (pgdurable.cell = on, set by distribute_schema)? a bool
IN_CELL: Query[bool] = scalar(
    "SELECT coalesce(current_setting('pgdurable.cell', true), '') = 'on'", bool)
# -- the group of the node this session is on (0: the coordinator); NULL without Citus
LOCAL_GROUP: Query[int | None] = nullable(
    "SELECT (SELECT groupid FROM pg_catalog.pg_dist_local_group)", int)
# -- the coordinator (group 0), as the cluster's metadata names it
COORDINATOR: Query[NodeRow] = record("""
SELECT nodeid, groupid, nodename, nodeport FROM pg_catalog.pg_dist_node
 WHERE groupid = 0 AND noderole = 'primary' AND isactive
 ORDER BY nodeid LIMIT 1""", NodeRow)
# -- is (schema) a distributed schema? answers a bool
DISTRIBUTED: Query[bool] = scalar(
    "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_schema"
    " WHERE schemaid = pg_catalog.to_regnamespace(%s))", bool)
# -- does (schema) exist? answers a bool
SCHEMA_EXISTS: Query[bool] = scalar(
    "SELECT pg_catalog.to_regnamespace(%s) IS NOT NULL", bool)
# -- distribute (schema): every table of it to one worker node; answers nothing read
DISTRIBUTE_SCHEMA: Query[None] = statement("SELECT citus_schema_distribute(%s)")
# -- the functions of (schema) Citus does not know (pg_dist_object), qualified signatures
UNDISTRIBUTED: Query[str] = column("""
SELECT p.oid::regprocedure::text
  FROM pg_catalog.pg_proc p
 WHERE p.pronamespace = pg_catalog.to_regnamespace(%s) AND p.prokind IN ('f', 'p')
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_dist_object d
                    WHERE d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid)
 ORDER BY 1""")
# -- make (signature) a distributed function; answers nothing read
DISTRIBUTE_FUNCTION: Query[None] = statement("SELECT create_distributed_function(%s)")
# -- run (command text) on every worker node; answers nothing read
ON_WORKERS: Query[None] = statement("SELECT run_command_on_workers(%s)")
# -- let this session distribute (and later migrate) tables with triggers; answers nothing
UNSAFE_TRIGGERS = "SET citus.enable_unsafe_triggers = on"
