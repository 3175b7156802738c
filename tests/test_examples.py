"""Every script in examples/ runs, against a fresh migrated database.

Plain scripts get the database in ``PGDURABLE_DSN``; pytest files
(``examples/test_*.py``) are run with pytest on the test server
(``PGDURABLE_TEST_DSN``). A new example is picked up without editing this file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"quickstart.py", "operations.py"}


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
