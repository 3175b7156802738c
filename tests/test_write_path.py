"""The worker's batched write parameters (``engine.batch_writer.batch_params``): states and
results sent as one JSON array each must store exactly what each step returned, in
order, with each run fenced on its own (the same answers as the per-element arrays)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg

from pgdurable.engine.batch_writer import _Write, batch_params
from pgdurable.foundation import run_queries as q

# JSON that text-array escaping and naive joining both get wrong if done badly
TRICKY = [
    {"q": 'a "quoted", {braced} [list] value', "b": "back\\slash", "n": None},
    {"u": "caf\u00e9 \u2028 \U0001f600", "ctl": "tab\tnew\nline", "e": ""},
    ["array", "state", 1, 2.5, True, False, None],
    "a bare string with , and }",
    42,
    None,
]


def _writes(rows: list[tuple[Any, ...]], done: list[bool], results: list[Any],
            token_shift: dict[int, int]) -> list[_Write]:
    loop = asyncio.new_event_loop()
    try:
        return [
            _Write(str(rid), tok + token_shift.get(i, 0), json.dumps(TRICKY[i]), 0.25,
                   json.dumps(results[i]) if done[i] else None, loop.create_future())
            for i, (rid, tok) in enumerate(rows)
        ]
    finally:
        loop.close()


def test_batch_params_store_each_state_and_result_exactly(conn: psycopg.Connection[Any]) -> None:
    for _ in TRICKY:
        conn.execute("SELECT pgdurable.start_run('t','1','{}','default',0,3,NULL,NULL,NULL,NULL)")
    claimed = conn.execute(
        "SELECT id, lease_token FROM pgdurable.claim_runs('w1', ARRAY['default'], ARRAY['t'],"
        " ARRAY['1'], 10, '60 s'::interval) ORDER BY id").fetchall()
    done = [False, True, False, True, False, True]
    results = [None, {"ok": 'he said "hi"'}, None, None, None, "fin"]  # Done(None) -> JSON null
    batch = _writes(claimed, done, results, token_shift={4: 1})  # run 4: a stale token
    rows = dict(conn.execute(q.WRITE_STEPS, batch_params("w1", batch)).fetchall())
    ids = [r[0] for r in claimed]
    assert rows == {str(rid): ("lost" if i == 4 else "completed" if done[i] else "leased")
                    for i, rid in enumerate(ids)}
    stored = {r[0]: r[1:] for r in conn.execute(
        "SELECT id, state, result, step, spent FROM pgdurable.runs").fetchall()}
    for i, rid in enumerate(ids):
        state, result, step, spent = stored[rid]
        if i == 4:
            assert (state, step) == ({}, 0)  # fenced out: untouched
            continue
        assert state == TRICKY[i] and step == 1 and float(spent) == 0.25
        assert result == (results[i] if done[i] else None)
    # the JSON null result of a Done(None) is stored as JSON null, not SQL NULL
    assert conn.execute("SELECT result IS NOT NULL FROM pgdurable.runs WHERE id = %s",
                        (ids[3],)).fetchone() == (True,)
    hist = dict(conn.execute("SELECT run_id, state FROM pgdurable.checkpoints").fetchall())
    assert hist == {rid: TRICKY[i] for i, rid in enumerate(ids) if i != 4}
