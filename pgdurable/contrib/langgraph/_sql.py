"""The LangGraph saver's parameters and the conversion of its stored checkpoints into
LangGraph's ``CheckpointTuple`` (the statements and their rows:
:mod:`pgdurable.foundation.queries.langgraph`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg.types.json import Jsonb

from ...foundation.queries.langgraph import StoredCheckpoint

Fence = tuple[bytes, bytes, int]


def put_params(serde: SerializerProtocol, config: RunnableConfig, checkpoint: Checkpoint,
               metadata: CheckpointMetadata, fence: Fence | None) -> tuple[Any, ...]:
    conf = config["configurable"]
    type_, blob = serde.dumps_typed(checkpoint)
    meta = get_serializable_checkpoint_metadata(config, metadata)
    key, owner, token = fence if fence is not None else (None, None, None)
    return (str(conf["thread_id"]), conf.get("checkpoint_ns", ""), checkpoint["id"],
            conf.get("checkpoint_id"), type_, blob, Jsonb(meta), key, owner, token)


def next_config(config: RunnableConfig, checkpoint: Checkpoint) -> RunnableConfig:
    conf = config["configurable"]
    return {"configurable": {"thread_id": conf["thread_id"],
                             "checkpoint_ns": conf.get("checkpoint_ns", ""),
                             "checkpoint_id": checkpoint["id"]}}


def writes_params(serde: SerializerProtocol, config: RunnableConfig,
                  writes: Sequence[tuple[str, Any]], task_id: str, task_path: str,
                  fence: Fence | None) -> tuple[Any, ...]:
    conf = config["configurable"]
    idx: list[int] = []
    channels: list[str] = []
    types: list[str] = []
    values: list[bytes] = []
    for i, (channel, value) in enumerate(writes):
        type_, blob = serde.dumps_typed(value)
        idx.append(WRITES_IDX_MAP.get(channel, i))
        channels.append(channel)
        types.append(type_)
        values.append(blob)
    key, owner, token = fence if fence is not None else (None, None, None)
    return (str(conf["thread_id"]), conf.get("checkpoint_ns", ""), conf["checkpoint_id"],
            task_id, task_path, idx, channels, types, values, key, owner, token)


def get_params(config: RunnableConfig) -> tuple[Any, ...]:
    conf = config["configurable"]
    return (str(conf["thread_id"]), conf.get("checkpoint_ns", ""), get_checkpoint_id(config))


def list_params(config: RunnableConfig | None, filter: dict[str, Any] | None,
                before: RunnableConfig | None, limit: int | None) -> tuple[Any, ...]:
    conf = config["configurable"] if config else {}
    thread = conf.get("thread_id")
    return (None if thread is None else str(thread), conf.get("checkpoint_ns"),
            get_checkpoint_id(config) if config else None,
            get_checkpoint_id(before) if before else None,
            Jsonb(filter) if filter else None, limit)


def to_tuple(serde: SerializerProtocol, thread_id: str, ns: str,
             stored: StoredCheckpoint) -> CheckpointTuple:
    """A stored checkpoint of ``thread_id``/``ns`` as LangGraph's CheckpointTuple."""
    cid, parent = stored.checkpoint_id, stored.parent_id
    checkpoint: Checkpoint = serde.loads_typed((stored.type, bytes(stored.blob)))
    writes = [] if stored.tasks is None else [
        (t, c, serde.loads_typed((ty, bytes(v))))
        for t, c, ty, v in zip(stored.tasks, stored.channels or (), stored.types or (),
                               stored.values or (), strict=True)
    ]
    return CheckpointTuple(
        config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                 "checkpoint_id": cid}},
        checkpoint=checkpoint,
        metadata=stored.metadata,
        parent_config=(
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                              "checkpoint_id": parent}}
            if parent else None
        ),
        pending_writes=writes,
    )


def check_thread_ids(thread_ids: Sequence[str]) -> list[str]:
    if isinstance(thread_ids, str | bytes):
        raise TypeError("thread_ids must be a sequence of thread ids, not a str")
    return [str(t) for t in thread_ids]


def check_strategy(strategy: str) -> None:
    if strategy not in ("keep_latest", "delete"):
        raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
