"""`pgdurable demo`: the README's first command, run as a real process."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

CLI = [sys.executable, "-m", "pgdurable"]
ROOT = Path(__file__).resolve().parent.parent


def _check_output(p: subprocess.CompletedProcess[str]) -> None:
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    out = p.stdout
    for needle in ("SIGKILL worker-1", "spawned worker-2", "run leased by worker-2",
                   "resumed under fencing token", "POST /signals/ci/", "alice approves",
                   "run completed", "tool web_search executed 1 time(s) (worker-1)",
                   "demo passed"):
        assert needle in out, needle
    # the tool's side effect happened once, in worker-1, before the kill; the
    # recorded model calls were replayed, not made again; only summarize, in
    # flight at the kill, ran twice
    assert out.count("calling the web_search API") == 1
    assert out.count("model planned") == 1 and out.count("model answered") == 3
    assert out.count("model is summarizing") == 2


def _normal(line: str) -> str:
    """A line of the demo's output with what changes from run to run made constant."""
    line = re.sub(r"^\s*\d+\.\d+s ", "T ", line.rstrip())
    line = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "RUN", line)
    line = re.sub(r"\b(build|report)-[0-9a-f]{8}\b", r"\1-X", line)
    return re.sub(r"\(pid \d+\)", "(pid N)", line)


def excerpts() -> dict[str, list[str]]:
    """The demo timeline shown by the README and docs/getting-started.md."""
    found = {}
    for page in ("README.md", "docs/getting-started.md"):
        text = (ROOT / page).read_text()
        start = text.index("```text\n", text.index("The timeline (abridged):")) + 8
        found[page] = text[start:text.index("```", start)].splitlines()
    return found


def _check_excerpts(out: str, *, embedded: bool) -> None:
    """Every line the docs show is one the demo printed (times, pids, ids aside)."""
    printed = {_normal(line) for line in out.splitlines()}
    for page, lines in excerpts().items():
        for line in lines:
            if line.startswith("inspect it: ") and not embedded:
                continue  # against a server the hint names --dsn
            assert _normal(line) in printed, (page, line)


def _run_the_hint(out: str, env: dict[str, str] | None = None) -> str:
    """The demo's closing hint, run as printed: it shows the finished run."""
    hint = next(line for line in out.splitlines() if line.startswith("inspect it: "))
    command = shlex.split(hint.removeprefix("inspect it: "))
    assert command[0] == "pgdurable", hint
    p = subprocess.run([*CLI, *command[1:]], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=env)
    assert p.returncode == 0, (hint, p.stderr)
    assert "demo.research_agent" in p.stdout and "completed" in p.stdout, p.stdout
    return hint


@pytest.mark.crash
def test_demo_against_a_server(dsn: str) -> None:
    t0 = time.monotonic()
    p = subprocess.run([*CLI, "demo", "--dsn", dsn], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    print(f"\ndemo took {time.monotonic() - t0:.1f} s")
    _check_output(p)
    _check_excerpts(p.stdout, embedded=False)
    env = {k: v for k, v in os.environ.items() if k not in ("PGDURABLE_DSN", "DATABASE_URL")}
    assert " --dsn " in _run_the_hint(p.stdout, env)  # as given: no environment needed
    with psycopg.connect(dsn) as conn:
        run = conn.execute("SELECT id, status, claims FROM pgdurable.runs WHERE task = 'demo.research_agent'").fetchall()
        assert len(run) == 1 and run[0][1] == "completed"
        rid = run[0][0]
        effects = conn.execute("SELECT key, status, token FROM pgdurable.effects WHERE run_id = %s",
                               (rid,)).fetchall()
        assert [(k, s) for k, s, _ in effects] == [("workflow:web_search#1", "succeeded")]
        rows = conn.execute("SELECT state->'workflow'->>'name', token FROM pgdurable.checkpoints "
                            "WHERE run_id = %s ORDER BY step", (rid,)).fetchall()
        assert [n for n, _ in rows] == ["plan", "answer:1", "answer:2", "answer:3", "web_search",
                                        "summarize", "signal:ci#1", "signal:approval#1", "return"]
        token = dict(rows)
        assert len(set(token.values())) >= 3, "worker-1, worker-2 after the kill, after each wait"
        # the tool's effect and step were recorded under worker-1's token; summarize,
        # in flight at the kill, was recorded by worker-2 under a newer one
        assert effects[0][2] == token["plan"] == token["web_search"] < token["summarize"]


@pytest.mark.slow
@pytest.mark.crash
def test_demo_on_embedded_postgres(tmp_path: Any) -> None:
    pytest.importorskip("pgserver")
    data = tmp_path / "pgdata"
    p = subprocess.run([*CLI, "demo", "--data-dir", str(data)], capture_output=True, text=True,
                       timeout=180, cwd=tmp_path)
    _check_output(p)
    assert "starting an embedded PostgreSQL" in p.stdout
    assert (data / "PG_VERSION").exists()
    _check_excerpts(p.stdout.replace(f" --data-dir {data}", ""), embedded=True)
    # the embedded server stopped with the demo: the hint starts it for its command
    assert _run_the_hint(p.stdout).startswith(f"inspect it: pgdurable embedded --data-dir {data}")
