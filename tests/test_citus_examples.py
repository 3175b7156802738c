"""Every example runs in a cell on Citus (issue 46: the whole engine in a distributed schema).

One Citus cluster per module (tests/_citus_cluster.py: a coordinator and two
workers on free ports; skipped with the reason when citus.so is not
installed) and one database; its cells are schemas migrated on the coordinator
and distributed (``distribute_schema``), as in tests/test_citus.py.

The list is derived from ``examples/``: a new example is covered by itself,
unless it is in :data:`NOT_IN_A_CELL` with the reason. Each example runs in ONE
fresh cell of its own (an example expects a fresh database: three of them
charge the same budget ``tenant:acme`` and check its totals), schema
``ex_<name>``, created when its test starts (migrate + distribute: about 3 s;
Citus places the cells on the two worker nodes in turn, so both nodes run about
half of them), as a process given ``PGDURABLE_DSN`` = the cell's node
(``cell_dsn``) and ``PGDURABLE_SCHEMA`` = the cell, connected to that node only.
The examples whose own SQL names schema ``pgdurable`` (test_schemas' list of
them: they cannot run in another schema) share the cell named ``pgdurable``
(there is one such schema per database). One cell per example, not every
example in both of two cells: that would double a module that already takes
minutes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import _citus_cluster
import pytest
from test_schemas import _NOT_IN_A_SCHEMA

from pgdurable.foundation.migrations import migrate
from pgdurable.ops.citus import cell_dsn, distribute_schema

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(_citus_cluster.missing() is not None,
                                 reason=_citus_cluster.missing() or "")]

#: The cell of the examples whose own SQL names schema pgdurable.
DEFAULT = "pgdurable"

#: Examples that cannot run in a cell, and why.
NOT_IN_A_CELL = {
    "test_with_pgdurable.py": "a pytest file: the plugin creates fresh databases on a "
                              "server (CREATE DATABASE), not in a cell",
    "tenants.py": "migrates its own two schemas (DDL: through the coordinator, by design)",
    "failover.py": "starts its own primary and standby servers",
    "roles.py": "creates roles and grants (DDL on every node): through the coordinator, "
                "by design",
}
#: Examples whose own SQL names schema pgdurable: run in the cell named pgdurable.
IN_THE_DEFAULT_CELL = {name for name in _NOT_IN_A_SCHEMA if name not in NOT_IN_A_CELL}

EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py")
                  if p.name not in NOT_IN_A_CELL)


def _cell_of(name: str) -> str:
    """The schema of the example's cell."""
    return DEFAULT if name in IN_THE_DEFAULT_CELL else "ex_" + name.removesuffix(".py")


class Cells:
    """The module's cluster and database; a cell made on first use."""

    def __init__(self, cluster: _citus_cluster.Cluster, coordinator: str) -> None:
        self.cluster, self.coordinator = cluster, coordinator
        self.dsns: dict[str, str] = {}

    def dsn(self, schema: str) -> str:
        """The DSN of the node holding ``schema``, migrated and distributed first."""
        if schema not in self.dsns:
            migrate(self.coordinator, schema=schema)
            distribute_schema(self.coordinator, schema)
            self.dsns[schema] = cell_dsn(self.coordinator, schema)
        return self.dsns[schema]


@pytest.fixture(scope="module")
def cells() -> Iterator[Cells]:
    with _citus_cluster.cluster() as cluster:
        yield Cells(cluster, cluster.create_database("pgd_cell_examples"))


def test_every_example_is_run_or_excluded_with_a_reason() -> None:
    names = {p.name for p in (ROOT / "examples").glob("*.py")}
    assert set(NOT_IN_A_CELL) <= names  # no stale exclusion
    assert names == set(EXAMPLES) | set(NOT_IN_A_CELL)
    assert all(reason.strip() for reason in NOT_IN_A_CELL.values())
    assert all(len(_cell_of(name)) <= 48 for name in EXAMPLES)  # schema names' limit


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_example_runs_in_a_cell(example: str, cells: Cells) -> None:
    schema = _cell_of(example)
    dsn = cells.dsn(schema)
    assert any(f"port={w.port}" in dsn for w in cells.cluster.workers)  # a worker node
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "PGBOUNCER_DSN", "PGDURABLE_TEST_DSN")}
    env.update(PGDURABLE_DSN=dsn, PGDURABLE_SCHEMA=schema, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, str(ROOT / "examples" / example)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, (f"{example} failed in {schema}:\n{p.stdout[-3000:]}\n"
                               f"{p.stderr[-3000:]}")
