"""Cells on Citus (issue 46): the engine in a distributed schema, the fleet on its node.

One Citus cluster per module (tests/_citus_cluster.py: a coordinator and two
workers on free ports, skipped with the reason when citus.so is not
installed). Its database holds two cells, schemas ``cell_a`` and ``cell_b``
(docs/schemas.md), each migrated on the coordinator and distributed
(``pgdurable.ops.citus.distribute_schema``: every table of a schema on one
worker node; the two land on the two nodes), and every test of a cell runs in
both: every process of the fleet -- the examples, the worker processes -- is
given the DSN of the node holding its cell, found by ``cell_dsn`` from Citus'
metadata, and the cell's schema.
"""

from __future__ import annotations

import asyncio
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
from _waiting import WAIT_LIMIT, app_running
from fix_fleet import Fleet
from psycopg.conninfo import conninfo_to_dict, make_conninfo

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


#: The two cells of the module's database: a schema each (docs/schemas.md).
CELLS = ("cell_a", "cell_b")


class Cell:
    def __init__(self, cluster: _citus_cluster.Cluster, coordinator: str, schema: str) -> None:
        self.cluster, self.coordinator, self.schema = cluster, coordinator, schema
        self.dsn = cell_dsn(coordinator, schema)
        #: the environment of a process of this cell (an example, a worker)
        self.env = {**os.environ, "PGDURABLE_DSN": self.dsn, "PGDURABLE_SCHEMA": schema,
                    "PYTHONPATH": str(ROOT)}

    def connect(self) -> psycopg.Connection[Any]:
        """An autocommit connection to the cell's node whose statements (naming
        pgdurable) go to the cell's schema."""
        c = psycopg.connect(self.dsn, autocommit=True)
        pgdurable.use_schema(c, self.schema)
        return c


@pytest.fixture(scope="module")
def cells() -> Iterator[dict[str, Cell]]:
    """One database, two cells: each schema migrated on the coordinator (tables local,
    as on a plain server), then distributed: Citus puts each on a worker node."""
    with _citus_cluster.cluster() as cluster:
        coordinator = cluster.create_database("pgd_cell")
        # cell_a through the Python API
        migrate(coordinator, schema="cell_a")
        distribute_schema(coordinator, "cell_a")
        assert migrate_cell(coordinator, schema="cell_a") == []  # a no-op now: it must be
        # cell_b through the command line: `pgdurable --schema cell_b migrate --citus`
        done = _cli("--schema", "cell_b", "migrate", "--citus", "--dsn", coordinator)
        assert done.returncode == 0, done.stderr
        assert "cell: schema cell_b on 127.0.0.1:" in done.stdout, done.stdout
        again = _cli("--schema", "cell_b", "migrate", "--citus", "--dsn", coordinator)
        assert again.returncode == 0 and "up to date" in again.stdout, again.stdout + again.stderr
        found = _cli("--schema", "cell_b", "cell-dsn", "--dsn", coordinator)
        assert found.returncode == 0 and found.stdout.strip() == cell_dsn(coordinator, "cell_b")
        yield {schema: Cell(cluster, coordinator, schema) for schema in CELLS}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items()
              if k not in ("PGDURABLE_DSN", "DATABASE_URL", "PGDURABLE_SCHEMA")}, **(env or {})}
    return subprocess.run([sys.executable, "-m", "pgdurable", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=WAIT_LIMIT)


@pytest.fixture(scope="module", params=CELLS)
def cell(request: pytest.FixtureRequest, cells: dict[str, Cell]) -> Cell:
    return cells[request.param]


def test_two_cells_land_on_two_workers(cells: dict[str, Cell]) -> None:
    ports = {c.schema: c.dsn for c in cells.values()}
    assert ports["cell_a"] != ports["cell_b"]  # the second schema went to the other node
    nodes = {w.port for w in next(iter(cells.values())).cluster.workers}
    for c in cells.values():
        with c.connect() as db:  # each node answers for its own cell's tables only
            assert db.execute("SELECT count(*) FROM pgdurable.runs").fetchone() == (0,)
            assert any(f"port={p}" in c.dsn for p in nodes)


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
            "SELECT DISTINCT nodeport FROM citus_shards WHERE table_name::text LIKE %s",
            (f"{cell.schema}.%",))}
        tables = c.execute("SELECT count(*) FROM citus_shards WHERE table_name::text = %s",
                           (f"{cell.schema}.runs",)).fetchone()
    assert len(ports) == 1 and tables == (1,)
    (port,) = ports
    assert f"port={port}" in cell.dsn and "dbname=pgd_cell" in cell.dsn
    assert port in {w.port for w in cell.cluster.workers}
    with cell.connect() as c:  # the node holds the shards and answers for them
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
    done = subprocess.run([sys.executable, str(ROOT / "examples" / example)], env=cell.env,
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
    with cell.connect() as db:
        # the crash app's step log: a plain table of the cell's node
        db.execute("CREATE TABLE IF NOT EXISTS test_step_log (run_id uuid, step int, "
                   "token bigint, pid int, event text, at timestamptz DEFAULT clock_timestamp())")
        fleet = Fleet(cell.dsn, tmp_path, "_crash_app:app",
                      env={"PGDURABLE_SCHEMA": cell.schema})
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


def test_the_role_model_works_on_the_cells_node(cells: dict[str, Cell]) -> None:
    """grant_roles through the coordinator; the app role, connected to the cell's
    node, starts, claims and completes a run through the SECURITY DEFINER
    functions of the NOLOGIN owner (executed on that node: no connection as the
    owner is needed; through the coordinator one would be, and is refused)."""
    coordinator = cells["cell_a"].cluster.create_database("pgd_cell_roles")
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


def test_an_app_given_the_coordinator_works_on_the_cells_node(cell: Cell) -> None:
    """Durable(coordinator DSN): it finds the cell's node when it opens; its pool's
    connections and its LISTEN are there, and a run completes through them."""
    node_port = int(conninfo_to_dict(cell.dsn)["port"])

    async def main() -> None:
        app = pgdurable.Durable(cell.coordinator, schema=cell.schema)

        @app.task("hello")
        async def hello(ctx: pgdurable.RunContext, state: dict[str, Any]) -> pgdurable.Done:
            return pgdurable.Done({"hi": state["who"]})

        async with app:
            async with app.pool.connection() as conn:
                assert conn.info.port == node_port
            async with app_running(app, poll_interval=3600.0):
                rid = await app.start("hello", {"who": cell.schema})
                assert await app.result(rid, timeout=WAIT_LIMIT) == {"hi": cell.schema}
                notifier = app.notifier()
                assert notifier is not None and notifier.backend_pid is not None
                with psycopg.connect(cell.dsn, autocommit=True) as c:  # LISTEN on the node
                    assert c.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                     (notifier.backend_pid,)).fetchone() == (1,)

    asyncio.run(main())


def test_maintenance_given_a_cells_node_goes_through_the_coordinator(cell: Cell) -> None:
    """``pgdurable maintain`` and ``prune`` given the cell's node: DDL cannot run there
    ("cannot create tables in a distributed schema from a worker node"), so both
    find the coordinator in the metadata and work through it."""
    def partitions() -> int:
        with psycopg.connect(cell.coordinator, autocommit=True) as c:
            row = c.execute("SELECT count(*) FROM citus_shards WHERE table_name::text LIKE %s",
                            (f"{cell.schema}.checkpoints_p%",)).fetchone()
        assert row is not None
        return int(row[0])

    before = partitions()
    env = {"PGDURABLE_SCHEMA": cell.schema}
    done = _cli("maintain", "--dsn", cell.dsn, "--days-ahead", "9", env=env)
    assert done.returncode == 0 and "created" in done.stdout, done.stdout + done.stderr
    assert partitions() > before
    with psycopg.connect(cell.coordinator, autocommit=True) as c:  # a day long gone
        c.execute("SET citus.enable_unsafe_triggers = on")
        c.execute(f"CREATE TABLE {cell.schema}.checkpoints_p20200101 PARTITION OF "
                  f"{cell.schema}.checkpoints FOR VALUES FROM ('2020-01-01 00:00+00') "
                  "TO ('2020-01-02 00:00+00')")
    with_old = partitions()
    done = _cli("prune", "--dsn", cell.dsn, "--older-than", "30d", env=env)
    assert done.returncode == 0 and "deleted" in done.stdout, done.stdout + done.stderr
    assert partitions() == with_old - 1  # the old day dropped, by the coordinator


def _connections(dsn: str, name: str) -> int:
    """The connections of application ``name`` to the node of ``dsn``."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND application_name = %s", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def _move(cell: Cell) -> tuple[int, int]:
    """Move the cell's schema (its whole colocation group) to the other worker node."""
    with psycopg.connect(cell.coordinator, autocommit=True) as c:
        row = c.execute("SELECT shardid, nodename, nodeport FROM citus_shards "
                        "WHERE table_name = %s::regclass", (f"{cell.schema}.runs",)).fetchone()
        assert row is not None
        shard, host, port = row
        other = next(w for w in cell.cluster.workers if w.port != port)
        c.execute("SELECT citus_move_shard_placement(%s, %s, %s, %s, %s, "
                  "shard_transfer_mode => 'block_writes')",
                  (shard, host, port, "127.0.0.1", other.port))
    return port, other.port


def test_a_running_fleet_follows_a_shard_move(cell: Cell, tmp_path: Path) -> None:
    """Last of each cell's tests: the schema moves to the other worker node while a
    worker runs a run across the move. The worker's pool and LISTEN follow it by
    themselves (foundation/cells.py): no connection of the library is left on the
    old node, and a run started after the move is claimed by the NOTIFY heard on
    the new one (the worker polls once an hour). ``cell_dsn`` names the new node
    and a fresh process completes a run there."""
    before = cell_dsn(cell.coordinator, cell.schema)
    for w in cell.cluster.workers:  # the crash app's step log, on both nodes (a local table)
        with psycopg.connect(cell.cluster.dsn(w, "pgd_cell"), autocommit=True) as c:
            c.execute("CREATE TABLE IF NOT EXISTS test_step_log (run_id uuid, step int, "
                      "token bigint, pid int, event text, at timestamptz DEFAULT clock_timestamp())")
    fleet = Fleet(cell.dsn, tmp_path, "_crash_app:app", env={"PGDURABLE_SCHEMA": cell.schema})
    # a sync client, made before the move: it follows when it is used
    client = pgdurable.DurableClient(make_conninfo(before, application_name="sync-client"),
                                     schema=cell.schema)
    try:
        # (a lease of 60 s, the default: the move blocks the cell's writes, heartbeats
        # included, for a few seconds; a 10 s lease could expire meanwhile, and the
        # run be taken again -- fenced, but not the one claim asserted below)
        fleet.start("f", poll=3600.0, ttl=60.0)
        assert client.get_run(client.start("steps", {"n": 1}, revision="1")) is not None
        with cell.connect() as db:
            first = db.execute(START, ("steps", "1", '{"n": 2}')).fetchone()
            across = db.execute(START, ("steps", "1", '{"n": 30, "sleep": 0.2}')).fetchone()
            assert first is not None and across is not None
            _wait_for(lambda: db.execute("SELECT status FROM pgdurable.runs WHERE id = %s",
                                         (first[0],)).fetchone() == ("completed",),
                      "a run before the move")
        old, new = _move(cell)
        after = cell_dsn(cell.coordinator, cell.schema)
        assert f"port={old}" in before and f"port={new}" in after
        _wait_for(lambda: _connections(before, "fleet-f") == 0 and _connections(after, "fleet-f") > 1,
                  "the worker's connections to leave the old node for the new")
        with psycopg.connect(after, autocommit=True) as db:
            pgdurable.use_schema(db, cell.schema)
            late = db.execute(START, ("steps", "1", '{"n": 2}')).fetchone()
            assert late is not None
            ends = (across[0], late[0])

            def ended() -> list[tuple[Any, ...]]:
                return db.execute("SELECT status, lease_token FROM pgdurable.runs "
                                  "WHERE id = ANY(%s) ORDER BY created_at", (list(ends),)).fetchall()

            _wait_for(lambda: all(s in ("completed", "failed") for s, _ in ended()),
                      "the runs across and after the move")
            assert ended() == [("completed", 1), ("completed", 1)], fleet.logs()
            steps = db.execute("SELECT count(*), count(DISTINCT step), max(token) "
                               "FROM pgdurable.checkpoints WHERE run_id = %s",
                               (across[0],)).fetchone()
            assert steps == (30, 30, 1), fleet.logs()  # every step once, one claim
        assert "following it" in fleet.logs()
        # the client's last look was before the move (at open): within FOLLOW_EVERY
        # of being used, it looks again, and its pool goes to the new node
        assert client.result(late[0], timeout=WAIT_LIMIT) == {"i": 2}
        _wait_for(lambda: client.get_run(late[0]) is not None
                  and _connections(before, "sync-client") == 0
                  and _connections(after, "sync-client") > 0,
                  "the sync client's connections to leave the old node for the new")
    finally:
        client.close()
        for p in fleet.all:
            p._kill_group()
    env = {**cell.env, "PGDURABLE_DSN": after}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], env=env,
                          capture_output=True, text=True, timeout=WAIT_LIMIT, cwd=ROOT)
    assert done.returncode == 0 and "'approved': True" in done.stdout, done.stdout + done.stderr
