"""History partitions (``sql/functions/history_partitions.sql``): create the daily ones
ahead, drop old ones, move consumed signals into ``signal_history``, and the maintenance
leader's lease (:mod:`pgdurable.ops.partitions`)."""

from __future__ import annotations

from dataclasses import dataclass

from .core import Query, Row, scalar

__all__ = ["CREATE", "DROP", "LEAD", "MOVE_SIGNALS", "DroppedPartition"]


@dataclass(frozen=True)
class DroppedPartition:
    """One dropped partition: its table, its name and what happened to its rows."""

    history_table: str
    partition_name: str
    rows_dropped: int
    rows_kept: int


def _dropped(r: Row) -> DroppedPartition:
    table, name, dropped, kept = r
    return DroppedPartition(str(table), str(name), int(dropped), int(kept))


# -- create the missing daily partitions from today to today + n days; how many
# -- params: (days_ahead)
CREATE = scalar("SELECT pgdurable.create_history_partitions(%s::integer, 0)", int)
# -- drop daily partitions older than the cut-off (keeping rows of runs retention keeps);
# -- one DroppedPartition per partition
# -- params: (older_than)
DROP = Query(
    "SELECT history_table, partition_name, rows_dropped, rows_kept "
    "FROM pgdurable.drop_history_partitions(%s::interval)", _dropped)
# -- move one batch of signals consumed over an hour ago into signal_history; how many
# -- params: (min_age, batch)
MOVE_SIGNALS = scalar("SELECT pgdurable.move_consumed_signals(%s::interval, %s::integer)", int)
# -- take (or keep) the maintenance lease: true when this owner is the leader
# -- params: (key, owner, ttl_ms)
LEAD = scalar("SELECT acquired FROM pgdurable.acquire_lease(%s::text, %s::text, %s::bigint)",
              bool)
