"""list_runs on 1,000,000 runs vs 10,000, and the dashboard's run page.

One command::

    .venv/bin/python benchmarks/list_runs.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--big 1000000] [--small 10000] [--samples 200]

Two scratch databases with the same distribution, filled with one
``generate_series`` INSERT each: 10 tasks, 5 queues, 10 tenants in
``metadata`` (``{"tenant": "tN", "user": "uM"}``), statuses 70 % completed /
10 % failed / 10 % waiting / 10 % runnable (pseudo-random, independent of the
tenant), created one second apart. Then ``ANALYZE``.

1. ``list_runs(status="failed", metadata={"tenant": "t3"}, limit=50)`` (the
   first page) and the page after it (its cursor), p50 over ``--samples``
   calls on each database, alternating (load hits both alike); printed: the
   ratio big/small and the plan on the big one.
2. The dashboard run page of a run with 200 checkpoints, served by uvicorn
   (in this process, over HTTP with httpx), p50 vs a trivial page of the same
   app (a 404 page rendered from the same templates, no query).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
from datetime import UTC, datetime

import httpx
import psycopg
import uvicorn
from _scratch import drop_scratch, scratch_dsn

from pgdurable import DurableClient
from pgdurable.ops.dashboard import create_app
from pgdurable.runs.search import encode_cursor, list_runs_query

DBS = ("pgdurable_bench_list_big", "pgdurable_bench_list_small")
FILL = """
INSERT INTO pgdurable.runs (task, revision, queue, status, metadata, created_at, finished_at)
SELECT 't' || (g %% 10), '1', 'q' || (g %% 5), s.status,
       jsonb_build_object('tenant', 't' || ((g * 7) %% 10), 'user', 'u' || (g %% 1000)),
       now() - make_interval(secs => g), CASE WHEN s.status IN ('completed', 'failed') THEN now() END
  FROM generate_series(1, %s) g,
       LATERAL (SELECT CASE WHEN h < 70 THEN 'completed' WHEN h < 80 THEN 'failed'
                            WHEN h < 90 THEN 'waiting' ELSE 'runnable' END AS status
                  FROM (SELECT abs(hashint4(g)) %% 100 AS h) x) s
"""
FILTERS = {"status": "failed", "metadata": {"tenant": "t3"}, "limit": 50}


def p50(xs: list[float]) -> float:
    return statistics.median(xs)


def fill(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(FILL, (n,))
        c.execute("VACUUM ANALYZE pgdurable.runs")


def time_list(dsns: list[str], samples: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    conns = [psycopg.connect(d, autocommit=True) for d in dsns]
    try:
        first_sql, first_params = list_runs_query(**FILTERS)  # type: ignore[arg-type]
        cursors = []
        for c in conns:
            rows = c.execute(first_sql, first_params).fetchall()
            last = rows[49]

            cursors.append(encode_cursor(last[16], str(last[0])))
        for _ in range(samples):
            for name, c, cur in zip(("big", "small"), conns, cursors, strict=True):
                t = time.perf_counter()
                c.execute(first_sql, first_params, prepare=True).fetchall()
                out.setdefault(f"{name} page 1", []).append(time.perf_counter() - t)
                q, p = list_runs_query(**FILTERS, cursor=cur)  # type: ignore[arg-type]
                t = time.perf_counter()
                c.execute(q, p, prepare=True).fetchall()
                out.setdefault(f"{name} page 2", []).append(time.perf_counter() - t)
        plan = conns[0].execute("EXPLAIN (ANALYZE, BUFFERS) " + first_sql, first_params).fetchall()
        print("plan (big, page 1):")
        for (line,) in plan:
            print("   ", line)
    finally:
        for c in conns:
            c.close()
    return out


def time_page(dsn: str, samples: int) -> dict[str, list[float]]:
    with DurableClient(dsn) as client:
        rid = client.start("long", {"i": 0}, revision="1", metadata={"tenant": "t3"})
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT * FROM pgdurable.claim_runs('w', '{default}', '{long}', '{1}', 1, "
                  "'10 min')")
        for i in range(1, 201):
            c.execute("SELECT pgdurable.checkpoint_run(%s, 1, 'w', %s::jsonb, 0)",
                      (rid, f'{{"i": {i}, "note": "step {i}"}}'))
    server = uvicorn.Server(uvicorn.Config(create_app(dsn), host="127.0.0.1", port=0,
                                           log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    out: dict[str, list[float]] = {"run page (200 steps)": [], "trivial page": []}
    try:
        with httpx.Client() as http:
            assert http.get(f"{base}/runs/{rid}").text.count('<tr id="step-') == 200
            for _ in range(5):  # warm up
                http.get(f"{base}/runs/{rid}")
            for _ in range(samples):
                t = time.perf_counter()
                r = http.get(f"{base}/runs/{rid}")
                out["run page (200 steps)"].append(time.perf_counter() - t)
                assert r.status_code == 200
                t = time.perf_counter()
                r = http.get(f"{base}/runs/not-a-run")
                out["trivial page"].append(time.perf_counter() - t)
                assert r.status_code == 404
    finally:
        server.should_exit = True
        thread.join(30)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--big", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--samples", type=int, default=200)
    a = ap.parse_args()
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")
    try:
        dsns = [scratch_dsn(a.dsn, db) for db in DBS]
        t = time.perf_counter()
        fill(dsns[0], a.big)
        print(f"filled {a.big:,} runs in {time.perf_counter() - t:.1f} s")
        fill(dsns[1], a.small)
        res = time_list(dsns, a.samples)
        for page in ("page 1", "page 2"):
            big, small = p50(res[f"big {page}"]), p50(res[f"small {page}"])
            print(f"list_runs {page}: p50 {a.big:,} runs {big * 1000:.2f} ms, "
                  f"{a.small:,} runs {small * 1000:.2f} ms, ratio {big / small:.2f} (target <= 2)")
        pages = time_page(dsns[0], a.samples)
        run_p50 = p50(pages["run page (200 steps)"])
        base_p50 = p50(pages["trivial page"])
        print(f"run page (200 steps): p50 {run_p50 * 1000:.1f} ms; trivial page p50 "
              f"{base_p50 * 1000:.1f} ms; ratio {run_p50 / base_p50:.1f} (target < 50 ms)")
    finally:
        drop_scratch(a.dsn, *DBS)


if __name__ == "__main__":
    main()
