"""Run metadata (set at start, readable in SQL, GIN-searched) and list_runs
(filters, keyset pagination, plans that use the indexes, typed bad input)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgdurable import Durable, DurableClient
from pgdurable.runs.search import list_runs_query


async def test_metadata_set_at_start_is_readable_in_sql_and_kept_on_repeat(dsn: str) -> None:
    async with Durable(dsn) as app:
        rid = await app.start("agent", {"q": 1}, revision="1",
                              metadata={"tenant": "acme", "user": "u-7"}, idempotency_key="k1")
        again = await app.start("agent", {}, revision="1", metadata={"tenant": "evil"},
                                idempotency_key="k1")
        plain = await app.start("agent", {}, revision="1")
    assert again == rid
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT metadata FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone() \
            == ({"tenant": "acme", "user": "u-7"},)
        assert c.execute("SELECT metadata FROM pgdurable.runs WHERE id = %s",
                         (plain,)).fetchone() == (None,)
        # nobody relabels an existing run (not inserted by this transaction)
        c.execute("SELECT pgdurable.tag_started_run(%s, true, '{\"tenant\": \"x\"}', NULL)", (rid,))
        assert c.execute("SELECT metadata->>'tenant' FROM pgdurable.runs WHERE id = %s",
                         (rid,)).fetchone() == ("acme",)


async def test_metadata_with_a_flow_control_key_and_a_delayed_start(dsn: str) -> None:
    """metadata= wraps whichever start statement flow control chose (key, delay):
    one statement sets the key, the delay and the label."""
    async with Durable(dsn) as app:
        rid = await app.start("agent", {}, revision="1", key="tenant:acme",
                              delay=timedelta(hours=1), metadata={"tenant": "acme"})
        page = await app.list_runs(metadata={"tenant": "acme"})
    assert [r.id for r in page.items] == [rid]
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT concurrency_key, available_at > now() + interval '50 minutes', "
                        "metadata FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone()
    assert row == ("tenant:acme", True, {"tenant": "acme"})


def test_sync_client_start_with_metadata_and_bad_metadata_changes_nothing(dsn: str) -> None:
    with DurableClient(dsn) as client:
        rid = client.start("agent", {}, revision="1", metadata={"tenant": "acme"})
        assert client.list_runs(metadata={"tenant": "acme"}).items[0].id == rid
        for bad, err in (([1], TypeError), ({1: "x"}, TypeError), ({"x": object()}, TypeError),
                         ({"x": "y" * 9000}, ValueError)):
            with pytest.raises(err):
                client.start("agent", {}, revision="1", metadata=bad)  # type: ignore[arg-type]
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT count(*) FROM pgdurable.runs").fetchone() == (1,)


async def test_list_runs_filters_and_keyset_pages(dsn: str) -> None:
    async with Durable(dsn) as app:
        ids = []
        for i in range(7):
            ids.append(await app.start("agent" if i % 2 else "other", {}, revision="1",
                                       queue="q1" if i < 5 else "q2",
                                       metadata={"tenant": "acme" if i < 4 else "globex",
                                                 "n": i}))
        with psycopg.connect(dsn, autocommit=True) as c:  # distinct, known creation times
            for i, rid in enumerate(ids):
                c.execute("UPDATE pgdurable.runs SET created_at = '2026-01-01'::timestamptz "
                          "+ make_interval(mins => %s) WHERE id = %s", (i, rid))
            c.execute("UPDATE pgdurable.runs SET status = 'failed', finished_at = now() "
                      "WHERE id = ANY(%s::uuid[])", ([ids[1], ids[3], ids[6]],))
        seen: list[str] = []
        page = await app.list_runs(limit=3)
        while True:
            seen += [r.id for r in page.items]
            if page.next_cursor is None:
                break
            page = await app.list_runs(limit=3, cursor=page.next_cursor)
        assert seen == ids[::-1], "newest first, every run once"
        got = await app.list_runs(status="failed", metadata={"tenant": "acme"})
        assert [r.id for r in got.items] == [ids[3], ids[1]] and got.next_cursor is None
        assert got.items[0].metadata == {"tenant": "acme", "n": 3}
        assert [r.id for r in (await app.list_runs(task="agent", queue="q1")).items] == \
            [ids[3], ids[1]]
        assert [r.id for r in (await app.list_runs(status=["failed", "runnable"],
                                                   queue="q2")).items] == [ids[6], ids[5]]
        t0 = datetime(2026, 1, 1, tzinfo=UTC)
        got = await app.list_runs(since=t0 + timedelta(minutes=2), until=t0 + timedelta(minutes=4))
        assert [r.id for r in got.items] == [ids[3], ids[2]]
        got = await app.list_runs(id_prefix=ids[4][:8])
        assert ids[4] in [r.id for r in got.items]
        assert all(r.id.startswith(ids[4][:8]) for r in got.items)
        got = await app.list_runs(id_prefix=ids[4][:13])
        assert [r.id for r in got.items] == [ids[4]], "a prefix with its dash"


@pytest.mark.parametrize(("filters", "err"), [
    ({"status": "nope"}, ValueError), ({"status": 3}, TypeError), ({"status": []}, TypeError),
    ({"task": ""}, ValueError), ({"queue": 1}, TypeError), ({"metadata": "x"}, TypeError),
    ({"since": "2026"}, TypeError), ({"until": datetime(2026, 1, 1)}, ValueError),
    ({"id_prefix": "xyz"}, ValueError), ({"id_prefix": "0" * 33}, ValueError),
    ({"limit": 0}, ValueError), ({"limit": 1001}, ValueError), ({"limit": True}, TypeError),
    ({"cursor": "!!!"}, ValueError), ({"cursor": 5}, TypeError),
])
def test_list_runs_bad_input_is_typed(filters: dict[str, Any], err: type[Exception]) -> None:
    with pytest.raises(err):
        list_runs_query(**filters)


def test_list_runs_plans_use_the_indexes(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("""
          INSERT INTO pgdurable.runs (task, revision, queue, status, metadata, created_at)
          SELECT 't' || (g % 10), '1', 'q' || (g % 5),
                 (ARRAY['runnable','completed','failed'])[1 + g % 3],
                 jsonb_build_object('tenant', 't' || (g % 100)),
                 now() - make_interval(secs => g)
            FROM generate_series(1, 50000) g""")
        c.execute("ANALYZE pgdurable.runs")
        cases = [{}, {"task": "t3"}, {"queue": "q2"}, {"status": "failed"},
                 {"metadata": {"tenant": "t7"}, "status": "failed"},
                 {"metadata": {"tenant": "t7"}}, {"id_prefix": "ab"}]
        for filters in cases:
            query, params = list_runs_query(**filters)
            plan = "\n".join(r[0] for r in c.execute("EXPLAIN " + query, params).fetchall())
            assert "Seq Scan" not in plan, (filters, plan)


def test_importing_pgdurable_does_not_import_opentelemetry() -> None:
    import subprocess
    code = ("import sys, pgdurable, pgdurable.worker, pgdurable.foundation.metrics, pgdurable.runs.tracing; "
            "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry', "
            "'prometheus_client', 'starlette', 'jinja2'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_sqlalchemy_start_run_with_metadata(dsn: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from pgdurable.contrib.sqlalchemy import start_run, url_from_dsn

    engine = create_engine(url_from_dsn(dsn))
    try:
        with Session(engine) as session, session.begin():
            rid = start_run(session, "order", {}, revision="7", metadata={"tenant": "acme"})
    finally:
        engine.dispose()
    with DurableClient(dsn) as client:
        assert [r.id for r in client.list_runs(metadata={"tenant": "acme"}).items] == [rid]


def test_cli_runs_filters_and_cursor(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from pgdurable.ops.cli import app as cli_app

    monkeypatch.setenv("PGDURABLE_DSN", dsn)
    with DurableClient(dsn) as client:
        ids = [client.start("agent", {}, revision="1", metadata={"tenant": t})
               for t in ("acme", "acme", "globex")]

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli_app, ["runs", *args], catch_exceptions=False)

    r = run("--metadata", '{"tenant": "acme"}', "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert {x["id"] for x in doc["runs"]} == set(ids[:2]) and doc["next_cursor"] is None
    assert json.loads(run("--id-prefix", ids[2][:12], "--json").stdout)["runs"][0]["id"] == ids[2]
    r = run("--limit", "1", "--metadata", '{"tenant": "acme"}')
    assert r.exit_code == 0 and "more: --cursor" in r.stderr
    cursor = r.stderr.split("--cursor", 1)[1].split()[0]
    # --json carries the cursor in the document (stderr says nothing then)
    page1 = run("--limit", "1", "--metadata", '{"tenant": "acme"}', "--json")
    assert json.loads(page1.stdout)["next_cursor"] == cursor and "more:" not in page1.stderr
    page2 = json.loads(run("--limit", "1", "--metadata", '{"tenant": "acme"}', "--cursor",
                           cursor, "--json").stdout)
    assert len(page2["runs"]) == 1 and page2["runs"][0]["id"] in ids[:2]
    assert page2["runs"][0]["id"] != json.loads(page1.stdout)["runs"][0]["id"]
    assert json.loads(run("--since", "2999-01-01", "--json").stdout) == {
        "runs": [], "next_cursor": None}
    for bad in (["--metadata", "[1]"], ["--metadata", "{"], ["--id-prefix", "zz"],
                ["--cursor", "nope"]):
        assert run(*bad).exit_code == 2, bad
