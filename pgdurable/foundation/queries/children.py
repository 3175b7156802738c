"""Child runs (``sql/functions/children.sql``): start, park on, check and walk them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .core import Query, Row, column
from .signals import Parked, _parked
from .start import Started, started

__all__ = ["CHILDREN_OF", "PARK_CHILDREN", "RUN_TREE", "START_CHILD", "START_CHILDREN", "Parked",
           "Started", "TreeNode"]


@dataclass(frozen=True)
class TreeNode:
    """One run of a tree (:func:`~pgdurable.runs.children.run_tree`); ``depth`` 0 is the run
    asked for."""

    id: str
    parent_run_id: str | None
    depth: int
    child_key: str | None
    task: str
    status: str
    policy: str | None
    created_at: datetime
    finished_at: datetime | None
    error_type: str | None


def _tree_node(r: Row) -> TreeNode:
    return TreeNode(str(r[0]), None if r[1] is None else str(r[1]), int(r[2]), r[3], r[4], r[5],
                    r[6], r[7], r[8], r[9])


# -- fenced by the parent's token: start child (parent, key) once; returns (run_id, created)
START_CHILD = started(
    "SELECT run_id, created FROM pgdurable.start_child(%s::uuid, %s::bigint, %s::text, %s::text, "
    "%s::text, %s::jsonb, %s::text, %s::integer, %s::integer, %s::interval, %s::timestamptz, "
    "%s::numeric, %s::text)")
# -- fenced by the parent's token: start children (parent, key) once each, in one statement
# -- (parent, token, then one array per START_CHILD argument from the key on); one
# -- Started per key, in input order
START_CHILDREN = started(
    "SELECT run_id, created FROM pgdurable.start_children(%s::uuid, %s::bigint, %s::text[], "
    "%s::text[], %s::text[], %s::text[]::jsonb[], %s::text[], %s::integer[], %s::integer[], "
    "%s::interval[], %s::timestamptz[], %s::numeric[], %s::text[]) ORDER BY ord")
# -- fenced park on children; returns (status, wake_at, seconds until wake_at)
PARK_CHILDREN = Query(
    "SELECT status, wake_at, extract(epoch FROM wake_at - pgdurable.now())::float8 "
    "FROM pgdurable.park_children(%s::uuid, %s::bigint, %s::text, %s::jsonb, %s::numeric, "
    "%s::uuid[], %s::integer, %s::interval)", _parked)
# -- which of these ids are children of the run; one id (uuid) per row
CHILDREN_OF = column(
    "SELECT id FROM pgdurable.runs WHERE parent_run_id = %s::uuid AND id = ANY (%s::uuid[])"
)
# -- the run and its descendants in tree order; one TreeNode per row
RUN_TREE = Query(
    "SELECT id, parent_run_id, depth, child_key, task, status, parent_policy, created_at, "
    "finished_at, error_type FROM pgdurable.run_tree(%s::uuid)", _tree_node)

