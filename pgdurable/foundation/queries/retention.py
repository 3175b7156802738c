"""Retention (``sql/functions/retention.sql``): prune finished runs in batches, drop whole
history partitions first, and preview what a prune would delete
(:mod:`pgdurable.ops.retention`)."""

from __future__ import annotations

from dataclasses import dataclass

from .core import Query, Row

__all__ = ["DROP_PARTITIONS", "PREVIEW", "PRUNE", "DroppedPartitions", "PruneCounts",
           "PrunedBatch"]


@dataclass(frozen=True, slots=True)
class PrunedBatch:
    """What one batch deleted; ``locked``: it held the pruner lock (an exclusive batch
    that found it taken deleted nothing)."""

    runs: int
    checkpoints: int
    effects: int
    events: int
    signals: int
    locked: bool
    messages: int
    pubsub: int
    graph_checkpoints: int


@dataclass(frozen=True, slots=True)
class DroppedPartitions:
    """How many history partitions were dropped, and the rows they held."""

    partitions: int
    checkpoints: int
    events: int
    signals: int


@dataclass(frozen=True, slots=True)
class PruneCounts:
    """What a prune would delete (a dry run)."""

    runs: int
    checkpoints: int
    effects: int
    events: int
    signals: int
    messages: int
    pubsub: int
    graph_checkpoints: int


def _batch(r: Row) -> PrunedBatch:
    runs, checkpoints, effects, events, signals, locked, messages, pubsub, graphs = r
    return PrunedBatch(int(runs), int(checkpoints), int(effects), int(events), int(signals),
                       bool(locked), int(messages), int(pubsub), int(graphs))


def _dropped(r: Row) -> DroppedPartitions:
    partitions, checkpoints, events, signals = r
    return DroppedPartitions(int(partitions), int(checkpoints), int(events), int(signals))


def _counts(r: Row) -> PruneCounts:
    return PruneCounts(*(int(v) for v in r))


# -- one batch, one transaction: delete up to n old terminal runs and their
# -- history, then (unless an exclusive batch found the pruner lock taken) up to n
# -- consumed thread messages older than the cut-off and up to n rows of pubsub
# -- topics idle that long; one PrunedBatch
# -- params: (older_than, batch, older_than, batch, batch, older_than, batch, exclusive)
PRUNE = Query(
    "SELECT p.runs, p.checkpoints, p.effects, p.events, p.signals, p.locked, "
    "CASE WHEN p.locked THEN pgdurable.prune_thread_messages(%s::interval, %s::integer) "
    "ELSE 0 END, "
    "CASE WHEN p.locked THEN pgdurable.prune_pubsub(%s::interval, %s::integer) ELSE 0 END, "
    "CASE WHEN p.locked THEN pgdurable.prune_graph_checkpoints(%s::integer) ELSE 0 END "
    "FROM pgdurable.prune_runs(%s::interval, %s::integer, %s::boolean) p", _batch)
# -- retention by partition first: drop whole daily history partitions older than
# -- the cut-off; one DroppedPartitions (how many, and the checkpoint, event and signal
# -- rows they held)
# -- params: (older_than)
DROP_PARTITIONS = Query(
    "SELECT count(*), "
    "coalesce(sum(d.rows_dropped) FILTER (WHERE d.history_table = 'checkpoints'), 0), "
    "coalesce(sum(d.rows_dropped) FILTER (WHERE d.history_table = 'run_events'), 0), "
    "coalesce(sum(d.rows_dropped) FILTER (WHERE d.history_table = 'signal_history'), 0) "
    "FROM pgdurable.drop_history_partitions(%s::interval) d", _dropped)
# -- dry run: how many rows prune_runs, prune_thread_messages, prune_pubsub and
# -- prune_graph_checkpoints would delete in total; one PruneCounts
# -- params: (older_than,)
PREVIEW = Query(
    "SELECT p.runs, p.checkpoints, p.effects, p.events, p.signals, p.messages, p.pubsub, "
    "p.graph_checkpoints FROM pgdurable.prune_preview_all(%s::interval) p", _counts)
