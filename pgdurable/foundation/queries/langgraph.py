"""The LangGraph checkpoint saver (``sql/functions/langgraph.sql``;
:mod:`pgdurable.contrib.langgraph`): one statement per operation. Rows are decoded
into records here; turning a record into LangGraph's ``CheckpointTuple`` (its
serializer) is the saver's (``contrib/langgraph/_sql.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .core import Query, Row, record, statement

__all__ = ["COPY_THREAD", "DELETE_FOR_RUNS", "DELETE_THREADS", "GET", "LIST",
           "PRUNE_KEEP_LATEST", "PUT", "PUT_WRITES", "SET_RETENTION", "ListedCheckpoint",
           "StoredCheckpoint"]


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint as stored: its id and parent's, its serialized form (``type``,
    ``blob``), its metadata, and its pending writes as parallel arrays (NULL: none)."""

    checkpoint_id: str
    parent_id: str | None
    type: str
    blob: bytes
    metadata: Any
    tasks: list[str] | None
    channels: list[str] | None
    types: list[str] | None
    values: list[bytes] | None


@dataclass(frozen=True, slots=True)
class ListedCheckpoint:
    """A checkpoint of a listing, with the thread and namespace it belongs to."""

    thread_id: str
    ns: str
    checkpoint: StoredCheckpoint


def _listed(r: Row) -> ListedCheckpoint:
    return ListedCheckpoint(r[0], r[1], StoredCheckpoint(*r[2:]))


# -- save one checkpoint, fenced by (lease key, owner, token) when given
PUT = statement("SELECT pgdurable.lg_put(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")
# -- save a task's pending writes, fenced like PUT
PUT_WRITES = statement(
    "SELECT pgdurable.lg_put_writes(%s, %s, %s, %s, %s, %s::integer[], %s::text[], "
    "%s::text[], %s::bytea[], %s, %s, %s)"
)
# -- one checkpoint (newest of the namespace when the id is NULL) with its writes; one
# -- StoredCheckpoint, no row when there is none
GET = record("SELECT * FROM pgdurable.lg_get(%s, %s, %s)", StoredCheckpoint)
# -- checkpoints matching (thread, ns, id, before, metadata filter, limit), newest first;
# -- one ListedCheckpoint per row
LIST = Query("SELECT * FROM pgdurable.lg_list(%s, %s, %s, %s, %s::jsonb, %s)", _listed)
# -- delete threads / runs, copy a thread, keep only the newest per namespace
DELETE_THREADS = statement("SELECT pgdurable.lg_delete_threads(%s::text[])")
DELETE_FOR_RUNS = statement("SELECT pgdurable.lg_delete_for_runs(%s::text[])")
COPY_THREAD = statement("SELECT pgdurable.lg_copy_thread(%s, %s)")
PRUNE_KEEP_LATEST = statement("SELECT pgdurable.lg_prune_keep_latest(%s::text[])")
# -- set the retention policy applied by every `pgdurable prune` batch
SET_RETENTION = statement("SELECT pgdurable.lg_set_retention(%s::integer, %s::interval)")
