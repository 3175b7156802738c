"""The durable task kit's store (``sql/functions/task_checkpoints.sql``;
:class:`~pgdurable.PostgresDurableStore` in :mod:`pgdurable.models.durable_tasks`)."""

from __future__ import annotations

from typing import Any

from .core import Query, column, scalar, statement

__all__ = ["LOAD", "LOCK", "NOW_MS", "SAVE", "UNLOCK"]

# -- block until this session holds the task id's advisory lock
LOCK = statement("SELECT pg_advisory_lock(pgdurable.task_lock_key(%s))")
# -- release it (true if it was held)
UNLOCK = scalar("SELECT pg_advisory_unlock(pgdurable.task_lock_key(%s))", bool)
# -- the stored record (a JSON object) or NULL
LOAD: Query[Any] = column("SELECT pgdurable.task_checkpoint_load(%s)")
# -- upsert the record
SAVE = statement("SELECT pgdurable.task_checkpoint_save(%s, %s::jsonb)")
# -- the database clock in epoch milliseconds
NOW_MS = scalar("SELECT (extract(epoch FROM pgdurable.now()) * 1000)::bigint", int)
