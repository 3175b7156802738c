"""Helper processes and apps for the operations tests (retention, CLI)."""

from __future__ import annotations

import sys
import time
from typing import Any

import psycopg

from pgdurable import Continue, Done, Durable, RunContext

# -- an app for `pgdurable worker tests._ops_procs:app` (DSN from PGDURABLE_DSN) --------
_app: Durable | None = None


def __getattr__(name: str) -> Any:
    global _app
    if name == "app":
        if _app is None:
            _app = Durable()

            @_app.task("ops.two_steps", revision="1")
            async def two_steps(ctx: RunContext, state: dict[str, Any]) -> Any:
                if ctx.step == 0:
                    return Continue({**state, "first": True})
                return Done({"ok": True})

        return _app
    raise AttributeError(name)


CLAIM = (
    "SELECT count(*) FROM pgdurable.claim_runs('latency-probe', ARRAY['probe'], "
    "ARRAY['probe.task'], ARRAY['1'], 1, interval '1 hour')"
)


def claim_latencies(dsn: str, ready: Any, stop: Any, out: Any) -> None:
    """Claim one probe run at a time until ``stop``; put [(t_start, seconds, claimed)] in ``out``.

    The connection has ``lock_timeout = 5ms``: a claim that waits on a lock
    (held by the prune, say) fails with LockNotAvailable and is recorded with
    ``claimed = -1``, so blocking is seen by the database, not by a stopwatch
    that a busy machine can fool.
    """
    samples: list[tuple[float, float, int]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '5ms'")
        conn.execute(CLAIM)  # warm up: plan, catalog caches
        ready.set()
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                row = conn.execute(CLAIM).fetchone()
                claimed = int(row[0]) if row else 0
            except psycopg.errors.LockNotAvailable:
                claimed = -1
            samples.append((time.time(), time.perf_counter() - t0, claimed))
            time.sleep(0.005)
    out.put(samples)


if __name__ == "__main__":  # pragma: no cover
    print("helper module; see tests/test_retention.py", file=sys.stderr)
