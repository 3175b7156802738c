"""The dashboard's boundary (issue 36), over real HTTP (uvicorn; httpx's ASGI
transport where a test needs several client addresses):

- with a token or an ``authorize`` hook, EVERY route (pages, ``/events``,
  ``/metrics``, scripts) needs it: a signed session cookie from the login form
  (HttpOnly, SameSite=Strict) or a bearer header; the hook is asked on each
  request;
- the Host header must name a trusted host (loopback by default), and a POST's
  Origin is compared with that list, not with the request's own Host;
- a POST declaring a huge body is refused before it is read, and one that does
  not declare its size is cut at the cap;
- a token shorter than 32 bytes is refused; wrong tokens lock a client out;
- served on a non-loopback address without either, the CLI warns loudly;
- mounted in a parent app (no lifespan), every page works: the pool opens on
  first use;
- the run page fetches a bounded amount whatever the history's size (diffs
  computed in SQL, steps paged);
- a fork step beyond the SQL integer is a 400 naming the parameter.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from _dashboard_server import COOKIE, free_port, login, serving
from _dashboard_server import form_csrf as _csrf
from _pgnet import proxied
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from pgdurable import DurableClient
from pgdurable.ops.dashboard import create_app

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "dashboard-boundary-token-0123456789abcdef"  # 41 bytes


@pytest.fixture(autouse=True)
def _own_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's /metrics reads its own database: ``metrics.enable`` keeps the
    first DSN of the process (a dashboard's queue gauges are of that one)."""
    from pgdurable.foundation import metrics

    monkeypatch.setattr(metrics, "_m", None)


def _seed(dsn: str) -> str:
    with DurableClient(dsn) as c:
        rid = c.start("secret-agent", {"n": 0}, revision="1", metadata={"tenant": "acme"})
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT * FROM pgdurable.claim_runs('w1', ARRAY['default'], "
                     "ARRAY['secret-agent'], ARRAY['1'], 1, '300 s')")
        conn.execute("SELECT pgdurable.checkpoint_run(%s, 1, 'w1', '{\"n\": 1}', 0)", (rid,))
    return rid


def _status(dsn: str, rid: str) -> str:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT status FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone()
    assert row is not None
    return str(row[0])


def _paths(rid: str) -> list[str]:
    return ["/", "/runs", f"/runs/{rid}", "/schedules", "/leases", "/events", "/metrics",
            "/static/live.js", "/runs?metadata=%7B%22tenant%22%3A%22acme%22%7D"]


# -- authentication in front of every route ---------------------------------------------


def test_with_a_token_every_route_needs_a_session(dsn: str) -> None:
    rid = _seed(dsn)
    other = "another-token-" + "y" * 30
    with serving(create_app(dsn, token=other)) as base, login(base, other) as client:
        foreign = client.cookies[COOKIE]  # a session of a dashboard with another token
    with serving(create_app(dsn, token=TOKEN)) as base:
        assert httpx.get(base + "/runs", cookies={COOKIE: foreign}).status_code == 303
        for path in _paths(rid):
            r = httpx.get(base + path, timeout=30)
            assert r.status_code in (303, 401), (path, r.status_code)
            assert rid not in r.text and "secret-agent" not in r.text and "acme" not in r.text
            if r.status_code == 303:  # a page: to the login form, and back after
                assert r.headers["location"].startswith("/login?next=%2F"), r.headers
        form = httpx.get(base + "/login")
        assert form.status_code == 200 and 'type="password"' in form.text
        assert httpx.get(base + "/static/style.css").status_code == 200  # the form's CSS
        # a wrong token: no cookie, nothing shown
        wrong = httpx.post(base + "/login", data={"token": "x" * 40})
        assert wrong.status_code == 403 and COOKIE not in wrong.cookies
        # a forged or truncated cookie is no session
        for forged in ("v1.9999999999.00.00", "anything", ""):
            r = httpx.get(base + "/runs", cookies={COOKIE: forged})
            assert r.status_code == 303
        with login(base, TOKEN) as client:
            cookie = next(h for h in client.post(
                "/login", data={"token": TOKEN}).headers.get_list("set-cookie"))
            assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
            assert "Path=/" in cookie and "Max-Age=" in cookie
            for path in _paths(rid):
                if path == "/events":
                    with client.stream("GET", path) as r:
                        assert r.status_code == 200
                    continue
                r = client.get(path)
                assert r.status_code == 200, (path, r.text[-500:])
            assert rid in client.get(f"/runs/{rid}").text
            r = client.post("/logout")
            assert r.status_code == 303
            assert client.get("/runs").status_code == 303, "logged out"
        # a bearer header for scrapers and scripts
        r = httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and "pgdurable_queue_depth" in r.text
        r = httpx.get(base + "/metrics", headers={"Authorization": "Bearer " + "z" * 40})
        assert r.status_code == 401


def test_the_authorize_hook_is_asked_on_every_request(dsn: str) -> None:
    rid = _seed(dsn)
    seen: list[str] = []
    allowed = {"ok": False}

    def hook(request: Any) -> bool:
        seen.append(request.url.path)
        return allowed["ok"]

    with serving(create_app(dsn, authorize=hook)) as base:
        for path in _paths(rid):
            r = httpx.get(base + path, timeout=30)
            assert r.status_code == 403, (path, r.status_code)
            assert rid not in r.text and "secret-agent" not in r.text
        assert len(seen) == len(_paths(rid))
        assert httpx.get(base + "/login").status_code in (403, 404), "no login form"
        allowed["ok"] = True
        for path in _paths(rid):
            if path == "/events":
                with httpx.stream("GET", base + path, timeout=30) as r:
                    assert r.status_code == 200
                continue
            assert httpx.get(base + path).status_code == 200, path


# -- trusted hosts, for the Host check and the Origin comparison ------------------------


def test_the_host_must_be_trusted(dsn: str) -> None:
    rid = _seed(dsn)
    with serving(create_app(dsn)) as base:
        port = base.rsplit(":", 1)[1]
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io"):
            r = httpx.get(base + f"/runs/{rid}", headers={"Host": host})
            assert r.status_code == 400 and rid not in r.text, host
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
            assert httpx.get(base + "/runs", headers={"Host": host}).status_code == 200, host
    with serving(create_app(dsn, trusted_hosts=["ops.example.com", "*.ops.example"])) as base:
        assert httpx.get(base + "/", headers={"Host": "ops.example.com"}).status_code == 200
        assert httpx.get(base + "/", headers={"Host": "a.ops.example"}).status_code == 200
        assert httpx.get(base + "/").status_code == 400, "127.0.0.1 is not in the list"
    with pytest.raises(ValueError, match="wildcard"):
        create_app(dsn, trusted_hosts=["ops.*"])
    with pytest.raises(TypeError):
        create_app(dsn, trusted_hosts="localhost")  # type: ignore[arg-type]


def test_a_post_is_refused_from_an_untrusted_origin(dsn: str) -> None:
    rid = _seed(dsn)
    app = create_app(dsn, actions=True, token=TOKEN,
                     trusted_hosts=["127.0.0.1", "ops.example.com"])
    with serving(app) as base, login(base, TOKEN) as client:
        port = base.rsplit(":", 1)[1]
        csrf = _csrf(client.get(f"/runs/{rid}").text, "cancel")
        url = f"/runs/{rid}/cancel"
        data = {"csrf": csrf, "token": TOKEN}
        # DNS rebinding: the attacker's page names its own host in Host and Origin
        rebound = client.post(url, data=data, headers={
            "Host": f"attacker.example:{port}", "Origin": f"http://attacker.example:{port}"})
        assert rebound.status_code == 400
        for origin in ("http://attacker.example", f"http://127.0.0.1:{int(port) + 1}",
                       "null", "file://", f"http://127.0.0.1:{port}/x"):
            r = client.post(url, data=data, headers={"Origin": origin})
            assert r.status_code == 403 and "CSRF" in r.text, origin
        assert _status(dsn, rid) == "leased"
        # a trusted origin (a TLS proxy in front, say) may act
        r = client.post(url, data=data, headers={"Origin": "https://ops.example.com"})
        assert r.status_code == 303, r.text
    assert _status(dsn, rid) == "leased"  # a cancel request on a leased run: still leased
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT cancel_requested_at IS NOT NULL FROM pgdurable.runs "
                         "WHERE id = %s", (rid,)).fetchone() == (True,)


# -- the form read: Content-Length first, streamed with a cap ---------------------------


def _raw_post(port: int, path: str, headers: dict[str, str], body_chunks: Iterator[bytes],
              chunked: bool) -> tuple[int, int]:
    """Send a POST over a raw socket; stop sending once the server answers.
    Returns (status, bytes of body sent)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        s.sendall((head + "\r\n").encode())
        s.setblocking(False)
        answer = b""
        for chunk in body_chunks:
            try:
                answer += s.recv(65536)
            except BlockingIOError:
                pass
            if answer:
                break
            data = (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") if chunked else chunk
            try:
                s.sendall(data)
            except BlockingIOError:
                break  # the server stopped reading
            except OSError:
                break
            sent += len(chunk)
        s.settimeout(30)
        while b"\r\n" not in answer:
            more = s.recv(65536)
            if not more:
                break
            answer += more
    return int(answer.split(b" ", 2)[1]), sent


def test_a_huge_post_is_refused_before_it_is_read(dsn: str) -> None:
    rid = _seed(dsn)
    with serving(create_app(dsn, actions=True, token=TOKEN)) as base:
        port = int(base.rsplit(":", 1)[1])
        # unauthenticated, 600 MB declared: answered at once, the body never sent
        status, sent = _raw_post(port, f"/runs/{rid}/cancel", {
            "Content-Type": "application/x-www-form-urlencoded",
            "Content-Length": str(600 * 2**20)}, iter(()), chunked=False)
        assert (status, sent) == (413, 0)
        with login(base, TOKEN) as client:
            cookie = client.cookies[COOKIE]
        # logged in, the size not declared (chunked): cut at the cap, not read on
        big = (b"x" * 65536 for _ in range(600 * 16))  # up to 600 MB
        status, sent = _raw_post(port, f"/runs/{rid}/cancel", {
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"{COOKIE}={cookie}", "Transfer-Encoding": "chunked"}, big, chunked=True)
        assert status == 413
        assert sent < 64 * 2**20, f"the server read on: {sent} bytes sent"
        r = httpx.post(f"{base}/runs/{rid}/cancel", content=b"x" * 70000,
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 413
    assert _status(dsn, rid) == "leased"


# -- the token: 32 bytes at least, and a bounded number of wrong attempts ---------------


def test_a_short_token_is_refused(dsn: str) -> None:
    for short in ("short", "x" * 31, "é" * 15 + "x"):  # 31 bytes
        with pytest.raises(ValueError, match="32 bytes"):
            create_app(dsn, token=short)
        with pytest.raises(ValueError, match="32 bytes"):
            create_app(dsn, actions=True, token=short)
    create_app(dsn, token="x" * 32)
    create_app(dsn, token="é" * 16)  # 32 bytes in UTF-8
    p = subprocess.run([sys.executable, "-m", "pgdurable", "dashboard", "--dsn", dsn,
                        "--port", str(free_port()), "--token", "short"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "32 bytes" in p.stderr and "Traceback" not in p.stderr


async def test_wrong_tokens_lock_the_client_out(dsn: str) -> None:
    rid = _seed(dsn)
    app = create_app(dsn, actions=True, token=TOKEN)
    limit = app.state.dashboard.attempts.limit

    def client(addr: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app, client=(addr, 4711))
        return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")

    async with client("10.0.0.1") as mallory, client("10.0.0.2") as alice:
        for _ in range(limit):
            r = await mallory.post("/login", data={"token": "w" * 40})
            assert r.status_code == 403
        r = await mallory.post("/login", data={"token": TOKEN})  # even the right one now
        assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
        assert COOKIE not in r.cookies
        r = await mallory.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 429
        # another client is not locked out
        r = await alice.post("/login", data={"token": TOKEN})
        assert r.status_code == 303 and COOKIE in alice.cookies
        # a wrong action token counts too
        page = (await alice.get(f"/runs/{rid}")).text
        csrf = _csrf(page, "cancel")
        for _ in range(limit):
            r = await alice.post(f"/runs/{rid}/cancel", data={"csrf": csrf, "token": "w" * 40})
            assert r.status_code == 403 and "wrong or missing action token" in r.text
        r = await alice.post(f"/runs/{rid}/cancel", data={"csrf": csrf, "token": TOKEN})
        assert r.status_code == 429
    await app.state.dashboard.aclose()
    assert _status(dsn, rid) == "leased"
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT cancel_requested_at FROM pgdurable.runs WHERE id = %s",
                         (rid,)).fetchone() == (None,)


# -- a loud warning when served to the network without authentication -------------------


@contextmanager
def _cli_dashboard(dsn: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PGDURABLE_DASHBOARD_TOKEN", None)
    p = subprocess.Popen([sys.executable, "-m", "pgdurable", "dashboard", "--dsn", dsn,
                          "--port", str(port), *args], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + 60
        while True:  # until it answers (whatever the status)
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
                break
            except httpx.TransportError:
                assert p.poll() is None, p.communicate()
                assert time.monotonic() < end, "the dashboard did not start"
                time.sleep(0.05)
        yield p, port
    finally:
        p.terminate()
        p.wait(30)


def test_served_to_the_network_without_authentication_it_warns(dsn: str) -> None:
    with _cli_dashboard(dsn, "--host", "0.0.0.0") as (p, port):
        r = httpx.get(f"http://127.0.0.1:{port}/")
        assert r.status_code == 200
    err = p.stderr.read() if p.stderr else ""
    assert "WARNING" in err and "0.0.0.0" in err and "no token" in err, err
    assert "--trusted-host" in err, "remote names are refused until trusted: say so"
    with _cli_dashboard(dsn, "--host", "0.0.0.0", "--token", TOKEN,
                        "--trusted-host", "ops.example.com") as (p, port):
        r = httpx.get(f"http://127.0.0.1:{port}/", headers={"Host": "ops.example.com"})
        assert r.status_code == 303, "a login first"
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 400, "not trusted"
    err = p.stderr.read() if p.stderr else ""
    assert "no token" not in err, err
    with _cli_dashboard(dsn) as (p, port):  # loopback: no warning
        pass
    assert "WARNING" not in (p.stderr.read() if p.stderr else "")


async def test_answering_on_a_network_address_without_authentication_warns_once(
    dsn: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """Whatever serves it (mounted, another server): the first request that
    reached it on a non-loopback address logs a warning, once."""
    app = create_app(dsn, trusted_hosts=["10.1.2.3"])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://10.1.2.3") as client:
        with caplog.at_level("WARNING", logger="pgdurable.dashboard"):
            for _ in range(3):
                assert (await client.get("/runs")).status_code == 200
    warned = [r for r in caplog.records if "not loopback" in r.getMessage()]
    assert len(warned) == 1 and "10.1.2.3" in warned[0].getMessage()
    await app.state.dashboard.aclose()


# -- mounted in a parent app (no lifespan): the pool opens on first use -----------------


def test_mounted_in_a_parent_app_every_page_works(dsn: str) -> None:
    rid = _seed(dsn)
    ops = create_app(dsn, actions=True, token=TOKEN)
    parent = Starlette(routes=[Route("/", lambda r: PlainTextResponse("parent")),
                               Mount("/ops", app=ops)])
    with serving(parent) as base:
        assert httpx.get(base + "/").text == "parent"
        r = httpx.get(base + "/ops/runs")
        assert r.status_code == 303 and r.headers["location"] == "/ops/login?next=%2Fruns"
        client = httpx.Client(base_url=base, timeout=30)
        r = client.post("/ops/login", data={"token": TOKEN, "next": "/runs"})
        assert r.status_code == 303 and r.headers["location"] == "/ops/runs"
        assert "Path=/ops" in r.headers["set-cookie"]
        for path in ("/", "/runs", f"/runs/{rid}", "/schedules", "/leases", "/metrics"):
            page = client.get("/ops" + path)
            assert page.status_code == 200, (path, page.text[-500:])
        page = client.get(f"/ops/runs/{rid}").text
        assert 'href="/ops/static/style.css"' in page and 'id="step-1"' in page
        with client.stream("GET", "/ops/events") as events:
            assert events.status_code == 200
            for line in events.iter_lines():
                if line.startswith("data: "):
                    assert json.loads(line[6:])["channel"] == "reconnect"
                    break
        r = client.post(f"/ops/runs/{rid}/cancel",
                        data={"csrf": _csrf(page, "cancel"), "token": TOKEN})
        assert r.status_code == 303 and r.headers["location"].startswith(f"/ops/runs/{rid}?")
        client.close()
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT cancel_requested_at IS NOT NULL FROM pgdurable.runs "
                         "WHERE id = %s", (rid,)).fetchone() == (True,)


# -- the run page fetches a bounded amount, whatever the history ------------------------

STEPS = 60
BLOB = 512 * 1024  # characters of each checkpoint's state


def test_the_run_page_fetches_a_bounded_amount(dsn: str) -> None:
    """60 checkpoints of 512 KiB each (30 MiB of history): a view and its live
    refreshes fetch less than one checkpoint's worth, and the timeline pages."""
    with DurableClient(dsn) as c:
        rid = c.start("big", {}, revision="1")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT * FROM pgdurable.claim_runs('w1', ARRAY['default'], ARRAY['big'], "
                     "ARRAY['1'], 1, '300 s')")
        for step in range(1, STEPS + 1):
            blob = (f"{step:04d}" * (BLOB // 4))
            conn.execute("SELECT pgdurable.checkpoint_run(%s, 1, 'w1', %s, 0)",
                         (rid, json.dumps({"n": step, "blob": blob, "same": "kept"})))
    with proxied(dsn) as (proxy, through):
        proxy.forwarding = True
        with serving(create_app(through)) as base:
            httpx.get(base + "/")  # the pool's connections, the privilege check
            before = proxy.received
            views = [httpx.get(f"{base}/runs/{rid}", timeout=60) for _ in range(4)]
            fetched = proxy.received - before
            older = httpx.get(f"{base}/runs/{rid}", params={"steps_to": "10"}, timeout=60)
            bad = httpx.get(f"{base}/runs/{rid}", params={"steps_to": "soon"}, timeout=60)
    print(f"4 views of a {STEPS * BLOB / 2**20:.0f} MiB history fetched {fetched} bytes")
    assert fetched < BLOB, f"{fetched} bytes fetched for 4 views"
    page = views[-1]
    assert page.status_code == 200
    shown = [int(n) for n in re.findall(r'<tr id="step-(\d+)"', page.text)]
    assert shown == list(range(STEPS - 49, STEPS + 1)), "the last 50 steps"
    row = page.text[page.text.index(f'id="step-{STEPS}"'):]
    assert f'"n": {STEPS}' in row, row[:800]
    assert "same" not in row.split("</tr>")[0], "an unchanged key is no change"
    assert 'steps_to=10' in page.text, "a link to the earlier steps"
    assert older.status_code == 200
    assert [int(n) for n in re.findall(r'<tr id="step-(\d+)"', older.text)] == list(range(1, 11))
    first = older.text[older.text.index('id="step-1"'):].split("</tr>")[0]
    assert '"n": 1, "blob"' in first and "...</td>" in first, first
    assert bad.status_code == 400


def _python_change(before: Any, after: Any) -> dict[str, Any]:
    """The state change the page showed before it was computed in SQL."""
    if isinstance(before, dict) and isinstance(after, dict):
        return {k: after.get(k) for k in sorted(set(before) | set(after))
                if before.get(k) != after.get(k)}
    return {} if before == after else {"value": after}


def test_state_changes_are_computed_in_sql_as_before(dsn: str) -> None:
    states: list[Any] = [{"a": 1, "b": [1, 2]}, {"a": 1, "b": [1, 2]}, {"a": 2, "c": None},
                         {"a": 2, "c": {"x": 1}}, [1, 2], [1, 2], "text", {"a": "<b>&'"}]
    with DurableClient(dsn) as c:
        rid = c.start("changes", {}, revision="1")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT * FROM pgdurable.claim_runs('w1', ARRAY['default'], "
                     "ARRAY['changes'], ARRAY['1'], 1, '300 s')")
        for state in states:
            conn.execute("SELECT pgdurable.checkpoint_run(%s, 1, 'w1', %s, 0)",
                         (rid, json.dumps(state)))
    with serving(create_app(dsn)) as base:
        page = httpx.get(f"{base}/runs/{rid}").text
    cells = re.findall(r'<tr id="step-(\d+)">.*?<td class="mono small">(.*?)</td>', page, re.S)
    assert [int(n) for n, _ in cells] == list(range(1, len(states) + 1))
    before: Any = {}
    for (_, cell), after in zip(cells, states, strict=True):
        assert "<" not in cell and "&" not in cell, "HTML's characters as JSON escapes"
        assert json.loads(cell) == _python_change(before, after), (cell, before, after)
        before = after


# -- fork: a step beyond the SQL integer is a 400 naming it -----------------------------


def test_a_fork_step_beyond_the_sql_integer_is_a_400(dsn: str) -> None:
    rid = _seed(dsn)
    with serving(create_app(dsn, actions=True, token=TOKEN)) as base, \
            login(base, TOKEN) as client:
        csrf = _csrf(client.get(f"/runs/{rid}").text, "fork")
        for step, says in ((str(2**40), "from_step"), ("-1", "from_step"),
                           ("abc", "step"), (str(10**30), "from_step")):
            r = client.post(f"/runs/{rid}/fork", data={"csrf": csrf, "token": TOKEN,
                                                         "step": step})
            assert r.status_code == 400 and says in r.text, (step, r.status_code, r.text[-300:])
        r = client.post(f"/runs/{rid}/fork", data={"csrf": csrf, "token": TOKEN, "step": "1",
                                                     "state": "{not json"})
        assert r.status_code == 400 and "JSON" in r.text
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT count(*) FROM pgdurable.runs").fetchone() == (1,)
