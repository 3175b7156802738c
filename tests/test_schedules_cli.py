"""``pgdurable schedule list | add | pause | resume | delete | trigger | runs``."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from pgdurable.ops.cli import app


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, ["schedule", *args], catch_exceptions=False)


def jcli(*args: str) -> Any:
    r = cli(*args, "--json")
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return json.loads(r.stdout)


@pytest.mark.parametrize(("args", "named"), [
    (["--cron", "0 25 * * *"], "invalid cron expression '0 25 * * *'"),
    (["--cron", "0 7 * * *", "--timezone", "Moon/Base"], "unknown time zone 'Moon/Base'"),
    (["--cron", "0 7 * * *", "--every", "10m"], "exactly one of cron= and every="),
    ([], "exactly one of cron= and every="),
    (["--every", "soon"], "bad age 'soon'"),
    (["--every", "10m", "--overlap", "queue"], "overlap must be one of"),
    (["--every", "10m", "--catchup", "maybe"], "catchup must be one of"),
    (["--every", "10m", "--state", "{nope"], "--state is not JSON"),
])
def test_add_refuses_bad_input_and_writes_nothing(dsn: str, conn: psycopg.Connection[Any],
                                                  args: list[str], named: str) -> None:
    r = cli("add", "bad", "--task", "digest", "--dsn", dsn, *args)
    assert r.exit_code == 2
    assert named in " ".join(r.stderr.split())
    assert conn.execute("SELECT count(*) FROM pgdurable.schedules").fetchone() == (0,)


def test_add_list_pause_resume_trigger_runs_delete(dsn: str,
                                                   conn: psycopg.Connection[Any]) -> None:
    r = cli("add", "digest", "--task", "digest", "--cron", "0 7 * * 1-5", "--timezone",
            "Europe/Berlin", "--state", '{"to": "team"}', "--catchup", "all", "--dsn", dsn)
    assert r.exit_code == 0 and "schedule digest created" in r.stdout, r.stderr
    assert "unchanged" in cli("add", "digest", "--task", "digest", "--cron", "0 7 * * 1-5",
                              "--timezone", "Europe/Berlin", "--state", '{"to": "team"}',
                              "--catchup", "all", "--dsn", dsn).stdout
    assert cli("add", "monitor", "--task", "monitor", "--every", "10m", "--dsn", dsn).exit_code == 0
    listed = {s["name"]: s for s in jcli("list", "--dsn", dsn)}
    assert listed["digest"]["cron"] == "0 7 * * 1-5"
    assert listed["digest"]["timezone"] == "Europe/Berlin"
    assert listed["digest"]["state"] == {"to": "team"} and listed["digest"]["catchup"] == "all"
    assert listed["monitor"]["every"] == 600.0
    assert listed["monitor"]["declared_by"] is None and not listed["monitor"]["undeclared"]

    assert "paused" in cli("pause", "digest", "--dsn", dsn).stdout
    assert "already paused" in cli("pause", "digest", "--dsn", dsn).stdout
    assert {s["name"]: s["paused"] for s in jcli("list", "--dsn", dsn)} == {
        "digest": True, "monitor": False}
    assert "resumed" in cli("resume", "digest", "--dsn", dsn).stdout
    assert "was not paused" in cli("resume", "digest", "--dsn", dsn).stdout

    r = cli("trigger", "monitor", "--dsn", dsn)
    assert r.exit_code == 0
    run_id = r.stdout.strip()
    assert conn.execute("SELECT task FROM pgdurable.runs WHERE id = %s", (run_id,)).fetchone() == (
        "monitor",)
    runs = jcli("runs", "monitor", "--dsn", dsn)
    assert [(x["run_id"], x["triggered"], x["status"]) for x in runs] == [
        (run_id, True, "runnable")]
    assert run_id in cli("runs", "monitor", "--dsn", dsn).stdout
    assert jcli("list", "--dsn", dsn)[1]["last_run_id"] == run_id

    assert "deleted" in cli("delete", "monitor", "--dsn", dsn).stdout
    assert [s["name"] for s in jcli("list", "--dsn", dsn)] == ["digest"]
    # the run keeps its schedule record
    assert conn.execute("SELECT schedule FROM pgdurable.schedule_runs").fetchone() == ("monitor",)


@pytest.mark.parametrize("command", ["pause", "resume", "delete", "trigger"])
def test_unknown_schedule_exits_3(dsn: str, command: str) -> None:
    r = cli(command, "nope", "--dsn", dsn)
    assert r.exit_code == 3
    assert "no schedule" in r.stderr


def test_list_marks_schedules_no_code_declares(dsn: str, conn: psycopg.Connection[Any]) -> None:
    for name, undeclared in (("kept", False), ("gone", True)):
        conn.execute(
            "SELECT pgdurable.upsert_schedule(%s, NULL, '1 hour', 'UTC', 'job', '1', '{}', "
            "'default', 3, 'skip', 'latest', 100, pgdurable.now() + interval '1 hour', 'code')",
            (name,))
        if undeclared:
            assert conn.execute("SELECT pgdurable.mark_undeclared('code', '{job}', '{kept}')"
                                ).fetchone() == (1,)
    assert {s["name"]: s["undeclared"] for s in jcli("list", "--dsn", dsn)} == {
        "gone": True, "kept": False}
    text = " ".join(cli("list", "--dsn", dsn).stdout.split())
    assert "not in code" in text


def test_resume_of_a_schedule_with_a_bad_cron_written_by_sql(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pgdurable.upsert_schedule('bad', '0 25 * * *', NULL, 'UTC', 'job', "
                 "'1', '{}', 'default', 3, 'skip', 'latest', 100, pgdurable.now(), NULL)")
    conn.execute("SELECT pgdurable.pause_schedule('bad')")
    r = cli("resume", "bad", "--dsn", dsn)
    assert r.exit_code == 2 and "invalid cron expression" in r.stderr
    assert conn.execute("SELECT paused FROM pgdurable.schedules").fetchone() == (True,)
