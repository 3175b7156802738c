"""Events kept in daily partitions (sql/0039_events_partitions.sql): the upgrade in place
keeps every row, retention drops whole days but never what an unfinished run may still
read, and a dedup id holds across partitions (pgdurable.event_ids)."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgdurable
from pgdurable.foundation import migrations
from pgdurable.ops.partitions import maintain_sync
from pgdurable.ops.retention import prune_sync
from tests.test_partitions import at, db_today, start

SEND = "SELECT event_id, created FROM pgdurable.send_event(%s, %s::jsonb, %s)"


def send(conn: psycopg.Connection[Any], name: str, data: str, event_id: str | None) -> Any:
    return conn.execute(SEND, (name, data, event_id)).fetchone()


def holder(conn: psycopg.Connection[Any], event_id: int) -> list[str]:
    """The partition(s) of events holding this event."""
    return [r[0] for r in conn.execute(
        "SELECT tableoid::regclass::text FROM pgdurable.events WHERE id = %s", (event_id,))]


def scalar(conn: psycopg.Connection[Any], query: str, *args: Any) -> Any:
    row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


def test_a_duplicate_id_is_deduplicated_across_a_partition_boundary(
        conn: psycopg.Connection[Any]) -> None:
    day = db_today(conn) + timedelta(days=1)
    at(conn, day - timedelta(seconds=1))  # 23:59:59 of today
    first = send(conn, "order.paid", '{"order": 1}', "pay-1")
    assert first[1] is True
    at(conn, day + timedelta(seconds=1))  # 00:00:01 of tomorrow: another partition
    assert send(conn, "order.paid", '{"order": 1}', "pay-1") == (first[0], False)
    with pytest.raises(psycopg.Error) as exc:
        send(conn, "order.paid", '{"order": 2}', "pay-1")
    assert exc.value.sqlstate == "PD015"
    # the same id under another name is another event, in tomorrow's partition
    other = send(conn, "order.refunded", '{"order": 1}', "pay-1")
    assert other[1] is True
    assert holder(conn, first[0]) != holder(conn, other[0])
    assert scalar(conn, "SELECT count(*) FROM pgdurable.events") == 2
    # an event that landed in events_default (no partition for its day yet) is moved into
    # the day's partition when it is created, and its id still deduplicates
    far = day + timedelta(days=30)
    at(conn, far)
    late = send(conn, "order.paid", '{"order": 3}', "pay-3")
    assert holder(conn, late[0]) == ["pgdurable.events_default"]
    assert scalar(conn, "SELECT pgdurable.create_event_partitions(0, 0)") == 1
    assert holder(conn, late[0]) == [f"pgdurable.events_p{far:%Y%m%d}"]
    assert send(conn, "order.paid", '{"order": 3}', "pay-3") == (late[0], False)


def test_retention_drops_whole_days_but_not_what_unfinished_runs_may_read(
        conn: psycopg.Connection[Any]) -> None:
    day0 = db_today(conn) - timedelta(days=60)
    at(conn, day0)
    assert scalar(conn, "SELECT pgdurable.create_event_partitions(2, 0)") == 3
    conn.execute("SELECT pgdurable.upsert_event_trigger('jobs', 'job', 'jobtask', '1', 'default',"
                 " 3, NULL, NULL, NULL, false, 5, '1 hour')")
    at(conn, day0 + timedelta(hours=10))
    a = send(conn, "note", '{"n": 1}', "a-1")[0]            # nobody needs it
    at(conn, day0 + timedelta(hours=12))
    job = send(conn, "job", '{"n": 2}', "job-1")[0]         # in an open batch window
    (window_run,) = conn.execute("SELECT run_id FROM pgdurable.event_windows").fetchone() or ()
    at(conn, day0 + timedelta(days=1, hours=12))
    b = send(conn, "note", '{"n": 3}', "b-1")[0]            # after the window's run started
    at(conn, day0 + timedelta(days=2, hours=12))
    later_run = start(conn)                                  # unfinished, created on day 2
    # 40 days on: the three days are past a 30-day retention
    at(conn, day0 + timedelta(days=40))
    done = maintain_sync(conn, days_ahead=0, older_than="30d")
    mine = sorted((d.partition_name, d.rows_dropped, d.rows_kept)
                  for d in done.dropped if d.history_table == "events")
    assert mine == [(f"events_p{day0:%Y%m%d}", 1, 1),
                    (f"events_p{day0 + timedelta(days=1):%Y%m%d}", 0, 1),
                    (f"events_p{day0 + timedelta(days=2):%Y%m%d}", 0, 0)]
    # "a" was before every unfinished run: gone, with its id; "job" is in the window of an
    # unfinished run and "b" came after that run started (a wait_event of it may still
    # see it): both kept, in events_default, their ids still deduplicating
    assert holder(conn, a) == []
    assert holder(conn, job) == holder(conn, b) == ["pgdurable.events_default"]
    assert scalar(conn, "SELECT array_agg(event_key ORDER BY event_key) FROM pgdurable.event_ids"
                  ) == ["b-1", "job-1"]
    assert send(conn, "job", '{"n": 2}', "job-1") == (job, False)
    assert scalar(conn, "SELECT count(*) FROM pgdurable.event_window_events "
                  "WHERE event_id = %s", job) == 1
    # the window's run reads its event after the drop
    assert [r[0] for r in conn.execute(
        "SELECT id FROM pgdurable.take_event_window(%s)", (window_run,))] == [job]
    # once the window's run is over, only later_run (created on day 2) is unfinished:
    # retention row by row takes "job", "b" and the emptied window
    conn.execute("SELECT pgdurable.cancel_run(%s)", (window_run,))
    pruned = prune_sync(conn, "30d")
    assert pruned.sent_events == 2 + 1
    assert holder(conn, job) == holder(conn, b) == []
    assert scalar(conn, "SELECT count(*) FROM pgdurable.event_ids") == 0
    # a dropped id deduplicates no more
    assert send(conn, "note", '{"n": 1}', "a-1")[1] is True
    assert scalar(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", later_run) == \
        "runnable"


def test_an_event_in_an_unfinished_runs_window_is_kept_whatever_its_age(
        conn: psycopg.Connection[Any]) -> None:
    """The window rule on its own: the event is older than every unfinished run (the
    horizon would let it go), but it is in the window of one of them."""
    day0 = db_today(conn) - timedelta(days=60)
    at(conn, day0)
    assert scalar(conn, "SELECT pgdurable.create_event_partitions(0, 0)") == 1
    event = send(conn, "job", '{"n": 1}', None)[0]
    at(conn, day0 + timedelta(days=5))
    run = start(conn)
    window = scalar(conn, "INSERT INTO pgdurable.event_windows (trigger, key, run_id, due_at, "
                    "events) VALUES ('t', '', %s, pgdurable.now(), 1) RETURNING id", run)
    conn.execute("INSERT INTO pgdurable.event_window_events (window_id, event_id, event_at) "
                 "SELECT %s, id, created_at FROM pgdurable.events WHERE id = %s", (window, event))
    at(conn, day0 + timedelta(days=40))
    assert conn.execute("SELECT partition_name, rows_dropped, rows_kept "
                        "FROM pgdurable.drop_event_partitions('30 days')").fetchall() == \
        [(f"events_p{day0:%Y%m%d}", 0, 1)]
    assert holder(conn, event) == ["pgdurable.events_default"]
    assert scalar(conn, "SELECT pgdurable.prune_events('30 days', 100)") == 0
    conn.execute("SELECT pgdurable.cancel_run(%s)", (run,))
    assert scalar(conn, "SELECT pgdurable.prune_events('30 days', 100)") == 1 + 1  # + window
    assert holder(conn, event) == []


def test_bad_partition_arguments_change_nothing(conn: psycopg.Connection[Any]) -> None:
    before = scalar(conn, "SELECT count(*) FROM pgdurable.event_partitions")
    for query in ("SELECT pgdurable.create_event_partitions(-1, 0)",
                  "SELECT pgdurable.create_event_partitions(3, 400)",
                  "SELECT * FROM pgdurable.drop_event_partitions('-1 day')",
                  "SELECT * FROM pgdurable.drop_event_partitions(NULL)"):
        with pytest.raises(psycopg.Error) as exc:
            conn.execute(query)
        assert exc.value.sqlstate == "PD000", query
    assert scalar(conn, "SELECT count(*) FROM pgdurable.event_partitions") == before


def _forget() -> None:
    """migrations reads its folder once (cached): read it again."""
    migrations.load_migrations.cache_clear()
    migrations.load_definitions.cache_clear()


def test_upgrade_in_place_keeps_the_events(empty_dsn: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A database with events (0037's table) is upgraded by 0039: every row kept in its
    day's partition, the indexes (the GIN one included), the dedup ids, the window links,
    and the numbers go on."""
    here = Path(str(migrations._sql_dir()))
    before = tmp_path / "sql"
    shutil.copytree(here, before)
    mine = next(before.glob("[0-9][0-9][0-9][0-9]_events_partitions.sql"))
    for later in before.glob("[0-9][0-9][0-9][0-9]_*.sql"):
        if later.name >= mine.name:
            later.unlink()
    # the release before had another functions/events.sql: the upgrade applies this one
    with (before / "functions" / "events.sql").open("a") as f:
        f.write("\n-- as released before the partitions\n")
    monkeypatch.setattr(migrations, "_sql_dir", lambda: before)
    _forget()
    try:
        pgdurable.migrate(empty_dsn)
    finally:
        monkeypatch.undo()
        _forget()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert scalar(c, "SELECT relkind FROM pg_class WHERE oid = 'pgdurable.events'::regclass"
                      ) == "r"
        c.execute("""
          INSERT INTO pgdurable.events (name, data, event_key, created_at)
          VALUES ('msg', '{"k": "a"}', 'm-1', now() - interval '3 days'),
                 ('msg', '{"k": "b"}', NULL, now() - interval '1 day'),
                 ('msg', '{"k": "c"}', 'm-3', now())""")
        c.execute("INSERT INTO pgdurable.event_windows (trigger, key, run_id, due_at, events) "
                  "VALUES ('t', '', gen_random_uuid(), now(), 2)")
        c.execute("INSERT INTO pgdurable.event_window_events (window_id, event_id) "
                  "SELECT w.id, e.id FROM pgdurable.event_windows w, pgdurable.events e "
                  "WHERE e.event_key IS NOT NULL")
        rows = c.execute("SELECT id, name, data, event_key, created_at FROM pgdurable.events "
                         "ORDER BY id").fetchall()
    applied = pgdurable.migrate(empty_dsn)  # 0039 and whatever came after it
    assert [m.name for m in applied] == sorted(
        p.name for p in here.glob("[0-9][0-9][0-9][0-9]_*.sql") if p.name >= mine.name)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT id, name, data, event_key, created_at FROM pgdurable.events "
                         "ORDER BY id").fetchall() == rows
        assert scalar(c, "SELECT relkind FROM pg_class WHERE oid = 'pgdurable.events'::regclass"
                      ) == "p"
        days = [r[0] for r in c.execute("SELECT tableoid::regclass::text FROM pgdurable.events "
                                        "ORDER BY id")]
        assert days == [f"pgdurable.events_p{r[4]:%Y%m%d}" for r in rows]
        indexes = dict(c.execute("SELECT indexname, indexdef FROM pg_indexes "
                                 "WHERE schemaname = 'pgdurable' AND tablename = 'events'"
                                 ).fetchall())
        assert set(indexes) == {"events_pkey", "events_name_created_idx", "events_created_idx",
                                "events_data_idx"}
        assert "gin (data jsonb_path_ops)" in indexes["events_data_idx"]
        assert c.execute("SELECT event_key, event_id FROM pgdurable.event_ids ORDER BY 1"
                         ).fetchall() == [("m-1", rows[0][0]), ("m-3", rows[2][0])]
        assert c.execute("SELECT event_id, event_at FROM pgdurable.event_window_events "
                         "ORDER BY 1").fetchall() == [(rows[0][0], rows[0][4]),
                                                      (rows[2][0], rows[2][4])]
        # an old id deduplicates, the next number follows the old ones, the window reads
        assert send(c, "msg", '{"k": "a"}', "m-1") == (rows[0][0], False)
        new = send(c, "msg", '{"k": "d"}', "m-4")
        assert new[1] is True and new[0] > rows[-1][0]
        run = scalar(c, "SELECT run_id FROM pgdurable.event_windows")
        assert [r[0] for r in c.execute("SELECT id FROM pgdurable.take_event_window(%s)",
                                        (run,))] == [rows[0][0], rows[2][0]]
