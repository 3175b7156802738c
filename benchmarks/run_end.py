"""What a run's end costs the server: one ``runs_end`` trigger
(sql/0027_run_end_trigger.sql) against the three triggers it replaced.

One command::

    .venv/bin/python benchmarks/run_end.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--runs 2000] [--rounds 8]

``--dsn`` names a maintenance database. Three scratch databases are made:

* ``pgdurable_bench_end_new``: migrated as shipped (one trigger, ``runs_end``);
* ``pgdurable_bench_end_old``: migrated up to 0026 (``runs_child_end``,
  ``runs_flow_slot_freed_trg`` and ``runs_stream_end``), then 0028's file run by
  hand (the fences as shipped), the baseline;
* ``pgdurable_bench_end_none``: as shipped with ``runs_end`` disabled, for
  reference only (no done NOTIFY, fan-in, children's policy, freed slot or
  stream end: what the end-of-run work costs in all).

In each round, in alternating order, each database gets ``--runs`` runs
(root runs of an unlimited queue, no listener, no events: the common case);
ONE ``DO`` block then claims each (untimed) and completes it with
``complete_run``, timed with ``clock_timestamp()``: server time per
completion, without the client's round trip or a commit. One run is leased at
a time, and 0028 (which changed how a fence reads its runs:
benchmarks/fence_scaling.py) is in both schemas, so that the fence costs the
same. Printed: µs per completion per round, and the median ratio new / old
(lower is better).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import psycopg
from _scratch import drop_scratch, scratch_dsn

FENCES = Path(__file__).resolve().parent.parent / "sql" / "0028_fence_by_primary_key.sql"
NEW, OLD, NONE = "pgdurable_bench_end_new", "pgdurable_bench_end_old", "pgdurable_bench_end_none"
COMPLETE_EACH = """
DO $$
DECLARE
  r record;
  t0 timestamptz;
  spent interval := interval '0';
BEGIN
  FOR i IN 1..current_setting('bench.runs')::integer LOOP
    SELECT c.id, c.lease_token INTO r
      FROM pgdurable.claim_runs('bench', '{q}', '{t}', '{1}', 1, '600 s') c;
    t0 := clock_timestamp();
    PERFORM pgdurable.complete_run(r.id, r.lease_token, 'bench', '{}', '{}', 0);
    spent := spent + (clock_timestamp() - t0);
  END LOOP;
  PERFORM set_config('bench.ms', (extract(epoch FROM spent) * 1000)::text, false);
END
$$"""


def per_completion_us(dsn: str, runs: int) -> float:
    """Server µs per ``complete_run`` of ``runs`` runs, each claimed just before
    (untimed; one run leased at a time)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pgdurable.start_run('t', '1', '{}', 'q', 0, 3, NULL, NULL, NULL, NULL) "
                  "FROM generate_series(1, %s)", (runs,))
        c.execute("SELECT set_config('bench.runs', %s, false)", (str(runs),))
        c.execute(COMPLETE_EACH)
        row = c.execute("SELECT current_setting('bench.ms')::float8").fetchone()
        assert row is not None
        c.execute("TRUNCATE pgdurable.runs CASCADE")
        return float(row[0]) * 1000 / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    dbs = {"new": scratch_dsn(args.dsn, NEW), "old": scratch_dsn(args.dsn, OLD, before=27),
           "none": scratch_dsn(args.dsn, NONE)}
    try:
        with psycopg.connect(dbs["none"], autocommit=True) as c:
            c.execute("ALTER TABLE pgdurable.runs DISABLE TRIGGER runs_end")
        with psycopg.connect(dbs["old"], autocommit=True) as c:
            c.execute(FENCES.read_bytes())
            c.execute("SELECT pgdurable.secure_schema()")
        us: dict[str, list[float]] = {k: [] for k in dbs}
        print(f"{'round':<6} {'3 triggers µs':>14} {'runs_end µs':>12} {'none µs':>8} "
              f"{'new / old':>10}")
        for r in range(1, args.rounds + 1):
            for name in (list(dbs) if r % 2 else list(reversed(dbs))):
                us[name].append(per_completion_us(dbs[name], args.runs))
            print(f"{r:<6} {us['old'][-1]:>14.0f} {us['new'][-1]:>12.0f} {us['none'][-1]:>8.0f} "
                  f"{us['new'][-1] / us['old'][-1]:>10.3f}")
        med = {k: statistics.median(v) for k, v in us.items()}
        ratios = [n / o for n, o in zip(us["new"], us["old"], strict=True)]
        print(f"median µs per completion: three triggers {med['old']:.0f}, runs_end "
              f"{med['new']:.0f}, no end trigger {med['none']:.0f}")
        print(f"runs_end / three triggers: median {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}); the end-of-run work: "
              f"{med['old'] - med['none']:.0f} µs before, {med['new'] - med['none']:.0f} µs now")
    finally:
        drop_scratch(args.dsn, NEW, OLD, NONE)


if __name__ == "__main__":
    main()
