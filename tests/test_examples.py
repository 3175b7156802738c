"""Every script in examples/ runs, against a fresh migrated database.

Plain scripts get the database in ``PGDURABLE_DSN``; pytest files
(``examples/test_*.py``) are run with pytest on the test server
(``PGDURABLE_TEST_DSN``). A new example is picked up without editing this file.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgdurable import DurableClient

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"quickstart.py", "operations.py"}


#: The internal layers (docs/architecture.md): an example shows the public paths
#: (``pgdurable``, ``pgdurable.retention``, ``pgdurable.testing``, ``pgdurable.contrib.*``).
INTERNAL = ("pgdurable.foundation", "pgdurable.engine", "pgdurable.ops")


def imported(script: Path) -> set[str]:
    """Every module ``script`` imports, anywhere in it (``from a import b``: ``a``
    and ``a.b``, since ``b`` may be a submodule)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(script.read_text(), str(script))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def private(module: str) -> bool:
    """An internal pgdurable module: a layer's, or any ``_private`` one."""
    parts = module.split(".")
    return parts[0] == "pgdurable" and (
        module.startswith(tuple(m + "." for m in INTERNAL)) or module in INTERNAL
        or any(p.startswith("_") for p in parts[1:]))


def test_the_import_checks_see_what_they_look_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from pgdurable.foundation.db import resolve_dsn\n"
                   "from pgdurable import _private, Durable\nimport pgdurable.ops.cli\n")
    assert sorted(m for m in imported(bad) if private(m)) == [
        "pgdurable._private", "pgdurable.foundation.db", "pgdurable.foundation.db.resolve_dsn",
        "pgdurable.ops.cli"]
    assert not private("pgdurable.retention") and not private("pgdurable.contrib.adk")


def test_examples_import_only_public_modules() -> None:
    """What an example imports is what a user may import: no internal layer
    (``pgdurable.foundation``/``engine``/``ops``) and no ``_private`` module."""
    found = {p.name: sorted(m for m in imported(p) if private(m)) for p in EXAMPLES}
    assert {name: mods for name, mods in found.items() if mods} == {}


#: Imports every pgdurable module an example names, with pytest unimportable
#: (``sys.modules["pytest"] = None``), as on an install without the test tools.
WITHOUT_PYTEST = """
import importlib, sys
sys.modules["pytest"] = None
failed = []
for module in sys.argv[1:]:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == "pytest" or "pytest" in str(exc):
            failed.append(f"{module}: {exc}")
    except ImportError as exc:  # from pgdurable import NAME (not a module): fine
        if "pytest" in str(exc):
            failed.append(f"{module}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def plain(script: Path) -> bool:
    """A script of the core install: not a pytest file, no ``pgdurable.contrib``."""
    return not script.name.startswith("test_") and not any(
        m.startswith("pgdurable.contrib") for m in imported(script))


def test_plain_examples_need_no_pytest() -> None:
    """Each plain example's pgdurable imports work without pytest installed
    (``pgdurable.testing`` is the pytest plugin: it needs it), and no plain
    example imports pytest itself."""
    scripts = [p for p in EXAMPLES if plain(p)]
    assert len(scripts) >= 20
    for script in scripts:
        mods = sorted(m for m in imported(script) if m.split(".")[0] == "pgdurable")
        assert "pytest" not in imported(script), script.name
        p = subprocess.run([sys.executable, "-c", WITHOUT_PYTEST, *mods], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"{script.name} needs pytest:\n{p.stdout}{p.stderr[-2000:]}"
    # the check itself: the pytest plugin is refused without pytest
    p = subprocess.run([sys.executable, "-c", WITHOUT_PYTEST, "pgdurable.testing"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "pgdurable.testing" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script: Path, dsn: str, pg_server: Any) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    if script.name.startswith("test_"):
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(script)]
        env["PGDURABLE_TEST_DSN"] = pg_server.dsn
    else:
        cmd = [sys.executable, str(script)]
    env["PGDURABLE_DSN"] = dsn
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, f"{script.name} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"


def test_operations_example_leaves_other_finished_runs_alone(dsn: str) -> None:
    """On a database that already holds finished runs of others (one finished 30 days
    ago, past the example's pruner's 7 days), examples/operations.py prunes nothing
    for real: every one of them survives, and it says why."""
    with DurableClient(dsn) as client:
        others = [client.start("someone_elses", {"i": i}, revision="1") for i in range(3)]
        for rid in others:
            assert client.cancel(rid) == "cancelled"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgdurable.runs SET finished_at = now() - interval '30 days' "
                     "WHERE id = %s", (others[0],))
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        p = subprocess.run([sys.executable, str(ROOT / "examples" / "operations.py")], cwd=ROOT,
                           env={**env, "PGDURABLE_DSN": dsn}, capture_output=True, text=True,
                           timeout=180)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        assert "not pruning: the database holds 3 finished run(s) of others" in p.stdout
        left = conn.execute("SELECT count(*) FROM pgdurable.runs WHERE id = ANY(%s::uuid[])",
                            (others,)).fetchone()
    assert left == (3,)
