"""The sync twins are generated, current and complete (issue 39, tools/async_to_sync.py).

* the committed generated files equal what the tool writes now (the drift check CI
  runs), and an edit of an async source without regenerating is caught;
* the conversion does what its docstring says, and refuses what it cannot convert;
* the sync client's public methods are the async app's run API: same names, same
  parameters, so a method added to one and not the other fails here;
* what the generated client gained (``set_double_text``, ``double_text=``) works.
"""

from __future__ import annotations

import importlib.util
import inspect
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

from pgdurable import Durable, DurableClient
from pgdurable.app.run_api import AsyncRunAPI
from pgdurable.app.run_api_sync import RunAPI
from pgdurable.foundation import pooler
from pgdurable.foundation.thread_keys import encode_thread_key
from pgdurable.runs import schedules

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "async_to_sync.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("async_to_sync", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["async_to_sync"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _run(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(root / "tools" / "async_to_sync.py"), *args],
                          capture_output=True, text=True, cwd=root, timeout=120)


# -- drift ------------------------------------------------------------------------------


def test_every_generated_file_is_current(tmp_path: Path) -> None:
    done = _run("--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py"))
    expected = sorted(Path(u.target or u.source) for u in _tool().UNITS)
    assert generated == expected
    assert Path("pgdurable/app/run_api_sync.py") in generated
    stale = [str(p) for p in generated
             if (tmp_path / p).read_text() != (ROOT / p).read_text()]
    assert not stale, (f"generated files differ from the committed ones: {stale}; "
                       "run `python tools/async_to_sync.py` and commit the result")


def test_an_async_edit_without_regenerating_is_caught(tmp_path: Path) -> None:
    # a copy of the tree the tool reads, with a method added to the async source only
    for unit in _tool().UNITS:
        for rel in {unit.source, unit.target or unit.source}:
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / rel, tmp_path / rel)
    for rel in ("tools/async_to_sync.py", "pyproject.toml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    assert _run("--check", root=tmp_path).returncode == 0  # the copy is current
    source = tmp_path / "pgdurable/app/run_api.py"
    source.write_text(source.read_text() + '''
    async def ping(self) -> None:
        """Added to the app only."""
        await self.fetchone("SELECT 1", ())
''')
    section = tmp_path / "pgdurable/runs/fork.py"
    section.write_text(section.read_text().replace(
        '"""Fork ``run_id`` from', '"""Fork (edited) ``run_id`` from', 1))
    done = _run("--check", root=tmp_path)
    assert done.returncode == 1
    assert "pgdurable/app/run_api_sync.py" in done.stderr
    assert "pgdurable/runs/fork.py" in done.stderr
    # regenerating brings the twin along: the sync class gets the method, sync
    assert _run(root=tmp_path).returncode == 0
    twin = (tmp_path / "pgdurable/app/run_api_sync.py").read_text()
    assert '    def ping(self) -> None:\n        """Added to the app only."""\n' \
           '        self.fetchone("SELECT 1", ())\n' in twin
    assert "def fork_sync(app: SyncDatabase" in (tmp_path / "pgdurable/runs/fork.py").read_text()
    assert _run("--check", root=tmp_path).returncode == 0


# -- the conversion ---------------------------------------------------------------------


def test_the_conversion_rules() -> None:
    tool = _tool()
    source = '''\
import asyncio

from psycopg_pool import AsyncConnectionPool


async def wait(pool: AsyncConnectionPool[Any], conn: psycopg.AsyncConnection[Any]) -> Row:
    # a comment survives
    async with pool.connection() as c:
        row = await (await c.execute("SELECT 1")).fetchone()
    async for n in conn.notifies():
        await asyncio.sleep(0.1)
    return await one(conn, Q)  # renamed: a section's function
'''
    assert tool.convert(source, {**tool.NAMES, "one": "one_sync"}, rename_defs=False) == '''\
import time

from psycopg_pool import ConnectionPool


def wait(pool: ConnectionPool[Any], conn: psycopg.Connection[Any]) -> Row:
    # a comment survives
    with pool.connection() as c:
        row = c.execute("SELECT 1").fetchone()
    for n in conn.notifies():
        time.sleep(0.1)
    return one_sync(conn, Q)  # renamed: a section's function
'''
    # in a section, the functions defined there get their _sync names
    assert tool.convert("async def f(app: App) -> None:\n    await f(app)\n",
                        {**tool.NAMES, "f": "f_sync"}, rename_defs=True) == (
        "def f_sync(app: SyncDatabase) -> None:\n    f_sync(app)\n")
    # continuation lines stay under their bracket when the line before them changed
    assert tool.convert('''\
async def f(app: App, a: int,
            b: int) -> str:
    return await g(app, "x", h(a,
                               b), """
  a string's lines stay""")
''', {**tool.NAMES, "f": "f_sync", "g": "g_sync"}, rename_defs=True) == '''\
def f_sync(app: SyncDatabase, a: int,
           b: int) -> str:
    return g_sync(app, "x", h(a,
                              b), """
  a string's lines stay""")
'''
    assert tool.convert("async def f(call: Callable[[], Awaitable[list[T]]]) -> T: ...\n",
                        tool.NAMES, rename_defs=False) == (
        "def f(call: Callable[[], list[T]]) -> T: ...\n")
    # asyncio used for more than sleep stays imported
    out = tool.convert("import asyncio\nasync def f():\n    await asyncio.sleep(1)\n"
                       "    asyncio.current_task()\n", tool.NAMES, rename_defs=False)
    assert out.startswith("import asyncio\n") and "time.sleep(1)" in out
    with pytest.raises(tool.Unsupported, match="async comprehension"):
        tool.convert("async def f(xs):\n    return [x async for x in xs]\n", tool.NAMES,
                     rename_defs=False)


def test_the_names_of_section_twins() -> None:
    names = _tool().section_names()
    assert names["fork"] == "fork_sync"  # X -> X_sync
    assert names["resume_schedule_on"] == "resume_schedule_sync"  # X_on -> X_sync
    assert names["aconnect"] == "connect"  # (aname -> name)
    assert names["acheck_pool_schema"] == "check_pool_schema"
    assert names["_aloop"] == "_loop"  # private: the a after the underscore
    # each twin is defined where the tool says, and is sync
    for module, name in ((pooler, "connect"), (schedules, "resume_schedule_sync")):
        assert not inspect.iscoroutinefunction(getattr(module, name))


def test_generated_files_say_so() -> None:
    for unit in _tool().UNITS:
        text = (ROOT / (unit.target or unit.source)).read_text()
        if unit.target is not None:
            assert text.startswith("# WARNING: this file is generated by tools/async_to_sync.py"
                                   f" from {unit.source}.\n# DO NOT EDIT")
        else:
            assert "# async-to-sync: generated by tools/async_to_sync.py" in text


# -- the sync client's API is the app's run API -----------------------------------------

#: What only the async app offers (registering code and its event triggers, workers,
#: streams, its notifier, the events' retention beside the workers').
ASYNC_ONLY = {"task", "workflow", "register", "schedule", "tasks", "worker", "stream",
              "stream_thread", "stream_token", "notifier", "listen_conninfo", "pool",
              "stream_secrets", "on_event", "declare_triggers", "prune_events"}
#: What each class has of its own, kept by hand (``result`` waits differently: the
#: app's notifier, the client's own connection); compared below all the same.
OWN = {"open", "close", "result", "open_timeout"}


def _public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


def _params(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def api_differences(async_cls: type, sync_cls: type) -> list[str]:
    """How the public methods of ``sync_cls`` differ from those of ``async_cls``."""
    diffs = []
    for name in sorted(_public(async_cls) ^ _public(sync_cls)):
        diffs.append(f"{name}: only in {(async_cls if hasattr(async_cls, name) else sync_cls)}")
    for name in sorted(_public(async_cls) & _public(sync_cls)):
        a, s = getattr(async_cls, name), getattr(sync_cls, name)
        if callable(a) and _params(a) != _params(s):
            diffs.append(f"{name}: {_params(a)} != {_params(s)}")
        if inspect.iscoroutinefunction(s):
            diffs.append(f"{name}: async in the sync class")
    return diffs


def test_the_sync_client_offers_the_apps_run_api() -> None:
    assert api_differences(AsyncRunAPI, RunAPI) == []
    assert {"start", "start_many", "get_run", "list_runs", "cancel", "retry", "fork",
            "fork_failed", "rewind", "signal", "signal_run", "send", "run_tree",
            "set_double_text", "with_idempotency"} <= _public(RunAPI)
    # the client is the run API plus its own; the app is the run API plus its own
    assert _public(DurableClient) - _public(RunAPI) == OWN
    assert _public(Durable) - _public(AsyncRunAPI) == ASYNC_ONLY | OWN
    assert _params(Durable.result) == _params(DurableClient.result)
    # neither class restates a run API method by hand (only the abstract I/O)
    for name in _public(AsyncRunAPI) - {"fetchone", "fetchall", "max_signal_payload"}:
        assert name not in vars(Durable) and name not in vars(DurableClient), name
    for cls in (Durable, DurableClient):
        assert not inspect.isabstract(cls)


def test_the_comparison_catches_a_method_added_to_one_side() -> None:
    class Wider(RunAPI):
        def extra(self) -> None:
            """Only here."""

    class Narrower(RunAPI):
        def send(self, thread_key: str, message: Any) -> Any:  # type: ignore[override]
            """Fewer parameters."""

    assert api_differences(AsyncRunAPI, Wider) == [f"extra: only in {Wider}"]
    (diff,) = api_differences(AsyncRunAPI, Narrower)
    assert diff.startswith("send: ")


# -- what the generated client gained ---------------------------------------------------


def test_the_sync_client_sets_a_threads_double_texting(dsn: str) -> None:
    with DurableClient(dsn) as client:
        client.set_double_text("web:1", "reject")
        with psycopg.connect(dsn) as c:
            row = c.execute("SELECT double_text FROM pgdurable.threads WHERE thread_key = %s",
                            (encode_thread_key("web:1"),)).fetchone()
        assert row == ("reject",)
        with pytest.raises(ValueError, match="strategy must be one of"):
            client.set_double_text("web:1", "shout")  # type: ignore[arg-type]
        client.thread_task("web:", "chat", revision="1", double_text="enqueue")
        delivery = client.send("web:1", "hi", double_text="enqueue")
        assert delivery.action == "wake"
