"""pgdurable.contrib.langgraph: the official conformance suite, leases, retention."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from pgdurable.contrib.langgraph import AsyncPgDurableSaver, PgDurableSaver


def _assert_all_passed(report: Any) -> None:
    for cap in ALL_CAPABILITIES:
        result = report.results[cap.value]
        assert result.detected, f"{cap.value} not detected"
        assert result.passed, f"{cap.value}: {result.failures}"
        assert result.tests_passed > 0 and result.tests_failed == 0, cap.value


async def test_conformance_async_saver(dsn: str) -> None:
    @checkpointer_test(name="AsyncPgDurableSaver")
    async def factory() -> AsyncGenerator[AsyncPgDurableSaver, None]:
        async with AsyncPgDurableSaver(dsn) as saver:
            yield saver

    _assert_all_passed(await validate(factory))


async def test_conformance_sync_saver(dsn: str) -> None:
    @checkpointer_test(name="PgDurableSaver")
    async def factory() -> AsyncGenerator[PgDurableSaver, None]:
        with PgDurableSaver(dsn) as saver:
            yield saver

    _assert_all_passed(await validate(factory))


# -- helpers for the tests below ------------------------------------------------
def _put_chain(saver: PgDurableSaver, thread: str, n: int, ns: str = "") -> list[str]:
    from langgraph.checkpoint.conformance.test_utils import (
        generate_checkpoint,
        generate_metadata,
    )

    ids: list[str] = []
    for i in range(n):
        conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
        if ids:
            conf["checkpoint_id"] = ids[-1]
        cp = generate_checkpoint(channel_values={"i": i}, channel_versions={"i": i + 1})
        saved = saver.put({"configurable": conf}, cp, generate_metadata(step=i), {"i": i + 1})
        ids.append(saved["configurable"]["checkpoint_id"])
    return ids


def _ids(saver: PgDurableSaver, thread: str) -> list[str]:
    return [t.config["configurable"]["checkpoint_id"]
            for t in saver.list({"configurable": {"thread_id": thread}})]


def test_retention_keep_last_n_through_the_prune_cli_in_batches(dsn: str) -> None:
    import subprocess
    import sys

    from pgdurable.ops.retention import prune_sync

    with PgDurableSaver(dsn) as saver:
        a = _put_chain(saver, "ta", 5)
        b = _put_chain(saver, "tb", 4)
        saver.put_writes({"configurable": {"thread_id": "ta", "checkpoint_ns": "",
                                           "checkpoint_id": a[0]}}, [("ch", 1)], "task")
        # no policy: nothing is pruned
        assert prune_sync(dsn, "7d").graph_checkpoints == 0
        saver.set_retention(keep_last=2)
        assert prune_sync(dsn, "7d", dry_run=True).graph_checkpoints == 5
        result = prune_sync(dsn, "7d", batch=2)
        assert result.graph_checkpoints == 5 and result.batches >= 3
        assert _ids(saver, "ta") == a[:2:-1][:2] == [a[4], a[3]]
        assert _ids(saver, "tb") == [b[3], b[2]]
        _put_chain(saver, "tc", 3)
        p = subprocess.run([sys.executable, "-m", "pgdurable", "prune", "--older-than",
                            "7d", "--dsn", dsn], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert "1 LangGraph checkpoint(s)" in p.stdout, p.stdout
        with saver.pool.connection() as conn:
            assert conn.execute("SELECT count(*) FROM pgdurable.lg_writes").fetchone() == (0,)


def test_retention_by_age_keeps_young_checkpoints(dsn: str) -> None:
    import psycopg

    with PgDurableSaver(dsn) as saver:
        a = _put_chain(saver, "ta", 4)
        saver.set_retention(max_age=3600)
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT pgdurable.prune_graph_checkpoints(100)").fetchone() == (0,)
            conn.execute("SELECT set_config('pgdurable.now', "
                         "(now() + interval '2 hours')::text, true)")
            assert conn.execute("SELECT pgdurable.prune_graph_checkpoints(100)").fetchone() == (3,)
        assert _ids(saver, "ta") == [a[3]]
        saver.set_retention()  # no policy
        with saver.pool.connection() as conn:
            assert conn.execute("SELECT count(*) FROM pgdurable.lg_retention").fetchone() == (0,)


def test_bad_arguments_raise_typed_errors_and_change_nothing(dsn: str) -> None:
    from pgdurable.contrib.langgraph import invoke_exclusive

    with PgDurableSaver(dsn) as saver:
        _put_chain(saver, "t", 2)
        for bad in ({"keep_last": 0}, {"keep_last": True}, {"max_age": -1}, {"max_age": "7d"}):
            with pytest.raises(ValueError):
                saver.set_retention(**bad)
        with pytest.raises(ValueError, match="unknown prune strategy"):
            saver.prune(["t"], strategy="everything")
        with pytest.raises(TypeError):
            saver.prune("t")
        with pytest.raises(TypeError):
            saver.delete_for_runs("run")
        with pytest.raises(TypeError):
            PgDurableSaver(42)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            AsyncPgDurableSaver(42)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="PgDurableSaver"):
            invoke_exclusive(object(), {}, {"configurable": {"thread_id": "t"}})
        assert len(_ids(saver, "t")) == 2
        with saver.pool.connection() as conn:
            assert conn.execute("SELECT count(*) FROM pgdurable.lg_retention").fetchone() == (0,)


def test_a_writer_whose_lease_lapsed_is_fenced_out(dsn: str) -> None:
    from pgdurable import LeaseLost
    from pgdurable.contrib.langgraph import ThreadBusy

    with PgDurableSaver(dsn) as saver, PgDurableSaver(dsn) as other:
        ids = _put_chain(saver, "t", 1)
        with saver.hold_thread("t", wait=False):
            _put_chain(saver, "t", 1)  # the holder writes
            with pytest.raises(ThreadBusy), other.hold_thread("t", wait=False):
                pass
            # the lease lapses (a stalled holder): expire it on the database clock
            with saver.pool.connection() as conn:
                conn.execute("UPDATE pgdurable.leases SET expires_at = pgdurable.now() "
                             "- interval '1 second' WHERE key = %s",
                             (b"langgraph:thread:t",))
            with other.hold_thread("t", wait=False):
                with pytest.raises(LeaseLost):
                    _put_chain(saver, "t", 1)
                with pytest.raises(LeaseLost):
                    saver.put_writes({"configurable": {"thread_id": "t", "checkpoint_ns": "",
                                                       "checkpoint_id": ids[0]}},
                                     [("c", 1)], "task")
        assert len(_ids(saver, "t")) == 2


@pytest.mark.parametrize(("module", "blocked", "extra"), [
    ("pgdurable.contrib.langgraph", "langgraph", "langgraph"),
    ("pgdurable.contrib.openai_agents", "agents", "openai-agents"),
])
def test_the_core_never_imports_the_frameworks(module: str, blocked: str, extra: str) -> None:
    import subprocess
    import sys

    code = (
        "import sys, pgdurable, pgdurable.contrib, pgdurable.testing, pgdurable.retention\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('langgraph', 'langchain_core', 'agents', 'openai')]\n"
        "assert not bad, bad\n"
        f"sys.modules[{blocked!r}] = None\n"
        "try:\n"
        f"    import {module}\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert f"pip install 'pgdurable[{extra}]'" in out.stdout


async def test_async_hold_thread_fails_fast_waits_and_fences(dsn: str) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    from pgdurable import LeaseLost
    from pgdurable.contrib.langgraph import ThreadBusy

    async with AsyncPgDurableSaver(dsn) as a, AsyncPgDurableSaver(dsn) as b:
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        async with a.hold_thread("t", wait=False):
            await a.aput(config, generate_checkpoint(), {}, {})
            with pytest.raises(ThreadBusy):
                async with b.hold_thread("t", wait=False):
                    pass
            with pytest.raises(ThreadBusy):
                async with b.hold_thread("t", max_wait=0.1):
                    pass
        # released: free at once; then a lapsed lease fences its holder's writes (the
        # holder's keeper may also notice first and cancel the block: LeaseLost either way)
        with pytest.raises(LeaseLost):
            async with b.hold_thread("t", wait=False):
                await b.aput(config, generate_checkpoint(), {}, {})
                async with a.pool.connection() as conn:
                    await conn.execute("UPDATE pgdurable.leases SET expires_at = "
                                       "pgdurable.now() - interval '1 second' WHERE key = %s",
                                       (b"langgraph:thread:t",))
                async with a.hold_thread("t", wait=False):
                    await b.aput(config, generate_checkpoint(), {}, {})
        assert len([t async for t in a.alist(config)]) == 2
