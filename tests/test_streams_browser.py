"""A streamed answer in a real browser, and the Node client against the real endpoints
(issue 41). Headless Chromium (Debian's ``chromium`` + Playwright for Python, never
``playwright install``) opens a small page
(clients/client/test/page: the AI SDK's chat over ``PgDurableChatTransport``, bundled
with esbuild) served with the HTTP endpoints by a real server process; a real worker
process streams a long scripted answer at a steady pace. The test SIGKILLs the worker
mid-answer (a second worker takes the run over when the lease ends), and reloads the
page mid-answer, twice: the text on the page ends equal to the expected answer, in ONE
assistant message, with no gap and no duplicate. Then a finished answer the page kept
only in part is completed on load, and a second turn stays its own message through a
reload. A second message sent while the first answer streams (enqueue) gets its own
assistant message, each exact, while they stream and through reloads mid-answer. A screenshot is saved (its path printed). The Node client (clients/client/test/live.test.mjs, ``node --test``) runs
start/run/result/send/stream against the same server, a stream through a database
blip, and the AI SDK's chat when a second message rolls the first answer back or (from the
same chat) interrupts it. Skipped, with the reason, without the client's node_modules, and the browser
test without Chromium or Playwright, the Node one without node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from _dashboard_server import free_port
from _stream_script import script
from _waiting import WAIT_LIMIT, until_sync

from pgdurable import Durable

CHROMIUM = os.environ.get("PGDURABLE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "clients" / "client"
ESBUILD = CLIENT / "node_modules" / ".bin" / "esbuild"
SECRET = "b" * 40
THREAD = "chat:browser"
WORDS = 400  # about 530 tokens: ~11 s of answer per attempt at 20 ms a token

if not (ESBUILD.exists() and (CLIENT / "node_modules" / "ai").is_dir()):
    pytest.skip("clients/client has no node_modules: run npm ci there (.ci/run does)",
                allow_module_level=True)

pytestmark = pytest.mark.fleet("_stream_app:app", ttl=2.0, poll=0.5,
                               env={"STREAM_DELAY": "0.02"})


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def esbuild(entry: str, out: Path, *args: str) -> None:
    """Bundle ``entry`` (in clients/client) from the client's source (not its dist/,
    which CI builds beside the suites) into ``out``."""
    built = subprocess.run([str(ESBUILD), entry, "--bundle", "--format=esm", *args,
                            f"--outfile={out}", "--log-level=warning"],
                           cwd=CLIENT, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr


def bundle(into: Path) -> Path:
    """The page and its bundle in ``into``."""
    into.mkdir()
    shutil.copy(CLIENT / "test" / "page" / "index.html", into / "index.html")
    esbuild("test/page/app.mjs", into / "bundle.js")
    return into


def serve(fleet: Any, static: Path | None = None) -> str:
    """The ASGI app (and the page under /page/) served by a real server process; its
    connections' application_name is fleet-http."""
    port = free_port()
    fleet.spawn("http", "-m", "_stream_http", str(port), *([str(static)] if static else []),
                env={"PGDURABLE_STREAM_SECRETS": SECRET, "PGAPPNAME": "fleet-http"})
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(base + "/agent/runs/x", timeout=1).status_code > 0
        except httpx.HTTPError:
            return False

    until_sync(up, "the HTTP server")
    return base


#: the page's stored messages with the last one's text cut to 100 characters
CUT_STORED = """key => {
  const m = JSON.parse(sessionStorage.getItem(key));
  const last = m[m.length - 1];
  last.parts = last.parts.map((p) => p.type === "text" ? { ...p, text: p.text.slice(0, 100) } : p);
  sessionStorage.setItem(key, JSON.stringify(m));
}"""


def q1(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> Any:
    with psycopg.connect(dsn) as c:
        row = c.execute(sql, params).fetchone()
    return None if row is None else row[0]


def answered(dsn: str) -> bool:
    """Whether the thread's messages are answered (consumed with their checkpoint)."""
    return bool(q1(dsn, "SELECT bool_and(consumed_at IS NOT NULL) FROM "
                        "pgdurable.thread_messages WHERE thread_key = %s", (THREAD,)))


def stored_text(dsn: str) -> str:
    """The text stored for the thread's answer so far (every text row, in order)."""
    return str(q1(dsn, "SELECT coalesce(string_agg(e.event->>'text', '' ORDER BY r.thread_no, "
                       "e.seq), '') FROM pgdurable.run_events e JOIN pgdurable.runs r "
                       "ON r.id = e.run_id WHERE r.thread_key = %s "
                       "AND e.event->>'type' = 'text'", (THREAD,)))


def assistant_texts(page: Any) -> list[str]:
    texts: list[str] = page.eval_on_selector_all(".message.assistant",
                                                 "els => els.map(e => e.textContent)")
    return texts


def shows_at_least(page: Any, n: int) -> None:
    """Wait until the page's assistant text is ``n`` characters long or longer."""
    page.wait_for_function(
        "n => [...document.querySelectorAll('.message.assistant')]"
        ".reduce((a, e) => a + e.textContent.length, 0) >= n", arg=n)


def test_reload_and_sigkill_mid_answer_leave_the_exact_answer(
        dsn: str, fleet: Any, browser: Any, tmp_path: Path) -> None:
    expected = script("browser", WORDS)
    static = bundle(tmp_path / "page")
    a = fleet.start("a")
    fleet.ready(a)
    base = serve(fleet, static)
    app = Durable(dsn)
    app.stream_secrets = [SECRET]
    token = app.stream_token(thread=THREAD, scope="write")
    url = f"{base}/page/#thread={THREAD}&token={token}&words={WORDS}"

    ctx = browser.new_context(viewport={"width": 1000, "height": 900})
    errors: list[str] = []
    try:
        page = ctx.new_page()
        page.set_default_timeout(WAIT_LIMIT * 1000)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        page.locator("body[data-resumed=yes][data-status=ready]").wait_for()  # nothing yet
        page.get_by_role("textbox", name="Message").fill("browser")
        page.get_by_role("button", name="Send").click()

        # 1. worker a dies mid-answer (SIGSTOP first: the answer is certainly unfinished)
        shows_at_least(page, len(expected) // 4)
        a.stop()
        assert not answered(dsn)
        a.kill()
        shown_at_kill = sum(map(len, assistant_texts(page)))
        b = fleet.start("b", ttl=30.0)  # takes the run over once a's lease (2 s) ends
        fleet.ready(b)

        # 2. reload while b is frozen mid-answer: the page rebuilds from its stored
        # messages and replays the answer so far
        shows_at_least(page, max(shown_at_kill + 20, len(expected) // 2))
        b.stop()
        assert not answered(dsn)
        page.reload()
        # the page shows exactly what is stored (b's unflushed tail is in b, frozen; a
        # statement b sent just before it froze may still land: read the stored text again)
        until_sync(lambda: assistant_texts(page) == [stored_text(dsn)], "the stored text")
        stored = stored_text(dsn)
        assert expected.startswith(stored) and len(stored) > len(expected) // 4
        assert page.locator("body").get_attribute("data-status") == "streaming"
        b.cont()

        # 3. reload while b streams (unfinished when checked just before)
        shows_at_least(page, 3 * len(expected) // 4)
        mid = not answered(dsn)
        page.reload()

        page.locator("body[data-resumed=yes][data-status=ready]").wait_for()
        texts = assistant_texts(page)
        assert texts == [expected], (len(texts), [len(t) for t in texts], len(expected))
        assert answered(dsn)

        # 4. a finished answer the page kept only in part (stored just before it ended)
        # is completed on load: replayed whole into the same message
        page.evaluate(CUT_STORED, f"pgdurable-chat:{THREAD}")
        page.reload()
        page.locator("body[data-resumed=yes][data-status=ready]").wait_for()
        assert assistant_texts(page) == [expected]

        # 5. a second turn is its own message; a reload keeps both, each whole
        page.evaluate("location.hash = location.hash.replace(/words=\\d+/, 'words=30')")
        page.reload()
        page.locator("body[data-resumed=yes][data-status=ready]").wait_for()
        page.get_by_role("textbox", name="Message").fill("again")
        page.get_by_role("button", name="Send").click()
        second = script("again", 30)
        page.wait_for_function(
            "n => document.body.dataset.status === 'ready' && "
            "[...document.querySelectorAll('.message.assistant')].length === 2 && "
            "document.querySelectorAll('.message.assistant')[1].textContent.length === n",
            arg=len(second))
        page.reload()
        page.locator("body[data-resumed=yes][data-status=ready]").wait_for()
        assert assistant_texts(page) == [expected, second]
        users = page.eval_on_selector_all(".message.user", "els => els.map(e => e.textContent)")
        assert users == ["browser", "again"]
        shot = tmp_path / "streamed-answer.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
    finally:
        ctx.close()
    assert not errors, errors
    print(f"answer {len(expected)} chars; worker a killed at {shown_at_kill} shown; "
          f"second reload mid-answer: {mid}")


def test_a_second_message_mid_answer_is_its_own_message_through_a_reload(
        dsn: str, fleet: Any, browser: Any, tmp_path: Path) -> None:
    """The user sends a second message while the first answer streams (double-texting
    ``enqueue``, the default): the page shows two assistant messages, each exactly its
    own answer (the first ends where it was answered, the second starts where its own
    step began), while they stream, after a reload mid-answer (the transport replays
    each unfinished answer into its own message) and after a reload once both are
    answered."""
    thread, words = "chat:browser-two", 150
    first, second = script("first", words), script("second", words)
    static = bundle(tmp_path / "page")
    fleet.ready(fleet.start("a"))
    base = serve(fleet, static)
    app = Durable(dsn)
    app.stream_secrets = [SECRET]
    token = app.stream_token(thread=thread, scope="write")
    ctx = browser.new_context(viewport={"width": 1000, "height": 900})
    errors: list[str] = []

    def consumed(mid_text: str) -> bool:
        return bool(q1(dsn, "SELECT consumed_at IS NOT NULL FROM pgdurable.thread_messages "
                            "WHERE thread_key = %s AND payload->>'text' = %s", (thread, mid_text)))

    def both(page: Any) -> None:
        page.wait_for_function(
            "want => { const t = [...document.querySelectorAll('.message.assistant')]"
            ".map(e => e.textContent); return document.body.dataset.status === 'ready' && "
            "t.length === 2 && t[0] === want[0] && t[1] === want[1]; }", arg=[first, second])

    try:
        page = ctx.new_page()
        page.set_default_timeout(WAIT_LIMIT * 1000)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{base}/page/#thread={thread}&token={token}&words={words}")
        page.locator("body[data-resumed=yes][data-status=ready]").wait_for()
        page.get_by_role("textbox", name="Message").fill("first")
        page.get_by_role("button", name="Send").click()
        shows_at_least(page, 40)
        page.get_by_role("textbox", name="Message").fill("second")
        page.get_by_role("button", name="Send").click()
        until_sync(lambda: q1(dsn, "SELECT count(*) FROM pgdurable.thread_messages "
                                   "WHERE thread_key = %s", (thread,)) == 2, "the second message")
        mid = [not consumed("first")]
        page.reload()  # mid-answer (the first's, unless it just ended): replayed, then the second
        # while they stream, the first never shows text of the second, nor the second of the first
        page.wait_for_function(
            "want => { const t = [...document.querySelectorAll('.message.assistant')]"
            ".map(e => e.textContent); return t.length === 2 && want[0].startsWith(t[0]) && "
            "want[1].startsWith(t[1]) && t[1].length > 0; }", arg=[first, second])
        mid.append(not consumed("second"))
        page.reload()  # mid-answer (the second's): both replayed, each in its own message
        both(page)
        page.reload()  # both answered: kept, the last replayed whole
        both(page)
        users = page.eval_on_selector_all(".message.user", "els => els.map(e => e.textContent)")
        assert users == ["first", "second"]
        history = q1(dsn, "SELECT state->'history' FROM pgdurable.runs WHERE thread_key = %s",
                     (thread,))
        assert [h["prompt"] for h in history] == ["first", "second"]  # two steps, one each
    finally:
        ctx.close()
    assert not errors, errors
    print(f"two answers of {len(first)} and {len(second)} chars; unanswered at the first reload "
          f"(the first answer), at the second (the second answer): {mid}")


def blip(dsn: str, rid: str) -> int:
    """A database blip under a live stream of run ``rid``: its events table locked, the
    server's statements that wait on the lock (pg_stat_activity) terminated mid-statement,
    then the lock released. How many statements were terminated."""
    with psycopg.connect(dsn) as locker, psycopg.connect(dsn, autocommit=True) as c:
        locker.execute("LOCK TABLE pgdurable.run_events IN ACCESS EXCLUSIVE MODE")
        waiting = ("SELECT pid FROM pg_stat_activity WHERE application_name = 'fleet-http' "
                   "AND datname = current_database() AND wait_event_type = 'Lock'")
        until_sync(lambda: c.execute(waiting).fetchone() is not None, "the server's read")
        assert q1(dsn, "SELECT status FROM pgdurable.runs WHERE id = %s", (rid,)) != "completed"
        killed = [r[0] for r in c.execute(waiting).fetchall()]
        for pid in killed:
            c.execute("SELECT pg_terminate_backend(%s)", (pid,))
        locker.rollback()
    return len(killed)


def test_the_node_client_against_the_real_endpoints(dsn: str, fleet: Any, tmp_path: Path) -> None:
    """clients/client/test/live.test.mjs (node --test): start, run, result, streamRun,
    send, streamThread, and a stream through a database blip: every pooled connection
    of the server terminated while it streams (the client retries the transient
    ``error`` frame from its cursor)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (Node.js 20+)")
    fleet.ready(fleet.start("a"))
    base = serve(fleet)
    (http,) = [p for p in fleet.all if p.name == "http"]
    app = Durable(dsn)
    app.stream_secrets = [SECRET]
    ready, done = tmp_path / "blip-ready", tmp_path / "blip-done"
    live = {
        "api": base + "/agent",
        "run": {"state": {"prompt": "node", "words": 40, "delay": 0.002},
                "expected": script("node", 40)},
        "thread": {"key": "chat:node", "message": {"text": "hello", "words": 30},
                   "token": app.stream_token(thread="chat:node", scope="write"),
                   "expected": script("hello", 30)},
        "rollback": {"key": "chat:rollback", "words": 300, "expected": script("r1", 30),
                     "token": app.stream_token(thread="chat:rollback", scope="write")},
        "interrupt": {"key": "chat:interrupt", "words": 300, "first": script("i0", 300),
                      "expected": script("i0+i1", 30),
                      "token": app.stream_token(thread="chat:interrupt", scope="write")},
        "blip": {"state": {"prompt": "blip", "words": 300, "delay": 0.01},
                 "expected": script("blip", 300), "ready": str(ready), "done": str(done)},
    }
    esbuild("test/live.test.mjs", tmp_path / "live.test.mjs", "--platform=node")
    proc = subprocess.Popen([node, "--test", str(tmp_path / "live.test.mjs")],
                            env={**os.environ, "PGDURABLE_LIVE": json.dumps(live)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        until_sync(lambda: ready.exists() or proc.poll() is not None, "the blip's stream")
        killed = 0
        if proc.poll() is None:  # the blip
            killed = blip(dsn, ready.read_text())
            done.touch()
        out, _ = proc.communicate(timeout=WAIT_LIMIT * 2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(out)
    assert proc.returncode == 0, out
    assert "# pass 5" in out and "# skipped 0" in out, out
    assert killed >= 1
    assert "stream ended by an error" in http.log()  # the transient error frame was sent
