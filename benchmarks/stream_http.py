"""Token streams to browsers: emit-to-browser latency, streams per server process,
and rows written per 1,000 tokens, against a bare LISTEN/NOTIFY relay.

One command::

    .venv/bin/python benchmarks/stream_http.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--levels 1,10,25,50,100,200] [--rate 20] [--seconds 6] [--quick]

Both modes stream the same payloads, ``--rate`` tokens a second per stream (each token
is the wall-clock time it was emitted, so a reader's latency is its arrival time minus
the token), to SSE readers in this process (httpx), through one server process:

* ``pgdurable``: one worker process runs a ``paced`` run per stream, each token a
  ``ctx.emit_text`` (buffered: a live tail over NOTIFY, flushed to the stream table every
  100 ms, durable and resumable); the server is ``pgdurable.http.create_app`` (its one
  LISTEN connection fans out to every open stream).
* ``relay`` (the baseline): a producer process sends one ``pg_notify`` per token and the
  server relays each notification of its one LISTEN connection to the stream's readers;
  nothing is stored, nothing can be resumed.

For each number of streams in ``--levels`` (until a mode's p99 passes 250 ms), both
modes in turn: the latency p50 and p99 over every token every reader received, and
the tokens that never arrived. Printed at the end: each mode's last level within
250 ms, the latency ratios (pgdurable / relay) at one stream and at each level, and
the stream table's rows per 1,000 tokens (pgdurable). Timings are noisy on a
shared machine: read the ratios, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
from _driver import load, worker_process
from _scratch import drop_scratch, scratch_dsn

HERE = Path(__file__).resolve().parent
DB = "pgdurable_bench_stream_http"
LIMIT_MS = 250.0
#: readers connect in the lead time before the first token
LEAD = 3.0
# -- the stream table's text rows and the tokens they hold, for the runs of one level
ROWS = ("SELECT count(*), coalesce(sum(length(e.event->>'text')), 0) FROM pgdurable.run_events e "
        "WHERE e.event->>'type' = 'text' AND e.run_id = ANY(%s::uuid[])")


@dataclass(frozen=True)
class Level:
    """One mode at one number of streams."""

    mode: str
    streams: int
    latencies_ms: list[float]
    expected: int
    rows: int = 0
    tokens: int = 0

    def pct(self, p: float) -> float:
        if not self.latencies_ms:
            return float("inf")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    @property
    def missing(self) -> int:
        return self.expected - len(self.latencies_ms)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(dsn: str, *argv: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parent}", "PGDURABLE_DSN": dsn}
    return subprocess.Popen([sys.executable, str(HERE / "_stream_bench.py"), *argv], env=env)


def wait_http(url: str) -> None:
    for _ in range(400):
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def read(client: httpx.AsyncClient, url: str, expected: int, until: float,
               out: list[float]) -> None:
    """Follow one SSE stream; each whole token's latency (ms) into ``out``."""
    buffer, got = "", 0
    async with client.stream("GET", url) as r:
        event = ""
        async for line in r.aiter_lines():
            now = time.time()
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "text":
                data = line[6:]
                text = json.loads(data)["text"] if data.startswith("{") else data
                buffer += text
                *tokens, buffer = buffer.split(" ")
                for token in tokens:
                    if token:
                        out.append((now - float(token)) * 1000)
                        got += 1
            elif line.startswith("data: ") and event in ("done", "error"):
                return
            if got >= expected or now > until:
                return


async def readers(urls: list[str], expected: int, until: float) -> list[float]:
    out: list[float] = []
    limits = httpx.Limits(max_connections=len(urls) + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        tasks = [asyncio.create_task(read(client, u, expected, until, out)) for u in urls]
        await asyncio.wait(tasks, timeout=max(1.0, until - time.time()))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return out


def level_pgdurable(dsn: str, base: str, streams: int, rate: float, seconds: float) -> Level:
    start_at = time.time() + LEAD
    state = json.dumps({"rate": rate, "seconds": seconds, "start_at": start_at})
    with psycopg.connect(dsn, autocommit=True) as c:
        ids = [str(r[0]) for r in c.execute(
            "SELECT (pgdurable.start_run('paced', '1', %s::jsonb, 'default', 0, 3, NULL, NULL, "
            "NULL, NULL)).run_id FROM generate_series(1, %s)", (state, streams)).fetchall()]
    expected = int(rate * seconds)
    urls = [f"{base}/runs/{rid}/stream" for rid in ids]
    lat = asyncio.run(readers(urls, expected, start_at + seconds + 10))
    with psycopg.connect(dsn) as c:
        row = c.execute(ROWS, (ids,)).fetchone()
    rows, chars = (int(row[0]), int(row[1])) if row else (0, 0)
    tokens = chars // len(f"{time.time():.6f} ")
    return Level("pgdurable", streams, lat, expected * streams, rows, tokens)


def level_relay(dsn: str, base: str, streams: int, rate: float, seconds: float) -> Level:
    start_at = time.time() + LEAD
    producer = spawn(dsn, "produce", str(streams), str(rate), str(seconds), str(start_at))
    try:
        expected = int(rate * seconds)
        urls = [f"{base}/relay/{i}" for i in range(streams)]
        lat = asyncio.run(readers(urls, expected, start_at + seconds + 10))
    finally:
        producer.wait(timeout=120)
    return Level("relay", streams, lat, expected * streams)


def show(lv: Level) -> str:
    extra = (f", {1000 * lv.rows / lv.tokens:.0f} rows/1000 tokens" if lv.tokens else "")
    return (f"  {lv.mode:9} {lv.streams:4} streams: p50 {lv.pct(0.5):7.1f} ms  p99 "
            f"{lv.pct(0.99):7.1f} ms  missing {lv.missing}{extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--levels", default="1,10,25,50,100,200")
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--quick", action="store_true", help="levels 1,5 for 2 s (proves it runs)")
    args = ap.parse_args()
    levels = [1, 5] if args.quick else [int(x) for x in args.levels.split(",")]
    seconds = 2.0 if args.quick else args.seconds
    dsn = scratch_dsn(args.dsn, DB)
    print(f"stream_http: {args.rate:g} tokens/s per stream for {seconds:g} s, levels {levels}; "
          f"{load()}", flush=True)
    results: dict[str, list[Level]] = {"pgdurable": [], "relay": []}
    port_p, port_r = free_port(), free_port()
    server_p = spawn(dsn, "pgdurable", str(port_p))
    server_r = spawn(dsn, "relay", str(port_r))
    try:
        wait_http(f"http://127.0.0.1:{port_p}/runs/x")
        wait_http(f"http://127.0.0.1:{port_r}/health")
        with worker_process(dsn, "_stream_bench:app", concurrency=max(levels) + 8,
                            pool_size=8):
            live = {"pgdurable", "relay"}
            for n in levels:
                for mode in ("pgdurable", "relay"):
                    if mode not in live:
                        continue
                    lv = (level_pgdurable(dsn, f"http://127.0.0.1:{port_p}", n, args.rate,
                                          seconds) if mode == "pgdurable" else
                          level_relay(dsn, f"http://127.0.0.1:{port_r}", n, args.rate, seconds))
                    results[mode].append(lv)
                    print(show(lv), flush=True)
                    if lv.pct(0.99) > LIMIT_MS or lv.missing > lv.expected // 100:
                        live.discard(mode)
                if not live:
                    break
    finally:
        stop(server_p)
        stop(server_r)
        drop_scratch(args.dsn, DB)
    print("result:")
    for mode, lvs in results.items():
        ok = [lv.streams for lv in lvs if lv.pct(0.99) <= LIMIT_MS and
              lv.missing <= lv.expected // 100]
        print(f"  {mode}: {max(ok) if ok else 0} streams within p99 {LIMIT_MS:g} ms "
              f"(of levels run: {[lv.streams for lv in lvs]})")
    for p_lv, r_lv in zip(results["pgdurable"], results["relay"], strict=False):
        print(f"  {p_lv.streams:4} streams: pgdurable / relay  p50 "
              f"{p_lv.pct(0.5) / r_lv.pct(0.5):.2f}x  p99 {p_lv.pct(0.99) / r_lv.pct(0.99):.2f}x")
    rows = [lv for lv in results["pgdurable"] if lv.tokens]
    if rows:
        per = [1000 * lv.rows / lv.tokens for lv in rows]
        print(f"  rows per 1,000 tokens (pgdurable): median {statistics.median(per):.0f} "
              f"(from {min(per):.0f} at the most streams to {max(per):.0f})")


if __name__ == "__main__":
    main()
