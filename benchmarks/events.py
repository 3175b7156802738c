"""Events (issue 43): what a send costs, and how soon a trigger's run starts.

One command::

    .venv/bin/python benchmarks/events.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--seconds 3] [--rounds 3] [--senders 8] [--samples 200] [--profile 2000]

``--dsn`` names a maintenance database; the benchmark creates (and drops) the
scratch database ``pgdurable_bench_events``.

1. **Accepted events/s at ``--senders`` concurrent senders** (threads, one
   autocommit connection each, prepared statements), each contender for
   ``--seconds``, interleaved for ``--rounds``: ``send_event`` with a dedup id and
   nothing listening; ``send_event`` with one debounce trigger keyed over 100
   keys (each event joins or opens a window: a run row per window); and the
   baseline, a bare ``INSERT`` of the same row (name, data, id) into a plain
   table with the same unique (name, id) key. Printed: events/s and ratio.
   Then, for the debounced send, where its time goes: one session sends
   ``--profile`` events with ``track_functions = all`` (self time per SQL function,
   from ``pg_stat_user_functions``), and the senders' lock waits while 8 of them
   ran (``pg_stat_activity`` sampled every 10 ms: the share of samples in which a
   sender waited on a lock, by lock type).
2. **Trigger latency**: one worker in this process; ``--samples`` times, one at a
   time, an event whose trigger starts one run per event, from the moment
   ``send_event`` returned (committed) to the handler's first line; against the
   baseline, ``start()`` returned -> the step's first line. p50 and p90.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
from _scratch import drop_scratch, scratch_dsn

from pgdurable import Done, Durable, Event, RunContext

DB = "pgdurable_bench_events"
SEND = "SELECT * FROM pgdurable.send_event(%s::text, %s::jsonb, %s::text)"
BARE = ("INSERT INTO bench_events (name, data, event_key) VALUES (%s::text, %s::jsonb, %s::text) "
        "RETURNING id")
TABLE = ("CREATE TABLE bench_events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
         "name text NOT NULL, data jsonb NOT NULL, event_key text, "
         "created_at timestamptz NOT NULL DEFAULT now(), UNIQUE (name, event_key))")


def rate(dsn: str, sql: str, name: str, senders: int, seconds: float) -> float:
    """Events/s of ``senders`` threads sending ``sql`` for ``seconds``."""
    counts = [0] * senders
    stop = time.perf_counter() + seconds
    start = threading.Barrier(senders)

    def send(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            start.wait()
            n = 0
            while time.perf_counter() < stop:
                conn.execute(sql, (name, f'{{"k": "k{n % 100}", "n": {n}}}', uuid.uuid4().hex),
                             prepare=True)
                n += 1
            counts[i] = n

    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


class LockSampler(threading.Thread):
    """Samples the senders' wait events every 10 ms (a separate connection)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.samples = dsn, 0
        self.waits: dict[str, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                for kind, n in conn.execute(
                        "SELECT coalesce(wait_event_type || ':' || wait_event, 'cpu'), count(*) "
                        "FROM pg_stat_activity WHERE datname = current_database() "
                        "AND pid <> pg_backend_pid() AND state = 'active' "
                        "AND query LIKE '%%send_event%%' GROUP BY 1"):
                    self.waits[kind] = self.waits.get(kind, 0) + n
                self.samples += 1
                time.sleep(0.01)


def profile(dsn: str, n: int, senders: int) -> None:
    """Self time per SQL function of ``n`` debounced sends from one session, and the lock
    waits of ``senders`` concurrent senders."""
    sampler = LockSampler(dsn)
    sampler.start()
    rate(dsn, SEND, "bench.keyed", senders, 2.0)
    sampler.stop.set()
    sampler.join()
    total = sum(sampler.waits.values()) or 1
    print(f"  {senders} debounced senders, what they were doing ({total} samples):",
          ", ".join(f"{k} {v / total:.0%}" for k, v in
                    sorted(sampler.waits.items(), key=lambda kv: -kv[1])[:6]))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET track_functions = 'all'")
        conn.execute("SELECT pg_stat_reset()")
        t0 = time.perf_counter()
        for i in range(n):
            conn.execute(SEND, ("bench.keyed", f'{{"k": "k{i % 100}", "p": {i}}}',
                                uuid.uuid4().hex), prepare=True)
        per = (time.perf_counter() - t0) / n * 1e6
        time.sleep(0.6)  # the statistics are flushed after 500 ms
        rows = conn.execute(
            "SELECT funcname, self_time / calls * 1000 FROM pg_stat_user_functions "
            "WHERE calls > 0 ORDER BY self_time DESC LIMIT 5").fetchall()
    print(f"  one session, {n} debounced sends: {per:.0f} us each; self time per call (us): "
          + ", ".join(f"{name} {us:.0f}" for name, us in rows))


def throughput(dsn: str, seconds: float, rounds: int, senders: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLE)
        conn.execute("SELECT pgdurable.upsert_event_trigger('bench_debounce', 'bench.keyed', "
                     "'nobody', '1', 'bench', 3, 'data.k', '1 hour', NULL, false, NULL, NULL)")
    contenders = [("send_event", SEND, "bench.plain"), ("send_event + debounce", SEND,
                                                        "bench.keyed"),
                  ("bare INSERT", BARE, "bench.plain")]
    best: dict[str, float] = {}
    for _name, sql, event in contenders:  # warm-up
        rate(dsn, sql, event, senders, 0.5)
    for _ in range(rounds):
        for name, sql, event in contenders:
            best[name] = max(best.get(name, 0.0), rate(dsn, sql, event, senders, seconds))
    base = best["bare INSERT"]
    print(f"accepted events/s at {senders} senders (best of {rounds} x {seconds:g} s):")
    for name, _, _ in contenders:
        print(f"  {name:24} {best[name]:8.0f}   ratio to bare INSERT {best[name] / base:.2f}")


async def latency(dsn: str, samples: int) -> None:
    app = Durable(dsn)
    started: dict[str, float] = {}
    seen = asyncio.Event()

    @app.on_event("bench.latency")
    async def on_latency(ctx: RunContext, events: list[Event]) -> None:
        started[str(events[0].data["i"])] = time.perf_counter()
        seen.set()

    @app.task("bench_direct")
    async def direct(ctx: RunContext, state: Any) -> Any:
        started[str(state["i"])] = time.perf_counter()
        seen.set()
        return Done()

    async with app:
        await app.declare_triggers()
        worker = app.worker(concurrency=4, lease_ttl=timedelta(seconds=30))
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(1.0)
        trig: list[float] = []
        base: list[float] = []
        try:
            for i in range(samples):
                for kind in ("event", "start"):
                    key = f"{kind}-{i}"
                    seen.clear()
                    if kind == "event":
                        await app.send_event("bench.latency", {"i": key})
                    else:
                        await app.start("bench_direct", {"i": key})
                    t0 = time.perf_counter()
                    await asyncio.wait_for(seen.wait(), 10)
                    (trig if kind == "event" else base).append(started[key] - t0)
                    await asyncio.sleep(0.01)
        finally:
            await worker.stop()
            await task

    def pct(xs: list[float], p: float) -> float:
        return statistics.quantiles(xs, n=100)[int(p) - 1] * 1000

    print(f"run started after commit, ms ({samples} samples each, one worker, NOTIFY):")
    print(f"  trigger (one run per event)  p50 {pct(trig, 50):6.2f}   p90 {pct(trig, 90):6.2f}")
    print(f"  start() (baseline)           p50 {pct(base, 50):6.2f}   p90 {pct(base, 90):6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--senders", type=int, default=8)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--profile", type=int, default=2000, help="sends profiled (0: none)")
    args = ap.parse_args()
    dsn = scratch_dsn(args.dsn, DB)
    try:
        throughput(dsn, args.seconds, args.rounds, args.senders)
        if args.profile:
            profile(dsn, args.profile, args.senders)
        asyncio.run(latency(dsn, args.samples))
    finally:
        drop_scratch(args.dsn, DB)


if __name__ == "__main__":
    main()
