"""Cells on Citus (issue 46): the engine in a distributed schema, the fleet on its node.

One Citus cluster per module (tests/_citus_cluster.py: a coordinator and two
workers on free ports, skipped with the reason when citus.so is not
installed). Its database is migrated on the coordinator, the schema
distributed (``pgdurable.ops.citus.distribute_schema``: every table on one
worker node), and every process of the fleet -- the examples, the worker
processes -- is given the DSN of the node holding it, found by
``cell_dsn`` from Citus' metadata.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _citus_cluster
import psycopg
import pytest
from _waiting import WAIT_LIMIT
from fix_fleet import Fleet
from psycopg.conninfo import make_conninfo

import pgdurable
from pgdurable.foundation.migrations import migrate
from pgdurable.ops.citus import (
    SchemaNotDistributed,
    cell_dsn,
    distribute_schema,
    migrate_cell,
    split_statements,
)

ROOT = Path(__file__).resolve().parent.parent
START = ("SELECT run_id FROM pgdurable.start_run(%s, %s, %s::jsonb, 'default', 0, 3, "
         "NULL, NULL, NULL, NULL)")

pytestmark = pytest.mark.skipif(_citus_cluster.missing() is not None,
                                reason=_citus_cluster.missing() or "")


class Cell:
    def __init__(self, cluster: _citus_cluster.Cluster, coordinator: str, dsn: str) -> None:
        self.cluster, self.coordinator, self.dsn = cluster, coordinator, dsn


@pytest.fixture(scope="module")
def cell() -> Iterator[Cell]:
    with _citus_cluster.cluster() as cluster:
        coordinator = cluster.create_database("pgd_cell")
        migrate(coordinator)  # tables local on the coordinator, as on a plain server
        distribute_schema(coordinator)
        migrate_cell(coordinator)  # a no-op now, and it must be one
        yield Cell(cluster, coordinator, cell_dsn(coordinator))


def test_split_statements_respects_quotes_and_comments() -> None:
    text = ("CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$;\n"
            "-- a comment; not a statement\nSELECT 'a;b', \"c;d\" /* ; */;\n"
            "DO $x$ BEGIN PERFORM 1; END $x$;\n-- trailing; comment\n")
    parts = split_statements(text)
    assert [p.strip().split()[0] for p in parts] == ["CREATE", "--", "DO"]
    assert "SELECT 1; $$;" in parts[0] and "'a;b'" in parts[1]


def test_cell_dsn_names_the_node_holding_the_schema(cell: Cell) -> None:
    with psycopg.connect(cell.coordinator, autocommit=True) as c:
        ports = {r[0] for r in c.execute(
            "SELECT DISTINCT nodeport FROM citus_shards WHERE table_name::text LIKE 'pgdurable.%'")}
        tables = c.execute("SELECT count(*) FROM citus_shards "
                           "WHERE table_name::text = 'pgdurable.runs'").fetchone()
    assert len(ports) == 1 and tables == (1,)
    (port,) = ports
    assert f"port={port}" in cell.dsn and "dbname=pgd_cell" in cell.dsn
    assert port in {w.port for w in cell.cluster.workers}
    with psycopg.connect(cell.dsn) as c:  # the node holds the shards and answers for them
        assert c.execute("SELECT count(*) FROM pgdurable.runs").fetchone() == (0,)
    with pytest.raises(SchemaNotDistributed):
        cell_dsn(cell.coordinator, "public")


@pytest.mark.parametrize("example, expect", [
    # start, steps with checkpoints, a signal kept until the run parks on it, result()
    ("quickstart.py", "'approved': True"),
    # child runs: a parent parked on its children, woken when they end
    ("children.py", "completed"),
    # a timer wake (the approval never comes: the wait times out)
    ("signals.py", "'type': 'timeout'"),
])
def test_examples_complete_in_the_cell(cell: Cell, example: str, expect: str) -> None:
    env = {**os.environ, "PGDURABLE_DSN": cell.dsn, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / example)], env=env,
                          capture_output=True, text=True, timeout=WAIT_LIMIT, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert expect in done.stdout, done.stdout + done.stderr


def _wait_for(pred: Callable[[], Any], what: str) -> Any:
    end = time.monotonic() + WAIT_LIMIT
    while not (got := pred()):
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return got


def test_a_sigkilled_workers_run_completes_once_on_another(cell: Cell, tmp_path: Path) -> None:
    with psycopg.connect(cell.dsn, autocommit=True) as db:
        # the crash app's step log: a plain table of the cell's node
        db.execute("CREATE TABLE IF NOT EXISTS test_step_log (run_id uuid, step int, "
                   "token bigint, pid int, event text, at timestamptz DEFAULT clock_timestamp())")
        fleet = Fleet(cell.dsn, tmp_path, "_crash_app:app")
        try:
            a = fleet.start("a")
            rid = db.execute(START, ("steps", "1", '{"n": 5, "hang_at": 3}')).fetchone()
            assert rid is not None
            rid = rid[0]

            def logged() -> list[tuple[Any, ...]]:
                return db.execute("SELECT step, token, pid, event FROM test_step_log "
                                  "WHERE run_id = %s ORDER BY at", (rid,)).fetchall()

            _wait_for(lambda: (3, 1, a.pid, "start") in logged(), "a to be inside step 3")
            b = fleet.start("b")  # polls once a minute: only the lease expiry wakes it
            a.kill()
            _wait_for(lambda: db.execute("SELECT status FROM pgdurable.runs WHERE id = %s",
                                         (rid,)).fetchone() in (("completed",), ("failed",)),
                      "the run to end")
            row = db.execute("SELECT status, result, lease_token FROM pgdurable.runs "
                             "WHERE id = %s", (rid,)).fetchone()
            assert row == ("completed", {"i": 5}, 2), fleet.logs()
            steps = [(r[0], r[1]) for r in db.execute(
                "SELECT step, token FROM pgdurable.checkpoints WHERE run_id = %s ORDER BY step",
                (rid,)).fetchall()]
            assert steps == [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]
            # every step ran once, but step 3 (interrupted by the kill): once by each
            runs = [(s, t, p) for s, t, p, _ in logged()]
            assert runs == [(0, 1, a.pid), (1, 1, a.pid), (2, 1, a.pid), (3, 1, a.pid),
                            (3, 2, b.pid), (4, 2, b.pid)]
            assert b.terminate() == 0
        finally:
            for p in fleet.all:
                p._kill_group()


def test_the_role_model_works_on_the_cells_node(cell: Cell) -> None:
    """grant_roles through the coordinator; the app role, connected to the cell's
    node, starts, claims and completes a run through the SECURITY DEFINER
    functions of the NOLOGIN owner (executed on that node: no connection as the
    owner is needed; through the coordinator one would be, and is refused)."""
    coordinator = cell.cluster.create_database("pgd_cell_roles")
    migrate(coordinator)
    distribute_schema(coordinator)
    with psycopg.connect(coordinator, autocommit=True) as admin:
        for role, login in (("cell_owner", "NOLOGIN"), ("cell_app", "LOGIN"),
                            ("cell_ro", "LOGIN")):
            admin.execute(f"CREATE ROLE {role} {login}")
        pgdurable.grant_roles(admin, owner_role="cell_owner", app_role="cell_app",
                              readonly_role="cell_ro")
    migrate_cell(coordinator)  # secure_schema again, through the coordinator
    with psycopg.connect(make_conninfo(cell_dsn(coordinator), user="cell_app"),
                         autocommit=True) as app:
        app.execute(START, ("t", "1", "{}"))
        (rid, token), = app.execute(
            "SELECT id, lease_token FROM pgdurable.claim_runs('w', '{default}', '{t}', '{1}', "
            "1, '60s')").fetchall()
        done = app.execute("SELECT * FROM pgdurable.write_steps('w', %s, %s, %s::jsonb[], "
                           "'{0}', '{t}', %s::jsonb[])",
                           ([rid], [token], ['{"ok": 1}'], ['{"r": 2}'])).fetchall()
        assert done == [(rid, "completed")]
        assert app.execute("SELECT status, result FROM pgdurable.runs WHERE id = %s",
                           (rid,)).fetchone() == ("completed", {"r": 2})
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("UPDATE pgdurable.runs SET status = 'failed'")


def test_cell_dsn_follows_a_shard_move(cell: Cell) -> None:
    # last in the module: the schema moves to the other worker node
    before = cell_dsn(cell.coordinator)
    with psycopg.connect(cell.coordinator, autocommit=True) as c:
        row = c.execute("SELECT shardid, nodename, nodeport FROM citus_shards "
                        "WHERE table_name = 'pgdurable.runs'::regclass").fetchone()
        assert row is not None
        shard, host, port = row
        other = next(w for w in cell.cluster.workers if w.port != port)
        # moves the schema's whole colocation group (every table of the cell)
        c.execute("SELECT citus_move_shard_placement(%s, %s, %s, %s, %s, "
                  "shard_transfer_mode => 'block_writes')",
                  (shard, host, port, "127.0.0.1", other.port))
    after = cell_dsn(cell.coordinator)
    assert f"port={port}" in before and f"port={other.port}" in after
    env = {**os.environ, "PGDURABLE_DSN": after, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], env=env,
                          capture_output=True, text=True, timeout=WAIT_LIMIT, cwd=ROOT)
    assert done.returncode == 0 and "'approved': True" in done.stdout, done.stdout + done.stderr
