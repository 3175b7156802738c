"""The dashboard's run page and lists over HTTP (no browser): a run's result, a
run that recovered from a crash, a fork's durations and labels, children in the
run list, the workers page, the icon every browser asks for, and what it says
on a database it cannot use. The browser checks are in test_dashboard_browser.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from _dashboard_server import serving

from pgdurable import DurableClient
from pgdurable.ops.dashboard import create_app

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "pgdurable"]


def _claim(conn: psycopg.Connection[Any], task: str, owner: str, revision: str = "1") -> int:
    row = conn.execute("SELECT lease_token FROM pgdurable.claim_runs(%s, ARRAY['default'], "
                       "ARRAY[%s], ARRAY[%s], 1, '60 s')", (owner, task, revision)).fetchone()
    assert row is not None, "nothing claimed"
    return int(row[0])


def recovered_run(dsn: str) -> str:
    """A run whose first worker died (its lease expired), finished by a second one."""
    with DurableClient(dsn) as c:
        rid = c.start("agent", {"n": 0}, revision="1")
    with psycopg.connect(dsn, autocommit=True) as conn:
        _claim(conn, "agent", "w-1")
        conn.execute("SELECT pgdurable.emit_event(%s, 1, 'w-1', 0, '{\"token\": \"hi\"}')",
                     (rid,))
        conn.execute("UPDATE pgdurable.runs SET lease_expires_at = now() - interval '1 s' "
                     "WHERE id = %s", (rid,))  # w-1 died
        token = _claim(conn, "agent", "w-2")
        assert conn.execute("SELECT error->>'type' FROM pgdurable.runs WHERE id = %s",
                            (rid,)).fetchone() == ("LeaseExpired",)
        conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w-2', '{\"n\": 1}', "
                     "'{\"answer\": 42, \"note\": \"<b>not markup</b>\"}', 0)", (rid, token))
    return rid


def test_a_completed_run_shows_its_result_and_no_error(dsn: str) -> None:
    rid = recovered_run(dsn)
    with psycopg.connect(dsn) as conn:  # the end event says how the run ended: no error
        end = conn.execute("SELECT event FROM pgdurable.run_events WHERE run_id = %s AND final",
                           (rid,)).fetchone()
    assert end == ({"type": "end", "status": "completed", "error": None,
                    "result": {"answer": 42, "note": "<b>not markup</b>"}},)
    with serving(create_app(dsn)) as base:
        page = httpx.get(f"{base}/runs/{rid}").text
    assert 'class="errorbox"' not in page and "Error</h2>" not in page
    result = page[page.index('id="result"'):]
    assert '"answer": 42' in result and "\\u003cb\\u003enot markup" in result  # JSON, not HTML
    recovered = page[page.index('id="recovered"'):]
    assert "Recovered: an earlier attempt ended with <strong>LeaseExpired</strong>" in recovered


def test_a_read_only_role_sees_that_the_result_is_hidden(dsn: str) -> None:
    from test_security_boundary import _as, _grant, roles

    rid = recovered_run(dsn)
    with roles(dsn, "NOLOGIN", "LOGIN", "LOGIN") as (owner, app_role, ro):
        _grant(dsn, owner, app_role, ro)
        with serving(create_app(_as(dsn, ro))) as base:
            page = httpx.get(f"{base}/runs/{rid}").text
    res = page[page.index('id="res-h"'):page.index("</section>", page.index('id="res-h"'))]
    assert "Hidden: this role may read the views only" in res and "42" not in res


def test_a_fork_keeps_its_labels_and_no_step_has_a_negative_duration(dsn: str) -> None:
    with DurableClient(dsn) as c:
        rid = c.start("agent", {"n": 0}, revision="1", metadata={"tenant": "acme"})
    with psycopg.connect(dsn, autocommit=True) as conn:
        token = _claim(conn, "agent", "w-1")
        conn.execute("SELECT pgdurable.checkpoint_run(%s, %s, 'w-1', '{\"n\": 1}', 0)",
                     (rid, token))
        conn.execute("SELECT pgdurable.checkpoint_run(%s, %s, 'w-1', '{\"n\": 2}', 0)",
                     (rid, token))
        fork = str(conn.execute("SELECT pgdurable.fork_run(%s, 2, NULL, 'keep', NULL)",
                                (rid,)).fetchone()[0])  # type: ignore[index]
        token = _claim(conn, "agent", "w-2")  # the fork runs a step of its own
        conn.execute("SELECT pgdurable.checkpoint_run(%s, %s, 'w-2', '{\"n\": 3}', 0)",
                     (fork, token))
        assert conn.execute("SELECT metadata FROM pgdurable.runs WHERE id = %s",
                            (fork,)).fetchone() == ({"tenant": "acme"},)
    with serving(create_app(dsn)) as base:
        page = httpx.get(f"{base}/runs/{fork}").text
        found = httpx.get(f"{base}/runs", params={"metadata": '{"tenant": "acme"}'}).text
    assert '{"tenant": "acme"}' in page  # Metadata, as its source's
    assert fork[:8] in found and rid[:8] in found
    durations = re.findall(r'<tr id="step-\d+">\s*<th[^>]*>\d+</th>\s*<td[^>]*>[^<]*</td>\s*'
                           r"<td>[^<]*</td>\s*<td>([^<]*)</td>", page)
    assert len(durations) == 3, page
    assert all(d and not d.startswith("-") for d in durations), durations


def test_children_are_marked_with_their_parent_in_the_run_list(dsn: str) -> None:
    with DurableClient(dsn) as c:
        parent = c.start("fan", {}, revision="1")
    with psycopg.connect(dsn, autocommit=True) as conn:
        token = _claim(conn, "fan", "w-1")
        child = str(conn.execute(
            "SELECT run_id FROM pgdurable.start_child(%s, %s, 'c-1', 'leaf', '1', '{}', "
            "'default', 0, 3, NULL, NULL, NULL, 'cancel')", (parent, token)
        ).fetchone()[0])  # type: ignore[index]
    with serving(create_app(dsn)) as base:
        runs = httpx.get(f"{base}/runs").text
    assert "<th scope=\"col\">Parent</th>" in runs
    row = runs[runs.index(f'<th scope="row"><a class="mono" href="/runs/{child}"'):]
    row = row[:row.index("</tr>")]
    assert f'href="/runs/{parent}"' in row and f"↳ {parent[:8]}" in row
    top = runs[runs.index(f'<th scope="row"><a class="mono" href="/runs/{parent}"'):]
    assert "↳" not in top[:top.index("</tr>")]


def test_the_workers_page_lists_live_and_lapsed_workers(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgdurable.register_worker('host-a:11:x', ARRAY['agent', 'mailer'], "
                     "ARRAY['3', '1'])")
        conn.execute("SELECT pgdurable.worker_started('host-a:11:x', 'i-1', '60 s', 'host-a', "
                     "11, ARRAY['default', 'mail'], 8)")
        conn.execute("SELECT pgdurable.worker_started('host-b:12:y', 'i-2', '60 s', 'host-b', "
                     "12, ARRAY['default'], 2)")
        conn.execute("UPDATE pgdurable.worker_presence SET until = now() - interval '1 s' "
                     "WHERE worker_id = 'host-b:12:y'")  # killed: its row lapsed
        with DurableClient(dsn) as c:
            c.start("agent", {}, revision="3")
        _claim(conn, "agent", "host-a:11:x", revision="3")
        for bad in (("w", "i", "60 s", "h", -1, ["q"], 1), ("w", "i", "60 s", "h", 1, ["q"], 0),
                    ("", "i", "60 s", "h", 1, ["q"], 1)):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute("SELECT pgdurable.worker_started(%s, %s, %s::interval, %s, %s, "
                             "%s, %s)", bad)
            assert refused.value.sqlstate == "PD000"  # InvalidInput, nothing written
        assert conn.execute("SELECT count(*) FROM pgdurable.worker_presence").fetchone() == (2,)
    with serving(create_app(dsn)) as base:
        page = httpx.get(f"{base}/workers").text
    assert "1 live worker(s)" in page
    a = page[page.index("host-a:11:x"):]
    a = a[:a.index("</tr>")]
    for cell in ("live", "host-a", ">11<", "default, mail", ">8<", ">1</a>", "agent@3, mailer@1",
                 " ago "):
        assert cell in a, (cell, a)
    b = page[page.index("host-b:12:y"):]
    assert "lapsed" in b[:b.index("</tr>")]


def test_no_page_asks_for_a_missing_resource(dsn: str) -> None:
    """Each page's links (stylesheet, script, icon) answer 200, and so does the
    /favicon.ico a browser asks for by itself."""
    with serving(create_app(dsn)) as base:
        for path in ("/", "/runs", "/workers", "/leases", "/schedules"):
            page = httpx.get(base + path).text
            for link in re.findall(r'(?:href|src)="(/static/[^"]+)"', page):
                assert httpx.get(base + link).status_code == 200, (path, link)
            assert 'rel="icon"' in page
        icon = httpx.get(base + "/favicon.ico")
        assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg")


def test_an_unmigrated_database_gets_a_page_that_says_migrate(empty_dsn: str) -> None:
    with serving(create_app(empty_dsn)) as base:  # serves anyway: the pages say why
        for path in ("/", "/runs", "/workers"):
            r = httpx.get(base + path)
            assert r.status_code == 503, (path, r.status_code, r.text[-500:])
            assert "has no pgdurable schema; run `pgdurable migrate`" in r.text
    nowhere = "postgresql://app:hunter2@127.0.0.1:1/app"
    with serving(create_app(nowhere)) as base:
        r = httpx.get(base + "/runs")
        assert r.status_code == 503 and "nothing answers at 127.0.0.1:1" in r.text
        assert "hunter2" not in r.text


def _dashboard_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "dashboard", "--port", "1", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize(("args", "needle"), [
    (["--actions"], "--actions needs --token (or $PGDURABLE_DASHBOARD_TOKEN)"),
    (["--token", "short"], "--token must be at least 32 bytes"),
    (["--trusted-host", "a b:1"], "trusted host 'a b:1'"),
])
def test_the_dashboard_command_speaks_of_its_options(dsn: str, args: list[str], needle: str
                                                     ) -> None:
    p = _dashboard_cli("--dsn", dsn, *args)
    assert p.returncode == 2 and needle in p.stderr, p.stderr
    assert "token=" not in p.stderr and "authorize=" not in p.stderr and "trusted_hosts" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_the_dashboard_command_on_an_unusable_database_is_one_line(empty_dsn: str) -> None:
    p = _dashboard_cli("--dsn", empty_dsn)
    assert p.returncode == 2 and "run `pgdurable migrate`" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    p = _dashboard_cli("--dsn", "postgresql://app:hunter2@127.0.0.1:1/app")
    assert p.returncode == 2 and "nothing answers at 127.0.0.1:1" in p.stderr, p.stderr
    assert "hunter2" not in p.stderr and "pool initialization" not in p.stderr
