"""What a schema of its own costs: the same runs in schema ``pgdurable`` and in another.

One command::

    .venv/bin/python benchmarks/schemas.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--runs 3000] [--rounds 3] [--concurrency 32]

One scratch database ``pgdurable_bench_schemas`` holds two pgdurable schemas:
``pgdurable`` and ``bench_tenant`` (docs/schemas.md). Per round, alternating which
goes first, one worker process serves each in turn (``PGDURABLE_SCHEMA`` unset, then
``bench_tenant``) and ``--runs`` runs of ``noop3`` (3 no-op steps) are enqueued in
batches and timed to their last completion (benchmarks/_driver.py), with the CPU seconds per
run of the worker and its database's backends read from /proc. Another schema's connections rewrite each
statement's text once (a cached lookup after that: pgdurable/foundation/schemas.py);
the SQL the server runs is the same. Reported: runs/s and CPU per run of
``bench_tenant`` over ``pgdurable``, per round and their spread (target: 1.0 within
the noise).
"""

from __future__ import annotations

import argparse

import psycopg
from _driver import CpuMeter, load, spread, timed_runs, worker_process
from _scratch import drop_scratch, scratch_dsn

import pgdurable

DB = "pgdurable_bench_schemas"
TENANT = "bench_tenant"


def measure(dsn: str, schema: str | None, runs: int, concurrency: int) -> tuple[float, float]:
    """(runs/s, CPU seconds per run of the worker and the backends) of ``runs`` noop3 runs
    in ``schema``."""
    with psycopg.connect(dsn, autocommit=True) as c, worker_process(
            dsn, "_throughput_app:app", concurrency=concurrency, schema=schema) as proc:
        if schema is not None:
            pgdurable.use_schema(c, schema)  # the driver's statements name pgdurable
        timed_runs(c, "noop3", 300)  # warm-up
        meter = CpuMeter(c, proc.pid)
        meter.start()
        secs = timed_runs(c, "noop3", runs)
        cpu = meter.stop()
    if cpu is None:
        raise SystemExit("cannot read CPU times from /proc (is the server on this machine?)")
    return runs / secs, cpu / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    dsn = scratch_dsn(args.dsn, DB)
    pgdurable.migrate(dsn, schema=TENANT)
    try:
        print(f"{args.runs} runs x 3 no-op steps per round and schema, one worker process, "
              f"concurrency {args.concurrency}; {load()}")
        speed, cpu = [], []
        for r in range(1, args.rounds + 1):
            order = [None, TENANT] if r % 2 else [TENANT, None]
            got = {s: measure(dsn, s, args.runs, args.concurrency) for s in order}
            (base_rate, base_cpu), (rate, per_run) = got[None], got[TENANT]
            speed.append(rate / base_rate)
            cpu.append(per_run / base_cpu)
            print(f"round {r}: pgdurable {base_rate:6.0f} runs/s {base_cpu * 1e3:.2f} ms CPU/run"
                  f" | {TENANT} {rate:6.0f} runs/s {per_run * 1e3:.2f} ms CPU/run | "
                  f"ratio runs/s {rate / base_rate:.3f}, CPU/run {per_run / base_cpu:.3f}")
        print(f"{TENANT} / pgdurable: runs/s {spread(speed, '.3f')}, CPU per run "
              f"{spread(cpu, '.3f')}; {load()}")
    finally:
        drop_scratch(args.dsn, DB)


if __name__ == "__main__":
    main()
