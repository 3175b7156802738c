"""pgbench as a baseline (shared by benchmarks/throughput.py and benchmarks/runs_check.py)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile


def pgbench_tps(dsn: str, script: str, args: list[str], env: dict[str, str] | None = None) -> float:
    """Transactions/s of ``pgbench -n -M prepared <args> -f <script> dsn``, where
    ``script`` is the text of a pgbench script (written to a temporary file)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        out = subprocess.run(
            ["pgbench", "-n", "-M", "prepared", *args, "-f", path, dsn],
            check=True, capture_output=True, text=True,
            env={**os.environ, **(env or {})}).stdout
    finally:
        os.unlink(path)
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    if m is None:
        raise RuntimeError(f"cannot parse pgbench output:\n{out}")
    return float(m.group(1))
