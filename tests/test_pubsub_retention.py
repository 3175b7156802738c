"""Retention of the pubsub tables (sql/0009 pubsub, used by clients/mastra):
``pgdurable.prune_pubsub`` and its place in :func:`pgdurable.ops.retention.prune_sync`."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgdurable.ops.retention import PruneResult, prune_sync

PUBLISH = "SELECT pgdurable.pubsub_publish(%s, %s::json[])"


def publish(conn: psycopg.Connection[Any], topic: str, n: int) -> None:
    events = [f'{{"id": "{topic}-{i}", "type": "t", "runId": "r\\u0000k", "data": {{"i": {i}}}}}'
              for i in range(n)]
    conn.execute(PUBLISH, (topic, events))


def age(conn: psycopg.Connection[Any], topic: str, by: str) -> None:
    conn.execute("UPDATE pgdurable.pubsub_topics SET updated_at = pgdurable.now() - %s::interval"
                 " WHERE topic = %s", (by, topic))


def topics(conn: psycopg.Connection[Any]) -> list[tuple[str, int]]:
    return conn.execute(
        "SELECT t.topic, (SELECT count(*) FROM pgdurable.pubsub_events e WHERE e.topic = t.topic)"
        "  FROM pgdurable.pubsub_topics t ORDER BY 1").fetchall()


def test_prune_deletes_abandoned_topics_in_batches_and_keeps_the_rest(
    conn: psycopg.Connection[Any],
) -> None:
    publish(conn, "abandoned-1", 5)
    publish(conn, "abandoned-2", 2)
    publish(conn, "young", 3)
    age(conn, "abandoned-1", "8 days")
    age(conn, "abandoned-2", "7 days 1 second")  # boundary pair with 'young' below
    age(conn, "young", "6 days 23 hours")
    preview = prune_sync(conn, "7d", dry_run=True)
    assert preview == PruneResult(dry_run=True, pubsub=9)  # 7 events + 2 topics
    result = prune_sync(conn, "7d", batch=3)
    assert result.pubsub == 9 and result.rows == 9 and result.batches >= 3
    assert topics(conn) == [("young", 3)]
    assert prune_sync(conn, "7d") == PruneResult(batches=1)


def test_clear_keeps_the_offset_counter_and_prune_checks_its_arguments(
    conn: psycopg.Connection[Any],
) -> None:
    publish(conn, "run-1", 3)
    assert conn.execute("SELECT pgdurable.pubsub_clear('run-1')").fetchone() == (3,)
    publish(conn, "run-1", 1)
    assert conn.execute("SELECT \"offset\" FROM pgdurable.pubsub_read('run-1', -1, 10)").fetchall() == [(3,)]
    for sql, params in (("SELECT pgdurable.prune_pubsub(%s::interval, %s)", ("-1 s", 10)),
                        ("SELECT pgdurable.prune_pubsub(%s::interval, %s)", ("1 s", 0)),
                        ("SELECT pgdurable.prune_pubsub(%s::interval, %s)", ("1 s", 100001)),
                        (PUBLISH, ("", ['{"id": "x"}'])),
                        (PUBLISH, ("t", ["[1]"]))):
        with pytest.raises(psycopg.Error) as err:
            conn.execute(sql, params)
        assert err.value.sqlstate == "PD000"  # pgdurable.InvalidInput
    assert topics(conn) == [("run-1", 1)]
