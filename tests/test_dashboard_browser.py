"""The dashboard in headless Chromium (Debian's ``chromium`` + Playwright for
Python, never ``playwright install``): pages render real runs, a filter
narrows the list, a finished step appears live (SSE, no reload), a dashboard
with a token sends the browser to its login form first (a wrong token is
refused there), cancel from the UI cancels the run and is refused with a wrong
token or with actions off;
queue limits, a schedule with its runs, a fork made from the UI with its
lineage on both runs, and, with a real worker process, a run's result and the
workers page (no request of the browser answered 404). Screenshots go to the
test's tmp dir (the last test prints where). Skipped, with the reason, without a
browser."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _dashboard_server import serving
from fix_fleet import Fleet

from pgdurable import DurableClient
from pgdurable.ops.dashboard import create_app
from pgdurable.runs.schedules import make_schedule, upsert_schedule_sync

CHROMIUM = os.environ.get("PGDURABLE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
TOKEN = "ui-token-123-of-the-browser-tests-0123456"  # 32 bytes at least

if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    pg.set_default_timeout(30_000)
    try:
        yield pg
    finally:
        ctx.close()


def _shot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)


def _log_in(page: Any, url: str, token: str = TOKEN) -> None:
    """Open ``url``: the dashboard sends the browser to its login form; log in
    there and land back on ``url``."""
    page.goto(url)
    page.wait_for_url("**/login?next=*")
    page.get_by_label("Dashboard token").fill(token)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(url)


def _status(dsn: str, rid: str) -> str:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT status FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone()
    assert row is not None
    return str(row[0])


def _claim(dsn: str, task: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT * FROM pgdurable.claim_runs('w1', ARRAY['default'], ARRAY[%s], "
                  "ARRAY['1'], 1, '300 s')", (task,))


def test_pages_filter_and_live_step(dsn: str, page: Any, tmp_path: Path) -> None:
    with DurableClient(dsn) as c:
        acme = [c.start("agent", {"n": 0}, revision="1", metadata={"tenant": "acme"})
                for _ in range(3)]
        other = c.start("mailer", {}, revision="1", queue="mail", metadata={"tenant": "globex"})
    _claim(dsn, "agent")
    with psycopg.connect(dsn) as c:
        leased = str(c.execute("SELECT id FROM pgdurable.runs WHERE status = 'leased'")
                     .fetchone()[0])  # type: ignore[index]
    with serving(create_app(dsn)) as base:
        page.goto(base + "/")
        assert page.get_by_role("rowheader", name="mail").is_visible()
        _shot(page, tmp_path, "queues")
        page.keyboard.press("r")  # keyboard navigation to Runs
        page.wait_for_url(base + "/runs")
        for rid in [*acme, other]:
            assert page.get_by_role("link", name=rid[:8]).is_visible()
        page.get_by_label("Metadata (JSON)").fill('{"tenant": "globex"}')
        page.get_by_role("button", name="Filter").click()
        page.wait_for_url("**metadata=*")
        assert page.get_by_role("link", name=other[:8]).is_visible()
        assert page.get_by_role("link", name=acme[0][:8]).count() == 0
        _shot(page, tmp_path, "runs-filtered")

        page.goto(f"{base}/runs/{leased}")
        # a locator, not wait_for_function: a string predicate is eval'd, which the
        # dashboard's Content-Security-Policy forbids
        page.locator("#live", has_text=re.compile(r"^live$")).wait_for()
        assert page.locator("#step-1").count() == 0
        t0 = time.monotonic()
        with psycopg.connect(dsn, autocommit=True) as c:  # a step finishes (fenced write)
            c.execute("SELECT pgdurable.checkpoint_run(%s, 1, 'w1', '{\"n\": 1}', 0)", (leased,))
        page.locator("#step-1").wait_for()  # no reload: SSE + fetch of the page
        seen = time.monotonic() - t0
        # the count is its own update of the page: wait for it, it must become 1
        page.locator("#step-count", has_text=re.compile(r"^1$")).wait_for()
        assert page.locator("#step-count").text_content() == "1"
        print(f"step visible {seen * 1000:.0f} ms after its checkpoint committed")
        _shot(page, tmp_path, "run-live")


def test_cancel_from_the_ui(dsn: str, page: Any, tmp_path: Path) -> None:
    with DurableClient(dsn) as c:
        rid = c.start("agent", {}, revision="1", metadata={"tenant": "acme"})
    with serving(create_app(dsn)) as base:  # actions off: no form, a forged POST is refused
        page.goto(f"{base}/runs/{rid}")
        assert page.get_by_role("button", name="Cancel run").count() == 0
        r = page.request.post(f"{base}/runs/{rid}/cancel", form={"csrf": "x", "token": TOKEN})
        assert r.status == 403
    assert _status(dsn, rid) == "runnable"
    with serving(create_app(dsn, actions=True, token=TOKEN)) as base:
        page.goto(f"{base}/runs/{rid}")  # every page needs a login first
        page.wait_for_url("**/login?next=*")
        assert page.get_by_role("button", name="Cancel run").count() == 0
        page.get_by_label("Dashboard token").fill("not-the-token")
        page.get_by_role("button", name="Log in").click()
        assert page.get_by_role("alert").text_content() == "wrong token"
        _shot(page, tmp_path, "login-refused")
        _log_in(page, f"{base}/runs/{rid}")
        # the live stream is authenticated too (the session cookie)
        page.locator("#live", has_text=re.compile(r"^live$")).wait_for()
        page.locator("form[action$='/cancel']").get_by_label("Action token").fill("not-the-token")
        page.get_by_role("button", name="Cancel run").click()
        assert page.get_by_role("alert").text_content() == "refused: wrong or missing action token"
        _shot(page, tmp_path, "cancel-refused")
        assert _status(dsn, rid) == "runnable"
        page.goto(f"{base}/runs/{rid}")
        page.locator("form[action$='/cancel']").get_by_label("Action token").fill(TOKEN)
        page.get_by_role("button", name="Cancel run").click()
        page.get_by_role("status").filter(has_text="cancel: cancelled").wait_for()
        _shot(page, tmp_path, "cancelled")
    assert _status(dsn, rid) == "cancelled"


def test_limits_schedules_and_fork_from_the_ui(dsn: str, page: Any, tmp_path: Path) -> None:
    with DurableClient(dsn) as c:
        rid = c.start("agent", {"n": 0}, revision="1")
    _claim(dsn, "agent")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgdurable.checkpoint_run(%s, 1, 'w1', '{\"n\": 1}', 0)", (rid,))
        conn.execute("SELECT pgdurable.set_queue('default', 4, NULL, 2, 5)")
        upsert_schedule_sync(conn, make_schedule("nightly-report", task="report",
                                                 cron="0 3 * * *"))
        scheduled = str(conn.execute("SELECT pgdurable.trigger_schedule('nightly-report')")
                        .fetchone()[0])  # type: ignore[index]
    with serving(create_app(dsn, actions=True, token=TOKEN)) as base:
        _log_in(page, base + "/")
        limits = page.locator("#limits")
        assert limits.get_by_role("rowheader", name="default").is_visible()
        assert limits.get_by_role("cell", name="1 / 4").is_visible()  # in use / concurrency
        _shot(page, tmp_path, "queues-limits")
        page.keyboard.press("s")  # keyboard navigation to Schedules
        page.wait_for_url(base + "/schedules")
        row = page.get_by_role("row").filter(has_text="nightly-report")
        assert row.get_by_text("0 3 * * * (UTC)").is_visible()
        assert row.get_by_role("link", name=scheduled[:8]).is_visible()
        assert row.get_by_role("button", name="Pause nightly-report").is_visible()
        _shot(page, tmp_path, "schedules")

        page.goto(f"{base}/runs/{rid}")
        assert page.locator("#step-1").get_by_text("1 · w1").is_visible()  # token · owner
        page.get_by_label("Fork from step").fill("1")
        fork = page.locator("form[action$='/fork']")
        fork.get_by_label("Action token").fill(TOKEN)
        fork.get_by_role("button", name="Fork run").click()
        page.get_by_role("status").filter(has_text=f"fork: forked from {rid} at step 1").wait_for()
        forked = page.url.split("/runs/")[1].split("?")[0]
        assert forked != rid
        _shot(page, tmp_path, "forked-run")
        page.locator("#forked-from").get_by_role("link", name=rid).click()
        page.wait_for_url(f"{base}/runs/{rid}")
        assert page.locator("#forks").get_by_role("link", name=forked[:8]).is_visible()
        _shot(page, tmp_path, "fork-source")


#: The worker process's options as before the fleet fixture: the worker's own lease TTL
#: (60 s), poll (5 s) and grace (30 s).
@pytest.mark.fleet("tests._ops_procs:app", ttl=60.0, poll=5.0, grace=30.0)
def test_result_and_workers_pages_with_a_real_worker(dsn: str, page: Any, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     fleet: Fleet) -> None:
    """A worker process runs a run to its end: the run page shows its result, the
    workers page the worker (host, pid, queues, concurrency, revisions), and no
    request of the browser gets a 404. Screenshots: run-result.png, workers.png
    in the test's tmp dir (printed)."""
    import socket

    missing: list[str] = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    worker = fleet.start("ui-worker-1", queues="default,reports", concurrency=3)
    try:
        with DurableClient(dsn) as c:
            rid = c.start("ops.two_steps", {"topic": "pg"}, revision="1")
            assert c.result(rid, timeout=60) == {"ok": True}
        with serving(create_app(dsn)) as base:
            page.goto(f"{base}/runs/{rid}")
            result = page.locator("#result")
            assert result.text_content() == '{"ok": true}'
            assert page.locator(".errorbox").count() == 0
            _shot(page, tmp_path, "run-result")
            page.keyboard.press("w")  # keyboard navigation to Workers
            page.wait_for_url(base + "/workers")
            row = page.get_by_role("row").filter(has_text="ui-worker-1")
            for cell in ("live", socket.gethostname(), str(worker.pid), "default, reports", "3",
                         "ops.two_steps@1"):
                assert row.get_by_role("cell", name=cell, exact=True).count() == 1, cell
            _shot(page, tmp_path, "workers")
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()
    assert missing == [], f"404s: {missing}"
    with capsys.disabled():
        print(f"\nscreenshots: {tmp_path / 'run-result.png'} and {tmp_path / 'workers.png'}")
