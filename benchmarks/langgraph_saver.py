"""PgDurableSaver vs LangGraph's own PostgresSaver: put and get_tuple ops/s.

One command::

    .venv/bin/python benchmarks/langgraph_saver.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]

``--dsn`` names a maintenance database; the benchmark creates (and afterwards
drops) one scratch database, migrated for pgdurable and set up for
``langgraph-checkpoint-postgres`` (both savers' tables side by side), so both
run against the same server, database and settings in the same run. Each saver
gets a one-connection pool and the default serializer.

The workload is a graph-like thread: every put is the next checkpoint of one
of 20 threads (parent = the previous one), with a ``messages`` channel that
grows by one message per step (changed every step), a ``step`` counter
(changed) and a 2 kB ``context`` document (unchanged after the first step, so
LangGraph's saver writes its blob once per thread). ``get_tuple`` loads the
newest checkpoint of a random thread, with its pending writes (one task's
write per checkpoint). Rounds alternate the savers (A B A B ...) and the best
round of each is reported, with the ratio pgdurable / LangGraph.
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from _scratch import drop_scratch, scratch_dsn
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg_pool import ConnectionPool

from pgdurable.contrib.langgraph import PgDurableSaver

DB = "pgdurable_bench_langgraph"
THREADS = 20
CONTEXT = "x" * 2048


class Chain:
    """The next checkpoint of each thread, shared shape for both savers."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.heads: dict[int, dict[str, Any]] = {}
        self.steps: dict[int, int] = {}
        self.last: dict[int, Any] = {}

    def next(self, t: int) -> tuple[dict[str, Any], Any, dict[str, Any], dict[str, Any]]:
        step = self.steps.get(t, 0) + 1
        self.steps[t] = step
        cp = empty_checkpoint()
        messages = [{"role": "user" if i % 2 else "assistant", "content": f"message {i} " * 8}
                    for i in range(step % 30)]
        cp["channel_values"] = {"messages": messages, "step": step, "context": CONTEXT}
        versions = {"messages": step, "step": step, "context": 1}
        cp["channel_versions"] = versions
        new = {"messages": step, "step": step} if step > 1 else dict(versions)
        conf: dict[str, Any] = {"thread_id": f"{self.prefix}-{t}", "checkpoint_ns": ""}
        if t in self.last:
            conf["checkpoint_id"] = self.last[t]
        return {"configurable": conf}, cp, {"source": "loop", "step": step, "parents": {}}, new


def bench_put(saver: Any, chain: Chain, seconds: float) -> float:
    n, end = 0, time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        t = random.randrange(THREADS)
        config, cp, meta, new = chain.next(t)
        saved = saver.put(config, cp, meta, new)
        saver.put_writes(saved, [("messages", {"role": "tool", "content": "ok"})], "task-1")
        chain.last[t] = saved["configurable"]["checkpoint_id"]
        n += 1
    return n / (time.perf_counter() - start)


def bench_get(saver: Any, chain: Chain, seconds: float) -> float:
    n, end = 0, time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        t = random.randrange(THREADS)
        tup = saver.get_tuple({"configurable": {"thread_id": f"{chain.prefix}-{t}",
                                                "checkpoint_ns": ""}})
        assert tup is not None and tup.checkpoint["channel_values"]["context"] == CONTEXT
        n += 1
    return n / (time.perf_counter() - start)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--seconds", type=float, default=3.0, help="per round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    dsn = scratch_dsn(args.dsn, DB)
    kwargs = {"autocommit": True, "prepare_threshold": 0}
    try:
        with ConnectionPool(dsn, min_size=1, max_size=1, kwargs=kwargs) as ours_pool, \
             ConnectionPool(dsn, min_size=1, max_size=1, kwargs=kwargs) as theirs_pool:
            theirs = PostgresSaver(theirs_pool)  # type: ignore[arg-type]
            theirs.setup()
            ours = PgDurableSaver(ours_pool)
            savers: list[tuple[str, Any, Chain]] = [
                ("pgdurable", ours, Chain("ours")), ("langgraph", theirs, Chain("theirs"))]
            best: dict[tuple[str, str], float] = {}
            ops: list[tuple[str, Callable[[Any, Chain, float], float]]] = [
                ("put", bench_put), ("get_tuple", bench_get)]
            for _name, saver, chain in savers:  # warm-up: every thread has checkpoints
                bench_put(saver, chain, 0.5)
            for r in range(args.rounds):
                for op, fn in ops:
                    order = savers if r % 2 == 0 else savers[::-1]
                    for name, saver, chain in order:
                        rate = fn(saver, chain, args.seconds)
                        best[(name, op)] = max(best.get((name, op), 0.0), rate)
                        print(f"round {r + 1} {op:9} {name:9} {rate:8.0f} ops/s", flush=True)
            print(f"\n{platform.node()} {platform.processor() or platform.machine()}, "
                  f"Python {platform.python_version()}")
            print(f"{'op':10} {'pgdurable':>10} {'langgraph':>10} {'ratio':>6}")
            for op, _ in ops:
                a, b = best[("pgdurable", op)], best[("langgraph", op)]
                print(f"{op:10} {a:10.0f} {b:10.0f} {a / b:6.2f}")
    finally:
        drop_scratch(args.dsn, DB)
    return 0


if __name__ == "__main__":
    sys.exit(main())
