"""tests/test_workflows_crash.py in a Citus cell (issue 46): workflows' worker
processes SIGKILLed at every step boundary and inside every step, and a
SIGSTOPped zombie, with the engine in a distributed schema and every process
connected to the node that holds it.

The same test functions, with ``dsn`` overridden: a fresh database on this
module's Citus cluster (tests/_citus_cluster.py), migrated on the coordinator in
schema ``cell_a``, then in ``cell_b`` (each test runs in both), that schema
distributed (``pgdurable.ops.citus.distribute_schema``), and the test given the
DSN of the node holding it (``cell_dsn``). Skipped with the
reason when Citus is not installed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import _citus_cluster
import psycopg
import pytest
import test_workflows_crash as base
from test_workflows_crash import db  # noqa: F401 (the ledger tables, on the cell's node)

import pgdurable
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


@pytest.fixture(params=["cell_a", "cell_b"])
def cell_schema(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs in two cells, schemas ``cell_a`` and ``cell_b`` of one database
    (docs/schemas.md): its worker processes get ``PGDURABLE_SCHEMA``."""
    monkeypatch.setenv("PGDURABLE_SCHEMA", request.param)
    return str(request.param)


@pytest.fixture
def dsn(citus: _citus_cluster.Cluster, cell_schema: str) -> str:
    """A fresh cell: migrated, distributed, the DSN of the node holding it."""
    coordinator = citus.create_database(f"pgd_wf_cell_{next(_names)}")
    migrate(coordinator, schema=cell_schema)
    distribute_schema(coordinator, cell_schema)
    return cell_dsn(coordinator, cell_schema)


@pytest.fixture
def conn(dsn: str, cell_schema: str) -> Iterator[psycopg.Connection[Any]]:
    """The tests' own connection: its statements (naming pgdurable) go to the cell's schema."""
    with psycopg.connect(dsn, autocommit=True) as c:
        pgdurable.use_schema(c, cell_schema)
        yield c


test_sigkill_at_every_step_boundary = base.test_sigkill_at_every_step_boundary
test_zombie_cannot_record_a_step = base.test_zombie_cannot_record_a_step
