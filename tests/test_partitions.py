"""Time-partitioned history: creation, rollover, retention by partition, migration."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from _released import migrate_released

import pgdurable
from pgdurable import Continue, Done, InvalidInput, RunContext
from pgdurable.foundation import migrations
from pgdurable.ops.partitions import maintain, maintain_sync
from pgdurable.ops.retention import prune_sync
from pgdurable.ops.testing import run_until_idle

TERMINAL = "('completed', 'failed', 'cancelled', 'incompatible')"


def db_today(conn: psycopg.Connection[Any]) -> datetime:
    """Midnight (UTC) of the database's today."""
    row = conn.execute("SELECT date_trunc('day', pgdurable.now() AT TIME ZONE 'UTC')").fetchone()
    assert row is not None
    return datetime.combine(row[0].date(), datetime.min.time(), UTC)


def at(conn: psycopg.Connection[Any], when: datetime | None) -> None:
    """Move this session's test clock (None: back to the real clock)."""
    conn.execute("SELECT set_config('pgdurable.now', %s, false)",
                 (when.isoformat() if when else "",))


def migrated_day(conn: psycopg.Connection[Any]) -> datetime:
    """Midnight (UTC) of the day the test database's template was migrated: its first
    daily partition. Today, unless the suite crossed midnight UTC since it began."""
    row = conn.execute("SELECT min(range_from) FROM pgdurable.history_partitions"
                       " WHERE history_table = 'checkpoints'").fetchone()
    assert row is not None and row[0] is not None
    return datetime.combine(row[0].astimezone(UTC).date(), datetime.min.time(), UTC)


def days_behind(dsn: str) -> int:
    """Days from :func:`migrated_day` to today (0; 1 after a midnight crossed)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return (db_today(c) - migrated_day(c)).days


def parts(conn: psycopg.Connection[Any], table: str) -> dict[str, Any]:
    return {r[0]: (r[1], r[2]) for r in conn.execute(
        "SELECT partition_name, range_from, is_default FROM pgdurable.history_partitions"
        " WHERE history_table = %s", (table,))}


def where(conn: psycopg.Connection[Any], table: str, run_id: Any) -> list[tuple[Any, ...]]:
    """(key, partition) of a run's rows, in key order."""
    key = "step" if table == "checkpoints" else "seq"
    return conn.execute(
        f"SELECT {key}, tableoid::regclass::text FROM pgdurable.{table}"
        f" WHERE run_id = %s ORDER BY {key}", (run_id,)).fetchall()


def start(conn: psycopg.Connection[Any]) -> Any:
    row = conn.execute("SELECT s.run_id FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 3,"
                       " NULL, NULL, NULL, NULL) s").fetchone()
    assert row is not None
    return row[0]


def claim(conn: psycopg.Connection[Any], owner: str = "w1") -> tuple[Any, int]:
    row = conn.execute("SELECT id, lease_token FROM pgdurable.claim_runs(%s, %s, %s, %s, 1,"
                       " '1 hour'::interval)", (owner, ["default"], ["t"], ["1"])).fetchone()
    assert row is not None
    return row[0], row[1]


def checkpoint(conn: psycopg.Connection[Any], rid: Any, token: int, n: int) -> None:
    conn.execute("SELECT pgdurable.emit_event(%s, %s, 'w1', 0, %s)", (rid, token, f'{{"n": {n}}}'))
    assert conn.execute("SELECT pgdurable.checkpoint_run(%s, %s, 'w1', %s)",
                        (rid, token, f'{{"n": {n}}}')).fetchone() is not None


def test_migration_makes_daily_partitions_and_rows_land_in_their_day(
    conn: psycopg.Connection[Any],
) -> None:
    first = migrated_day(conn)
    for table in ("checkpoints", "run_events", "signal_history"):
        row = conn.execute("SELECT relkind FROM pg_class WHERE oid = %s::regclass",
                           (f"pgdurable.{table}",)).fetchone()
        assert row == ("p",)
        p = parts(conn, table)
        assert p[f"{table}_default"] == (None, True)
        for d in range(4):  # the migration's day and 3 days ahead
            day = first + timedelta(days=d)
            assert p[f"{table}_p{day:%Y%m%d}"] == (day, False)
    today = db_today(conn)
    if today != first:  # the suite crossed midnight UTC since the template was migrated
        conn.execute("SELECT pgdurable.create_history_partitions(3)")
    rid = start(conn)
    rid, token = claim(conn)
    checkpoint(conn, rid, token, 1)
    assert where(conn, "checkpoints", rid) == [(1, f"pgdurable.checkpoints_p{today:%Y%m%d}")]
    assert where(conn, "run_events", rid) == [(1, f"pgdurable.run_events_p{today:%Y%m%d}")]


def test_rollover_at_a_day_boundary_with_runs_in_flight(conn: psycopg.Connection[Any]) -> None:
    today = db_today(conn)
    tomorrow = today + timedelta(days=1)
    far = today + timedelta(days=12)  # beyond the partitions made ahead: the default
    at(conn, tomorrow - timedelta(microseconds=1))
    runs = [start(conn) for _ in range(3)]
    leased = [claim(conn) for _ in runs]
    for rid, token in leased:
        checkpoint(conn, rid, token, 1)
    at(conn, tomorrow)
    for rid, token in leased:
        checkpoint(conn, rid, token, 2)
    at(conn, far)
    # the lease is an hour: renew by claiming again is not needed; time jumped 11
    # days, so write under a fresh claim
    for rid, _ in leased:
        conn.execute("UPDATE pgdurable.runs SET lease_expires_at = pgdurable.now() + '1 hour'"
                     " WHERE id = %s", (rid,))
    for rid, token in leased:
        checkpoint(conn, rid, token, 3)
    for rid, _ in leased:
        assert where(conn, "checkpoints", rid) == [
            (1, f"pgdurable.checkpoints_p{today:%Y%m%d}"),
            (2, f"pgdurable.checkpoints_p{tomorrow:%Y%m%d}"),
            (3, "pgdurable.checkpoints_default"),
        ]
    # maintenance on that day makes its partition and moves the rows out of the default
    result = maintain_sync(conn, days_ahead=0)
    assert result.created == 3 and not result.skipped  # three history tables
    for rid, token in leased:
        assert where(conn, "checkpoints", rid)[2] == (3, f"pgdurable.checkpoints_p{far:%Y%m%d}")
        assert where(conn, "run_events", rid) == [
            (1, f"pgdurable.run_events_p{today:%Y%m%d}"),
            (2, f"pgdurable.run_events_p{tomorrow:%Y%m%d}"),
            (3, f"pgdurable.run_events_p{far:%Y%m%d}"),
        ]
        row = conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w1', '{}', '1')",
                           (rid, token)).fetchone()
        assert row is not None
    assert maintain_sync(conn, days_ahead=0).created == 0  # idempotent
    assert conn.execute("SELECT count(*) FROM pgdurable.checkpoints_default").fetchone() == (0,)


def test_retention_drops_whole_partitions_and_keeps_live_runs_history(
    conn: psycopg.Connection[Any],
) -> None:
    day0 = db_today(conn) + timedelta(hours=12)
    at(conn, day0)
    done_old, live, done_recent = (start(conn) for _ in range(3))
    for _ in range(3):
        rid, token = claim(conn)
        checkpoint(conn, rid, token, 1)
        if rid == done_old:
            conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w1', '{}', '1')", (rid, token))
    # done_recent finishes 20 days later (in its own day's default partition)
    at(conn, day0 + timedelta(days=20))
    conn.execute("UPDATE pgdurable.runs SET lease_expires_at = pgdurable.now() + '1 hour'"
                 " WHERE id = %s", (done_recent,))
    token = conn.execute("SELECT lease_token FROM pgdurable.runs WHERE id = %s",
                         (done_recent,)).fetchone()[0]  # type: ignore[index]
    conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w1', '{}', '1')", (done_recent, token))
    at(conn, day0 + timedelta(days=40))
    result = prune_sync(conn, "30d")
    day = f"{day0:%Y%m%d}"
    assert result.partitions == 12  # 4 days x 3 tables, all ended before the cut-off
    assert result.runs == 1
    # done_old's: a checkpoint and an event per step, its last (complete_run) and the final event
    assert result.checkpoints == 2 and result.events == 2
    names = set(parts(conn, "checkpoints")) | set(parts(conn, "run_events"))
    assert f"checkpoints_p{day}" not in names and f"run_events_p{day}" not in names
    # the live run and the run finished inside the window keep their whole history
    for rid in (live, done_recent):
        assert where(conn, "checkpoints", rid)[0] == (1, "pgdurable.checkpoints_default")
        assert where(conn, "run_events", rid)[0] == (1, "pgdurable.run_events_default")
    assert conn.execute("SELECT count(*) FROM pgdurable.runs WHERE id = %s",
                        (done_old,)).fetchone() == (0,)
    # later, when done_recent is old enough, it goes row by row with its run
    at(conn, day0 + timedelta(days=60))
    result = prune_sync(conn, "30d")
    assert result.runs == 1 and result.checkpoints == 2 and result.partitions == 0
    assert conn.execute("SELECT run_id FROM pgdurable.checkpoints").fetchall() == [(live,)]


def test_maintain_rejects_bad_input_and_changes_nothing(conn: psycopg.Connection[Any]) -> None:
    before = conn.execute("SELECT count(*) FROM pgdurable.history_partitions").fetchone()
    with pytest.raises(InvalidInput):
        maintain_sync(conn, days_ahead=-1)
    with pytest.raises(InvalidInput):
        maintain_sync(conn, days_ahead=367)
    with pytest.raises(TypeError):
        maintain_sync(conn, days_ahead="7")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        maintain_sync(conn, older_than="30 days")
    with pytest.raises(TypeError):
        maintain_sync(object())  # type: ignore[arg-type]
    assert conn.execute("SELECT count(*) FROM pgdurable.history_partitions").fetchone() == before


async def test_maintain_async_and_leader_election(dsn: str) -> None:
    behind = days_behind(dsn)
    result = await maintain(dsn, days_ahead=10)
    assert result.created == 3 * (7 + behind)  # days 4 to 10 ahead, three tables
    with psycopg.connect(dsn, autocommit=True) as c:
        assert c.execute("SELECT acquired FROM pgdurable.acquire_lease(%s, 'other', 60000)",
                         (pgdurable.ops.partitions.MAINTENANCE_LEASE,)).fetchone() == (True,)
        assert maintain_sync(c, days_ahead=20, _lead=("me", 60000)).skipped
        assert maintain_sync(c, days_ahead=20, _lead=("other", 60000)).created == 30


def test_cli_maintain(dsn: str) -> None:
    behind = days_behind(dsn)
    out = subprocess.run([sys.executable, "-m", "pgdurable", "maintain", "--dsn", dsn,
                          "--days-ahead", "9", "--json"], capture_output=True, text=True,
                         check=True).stdout
    # days 4 to 9 ahead, three tables (and the days since the template, if any)
    assert f'"created": {3 * (6 + behind)}' in out


# the checkpoint columns before 0018 (later migrations may add more)
_CP_COLUMNS = "run_id, step, token, state, created_at, wake"


def test_migration_from_an_unpartitioned_installation_with_data(
    empty_dsn: str) -> None:
    mine = next(m for m in migrations.load_migrations()
                if m.name.endswith("_partitioned_history.sql"))
    migrate_released(empty_dsn, mine.version - 1)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT relkind FROM pg_class WHERE oid = 'pgdurable.checkpoints'"
                         "::regclass").fetchone() == ("r",)
        # runs of every age, each with checkpoints and events; a workflow row; a thread
        c.execute("""
          WITH r AS (
            INSERT INTO pgdurable.runs (task, revision, queue, status, step, finished_at,
                                        created_at)
            SELECT 't', '1', 'default', CASE WHEN g % 2 = 0 THEN 'completed' ELSE 'waiting' END,
                   3, CASE WHEN g % 2 = 0 THEN pgdurable.now() END,
                   pgdurable.now() - interval '41 days'
              FROM generate_series(1, 40) g RETURNING id),
          a AS (SELECT id, row_number() OVER () AS k FROM r),
          cp AS (INSERT INTO pgdurable.checkpoints (run_id, step, token, state, created_at, wake)
                 SELECT id, s, 1, jsonb_build_object('workflow', jsonb_build_object(
                          'kind', 'step', 'name', 'n' || s)),
                        pgdurable.now() - (k || ' days')::interval + (s || ' s')::interval,
                        CASE WHEN s = 2 THEN '{"w": 1}'::jsonb END
                   FROM a, generate_series(1, 3) s)
          INSERT INTO pgdurable.run_events (run_id, seq, event, created_at, step, idx, token)
          SELECT id, s, to_jsonb(s), pgdurable.now() - (k || ' days')::interval, s - 1, 0, 1
            FROM a, generate_series(1, 2) s""")
        cps = c.execute(f"SELECT {_CP_COLUMNS} FROM pgdurable.checkpoints ORDER BY run_id, step"
                        ).fetchall()
        evs = c.execute("SELECT * FROM pgdurable.run_events ORDER BY run_id, seq").fetchall()
        wf = c.execute("SELECT * FROM pgdurable.workflow_steps ORDER BY run_id, position"
                       ).fetchall()
    assert len(cps) == 120 and len(evs) == 80 and len(wf) == 120
    applied = pgdurable.migrate(empty_dsn)
    assert mine.version in [m.version for m in applied]
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT relkind FROM pg_class WHERE oid = 'pgdurable.checkpoints'"
                         "::regclass").fetchone() == ("p",)
        assert c.execute("SELECT to_regclass('pgdurable.checkpoints_unpartitioned')"
                         ).fetchone() == (None,)
        assert c.execute(f"SELECT {_CP_COLUMNS} FROM pgdurable.checkpoints ORDER BY run_id, step"
                         ).fetchall() == cps
        assert c.execute("SELECT * FROM pgdurable.run_events ORDER BY run_id, seq"
                         ).fetchall() == evs
        assert c.execute("SELECT * FROM pgdurable.workflow_steps ORDER BY run_id, position"
                         ).fetchall() == wf
        # 35 days back are daily partitions; older history is in the default partition
        spread = dict(c.execute(
            "SELECT tableoid::regclass::text LIKE '%%default', count(*)"
            " FROM pgdurable.checkpoints GROUP BY 1").fetchall())
        assert spread[True] > 0 and spread[False] > 0
        c.execute("SELECT * FROM pgdurable.thread_owners").fetchall()
    # the engine still works end to end on the migrated schema
    app = pgdurable.Durable(empty_dsn)

    @app.task("count", revision="1")
    async def count(ctx: RunContext, state: Any) -> Any:
        await ctx.emit({"at": state["n"]})
        return Continue({"n": state["n"] + 1}) if state["n"] < 3 else Done(state["n"])

    async def go() -> Any:
        try:
            rid = await app.start("count", {"n": 0})
            await run_until_idle(app)
            return rid
        finally:
            await app.close()

    import asyncio

    rid = asyncio.run(go())
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT status, result FROM pgdurable.runs WHERE id = %s",
                         (rid,)).fetchone() == ("completed", 3)
        assert c.execute("SELECT count(*) FROM pgdurable.checkpoints WHERE run_id = %s",
                         (rid,)).fetchone() == (4,)


def test_partition_helper_creates_only_partition_names(conn: psycopg.Connection[Any]) -> None:
    for table, name in (("runs", "runs_p20260101"), ("checkpoints", "leases2"),
                        ("checkpoints", "run_events_p20260101"),
                        ("checkpoints", "checkpoints_p2026")):
        with pytest.raises(psycopg.Error, match="not a partition name"):
            conn.execute("SELECT pgdurable._history_partition(%s, %s)", (table, name))
    assert conn.execute("SELECT to_regclass('pgdurable.leases2')").fetchone() == (None,)


async def test_run_maintenance_next_to_workers_is_leader_elected(dsn: str) -> None:
    import asyncio

    from pgdurable.ops.partitions import MAINTENANCE_LEASE, run_maintenance
    from tests._waiting import until

    last = f"checkpoints_p{(datetime.now(UTC) + timedelta(days=6)):%Y%m%d}"

    async def made() -> bool:
        async with await psycopg.AsyncConnection.connect(dsn) as c:
            cur = await c.execute("SELECT count(*) FROM pgdurable.history_partitions"
                                  " WHERE partition_name = %s", (last,))
            return (await cur.fetchone()) == (1,)

    stop = asyncio.Event()
    fleet = [asyncio.create_task(run_maintenance(dsn, every=0.05, days_ahead=6, stop=stop))
             for _ in range(3)]
    try:
        await until(made, "the leader made the partitions")
    finally:
        stop.set()
        await asyncio.gather(*fleet)
    with psycopg.connect(dsn) as c:
        owners = c.execute("SELECT owner FROM pgdurable.active_leases WHERE key = %s",
                           (MAINTENANCE_LEASE,)).fetchall()
    assert len(owners) == 1 and owners[0][0].startswith("maintenance:")
