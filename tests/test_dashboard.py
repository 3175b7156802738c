"""The dashboard over HTTP (no browser): pages render real runs from the views,
the read-only role is enough, actions are refused unless enabled and
authorized (token, hook, CSRF), SSE is fed by ONE LISTEN connection, and
/metrics parses. The browser checks are in test_dashboard_browser.py."""

from __future__ import annotations

import json
import re
import threading
import uuid
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
from _dashboard_server import form_csrf as _csrf
from _dashboard_server import login, serving
from prometheus_client.parser import text_string_to_metric_families
from test_security_boundary import _as, _grant, roles

from pgdurable import DurableClient
from pgdurable.ops.dashboard import create_app
from pgdurable.runs.schedules import make_schedule, upsert_schedule_sync

TOKEN = "s3cret-token-of-the-dashboard-tests-0123"  # 32 bytes at least


def _seed(dsn: str) -> dict[str, str]:
    with DurableClient(dsn) as c:
        ids = {
            "a": c.start("agent", {"n": 0}, revision="1", metadata={"tenant": "acme"}),
            "b": c.start("mailer", {}, revision="1", queue="mail", metadata={"tenant": "globex"}),
        }
    with psycopg.connect(dsn, autocommit=True) as conn:  # a step, via the engine's functions
        conn.execute("SELECT * FROM pgdurable.claim_runs('w1', ARRAY['default'], ARRAY['agent'], "
                     "ARRAY['1'], 1, '60 s')")
        conn.execute("SELECT pgdurable.checkpoint_run(%s, 1, 'w1', '{\"n\": 1}', 0)", (ids["a"],))
    return ids


def test_pages_render_real_runs_and_filters_narrow(dsn: str) -> None:
    ids = _seed(dsn)
    with serving(create_app(dsn)) as base:
        home = httpx.get(base + "/")
        assert home.status_code == 200 and "mail" in home.text and "default" in home.text
        runs = httpx.get(base + "/runs").text
        assert ids["a"][:8] in runs and ids["b"][:8] in runs
        narrowed = httpx.get(base + "/runs", params={"metadata": '{"tenant": "acme"}'}).text
        assert ids["a"][:8] in narrowed and ids["b"][:8] not in narrowed
        page = httpx.get(f"{base}/runs/{ids['a']}").text
        assert 'id="step-1"' in page and "w1" in page and '{"n": 1}' in page
        assert "Cancel run" not in page, "actions off by default"
        leases = httpx.get(base + "/leases").text
        assert ids["a"] in leases and ids["b"] not in leases
        assert httpx.get(base + "/runs", params={"since": "yesterday"}).status_code == 400
        assert httpx.get(f"{base}/runs/not-a-uuid").status_code == 404
        r = httpx.post(f"{base}/runs/{ids['a']}/cancel", data={"csrf": "x"})
        assert r.status_code == 403
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT status FROM pgdurable.runs WHERE id = %s",
                         (ids["a"],)).fetchone() == ("leased",)


def test_readonly_role_is_enough(dsn: str) -> None:
    ids = _seed(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:  # limits, a schedule, a fork
        conn.execute("SELECT pgdurable.set_queue('mail', 3, 1, 2, NULL)")
        conn.execute("SELECT pgdurable.set_bucket('api', 1, 5)")
        upsert_schedule_sync(conn, make_schedule("hourly", task="mailer", cron="0 * * * *"))
        conn.execute("SELECT pgdurable.trigger_schedule('hourly')")
        fork = conn.execute("SELECT pgdurable.fork_run(%s, 1, NULL, 'keep', NULL)",
                            (ids["a"],)).fetchone()[0]  # type: ignore[index]
    with roles(dsn, "NOLOGIN", "LOGIN", "LOGIN") as (owner, app_role, ro):
        _grant(dsn, owner, app_role, ro)
        with serving(create_app(_as(dsn, ro))) as base:
            for path in ("/", "/runs", f"/runs/{ids['a']}", "/leases", "/schedules",
                         f"/runs/{fork}",
                         "/runs?status=leased&metadata=%7B%22tenant%22%3A%22acme%22%7D"):
                r = httpx.get(base + path)
                assert r.status_code == 200, (path, r.text[-2000:])
            page = httpx.get(f"{base}/runs/{ids['a']}").text
            assert 'id="step-1"' in page and "read-only mode" in page
            assert '{"n": 1}' not in page, "no states for the read-only role"
            assert f'href="/runs/{fork}"' in page, "its fork, read from the views"
            assert "0 / 3" in httpx.get(base + "/").text and "api" in httpx.get(base + "/").text
            assert "0 * * * * (UTC)" in httpx.get(base + "/schedules").text


def test_create_app_refuses_actions_without_authorization(dsn: str) -> None:
    with pytest.raises(ValueError, match="token"):
        create_app(dsn, actions=True)
    with pytest.raises(ValueError, match="32 bytes"):  # was 8 characters (issue 36)
        create_app(dsn, actions=True, token="short")


def test_actions_need_token_csrf_and_the_hook(dsn: str) -> None:
    ids = _seed(dsn)
    allowed = {"ok": True}  # the hook is asked on every request, pages included
    app = create_app(dsn, actions=True, token=TOKEN, authorize=lambda req: allowed["ok"])
    with serving(app) as base, login(base, TOKEN) as client:
        page = client.get(f"/runs/{ids['b']}").text
        csrf = _csrf(page, "cancel")
        url = f"/runs/{ids['b']}/cancel"
        refused = [
            client.post(url, data={"csrf": csrf, "token": "wrong-token"}),
            client.post(url, data={"csrf": "0" * 64, "token": TOKEN}),
            client.post(url, data={"csrf": csrf, "token": TOKEN},
                        headers={"Origin": "https://evil.example"}),
            client.post(url, data={"csrf": csrf, "token": TOKEN},
                        headers={"Sec-Fetch-Site": "cross-site"}),
        ]
        allowed["ok"] = False
        refused.append(client.post(url, data={"csrf": csrf, "token": TOKEN}))  # the hook says no
        refused.append(httpx.post(base + url, data={"csrf": csrf, "token": TOKEN}))  # no session
        assert [r.status_code for r in refused] == [403] * 5 + [401]
        with psycopg.connect(dsn) as c:
            assert c.execute("SELECT status FROM pgdurable.runs WHERE id = %s",
                             (ids["b"],)).fetchone() == ("runnable",)
        allowed["ok"] = True
        r = client.post(url, data={"csrf": csrf, "token": TOKEN}, follow_redirects=True)
        assert r.status_code == 200 and "cancel: cancelled" in r.text
        r = client.post(f"/runs/{ids['b']}/retry", data={
            "csrf": _csrf(r.text, "retry"), "token": TOKEN}, follow_redirects=True)
        assert "retry: runnable" in r.text
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT status FROM pgdurable.runs WHERE id = %s",
                         (ids["b"],)).fetchone() == ("runnable",)


def _waiting_for_approval(dsn: str) -> str:
    """A run parked on ('approval', 'deploy-1'), as a worker would leave it."""
    with DurableClient(dsn) as c:
        rid = c.start("approve", {}, revision="1")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT * FROM pgdurable.claim_runs('w1', ARRAY['default'], "
                     "ARRAY['approve'], ARRAY['1'], 1, '60 s')")
        conn.execute("SELECT * FROM pgdurable.park_run(%s, 1, 'w1', '{}', 0, 'approval', "
                     "'deploy-1', NULL, NULL)", (rid,))
    return rid


def test_signal_approves_a_waiting_run(dsn: str) -> None:
    rid = _waiting_for_approval(dsn)
    with serving(create_app(dsn, actions=True, token=TOKEN)) as base, \
            login(base, TOKEN) as client:
        page = client.get(f"/runs/{rid}").text
        r = client.post(f"/runs/{rid}/signal", data={
            "csrf": _csrf(page, "signal"), "token": TOKEN, "kind": "approval",
            "payload": '{"approved": true}'}, follow_redirects=True)
        assert "signalled (woke the run)" in r.text
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT status, wake->'payload' FROM pgdurable.runs WHERE id = %s",
                            (rid,)).fetchone() == ("runnable", {"approved": True})


def test_a_signal_of_another_kind_is_kept_pending(dsn: str) -> None:
    # signal_run answers no row then: the page says so (it was a 500 when the answer
    # was read as rows[0][0])
    rid = _waiting_for_approval(dsn)
    with serving(create_app(dsn, actions=True, token=TOKEN)) as base, \
            login(base, TOKEN) as client:
        page = client.get(f"/runs/{rid}").text
        r = client.post(f"/runs/{rid}/signal", data={
            "csrf": _csrf(page, "signal"), "token": TOKEN, "kind": "review",
            "payload": "{}"}, follow_redirects=True)
        assert r.status_code == 200 and "signalled (kept pending)" in r.text
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT status FROM pgdurable.runs WHERE id = %s",
                            (rid,)).fetchone() == ("waiting",)
        assert conn.execute("SELECT kind FROM pgdurable.signals WHERE run_id = %s "
                            "AND consumed_at IS NULL", (rid,)).fetchall() == [("review",)]


def test_sse_fans_one_listen_connection_out_to_every_tab(dsn: str) -> None:
    ids = _seed(dsn)
    app = create_app(dsn)
    got: list[list[dict[str, Any]]] = [[], [], []]
    with serving(app) as base:
        ready = threading.Barrier(len(got) + 1, timeout=30)

        def tab(i: int) -> None:
            with httpx.stream("GET", base + "/events", timeout=30) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    msg = json.loads(line[6:])
                    got[i].append(msg)
                    if msg["channel"] == "reconnect" and len(got[i]) == 1:
                        ready.wait()
                    if msg["channel"] == "steps":
                        return

        threads = [threading.Thread(target=tab, args=(i,), daemon=True) for i in range(3)]
        for t in threads:
            t.start()
        ready.wait()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pgdurable.checkpoint_run(%s, 1, 'w1', '{\"n\": 2}', 0)",
                         (ids["a"],))
        for t in threads:
            t.join(30)
        assert app.state.dashboard.live.connections == 1
        with psycopg.connect(dsn) as conn:
            listeners = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND (query LIKE 'LISTEN pgdurable%%' "
                "     OR query LIKE 'SELECT pgdurable.listen_presence%%')").fetchone()
        assert listeners == (1,), "one LISTEN connection for all tabs"
    for msgs in got:
        assert {"channel": "steps", "runs": [ids["a"]]} in msgs


def test_metrics_endpoint_parses(dsn: str) -> None:
    _seed(dsn)
    with serving(create_app(dsn)) as base:
        text = httpx.get(base + "/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    depth = {(s.labels["queue"], s.labels["status"]): s.value
             for s in fams["pgdurable_queue_depth"].samples}
    assert depth[("default", "leased")] == 1 and depth[("mail", "runnable")] == 1
    assert "pgdurable_queue_oldest_runnable_age_seconds" in fams




def _claim(conn: psycopg.Connection[Any], task: str, owner: str = "w1") -> None:
    conn.execute("SELECT * FROM pgdurable.claim_runs(%s, ARRAY['default'], ARRAY[%s], "
                 "ARRAY['1'], 1, '60 s')", (owner, task))


def test_timeline_names_owners_effects_and_fork_lineage(dsn: str) -> None:
    with DurableClient(dsn) as c:
        rid = c.start("flow", {}, revision="1")
    with psycopg.connect(dsn, autocommit=True) as conn:
        _claim(conn, "flow", "worker-a")
        conn.execute("SELECT * FROM pgdurable.effect_begin(%s, 1, 'worker-a', 'charge')", (rid,))
        conn.execute("SELECT pgdurable.effect_finish(%s, 1, 'worker-a', 'charge', true, "
                     "'1', NULL)", (rid,))
        conn.execute("SELECT pgdurable.checkpoint_run(%s, 1, 'worker-a', %s, 0)",  # write_steps
                     (rid, '{"workflow": {"kind": "step", "name": "fetch"}}'))
        conn.execute("SELECT * FROM pgdurable.park_run(%s, 1, 'worker-a', %s, 0, 'approval', "  # _checkpoint
                     "'r-1', NULL, NULL)", (rid, '{"workflow": {"kind": "wait", "name": "ok#1"}}'))
        conn.execute("SELECT pgdurable.send_signal('approval', 'r-1', '{}', NULL, NULL)")
        _claim(conn, "flow", "worker-b")
        conn.execute("SELECT * FROM pgdurable.effect_begin(%s, 2, 'worker-b', 'mail')", (rid,))
        owners = conn.execute("SELECT step, token, owner FROM pgdurable.run_steps "
                              "WHERE run_id = %s ORDER BY step", (rid,)).fetchall()
    assert owners == [(1, 1, "worker-a"), (2, 1, "worker-a")]
    app = create_app(dsn, actions=True, token=TOKEN)
    with serving(app) as base, login(base, TOKEN) as client:
        page = client.get(f"/runs/{rid}").text
        row1 = page[page.index('id="step-1"'):page.index('id="step-2"')]
        assert "fetch" in row1 and "worker-a" in row1 and "charge" in row1
        assert "succeeded" in row1
        running = page[page.index('id="step-running"'):]
        assert "mail" in running and "started" in running, "the running step's effect"
        assert "Not forked." in page
        refused = client.post(f"/runs/{rid}/fork", data={
            "csrf": _csrf(page, "cancel"), "token": TOKEN, "step": "1"})
        assert refused.status_code == 403, "a CSRF token of another action"
        bad = client.post(f"/runs/{rid}/fork", data={
            "csrf": _csrf(page, "fork"), "token": TOKEN, "step": "7"})
        assert bad.status_code == 409 and "no recorded step 7" in bad.text
        r = client.post(f"/runs/{rid}/fork", data={
            "csrf": _csrf(page, "fork"), "token": TOKEN, "step": "1",
            "state": '{"patched": true}'}, follow_redirects=True)
        assert r.status_code == 200 and f"fork: forked from {rid} at step 1" in r.text
        fork_id = str(r.url).rsplit("/", 1)[1].split("?")[0]
        assert fork_id != rid
        assert re.search(rf'id="forked-from"><a class="mono" href="/runs/{rid}">{rid}</a> at '
                         r"step 1<", r.text)
        assert "copied by fork" in r.text and 'id="step-2"' not in r.text
        source = client.get(f"/runs/{rid}").text
        assert f'href="/runs/{fork_id}"' in source and "from step 1" in source
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT forked_from, forked_from_step, state FROM pgdurable.runs "
                            "WHERE id = %s", (fork_id,)).fetchone() == (
            uuid.UUID(rid), 1, {"workflow": {"kind": "step", "name": "fetch"}, "patched": True})


def test_schedules_page_and_actions(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        upsert_schedule_sync(conn, make_schedule("nightly", task="report", cron="0 3 * * *",
                                                 timezone="Europe/Paris"))
        upsert_schedule_sync(conn, make_schedule("poll", task="poll", every=timedelta(seconds=30)))
    with serving(create_app(dsn)) as base:  # actions off: no forms, a POST is refused
        page = httpx.get(base + "/schedules").text
        assert "0 3 * * * (Europe/Paris)" in page and "every 30.0 s" in page
        assert "Trigger now" not in page
        assert httpx.post(base + "/schedules/trigger", data={"name": "poll"}).status_code == 403
    with serving(create_app(dsn, actions=True, token=TOKEN)) as base, \
            login(base, TOKEN) as client:
        page = client.get("/schedules").text
        csrf = _schedule_csrf(page, "trigger", "poll")
        forged = client.post("/schedules/trigger", data={
            "name": "nightly", "csrf": csrf, "token": TOKEN})
        assert forged.status_code == 403, "a CSRF token is bound to its schedule"
        r = client.post("/schedules/trigger", data={"name": "poll", "csrf": csrf,
                                                          "token": TOKEN},
                       follow_redirects=True)
        assert "trigger poll: started run" in r.text and "(triggered)" in r.text
        r = client.post("/schedules/pause", data={
            "name": "poll", "csrf": _schedule_csrf(r.text, "pause", "poll"), "token": TOKEN},
            follow_redirects=True)
        assert "pause poll: paused" in r.text and "paused</span>" in r.text
        r = client.post("/schedules/resume", data={
            "name": "poll", "csrf": _schedule_csrf(r.text, "resume", "poll"), "token": TOKEN},
            follow_redirects=True)
        assert "resume poll: resumed" in r.text
        gone = client.post("/schedules/pause", data={
            "name": "nope", "csrf": "x", "token": TOKEN})
        assert gone.status_code == 403
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT paused, fired, next_fire_at > now() FROM pgdurable.schedules "
                           "WHERE name = 'poll'").fetchone()
        assert row == (False, 1, True)
        assert conn.execute("SELECT count(*) FROM pgdurable.schedule_runs").fetchone() == (1,)


def _schedule_csrf(html: str, action: str, name: str) -> str:
    m = re.search(rf'action="[^"]*/schedules/{action}" class="inline">\s*'
                  rf'<input type="hidden" name="name" value="{name}">\s*'
                  r'<input type="hidden" name="csrf" value="(\w+)"', html)
    assert m, html
    return m.group(1)


def test_queue_limits_keys_and_buckets(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgdurable.set_queue('llm', 2, 1, 5, 10)")
        conn.execute("SELECT pgdurable.set_bucket('openai:tokens', 100, 1000)")
        for key in ("acme", "acme", "globex"):
            conn.execute("SELECT * FROM pgdurable.start_run_flow('agent', '1', '{}', 'llm', 0, 3, "
                         "NULL, NULL, NULL, NULL, %s, NULL, NULL)", (key,))
        conn.execute("SELECT * FROM pgdurable.claim_runs('w1', ARRAY['llm'], ARRAY['agent'], "
                     "ARRAY['1'], 5, '60 s')")
    with serving(create_app(dsn)) as base:
        page = httpx.get(base + "/").text
    limits = page[page.index('id="limits"'):page.index('id="keys"')]
    assert re.search(r">llm</a></th>\s*<td[^>]*>2 / 2</td>\s*<td[^>]*>1</td>\s*"
                     r"<td[^>]*>5/s</td>", limits), limits
    keys = page[page.index('id="keys"'):page.index('id="buckets"')]
    assert re.search(r'>acme</td>\s*<td class="num bad">1 / 1</td>\s*<td class="num">1</td>',
                     keys), keys
    assert "openai:tokens" in page[page.index('id="buckets"'):]
