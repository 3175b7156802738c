"""What a signal_id costs a send, with many days of signal history kept.

One command::

    .venv/bin/python benchmarks/signal_dedup.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--days 40] [--sends 3000] [--rounds 3]

``--dsn`` names a maintenance database; the benchmark creates (and drops) the
scratch database ``pgdurable_bench_signal_dedup`` and makes ``--days`` daily
partitions of the history tables ahead (about what 30 days of retention keep).
One connection sends ``--sends`` signals nobody waits for, alternating per
round: ``send_signal`` with a new ``signal_id`` each time (what a webhook
sends), and the baseline, the same call without a signal_id (no dedup lookup).
Each send is its own transaction (autocommit, prepared). Printed: sends/s of
each and the ratio with id / without.

Before sql/0024_signal_history_ids.sql the dedup lookup probed every
``signal_history`` partition (0.55x at 42 partitions on the machine of
benchmarks/RESULTS.md); since, a new id costs one probe of
``signal_history_ids``.
"""

from __future__ import annotations

import argparse
import time
import uuid

import psycopg
from _scratch import drop_scratch, scratch_dsn

DB = "pgdurable_bench_signal_dedup"
SEND = "SELECT pgdurable.send_signal('bench', 'nobody', '{}'::jsonb, %s::text, '1 hour'::interval)"


def sends_per_second(conn: psycopg.Connection[object], n: int, with_id: bool) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        conn.execute(SEND, (uuid.uuid4().hex if with_id else None,), prepare=True)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--days", type=int, default=40)
    ap.add_argument("--sends", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    dsn = scratch_dsn(args.dsn, DB)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pgdurable.create_history_partitions(%s, 0)", (args.days,))
            parts = conn.execute(
                "SELECT count(*) FROM pg_inherits"
                " WHERE inhparent = 'pgdurable.signal_history'::regclass").fetchone()
            sends_per_second(conn, 200, True)  # warm-up: plans cached, both paths
            sends_per_second(conn, 200, False)
            ratios = []
            print(f"send_signal, {args.sends} sends per measurement, "
                  f"{parts[0] if parts else '?'} signal_history partitions")
            for r in range(args.rounds):
                order = (True, False) if r % 2 == 0 else (False, True)
                got = {w: sends_per_second(conn, args.sends, w) for w in order}
                ratios.append(got[True] / got[False])
                print(f"round {r + 1}: with a new signal_id {got[True]:7.0f}/s | without "
                      f"{got[False]:7.0f}/s | ratio {ratios[-1]:.2f}")
        ratios.sort()
        print(f"ratio with id / without: median {ratios[len(ratios) // 2]:.2f} "
              f"(all {ratios[0]:.2f}-{ratios[-1]:.2f})")
    finally:
        drop_scratch(args.dsn, DB)


if __name__ == "__main__":
    main()
