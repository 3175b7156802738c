"""Consumed signals as partitioned history (sql/0022_partitioned_signals.sql): the move,
dedup across it, retention by partition, the migration with data, and the Citus-readiness keys."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from _released import migrate_released
from _waiting import WAIT_LIMIT

import pgdurable
from pgdurable.foundation import migrations
from pgdurable.ops.partitions import maintain_sync
from pgdurable.ops.retention import prune_sync
from tests.test_partitions import at, claim, db_today, start

SEND = "SELECT array_agg(x) FROM pgdurable.send_signal(%s, %s, %s, %s) x"
SIGNAL_RUN = "SELECT array_agg(x) FROM pgdurable.signal_run(%s, %s, %s, %s) x"


def park(conn: psycopg.Connection[Any], ref: str) -> Any:
    """A run parked on ('ci', ref)."""
    start(conn)
    rid, token = claim(conn)
    conn.execute("SELECT pgdurable.park_run(%s, %s, 'w1', '{}', 0, 'ci', %s, NULL)",
                 (rid, token, ref))
    return rid


def where(conn: psycopg.Connection[Any], signal_id: str) -> list[str]:
    """Which tables (partitions) hold the signal with this id."""
    return [r[0] for r in conn.execute(
        "SELECT tableoid::regclass::text FROM pgdurable.signals WHERE signal_id = %s"
        " UNION ALL SELECT tableoid::regclass::text FROM pgdurable.signal_history"
        " WHERE signal_id = %s", (signal_id, signal_id))]


def move(conn: psycopg.Connection[Any], min_age: str = "1 hour") -> int:
    row = conn.execute("SELECT pgdurable.move_consumed_signals(%s)", (min_age,)).fetchone()
    assert row is not None
    return int(row[0])


def test_consumed_signals_move_and_still_deduplicate(conn: psycopg.Connection[Any]) -> None:
    day = db_today(conn) + timedelta(hours=12)
    at(conn, day)
    a, b = park(conn, "b1"), park(conn, "b2")
    woke = conn.execute(SEND, ("ci", "b1", '{"ok": 1}', "gh-1")).fetchone()
    assert woke == ([a],)
    assert conn.execute(SIGNAL_RUN, (b, "ci", '{"ok": 2}', "run-1")).fetchone() == ([b],)
    assert conn.execute(SEND, ("ci", "nobody", "{}", "pending-1")).fetchone() == (None,)
    # consumed less than an hour ago: not moved yet; pending ones never move
    assert move(conn) == 0
    at(conn, day + timedelta(minutes=61))
    assert maintain_sync(conn, days_ahead=0).signals_moved == 2
    part = f"pgdurable.signal_history_p{day:%Y%m%d}"
    assert where(conn, "gh-1") == [part] and where(conn, "run-1") == [part]
    assert where(conn, "pending-1") == ["pgdurable.signals"]
    # a resend answers what the first send answered and changes nothing
    c0 = conn.execute("SELECT (SELECT count(*) FROM pgdurable.signals),"
                      " (SELECT count(*) FROM pgdurable.signal_history)").fetchone()
    assert conn.execute(SEND, ("ci", "b1", '{"ok": 1}', "gh-1")).fetchone() == ([a],)
    assert conn.execute(SIGNAL_RUN, (b, "ci", '{"ok": 2}', "run-1")).fetchone() == ([b],)
    with pytest.raises(psycopg.Error, match="already sent") as conflict:
        conn.execute(SEND, ("ci", "b1", '{"ok": "other"}', "gh-1"))
    with pytest.raises(psycopg.Error, match="already sent") as conflict:
        conn.execute(SEND, ("ci", "b1", '{"ok": 2}', "run-1"))
    assert conflict.value.sqlstate == "PD008"  # SignalConflict
    assert conn.execute("SELECT (SELECT count(*) FROM pgdurable.signals),"
                        " (SELECT count(*) FROM pgdurable.signal_history)").fetchone() == c0
    # bad input changes nothing
    for bad in ("-1 s", None):
        with pytest.raises(psycopg.Error, match="min_age"):
            move(conn, bad)  # type: ignore[arg-type]


def test_retention_by_partition_keeps_signals_of_kept_runs(conn: psycopg.Connection[Any]) -> None:
    day0 = db_today(conn) + timedelta(hours=12)
    at(conn, day0)
    done, live = park(conn, "d"), park(conn, "l")
    conn.execute(SEND, ("ci", "d", "{}", "sig-done"))
    conn.execute(SEND, ("ci", "l", "{}", "sig-live"))
    rid, token = claim(conn)  # the woken run that finishes (claim order: either)
    rid2, token2 = claim(conn)
    for r, t in ((rid, token), (rid2, token2)):
        if r == done:
            conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w1', '{}', '1')", (r, t))
    at(conn, day0 + timedelta(hours=2))
    assert move(conn) == 2
    at(conn, day0 + timedelta(days=40))
    result = prune_sync(conn, "30d")
    assert result.runs == 1 and result.signals == 1
    assert where(conn, "sig-done") == []
    # the live run's signal went to the default partition and still deduplicates
    assert where(conn, "sig-live") == ["pgdurable.signal_history_default"]
    assert conn.execute(SEND, ("ci", "l", "{}", "sig-live")).fetchone() == ([live],)
    # a signal of a run pruned row by row goes with it
    conn.execute("UPDATE pgdurable.runs SET status = 'completed', finished_at = pgdurable.now(),"
                 " lease_owner = NULL, lease_expires_at = NULL WHERE id = %s", (live,))
    at(conn, day0 + timedelta(days=80))
    assert prune_sync(conn, "30d").signals == 1
    assert where(conn, "sig-live") == []


def test_prune_clears_forked_from_of_the_pruned_source(conn: psycopg.Connection[Any]) -> None:
    src, fork = start(conn), start(conn)
    conn.execute("UPDATE pgdurable.runs SET status = 'completed', finished_at = now() - interval '2 days'"
                 " WHERE id = %s", (src,))
    conn.execute("UPDATE pgdurable.runs SET forked_from = %s, forked_from_step = 0 WHERE id = %s",
                 (src, fork))
    assert prune_sync(conn, "1d").runs == 1
    assert conn.execute("SELECT forked_from FROM pgdurable.runs WHERE id = %s",
                        (fork,)).fetchone() == (None,)


def test_distributable_keys(conn: psycopg.Connection[Any]) -> None:
    """No foreign key to runs except from co-located per-run tables keyed by run id; the
    primary key of every per-run table contains the run id."""
    fks = {r[0] for r in conn.execute(
        "SELECT conrelid::regclass::text || '.' || a.attname FROM pg_constraint c"
        " JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]"
        " WHERE c.contype = 'f' AND c.confrelid = 'pgdurable.runs'::regclass"
        " AND c.conparentid = 0")}
    assert fks == {"pgdurable.effects.run_id", "pgdurable.durable_steps.run_id",
                   "pgdurable.schedule_runs.run_id", "pgdurable.run_rewinds.run_id",
                   "pgdurable.run_budgets.run_id", "pgdurable.budget_holds.run_id",
                   "pgdurable.event_waits.run_id", "pgdurable.event_cancels.run_id"}
    pk = conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint"
                      " WHERE conname = 'run_rewinds_pkey'").fetchone()
    assert pk == ("PRIMARY KEY (run_id, id)",)
    # the per-run tables of budgets (0036) and events (0037): keyed by run id first
    for table in ("run_budgets", "budget_holds", "event_waits", "event_cancels"):
        pk = conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint"
                          " WHERE conname = %s", (f"{table}_pkey",)).fetchone()
        assert pk is not None and pk[0].startswith("PRIMARY KEY (run_id"), (table, pk)


def test_migration_with_signals_in_it(empty_dsn: str) -> None:
    mine = next(m for m in migrations.load_migrations()
                if m.name.endswith("_partitioned_signals.sql"))
    migrate_released(empty_dsn, mine.version - 1)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        ids = [r[0] for r in c.execute(
            "INSERT INTO pgdurable.runs (task, revision, status, finished_at)"
            " SELECT 't', '1', 'completed', now() FROM generate_series(1, 3) RETURNING id")]
        # consumed 3 days ago, consumed a minute ago, pending
        c.execute("""
          INSERT INTO pgdurable.signals (kind, ref, payload, signal_id, created_at,
                                         consumed_by, consumed_at, woke)
          VALUES ('ci', 'old', '1', 'old', now() - interval '3 days', %(a)s,
                  now() - interval '3 days',
                  ARRAY[%(a)s]::uuid[]),
                 ('ci', 'new', '2', 'new', now(), %(b)s, now() - interval '1 minute', ARRAY[%(b)s]::uuid[]),
                 ('ci', 'pending', '3', 'pending', now(), NULL, NULL, '{}')""",
                  {"a": ids[0], "b": ids[1]})
        c.execute("INSERT INTO pgdurable.run_rewinds (run_id, from_step, to_step, status, revision,"
                  " checkpoints, effects) VALUES (%s, 2, 1, 'failed', '1', '[]', '[]')", (ids[2],))
        before = c.execute("SELECT id, kind, ref, payload, signal_id, consumed_by, woke"
                           " FROM pgdurable.signals ORDER BY id").fetchall()
    assert mine.version in [m.version for m in pgdurable.migrate(empty_dsn)]
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        rows = c.execute(
            "SELECT id, kind, ref, payload, signal_id, consumed_by, woke, tableoid::regclass::text"
            " FROM (SELECT *, tableoid FROM pgdurable.signals UNION ALL"
            "       SELECT *, tableoid FROM pgdurable.signal_history) s ORDER BY id").fetchall()
        assert [r[:-1] for r in rows] == before
        old_day = c.execute("SELECT to_char((now() - interval '3 days') AT TIME ZONE 'UTC', 'YYYYMMDD')"
                            ).fetchone()
        assert old_day is not None
        assert [r[-1] for r in rows] == [f"pgdurable.signal_history_p{old_day[0]}",
                                         "pgdurable.signals", "pgdurable.signals"]
        assert c.execute(SEND, ("ci", "old", "1", "old")).fetchone() == ([ids[0]],)
        with pytest.raises(psycopg.Error, match="already sent"):
            c.execute(SEND, ("ci", "old", "9", "old"))
        assert c.execute("SELECT count(*) FROM pgdurable.run_rewinds WHERE run_id = %s",
                         (ids[2],)).fetchone() == (1,)


def test_partition_drop_does_not_lock_runs(conn: psycopg.Connection[Any]) -> None:
    """Dropping history partitions never locks runs (with foreign keys it took ACCESS
    EXCLUSIVE on runs: claims stalled and complete_run deadlocked with it)."""
    conn.execute("SELECT pgdurable.create_history_partitions(0, 3)")
    with conn.transaction():
        dropped = conn.execute("SELECT count(*) FROM pgdurable.drop_history_partitions('1 day')"
                               ).fetchone()
        locks = conn.execute("SELECT mode FROM pg_locks WHERE pid = pg_backend_pid()"
                             " AND relation = 'pgdurable.runs'::regclass").fetchall()
    assert dropped is not None and dropped[0] in (6, 9)  # 2 or 3 whole days x 3 tables
    assert all(m not in ("AccessExclusiveLock", "ShareRowExclusiveLock", "ExclusiveLock")
               for (m,) in locks), locks


def ids(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """signal_history_ids as {signal_id: consumed_at}."""
    return dict(conn.execute("SELECT signal_id, consumed_at FROM pgdurable.signal_history_ids"
                             ).fetchall())


def history_ids(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """What signal_history_ids must hold: signal_history's rows that have a signal_id."""
    return dict(conn.execute("SELECT signal_id, consumed_at FROM pgdurable.signal_history"
                             " WHERE signal_id IS NOT NULL").fetchall())


def test_a_new_signal_id_probes_no_history_partition(conn: psycopg.Connection[Any]) -> None:
    """With many days of history, telling a new signal_id from a resent one takes
    one probe of signal_history_ids, not one of every partition (0024)."""
    conn.execute("SELECT pgdurable.create_history_partitions(40, 0)")
    parts = {r[0] for r in conn.execute(
        "SELECT inhrelid FROM pg_inherits WHERE inhparent = 'pgdurable.signal_history'::regclass")}
    assert len(parts) > 40
    park(conn, "p1")
    for _ in range(7):  # past plpgsql's custom plans: its generic plan is what runs from then on
        conn.execute(SEND, ("ci", "nobody", "{}", f"fresh-{_}"))
    with conn.transaction():
        assert conn.execute(SEND, ("ci", "p1", "{}", "fresh")).fetchone() is not None
        locked = {r[0] for r in conn.execute(
            "SELECT relation FROM pg_locks WHERE pid = pg_backend_pid() AND relation IS NOT NULL")}
    assert not locked & parts, "a new signal_id locked signal_history partitions"


def test_signal_history_ids_follow_the_history(conn: psycopg.Connection[Any]) -> None:
    """The ids mirror signal_history through the move, prune_runs, a partition drop
    that keeps a live run's signal (moved to the default partition) and one that
    drops them; an entry whose row went with a partition dropped by hand is a new id."""
    day0 = db_today(conn) + timedelta(hours=12)
    at(conn, day0)
    park(conn, "d")
    live, gone = park(conn, "l"), park(conn, "g")
    park(conn, "n")
    for ref in ("d", "l", "g"):
        conn.execute(SEND, ("ci", ref, "{}", f"sig-{ref}"))
    conn.execute(SEND, ("ci", "n", "{}", None))  # consumed, no signal_id: nothing to index
    for _ in range(4):
        rid, token = claim(conn)
        if rid != live:
            conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w1', '{}', '1')", (rid, token))
    assert ids(conn) == {}
    at(conn, day0 + timedelta(hours=2))
    assert move(conn) == 4
    assert set(ids(conn)) == {"sig-d", "sig-l", "sig-g"} and ids(conn) == history_ids(conn)
    # prune_runs deletes one run's signal row by row
    conn.execute("UPDATE pgdurable.runs SET finished_at = pgdurable.now() - interval '31 days'"
                 " WHERE id = %s", (gone,))
    assert prune_sync(conn, "30d").signals == 1
    assert set(ids(conn)) == {"sig-d", "sig-l"} and ids(conn) == history_ids(conn)
    assert conn.execute(SEND, ("ci", "g", "{}", "sig-g")).fetchone() == (None,)  # new again
    # a partition drop: the finished run's signal goes, the live run's moves to default
    at(conn, day0 + timedelta(days=40))
    maintain_sync(conn, days_ahead=0, older_than="30d")
    assert where(conn, "sig-l") == ["pgdurable.signal_history_default"]
    assert set(ids(conn)) == {"sig-l"} and ids(conn) == history_ids(conn)
    assert conn.execute(SEND, ("ci", "l", "{}", "sig-l")).fetchone() == ([live],)
    # an UPDATE by hand (no function updates history) is a remove and an add
    conn.execute("UPDATE pgdurable.signal_history SET signal_id = 'sig-l2' WHERE signal_id = 'sig-l'")
    assert set(ids(conn)) == {"sig-l2"} and ids(conn) == history_ids(conn)
    conn.execute("UPDATE pgdurable.signal_history SET signal_id = 'sig-l' WHERE signal_id = 'sig-l2'")
    assert conn.execute(SEND, ("ci", "d", "{}", "sig-d")).fetchone() == (None,)
    # a partition dropped by hand leaves a stale entry: the id is new, the entry goes
    conn.execute("INSERT INTO pgdurable.signal_history_ids (kind, signal_id, consumed_at) "
                 "VALUES ('ci', 'stale', now())")
    assert conn.execute(SEND, ("ci", "x", "{}", "stale")).fetchone() == (None,)
    assert "stale" not in ids(conn)
    assert where(conn, "stale") == ["pgdurable.signals"]


def test_migration_keeps_the_ids_of_a_move_that_commits_meanwhile(
        empty_dsn: str) -> None:
    """0024 fills signal_history_ids after its triggers lock signal_history: a
    move_consumed_signals still open when the migration starts is waited for and its
    ids are in the table (filled first, its ids would be left out and never deduplicate)."""
    mine = next(m for m in migrations.load_migrations()
                if m.name.endswith("_signal_history_ids.sql"))
    migrate_released(empty_dsn, mine.version - 1)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("""
          INSERT INTO pgdurable.signals (kind, ref, payload, signal_id, created_at,
                                         consumed_by, consumed_at, woke)
          VALUES ('ci', 'a', '1', 'moved-meanwhile', now() - interval '2 hours',
                  gen_random_uuid(), now() - interval '2 hours', '{}'),
                 ('ci', 'b', '2', 'moved-before', now() - interval '2 hours',
                  gen_random_uuid(), now() - interval '3 hours', '{}')""")
        c.execute("SELECT pgdurable.move_consumed_signals('1 hour', 1)")  # moved-before
        with psycopg.connect(empty_dsn) as mover:  # moved-meanwhile: not committed yet
            assert mover.execute("SELECT pgdurable.move_consumed_signals('1 hour')"
                                 ).fetchone() == (1,)
            done = threading.Event()
            failed: list[BaseException] = []

            def run_migration() -> None:
                try:
                    pgdurable.migrate(empty_dsn)
                except BaseException as exc:  # reported below
                    failed.append(exc)
                finally:
                    done.set()

            t = threading.Thread(target=run_migration)
            t.start()
            end = time.monotonic() + WAIT_LIMIT
            while not c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname ="
                                " current_database() AND wait_event_type = 'Lock'").fetchone()[0]:
                assert not done.is_set() and time.monotonic() < end, "the migration did not wait"
                time.sleep(0.02)
            mover.commit()
            t.join(WAIT_LIMIT)
        assert done.is_set() and not failed, failed
        got = {r[0] for r in c.execute("SELECT signal_id FROM pgdurable.signal_history_ids")}
        assert got == {"moved-before", "moved-meanwhile"}
        with pytest.raises(psycopg.Error, match="already sent"):
            c.execute(SEND, ("ci", "a", "9", "moved-meanwhile"))
