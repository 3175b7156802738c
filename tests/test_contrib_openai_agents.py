"""pgdurable.contrib.openai_agents: the session protocol and durable agent runs,
with real processes (tests/_agents_app.py) and the SDK's fake-model approach."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("agents")

from _waiting import WAIT_LIMIT, until_sync

from pgdurable.contrib.openai_agents import PgDurableSession, run_agent

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE test_ledger (event text, pid int, tag text, "
                     "at timestamptz DEFAULT clock_timestamp())")
        yield conn


def _env(dsn: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}", "PGDURABLE_DSN": dsn,
            "OPENAI_AGENTS_DISABLE_TRACING": "1", "OPENAI_API_KEY": "unused-no-network"}


async def test_session_protocol_round_trip(dsn: str) -> None:
    s = PgDurableSession("s1", dsn)
    other = PgDurableSession("s2", dsn)
    try:
        assert await s.get_items() == [] and await s.pop_item() is None
        await s.add_items([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        await s.add_items([{"role": "assistant", "content": "c"}])
        await other.add_items([{"role": "user", "content": "x"}])
        assert [i["content"] for i in await s.get_items()] == ["a", "b", "c"]
        assert [i["content"] for i in await s.get_items(limit=2)] == ["b", "c"]
        assert (await s.pop_item())["content"] == "c"
        await s.add_items([{"role": "user", "content": "d"}], key="k")
        await s.add_items([{"role": "user", "content": "d"}], key="k")  # idempotent
        assert [i["content"] for i in await s.get_items()] == ["a", "b", "d"]
        await s.clear_session()
        assert await s.get_items() == []
        assert [i["content"] for i in await other.get_items()] == ["x"]
        with pytest.raises(ValueError):
            PgDurableSession("", dsn)
        with pytest.raises(TypeError):
            PgDurableSession("s", 42)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await other.add_items({"role": "user"})  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await other.get_items(limit=-1)
        assert len(await other.get_items()) == 1
    finally:
        await s.close()
        await other.close()


def test_concurrent_add_items_from_processes_keep_order_and_lose_nothing(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    procs = [subprocess.Popen([sys.executable, str(TESTS / "_agents_app.py"), "add", "shared",
                               f"p{k}", "30"], env=_env(dsn), cwd=ROOT)
             for k in range(4)]
    for p in procs:
        assert p.wait(timeout=WAIT_LIMIT * 2) == 0
    items = [r[0]["content"] for r in db.execute(
        "SELECT item FROM pgdurable.session_get_items('shared', NULL)")]
    assert len(items) == 4 * 30 * 3 and len(set(items)) == len(items)
    # each call's three items stay together and in order
    for i in range(0, len(items), 3):
        tag, call, _ = items[i].split(":")
        assert items[i:i + 3] == [f"{tag}:{call}:{j}" for j in range(3)]
    # each process's calls appear in the order it made them
    for k in range(4):
        calls = [int(x.split(":")[1]) for x in items[::3] if x.startswith(f"p{k}:")]
        assert calls == list(range(30))


def _ledger(db: psycopg.Connection[Any], event: str) -> list[tuple[int, str]]:
    return [(r[0], r[1]) for r in db.execute(
        "SELECT pid, tag FROM test_ledger WHERE event = %s ORDER BY at", (event,))]


@pytest.mark.crash
def test_sigkill_mid_agent_run_resumes_without_repeating_model_calls_or_tools(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    from _agents_app import build

    async def start(text: str) -> str:
        app = build(dsn)
        async with app:
            return await run_agent(app, "shop", text, session_id="cust-1")

    def status(rid: str) -> tuple[Any, ...]:
        row = db.execute("SELECT status, result, error FROM pgdurable.runs WHERE id = %s",
                         (rid,)).fetchone()
        assert row is not None
        return tuple(row)

    def worker(name: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / f"{name}.log", "wb") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "pgdurable.worker", "_agents_app:app", "--lease-ttl", "2",
                 "--poll", "0.5", "--grace", "5", "--worker-id", name],
                env=_env(dsn), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    a = worker("a")
    rid = asyncio.run(start("buy the thing"))
    assert a.wait(timeout=WAIT_LIMIT) == -signal.SIGKILL  # killed itself in tool `crash`
    b = worker("b")
    try:
        until_sync(lambda: status(rid)[0] == "completed", "worker b to finish the run")
        # before the kill: model call 1 (-> charge), charge, model call 2 (-> crash): all
        # recorded, so none ran again; crash ran again (its result was never recorded)
        assert _ledger(db, "model") == [(a.pid, "1:0"), (a.pid, "1:1"), (b.pid, "1:2")]
        assert _ledger(db, "charge") == [(a.pid, "5")]
        assert _ledger(db, "killed") == [(a.pid, "")]
        assert _ledger(db, "crash-ok") == [(b.pid, "")]
        assert status(rid)[1]["final_output"] == "done after 1 user message(s)"
        # the conversation continues in the same session
        rid2 = asyncio.run(start("and again"))
        until_sync(lambda: status(rid2)[0] == "completed", "the second run")
        assert status(rid2)[1]["final_output"] == "done after 2 user message(s)"
        items = [r[0] for r in db.execute(
            "SELECT item FROM pgdurable.session_get_items('cust-1', NULL)")]
        kinds = [i.get("type", i.get("role")) for i in items]
        turn = ["user", "function_call", "function_call_output", "function_call",
                "function_call_output", "message"]
        assert kinds == turn + turn, kinds
        assert len(_ledger(db, "charge")) == 2
    finally:
        b.send_signal(signal.SIGKILL)
        b.wait(timeout=WAIT_LIMIT)
