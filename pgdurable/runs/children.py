"""Child runs: fan-out from a step, fan-in by waiting on the children, the run tree.

A step starts children with ``await ctx.start_child(task, state, key=...)`` and
waits for them by returning ``Wait.children(ids)`` (all of them),
``Wait.children(ids, any=True)`` (the first) or ``Wait.children(ids,
at_least=n)``, optionally with ``timeout=``. The next step finds their outcomes
in ``ctx.wake["children"]``: ``{id: {"status", "result", "error"}}``.

Guarantees (``sql/0010_children.sql``, each one tested):

* **Exactly once per (parent, key)**: ``pgdurable.start_child`` is fenced by the
  parent's lease token and keyed by ``(parent, key)``: a retried or replayed
  step gets the same child back; a stale attempt (its lease lost) starts none.
* **Fan-in without polling**: a child's terminal transition counts down its
  parent's wait in the same transaction; the child that completes the wait
  makes the parent runnable. 1,000 children wake the parent once.
* **A child's failure is reported, not propagated**: the parent sees
  ``status: "failed"`` and its error, and decides.
* **The tree**: ``parent_run_id``/``root_run_id`` on every child; a parent that
  ends (completed, failed or cancelled) while children are live applies each
  child's ``policy``: ``"cancel"`` (default; recursively) or ``"abandon"``. A
  child's deadline is capped by its parent's. ``pgdurable.run_tree(id)`` in
  SQL, :func:`run_tree` here, ``pgdurable run ID --tree`` on the command line.

Function-level API, for any programming model (step functions use it through
:meth:`~pgdurable.RunContext.start_child`; a workflow context can wrap the same
calls): :func:`start_child` (needs the parent's run id and current lease token),
:func:`child_params` (the validated parameters, for a caller's own
connection), :func:`check_children` (are these ids children of the run?),
:func:`park_children` (the fenced park, used by the worker) and
:func:`run_tree`.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Literal

from ..foundation import run_queries as q
from ..foundation.db import translated
from ..foundation.errors import InvalidInput, RunNotFound
from ..foundation.queries import children as cq
from ..foundation.queries.affinity import AFFINE_STARTED
from ..foundation.queries.children import Parked, TreeNode
from ..foundation.queries.core import many, one
from ..foundation.registry import start_params

if TYPE_CHECKING:
    from collections.abc import Sequence

    import psycopg

    from ..foundation.ports import App, Database
    from ..foundation.registry import TaskRegistry

__all__ = [
    "POLICIES",
    "ChildPolicy",
    "Parked",
    "TreeNode",
    "check_children",
    "child_params",
    "need_of",
    "park_children",
    "run_tree",
    "start_child",
]

ChildPolicy = Literal["cancel", "abandon"]
#: What happens to a live child when its parent ends first.
POLICIES: tuple[str, ...] = ("cancel", "abandon")

#: The SQL of the run tree, for the sync client until its twin is generated (issue 39).
RUN_TREE = cq.RUN_TREE.sql


def child_params(
    registry: TaskRegistry,
    parent_run_id: object,
    token: int,
    task: object,
    state: object = None,
    *,
    key: object,
    queue: object = "default",
    priority: object = 0,
    deadline: object = None,
    budget: object = None,
    revision: str | None = None,
    max_attempts: int | None = None,
    policy: object = "cancel",
) -> tuple[Any, ...]:
    """Validate a child start (before any SQL) and return the parameters of
    :data:`~pgdurable.foundation.queries.children.START_CHILD`.

    The task must be registered (:class:`~pgdurable.UnknownTask`) unless
    ``revision=`` is given; ``key`` is a non-empty name; ``policy`` is
    ``"cancel"`` or ``"abandon"``. Other arguments as in
    :meth:`pgdurable.Durable.start`. TypeError/ValueError for bad input.
    """
    rid = q.check_run_id(parent_run_id)
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError("token must be the parent's lease token (an int)")
    q.check_name(key, "child key")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
    p = start_params(registry, task, state, queue, priority, None, deadline, budget, revision,
                     max_attempts)
    # start_params: (task, revision, state, queue, priority, max_attempts,
    #                idempotency_key, deadline_in, deadline_at, budget)
    return (rid, token, key, p[0], p[1], p[2], p[3], p[4], p[5], p[7], p[8], p[9], policy)


async def start_child(
    app: App,
    parent_run_id: object,
    token: int,
    task: str,
    state: Any = None,
    *,
    key: str,
    queue: str = "default",
    priority: int = 0,
    deadline: Any = None,
    budget: float | None = None,
    revision: str | None = None,
    max_attempts: int | None = None,
    policy: ChildPolicy = "cancel",
    conn: psycopg.AsyncConnection[Any] | None = None,
    affinity_of: object = None,
) -> str:
    """Start the child ``key`` of run ``parent_run_id`` (once) and return its id.

    Fenced by ``token`` (the parent's current lease token): raises
    :class:`~pgdurable.LeaseLost` if the parent's claim is no longer current,
    and nothing is started. The same ``(parent, key)`` always returns the same
    child (whatever attempt asks, whatever state it passes); the same key with
    another task raises :class:`~pgdurable.InvalidInput`. Nothing is written
    for bad input or an unknown task (:class:`~pgdurable.UnknownTask`).
    ``affinity_of`` (a run id): a child created now gets that run's affinity
    (:mod:`pgdurable.foundation.affinity`), in the same statement.
    """
    params = child_params(
        app._registry, parent_run_id, token, task, state, key=key, queue=queue,
        priority=priority, deadline=deadline, budget=budget, revision=revision,
        max_attempts=max_attempts, policy=policy,
    )
    sql = cq.START_CHILD.sql
    if affinity_of is not None:  # same answer (run id, created): decoded as START_CHILD
        sql, params = AFFINE_STARTED.format(start=sql), (*params, q.check_run_id(affinity_of))
    if conn is not None:
        with translated():
            cur = await conn.execute(sql, params)
            row = await cur.fetchone()
    else:
        row = await app.fetchone(sql, params)
    return cq.START_CHILD.one(row).run_id


def _ids(ids: object) -> list[uuid.UUID]:
    if isinstance(ids, str | bytes) or not hasattr(ids, "__iter__"):
        raise TypeError("ids must be a list of run ids")
    out = [q.check_run_id(i) for i in ids]
    if not out:
        raise ValueError("ids must not be empty")
    if len(set(out)) != len(out):
        raise ValueError("ids must be distinct")
    return out


def need_of(ids: Sequence[object], any: bool = False, at_least: int | None = None) -> int:
    """How many of ``ids`` must finish: all, 1 (``any``) or ``at_least``; ValueError otherwise."""
    n = len(ids)
    if any and at_least is not None:
        raise ValueError("pass any=True or at_least=n, not both")
    if at_least is None:
        return 1 if any else n
    if isinstance(at_least, bool) or not isinstance(at_least, int):
        raise TypeError("at_least must be an int")
    if not 1 <= at_least <= n:
        raise ValueError(f"at_least must be between 1 and {n} (the number of ids), not {at_least}")
    return at_least


async def check_children(app: App, run_id: object, ids: Sequence[object]) -> list[str]:
    """``ids`` as strings if every one is a child of ``run_id``; else ``InvalidInput``
    (a ``ValueError``) naming the first that is not (the run itself included)."""
    rid = q.check_run_id(run_id)
    wanted = _ids(ids)
    if rid in wanted:
        raise InvalidInput(f"run {rid} cannot wait on itself")
    found = set(await many(app, cq.CHILDREN_OF, (rid, wanted)))
    for i in wanted:
        if i not in found:
            raise InvalidInput(f"run {i} is not a child of run {rid}")
    return [str(i) for i in wanted]


async def park_children(
    app: Database,
    ident: tuple[Any, ...],
    state_json: str,
    spend: float,
    ids: Sequence[str],
    need: int,
    wake_in: Any,
) -> Parked:
    """The fenced park on children (``ident`` = (run id, token, owner)):
    :class:`Parked` (status, wake time, seconds until it). Bad ids: InvalidInput, nothing
    changed."""
    return await one(app, cq.PARK_CHILDREN,
                     (*ident, state_json, spend, [uuid.UUID(i) for i in ids], need, wake_in))


def parse_tree(rows: list[tuple[Any, ...]]) -> list[TreeNode]:
    """Rows of :data:`RUN_TREE` as :class:`TreeNode` objects (for the sync client)."""
    return cq.RUN_TREE.all(rows)


async def run_tree(app: App, run_id: object) -> list[TreeNode]:
    """The run and all its descendants, in tree order (:class:`~pgdurable.RunNotFound` if none)."""
    rid = q.check_run_id(run_id)
    nodes = await many(app, cq.RUN_TREE, (rid,))
    if not nodes:
        raise RunNotFound(f"no run {rid}")
    return nodes
