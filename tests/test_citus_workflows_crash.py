"""tests/test_workflows_crash.py in a Citus cell (issue 46): workflows' worker
processes SIGKILLed at every step boundary and inside every step, and a
SIGSTOPped zombie, with the engine in a distributed schema and every process
connected to the node that holds it.

The same test functions, with ``dsn`` overridden: a fresh database on this
module's Citus cluster (tests/_citus_cluster.py), migrated on the coordinator,
its schema distributed (``pgdurable.ops.citus.distribute_schema``), and the
test given the DSN of the node holding it (``cell_dsn``). Skipped with the
reason when Citus is not installed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import _citus_cluster
import pytest
import test_workflows_crash as base
from test_workflows_crash import db  # noqa: F401 (the ledger tables, on the cell's node)

from pgdurable.foundation.migrations import migrate
from pgdurable.ops.citus import cell_dsn, distribute_schema

pytestmark = [*base.pytestmark,
              pytest.mark.skipif(_citus_cluster.missing() is not None,
                                 reason=_citus_cluster.missing() or "")]

_names = itertools.count()


@pytest.fixture(scope="module")
def citus() -> Iterator[_citus_cluster.Cluster]:
    with _citus_cluster.cluster() as cluster:
        yield cluster


@pytest.fixture
def dsn(citus: _citus_cluster.Cluster) -> str:
    """A fresh cell: migrated, distributed, the DSN of the node holding it."""
    coordinator = citus.create_database(f"pgd_wf_cell_{next(_names)}")
    migrate(coordinator)
    distribute_schema(coordinator)
    return cell_dsn(coordinator)


test_sigkill_at_every_step_boundary = base.test_sigkill_at_every_step_boundary
test_zombie_cannot_record_a_step = base.test_zombie_cannot_record_a_step
