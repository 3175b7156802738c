"""Flow control across all workers (issue 13): queue and per-key concurrency,
fair rotation between keys, start rates, shared token buckets, delayed start.

The limits are enforced by the database inside claim_runs, so the process
tests run several real ``python -m pgdurable.worker`` processes (the ``fleet``
fixture, tests/fix_fleet.py) against one
database and check the database's own record: a statement trigger on
pgdurable.runs (created by the test; its function lives in schema pgdurable,
as the workers' schema check requires) writes down, after every statement that
changed runs, how many runs of the queue were leased at that moment (the
high-water mark); a row trigger on pgdurable.buckets writes down when each
take of the bucket is due.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from _waiting import WAIT_LIMIT, until_sync
from fix_fleet import Fleet

import pgdurable
from pgdurable import InvalidInput, RateLimited

START = ("SELECT run_id FROM pgdurable.start_run_flow(%s, '1', %s::jsonb, %s, 0, 3, NULL, NULL, "
         "NULL, NULL, %s, NULL, NULL)")

pytestmark = pytest.mark.fleet("_flow_app:app", concurrency=16, ttl=10.0, poll=5.0)

HW = """
CREATE TABLE flow_hw (n bigint, per_key bigint);
CREATE FUNCTION pgdurable.test_flow_hw_trg() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.flow_hw
  SELECT (SELECT count(*) FROM pgdurable.runs r WHERE r.status = 'leased'
             AND r.queue = TG_ARGV[0] AND r.lease_expires_at > now()),
         (SELECT coalesce(max(x.c), 0) FROM (
             SELECT count(*) AS c FROM pgdurable.runs r WHERE r.status = 'leased'
                AND r.queue = TG_ARGV[0] AND r.lease_expires_at > now()
                AND r.concurrency_key <> '' GROUP BY r.concurrency_key) x);
  RETURN NULL;
END $$;
CREATE TRIGGER flow_hw AFTER UPDATE ON pgdurable.runs
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable.test_flow_hw_trg('{queue}');
"""


def one(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def start_many(conn: psycopg.Connection[Any], n: int, queue: str, key: str = "",
               task: str = "work", state: str = "{}") -> None:
    conn.execute(
        "SELECT pgdurable.start_run_flow(%s, '1', %s::jsonb, %s, 0, 3, NULL, NULL, NULL, NULL, "
        "%s, NULL, NULL) FROM generate_series(1, %s)", (task, state, queue, key, n))


def unfinished(conn: psycopg.Connection[Any], queue: str) -> int:
    return int(one(conn, "SELECT count(*) FROM pgdurable.runs WHERE queue = %s "
                         "AND status NOT IN ('completed')", queue))


def until_done(conn: psycopg.Connection[Any], queue: str, timeout: float = 300.0) -> None:
    until_sync(lambda: unfinished(conn, queue) == 0, f"every run of {queue} completed",
               timeout=timeout)


# -- bad input -----------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"concurrency": 0}, "concurrency"),
    ({"concurrency": -3}, "concurrency"),
    ({"per_key_concurrency": 0}, "per_key_concurrency"),
    ({"rate": 0}, "rate"),
    ({"rate": (-1, timedelta(seconds=1))}, "rate"),
    ({"rate": (10, timedelta(0))}, "rate"),
    ({"rate": 5, "burst": 0}, "burst"),
    ({"burst": 5}, "burst"),
])
def test_set_queue_bad_input_writes_nothing(dsn: str, conn: psycopg.Connection[Any],
                                            kwargs: dict[str, Any], name: str) -> None:
    with pgdurable.DurableClient(dsn) as client:
        with pytest.raises(ValueError, match=name):
            client.set_queue("q", **kwargs)
    assert one(conn, "SELECT count(*) FROM pgdurable.queues") == 0


def test_set_queue_bad_input_in_sql_too(conn: psycopg.Connection[Any]) -> None:
    for args in ((0, None, None, None), (None, -1, None, None), (None, None, 0, None),
                 (None, None, 1, 0.5)):
        with pytest.raises(psycopg.Error, match="set_queue") as info:
            conn.execute("SELECT pgdurable.set_queue('q', %s::int, %s::int, %s::numeric, "
                         "%s::numeric)", args)
        assert info.value.sqlstate == "PD000"
    assert one(conn, "SELECT count(*) FROM pgdurable.queues") == 0


async def test_acquire_bad_input_and_unknown_bucket(dsn: str, conn: psycopg.Connection[Any]) -> None:
    async with pgdurable.Durable(dsn) as app:
        with pytest.raises(ValueError, match="rate"):
            await app.set_bucket("b", rate=0)
        with pytest.raises(ValueError, match="burst"):
            await app.set_bucket("b", rate=1, burst=-1)
        assert one(conn, "SELECT count(*) FROM pgdurable.buckets") == 0
        await app.set_bucket("b", rate=(60, timedelta(minutes=1)), burst=5)
        for name, cost, match in (("nope", 1, "unknown bucket name"), ("b", 6, "cost"),
                                  ("b", 0, "cost"), ("b", -1, "cost")):
            with pytest.raises(ValueError, match=match):
                await pgdurable.runs.flow.acquire(app, name, cost)
        # nothing was taken by the refused calls
        assert one(conn, "SELECT tokens FROM pgdurable.buckets") == 5
        with pytest.raises(InvalidInput):
            await pgdurable.runs.flow.acquire(app, "nope", 1)


def test_start_bad_flow_input(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with pgdurable.DurableClient(dsn) as client:
        for kwargs, err in (({"delay": timedelta(seconds=-1)}, ValueError),
                            ({"at": datetime(2030, 1, 1)}, ValueError),
                            ({"at": datetime.now(UTC), "delay": timedelta(1)}, ValueError),
                            ({"key": ""}, ValueError), ({"key": 3}, TypeError),
                            ({"delay": 5}, TypeError)):
            with pytest.raises(err):
                client.start("work", {}, revision="1", **kwargs)
    assert one(conn, "SELECT count(*) FROM pgdurable.runs") == 0


# -- delayed start, keys, views --------------------------------------------------


def test_delayed_start_is_visible_and_not_claimed_early(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with pgdurable.DurableClient(dsn) as client:
        a = client.start("work", {}, revision="1", delay=timedelta(hours=1), key="tenant:a")
        at = datetime.now(UTC) + timedelta(days=1)
        b = client.start("work", {}, revision="1", at=at)
        c = client.start("work", {}, revision="1")
    rows = conn.execute("SELECT id::text, key, starts_at FROM pgdurable.delayed_runs "
                        "ORDER BY starts_at").fetchall()
    assert [r[0] for r in rows] == [a, b]
    assert rows[0][1] == "tenant:a" and rows[1][2] == at
    claimed = conn.execute("SELECT id::text FROM pgdurable.claim_runs('w', '{default}', '{work}', "
                           "'{1}', 10, '60 s')").fetchall()
    assert [r[0] for r in claimed] == [c]
    wait = one(conn, "SELECT pgdurable.next_wakeup('{default}', '{work}', '{1}')")
    assert wait is not None and wait > 0  # c's lease expiry (60 s), not a busy poll
    later = datetime.now(UTC) + timedelta(hours=2)
    conn.execute("SELECT set_config('pgdurable.now', %s, false)", (str(later),))
    claimed = conn.execute("SELECT id::text FROM pgdurable.claim_runs('w', '{default}', '{work}', "
                           "'{1}', 10, '60 s')").fetchall()
    ids = {r[0] for r in claimed}
    assert a in ids and b not in ids  # (c's lease lapsed too: reclaimed)


def test_views_show_limits_keys_and_buckets(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with pgdurable.DurableClient(dsn) as client:
        client.set_queue("llm", concurrency=20, per_key_concurrency=2,
                         rate=(600, timedelta(minutes=1)))
        client.set_bucket("openai", rate=100, burst=1000)
        for key in ("t1", "t1", "t2"):
            client.start("work", {}, revision="1", queue="llm", key=key)
    row = conn.execute("SELECT concurrency, per_key_concurrency, rate_per_second, burst, active, "
                       "keys_queued FROM pgdurable.queue_limits").fetchone()
    assert row == (20, 2, 10, 10, 0, 2)
    assert conn.execute("SELECT key, queued FROM pgdurable.queue_keys WHERE queue = 'llm' "
                        "ORDER BY key").fetchall() == [("t1", 2), ("t2", 1)]
    assert one(conn, "SELECT tokens FROM pgdurable.bucket_levels") == 1000
    for view in ("queue_limits", "queue_keys", "bucket_levels", "delayed_runs"):
        assert one(conn, "SELECT obj_description(%s::regclass)", f"pgdurable.{view}")
    # removing every limit takes the queue back to the plain claim
    with pgdurable.DurableClient(dsn) as client:
        client.set_queue("llm")
    assert one(conn, "SELECT count(*) FROM pgdurable.queues") == 0


def test_limits_changed_at_run_time_apply_at_the_next_claim(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pgdurable.set_queue('q', 2, NULL, NULL, NULL)")
    start_many(conn, 10, "q")
    claim = ("SELECT count(*) FROM pgdurable.claim_runs(%s, '{q}', '{work}', '{1}', 10, '60 s')")
    assert one(conn, claim, "w1") == 2
    assert one(conn, claim, "w2") == 0
    conn.execute("SELECT pgdurable.set_queue('q', 5, NULL, NULL, NULL)")
    assert one(conn, claim, "w2") == 3
    conn.execute("SELECT pgdurable.set_queue('q', NULL, NULL, NULL, NULL)")
    assert one(conn, claim, "w3") == 5


def test_queue_start_rate(conn: psycopg.Connection[Any]) -> None:
    """rate 1/s, burst 3: three runs at once, then one per second (test clock)."""
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    conn.execute("SELECT set_config('pgdurable.now', %s, false)", (str(t0),))
    conn.execute("SELECT pgdurable.set_queue('q', NULL, NULL, 1, 3)")
    start_many(conn, 10, "q")
    claim = ("SELECT count(*) FROM pgdurable.claim_runs('w', '{q}', '{work}', '{1}', 10, '1 h')")
    assert one(conn, claim) == 3
    assert one(conn, claim) == 0
    # no busy poll: next_wakeup says when the next token is due
    assert one(conn, "SELECT pgdurable.next_wakeup('{q}', '{work}', '{1}')") == pytest.approx(1.0)
    later = t0 + timedelta(seconds=2.5)
    conn.execute("SELECT set_config('pgdurable.now', %s, false)", (str(later),))
    assert one(conn, claim) == 2


def test_completion_frees_a_slot_and_notifies(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pgdurable.set_queue('q', 1, NULL, NULL, NULL)")
    start_many(conn, 2, "q")
    rid, token = conn.execute("SELECT id, lease_token FROM pgdurable.claim_runs('w', '{q}', "
                              "'{work}', '{1}', 10, '60 s')").fetchone() or (None, None)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgdurable_wake")
        conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w', '{}', 'null', 0)", (rid, token))
        got = [n.payload for n in listener.notifies(timeout=WAIT_LIMIT, stop_after=1)]
    assert got == ["q"]
    assert one(conn, "SELECT count(*) FROM pgdurable.claim_runs('w2', '{q}', '{work}', '{1}', "
                     "10, '60 s')") == 1


# -- fairness --------------------------------------------------------------------


def test_fairness_small_keys_start_before_100_more_of_the_big_key(
        conn: psycopg.Connection[Any]) -> None:
    """5,000 runs of one key first, then 20 keys with one run each: every one
    of the 20 starts before 100 more runs of the big key do."""
    conn.execute("SELECT pgdurable.set_queue('fair', 8, NULL, NULL, NULL)")
    start_many(conn, 5000, "fair", key="tenant:big")
    # the big key's backlog is already being served
    claim = ("SELECT c.id, c.lease_token, r.concurrency_key FROM pgdurable.claim_runs('w', "
             "'{fair}', '{work}', '{1}', 4, '60 s') c JOIN pgdurable.runs r USING (id)")
    done = "SELECT pgdurable.complete_run(%s, %s, 'w', '{}', 'null', 0)"
    for rid, token, _ in conn.execute(claim).fetchall():
        conn.execute(done, (rid, token))
    for i in range(20):
        start_many(conn, 1, "fair", key=f"tenant:{i:02d}")
    big = 0
    small: set[str] = set()
    while len(small) < 20:
        rows = conn.execute(claim).fetchall()
        assert rows
        for rid, token, key in rows:
            if key == "tenant:big":
                big += 1
            else:
                small.add(key)
            conn.execute(done, (rid, token))
    assert big < 100, big
    assert big <= 6  # one per round of keys


# -- real processes ----------------------------------------------------------------


@pytest.mark.slow
def test_queue_cap_holds_across_four_worker_processes(
        dsn: str, conn: psycopg.Connection[Any], fleet: Fleet) -> None:
    """4 processes x concurrency 16 on a queue capped at 5: never more than 5
    leased at once (trigger-kept high-water mark), and the cap is used."""
    n = int(os.environ.get("FLOW_CAP_RUNS", "2000"))
    conn.execute(HW.format(queue="capped"))
    conn.execute("SELECT pgdurable.set_queue('capped', 5, NULL, NULL, NULL)")
    start_many(conn, n, "capped", state='{"sleep": 0.002}')
    for i in range(4):
        fleet.start(f"cap{i}", queues="capped", concurrency=16)
    until_done(conn, "capped")
    high = one(conn, "SELECT max(n) FROM flow_hw")
    assert high == 5, high
    # nothing leaks: every slot is free again
    assert one(conn, "SELECT active FROM pgdurable.queue_limits") == 0


def test_per_key_limit_one_with_three_keys(dsn: str, conn: psycopg.Connection[Any],
                                           fleet: Fleet) -> None:
    conn.execute(HW.format(queue="perkey"))
    conn.execute("SELECT pgdurable.set_queue('perkey', NULL, 1, NULL, NULL)")
    for key in ("a", "b", "c"):
        start_many(conn, 15, "perkey", key=key, state='{"sleep": 0.02}')
    fleet.start("pk0", queues="perkey", concurrency=8)
    fleet.start("pk1", queues="perkey", concurrency=8)
    until_done(conn, "perkey")
    per_key, total = conn.execute("SELECT max(per_key), max(n) FROM flow_hw").fetchone() or (0, 0)
    assert per_key == 1
    assert 1 <= total <= 3


def test_sigkilled_worker_slots_come_back_when_its_leases_lapse(
        dsn: str, conn: psycopg.Connection[Any], fleet: Fleet) -> None:
    ttl = 2.0
    conn.execute(HW.format(queue="capk"))
    conn.execute("SELECT pgdurable.set_queue('capk', 5, NULL, NULL, NULL)")
    start_many(conn, 10, "capk", state='{"sleep": 3600}')
    a = fleet.start("A", queues="capk", concurrency=5, ttl=ttl)
    held = ("SELECT count(*) FROM pgdurable.runs WHERE status = 'leased' AND lease_owner = %s "
            "AND lease_expires_at > now()")
    until_sync(lambda: one(conn, held, "A") == 5, "A holds the 5 slots")
    b = fleet.start("B", queues="capk", concurrency=5, ttl=ttl)
    # B's claim loop claims first, then asks next_wakeup: either as a connection's
    # latest statement means B has claimed (a claim alone is seen only while in flight)
    until_sync(lambda: one(conn, "SELECT count(*) FROM pg_stat_activity WHERE application_name "
                                 "= %s AND (query LIKE '%%claim_runs%%' "
                                 "OR query LIKE '%%next_wakeup%%')", b.app_name) > 0,
               "B tried to claim")
    assert one(conn, held, "B") == 0  # the cap holds: B gets nothing while A lives
    a.kill()
    lapse = one(conn, "SELECT max(lease_expires_at) FROM pgdurable.runs WHERE lease_owner = 'A'")
    until_sync(lambda: one(conn, held, "B") == 5, "B takes the 5 slots")
    latest = one(conn, "SELECT max(leased_at) FROM pgdurable.runs WHERE lease_owner = 'B'")
    assert latest <= lapse + timedelta(seconds=1), (latest, lapse)
    assert one(conn, "SELECT max(n) FROM flow_hw") <= 5


def test_shared_bucket_rate_across_four_processes(dsn: str, conn: psycopg.Connection[Any],
                                                  fleet: Fleet) -> None:
    """A 50 tokens/s bucket (burst 10) shared by 4 worker processes: over the
    run, takes stay within [rate*t - burst, rate*t + burst]."""
    rate, burst, n = 50.0, 10.0, 600
    conn.execute("CREATE TABLE flow_acq (run_id uuid, at timestamptz DEFAULT clock_timestamp())")
    conn.execute("""
      CREATE TABLE flow_due (due timestamptz);
      CREATE FUNCTION pgdurable.test_flow_due_trg() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        INSERT INTO public.flow_due VALUES (NEW.refilled_at
          + make_interval(secs => greatest(0, -NEW.tokens) / NEW.rate));
        RETURN NULL;
      END $$;
      CREATE TRIGGER flow_due AFTER UPDATE ON pgdurable.buckets
        FOR EACH ROW EXECUTE FUNCTION pgdurable.test_flow_due_trg();
    """)
    conn.execute("SELECT pgdurable.set_bucket('shared', %s::numeric, %s::numeric)", (rate, burst))
    start_many(conn, n, "metered", task="metered", state='{"bucket": "shared"}')
    for i in range(4):
        fleet.start(f"tb{i}", queues="metered", concurrency=16)
    until_done(conn, "metered")
    assert one(conn, "SELECT count(*) FROM flow_acq") == n
    # every run reserved (or took) its token exactly once: no retry storm
    dues = [r[0] for r in conn.execute("SELECT due FROM flow_due ORDER BY due").fetchall()]
    assert len(dues) == n
    first = dues[0]
    for i, d in enumerate(dues, 1):
        assert i <= burst + rate * (d - first).total_seconds() + 1e-6
    t = (dues[-1] - first).total_seconds()
    assert rate * t - burst <= n <= rate * t + burst, (n, t)
    # and no run went ahead before its token was due
    acq = [r[0] for r in conn.execute("SELECT at FROM flow_acq ORDER BY at").fetchall()]
    for i, at in enumerate(acq, 1):
        assert i <= burst + rate * (at - first).total_seconds() + 1e-6


async def test_acquire_in_a_step_parks_until_the_tokens_are_due(dsn: str) -> None:
    """In-process: a step's acquire on an empty bucket parks the run on a
    timer (waiting, wake_at set, no worker slot) and the run completes after."""
    from _waiting import app_running, finished

    async with pgdurable.Durable(dsn) as app:
        calls: list[int] = []

        @app.task("meter")
        async def meter(ctx: pgdurable.RunContext, state: Any) -> Any:
            calls.append(ctx.step)
            await ctx.acquire("slow", 1)
            return pgdurable.Done(ctx.step)

        await app.set_bucket("slow", rate=2, burst=1)
        ids = [await app.start("meter", {}) for _ in range(3)]
        async with app_running(app, concurrency=3):
            infos = [await finished(app, i) for i in ids]
        assert sorted(i.result for i in infos) == [0, 1, 1]
        assert len(calls) == 5  # two parked once each, then went on without a second acquire


def test_rate_limited_from_headers() -> None:
    assert RateLimited.from_headers({"Retry-After": "7"}).retry_after == 7
    assert RateLimited.from_headers({"x-ratelimit-reset-tokens": "6m0s"}).retry_after == 360
    assert RateLimited.from_headers({"x-ratelimit-reset-requests": "250ms"}).retry_after == 0.25
    assert RateLimited.from_headers({}).retry_after == 1.0
    with pytest.raises(ValueError):
        RateLimited(datetime(2030, 1, 1))


def test_stats_and_buckets_commands_show_limits(dsn: str, conn: psycopg.Connection[Any]) -> None:
    import json

    from typer.testing import CliRunner

    from pgdurable.ops.cli import app as cli_app

    conn.execute("SELECT pgdurable.set_queue('llm', 20, 2, 10, 20)")
    conn.execute("SELECT pgdurable.set_bucket('openai', 100, 1000)")
    start_many(conn, 3, "llm", key="t1")
    env = {"PGDURABLE_DSN": dsn}
    r = CliRunner().invoke(cli_app, ["stats", "--json"], env=env, catch_exceptions=False)
    assert r.exit_code == 0, r.stdout
    row = {x["queue"]: x for x in json.loads(r.stdout)}["llm"]
    assert (row["concurrency"], row["active"], row["per_key_concurrency"], row["keys_queued"]) \
        == (20, 0, 2, 1)
    r = CliRunner().invoke(cli_app, ["stats"], env=env, catch_exceptions=False)
    assert r.exit_code == 0 and "queue limits" in r.stdout and "openai" in r.stdout
    r = CliRunner().invoke(cli_app, ["buckets", "--json"], env=env, catch_exceptions=False)
    assert [(b["name"], b["tokens"]) for b in json.loads(r.stdout)] == [("openai", 1000)]
