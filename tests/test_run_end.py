"""What a run's end sets off, from one trigger (runs_end, sql/0027_run_end_trigger.sql):
the done NOTIFY, the fan-in to a waiting parent, the children's policy, a limited
queue's freed slot and the final stream event, in that order and in the ending
transaction; a run leaving leased for a live status only frees its slot. Driven
through the SQL functions, with a real LISTEN connection."""

from __future__ import annotations

from typing import Any

import psycopg
from _released import migrate_released
from _waiting import WAIT_LIMIT

import pgdurable

CHANNELS = ("pgdurable_done", "pgdurable_wake", "pgdurable_events", "pgdurable_cancel")


def one(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def start_claimed(conn: psycopg.Connection[Any], task: str, queue: str) -> tuple[str, int]:
    """A new run of ``task`` in ``queue``, claimed by owner 'w': (id, token)."""
    conn.execute("SELECT pgdurable.start_run(%s, '1', '{}', %s, 0, 3, NULL, NULL, NULL, NULL)",
                 (task, queue))
    return claim(conn, task, queue)


def claim(conn: psycopg.Connection[Any], task: str, queue: str) -> tuple[str, int]:
    row = conn.execute("SELECT id, lease_token FROM pgdurable.claim_runs('w', ARRAY[%s], "
                       "ARRAY[%s], '{1}', 1, '60 s')", (queue, task)).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def child(conn: psycopg.Connection[Any], parent: tuple[str, int], key: str, queue: str,
          policy: str = "cancel") -> str:
    return str(one(conn, "SELECT run_id FROM pgdurable.start_child(%s, %s, %s, 'leaf', '1', '{}', "
                         "%s, 0, 3, NULL, NULL, NULL, %s)", *parent, key, queue, policy))


def status(conn: psycopg.Connection[Any], rid: str) -> str:
    return str(one(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", rid))


def heard(ear: psycopg.Connection[Any], n: int) -> list[tuple[str, str]]:
    """The next ``n`` notifications, then none more for a moment."""
    got = []
    if n:
        got = [(m.channel, m.payload) for m in ear.notifies(timeout=WAIT_LIMIT, stop_after=n)]
    got += [(m.channel, m.payload) for m in ear.notifies(timeout=0.3)]
    return got


def listening(dsn: str) -> psycopg.Connection[Any]:
    ear = psycopg.connect(dsn, autocommit=True)
    for ch in CHANNELS:
        ear.execute(f"LISTEN {ch}")
    ear.execute("SELECT pgdurable.listen_presence('pgdurable_done', 60)")  # a result() waiter
    return ear


def test_a_childs_end_wakes_its_parent_frees_its_slot_and_ends_its_stream(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pgdurable.set_queue('capped', 4, NULL, NULL, NULL)")
    parent = start_claimed(conn, "parent", "main")
    kid = child(conn, parent, "k", "capped")
    assert one(conn, "SELECT status FROM pgdurable.park_children(%s, %s, 'w', '{}', 0, "
                     "ARRAY[%s]::uuid[], 1)", *parent, kid) == "waiting"
    kid_token = claim(conn, "leaf", "capped")[1]
    assert one(conn, "SELECT pgdurable.emit_event(%s, %s, 'w', 0, '{\"say\": \"hi\"}')",
               kid, kid_token) == 1
    with listening(dsn) as ear:
        assert one(conn, "SELECT pgdurable.complete_run(%s, %s, 'w', '{}', '{\"ok\": 1}', 0)",
                   kid, kid_token) == "completed"
        assert heard(ear, 4) == [("pgdurable_done", kid), ("pgdurable_wake", "main"),
                                 ("pgdurable_wake", "capped"), ("pgdurable_events", kid)]
    wake = one(conn, "SELECT wake FROM pgdurable.runs WHERE id = %s", parent[0])
    assert status(conn, parent[0]) == "runnable" and wake["type"] == "children"
    assert wake["children"][kid]["status"] == "completed"
    assert wake["children"][kid]["result"] == {"ok": 1}
    events = conn.execute("SELECT seq, event, final FROM pgdurable.run_events WHERE run_id = %s "
                          "ORDER BY seq", (kid,)).fetchall()
    assert events == [(1, {"say": "hi"}, False),
                      (2, {"type": "end", "status": "completed", "result": {"ok": 1},
                           "error": None}, True)]
    assert one(conn, "SELECT count(*) FROM pgdurable.child_waits") == 0
    assert one(conn, "SELECT count(*) FROM pgdurable.child_wait_sets") == 0


def test_a_parents_end_applies_each_childs_policy(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    parent = start_claimed(conn, "parent", "main")
    runnable = child(conn, parent, "runnable", "kids")
    leased = child(conn, parent, "leased", "kids")
    abandoned = child(conn, parent, "abandoned", "kids", policy="abandon")
    # the first child gets a child of its own, then goes back to runnable
    first = claim(conn, "leaf", "kids")
    assert first[0] == runnable
    grandchild = child(conn, first, "g", "kids")
    conn.execute("SELECT pgdurable.release_run(%s, %s, 'w')", first)
    conn.execute("UPDATE pgdurable.runs SET priority = 1 WHERE id = %s", (leased,))
    assert claim(conn, "leaf", "kids")[0] == leased
    with listening(dsn) as ear:
        conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w', '{}', 'null', 0)", parent)
        got = heard(ear, 4)
    # the parent's done NOTIFY first; then, as its children's loop meets them, the
    # runnable child's end (its own done, then its child's) and the leased child's
    # cancel request; no stream had events
    assert sorted(got) == sorted([("pgdurable_done", grandchild), ("pgdurable_done", runnable),
                                  ("pgdurable_cancel", leased), ("pgdurable_done", parent[0])])
    assert got[0] == ("pgdurable_done", parent[0])
    assert {r: status(conn, r) for r in (runnable, grandchild, leased, abandoned)} == {
        runnable: "cancelled", grandchild: "cancelled", leased: "leased", abandoned: "runnable"}
    assert one(conn, "SELECT cancel_requested_at IS NOT NULL FROM pgdurable.runs WHERE id = %s",
               leased)
    err = one(conn, "SELECT error FROM pgdurable.runs WHERE id = %s", runnable)
    assert err["type"] == "RunCancelled" and parent[0] in err["message"]
    assert one(conn, "SELECT count(*) FROM pgdurable.run_events") == 0


def test_leaving_leased_for_a_live_status_only_frees_the_slot(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pgdurable.set_queue('capped', 4, NULL, NULL, NULL)")
    limited = start_claimed(conn, "t", "capped")
    plain = start_claimed(conn, "t", "main")
    for run in (limited, plain):  # a stream each: a park must not end it
        conn.execute("SELECT pgdurable.emit_event(%s, %s, 'w', 0, '{}')", run)
    park = ("SELECT status FROM pgdurable.park_run(%s, %s, 'w', '{}', 0, 'signal', 'go', NULL, "
            "NULL)")
    with listening(dsn) as ear:
        assert one(conn, park, *limited) == "waiting"
        assert heard(ear, 1) == [("pgdurable_wake", "capped")]
        assert one(conn, park, *plain) == "waiting"
        assert heard(ear, 0) == []
    assert one(conn, "SELECT count(*) FROM pgdurable.run_events WHERE final") == 0


def test_an_installation_mid_flight_upgrades_to_one_end_trigger(
        empty_dsn: str) -> None:
    """Migrated to 0026 with a parent waiting on a leased child: 0027 applies, the
    three end triggers are one, and the child's end then wakes the parent."""
    migrate_released(empty_dsn, 26)
    triggers = ("SELECT array_agg(tgname::text ORDER BY tgname) FROM pg_trigger "
                "WHERE tgrelid = 'pgdurable.runs'::regclass AND NOT tgisinternal")
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        before = one(c, triggers)
        assert {"runs_child_end", "runs_flow_slot_freed_trg", "runs_stream_end"} <= set(before)
        parent = start_claimed(c, "parent", "main")
        kid = child(c, parent, "k", "kids")
        c.execute("SELECT * FROM pgdurable.park_children(%s, %s, 'w', '{}', 0, "
                  "ARRAY[%s]::uuid[], 1)", (*parent, kid))
        kid_token = claim(c, "leaf", "kids")[1]
    assert [m.version for m in pgdurable.migrate(empty_dsn)][:1] == [27]
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        after = one(c, triggers)
        assert set(after) == set(before) - {
            "runs_child_end", "runs_flow_slot_freed_trg", "runs_stream_end"} | {"runs_end"}
        assert one(c, "SELECT pgdurable.complete_run(%s, %s, 'w', '{}', '{\"ok\": 1}', 0)",
                   kid, kid_token) == "completed"
        assert status(c, parent[0]) == "runnable"
        assert one(c, "SELECT wake->'children'->%s->>'status' FROM pgdurable.runs WHERE id = %s",
                   kid, parent[0]) == "completed"
