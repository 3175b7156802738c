"""Token streams (issue 41): ctx.emit_text buffered, flushed and tail-notified; a
reader that resumes after a SIGKILL gets every flushed token once, in order;
double-texting with racing senders in separate processes; scoped stream tokens
at the HTTP endpoints."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from _dashboard_server import free_port
from _stream_script import script, tokens
from _waiting import LISTENING, WAIT_LIMIT, until_sync

from pgdurable import Durable
from pgdurable.foundation.stream_tokens import TokenRefused, check_token, make_token, secrets_of
from pgdurable.runs import text as text_mod
from pgdurable.runs.live import follow_run, follow_thread

pytestmark = pytest.mark.fleet("_stream_app:app", ttl=2.0, poll=0.5)

SECRET = "s" * 40
OLD_SECRET = "o" * 40


def q1(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> Any:
    with psycopg.connect(dsn) as c:
        row = c.execute(sql, params).fetchone()
    return None if row is None else row[0]


def text_rows(dsn: str, rid: str) -> int:
    return int(q1(dsn, "SELECT count(*) FROM pgdurable.run_events WHERE run_id = %s "
                       "AND event->>'type' = 'text'", (rid,)))


async def collect(app: Durable, rid: str, after: str | None = None) -> str:
    out = []
    async for item in follow_run(app, rid, after):
        if item.kind == "text":
            out.append(item.text)
    return "".join(out)


def test_emit_text_is_stored_in_few_rows_and_read_exactly(dsn: str, fleet: Any) -> None:
    fleet.ready(fleet.start("a"))

    async def main() -> None:
        app = Durable(dsn)
        async with app:
            rid = await app.start("long", {"prompt": "rows", "words": 300, "delay": 0.001}, revision="1")
            got = await collect(app, rid)
            assert got == script("rows", 300)
            rows = text_rows(dsn, rid)
            n = len(tokens(script("rows", 300)))
            assert rows < n / 3, (rows, n)  # far fewer rows than tokens
            # a reader that resumes from any cursor gets the rest, once
            cursors: list[tuple[str, int]] = []
            shown = 0
            async for item in follow_run(app, rid):
                if item.kind == "text":
                    shown += len(item.text)
                    cursors.append((item.cursor, shown))
            for cursor, upto in cursors[:: max(1, len(cursors) // 7)]:
                assert got[:upto] + await collect(app, rid, cursor) == got
            # a cursor in the middle of a row (as after a live tail): "seq+n"
            seq = int(cursors[len(cursors) // 2][0].split("+")[0])
            before = await app.fetchone(
                "SELECT coalesce(sum(length(event->>'text')), 0) FROM pgdurable.run_events "
                "WHERE run_id = %s AND seq <= %s AND event->>'type' = 'text'", (rid, seq))
            assert before is not None
            rest = await collect(app, rid, f"{seq}+5")
            assert got[: int(before[0]) + 5] + rest == got

    asyncio.run(main())


def test_sigkill_mid_answer_loses_no_flushed_token_and_duplicates_none(
        dsn: str, fleet: Any) -> None:
    a = fleet.start("a", env={"STREAM_DELAY": "0.01"})
    fleet.ready(a)

    async def main() -> None:
        app = Durable(dsn)
        async with app:
            rid = await app.start("long", {"prompt": "crash", "words": 250, "delay": 0.01}, revision="1")
            live = asyncio.create_task(collect(app, rid))  # follows through the crash
            end = time.monotonic() + WAIT_LIMIT
            while text_rows(dsn, rid) < 4:
                assert time.monotonic() < end
                await asyncio.sleep(0.02)
            a.kill()  # mid-answer: its unflushed tail is lost
            stored = await app.fetchone(
                "SELECT coalesce(string_agg(event->>'text', '' ORDER BY seq), '') "
                "FROM pgdurable.run_events WHERE run_id = %s AND event->>'type' = 'text'", (rid,))
            assert stored is not None
            expected = script("crash", 250)
            assert expected.startswith(stored[0]) and len(stored[0]) < len(expected)
            b = fleet.start("b", env={"STREAM_DELAY": "0.001"})
            fleet.ready(b)
            assert await asyncio.wait_for(live, WAIT_LIMIT) == expected
            assert await collect(app, rid) == expected  # stored: no gap, no duplicate
            attempts = await app.fetchone(
                "SELECT count(DISTINCT token) FROM pgdurable.run_events WHERE run_id = %s "
                "AND event->>'type' = 'text'", (rid,))
            assert attempts is not None and attempts[0] == 2

    asyncio.run(main())


def test_tokens_sign_verify_rotate_and_scope() -> None:
    keys = (SECRET.encode(),)
    t = make_token(keys, run_id="r1", scope="read", ttl=60)
    g = check_token(keys, t)
    assert (g.run_id, g.thread, g.scope) == ("r1", None, "read")
    rotated = (b"n" * 40, SECRET.encode())  # a new key first: old tokens still verify
    assert check_token(rotated, t).run_id == "r1"
    with pytest.raises(TokenRefused):
        check_token((b"n" * 40,), t)  # the old key dropped
    with pytest.raises(TokenRefused):
        check_token(keys, make_token(keys, run_id="r1", ttl=1, now=time.time() - 10))
    forged = t.split(".")
    forged[1] = forged[1][:-2] + ("AA" if not forged[1].endswith("AA") else "BB")
    with pytest.raises(TokenRefused):
        check_token(keys, ".".join(forged))
    with pytest.raises(ValueError):
        secrets_of(["short"])  # a secret under 32 bytes


#: the HTTP server process's application_name: its connections in pg_stat_activity
HTTP_APP_NAME = "stream-http"


def _serve(dsn: str, fleet: Any, tmp_path: Path, static: Path | None = None) -> str:
    port = free_port()
    env = {"PGDURABLE_STREAM_SECRETS": f"{SECRET} {OLD_SECRET}", "PGAPPNAME": HTTP_APP_NAME}
    argv = ["-m", "_stream_http", str(port)] + ([str(static)] if static else [])
    fleet.spawn("http", *argv, env=env)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(base + "/agent/runs/x", timeout=1).status_code > 0
        except httpx.HTTPError:
            return False

    until_sync(up, "the HTTP server")
    return base


def test_http_tokens_refused_when_expired_for_another_run_or_read_for_write(
        dsn: str, fleet: Any, tmp_path: Path) -> None:
    fleet.ready(fleet.start("a"))
    base = _serve(dsn, fleet, tmp_path) + "/agent"
    app = Durable(dsn)
    app.stream_secrets = [SECRET]
    r = httpx.post(base + "/runs", json={"task": "long", "state": {"prompt": "t", "words": 5}})
    assert r.status_code == 403  # no token, and authorize (no session) said no
    r = httpx.post(base + "/runs", json={"task": "long", "state": {"prompt": "t", "words": 5}},
                   headers={"X-Test-Auth": "yes"})
    assert r.status_code == 201, r.text
    rid, token = r.json()["run_id"], r.json()["token"]
    other = httpx.post(base + "/runs", json={"task": "long", "state": {"prompt": "u", "words": 5}},
                       headers={"X-Test-Auth": "yes"}).json()["run_id"]
    auth = {"Authorization": f"Bearer {token}"}
    until_sync(lambda: httpx.get(f"{base}/runs/{rid}", headers=auth).json()["status"]
               == "completed", "the run")
    assert httpx.get(f"{base}/runs/{rid}", headers=auth).json()["result"] == len(script("t", 5))
    assert httpx.get(f"{base}/runs/{other}", headers=auth).status_code == 403  # another run
    expired = make_token((SECRET.encode(),), run_id=rid, ttl=1, now=time.time() - 5)
    r = httpx.get(f"{base}/runs/{rid}", headers={"Authorization": f"Bearer {expired}"})
    assert r.status_code == 401 and "expired" in r.json()["error"]
    old = make_token((OLD_SECRET.encode(),), run_id=rid)  # a key still in the rotation
    assert httpx.get(f"{base}/runs/{rid}", params={"token": old}).status_code == 200
    # a thread: read cannot write; write can
    read = app.stream_token(thread="chat:tok", scope="read")
    write = app.stream_token(thread="chat:tok", scope="write")
    url = base + "/threads/chat%3Atok/messages"
    r = httpx.post(url, json={"message": {"text": "x"}}, headers={"Authorization": f"Bearer {read}"})
    assert r.status_code == 403 and "read-only" in r.json()["error"]
    other_thread = app.stream_token(thread="chat:other", scope="write")
    r = httpx.post(url, json={"message": {"text": "x"}},
                   headers={"Authorization": f"Bearer {other_thread}"})
    assert r.status_code == 403
    assert q1(dsn, "SELECT count(*) FROM pgdurable.thread_messages") == 0  # nothing stored
    r = httpx.post(url, json={"message": {"text": "x", "words": 5}, "message_id": "m1"},
                   headers={"Authorization": f"Bearer {write}"})
    assert r.status_code == 201, r.text
    # the answer as SSE, until it is answered
    with httpx.stream("GET", base + "/threads/chat%3Atok/stream", params={"message": "m1"},
                      headers={"Authorization": f"Bearer {read}"}, timeout=WAIT_LIMIT) as s:
        frames = _frames(s)
    text = "".join(json.loads(d)["text"] for e, _, d in frames if e == "text")
    assert text == script("x", 5) and frames[-1][0] == "done"


def _frames(s: httpx.Response) -> list[tuple[str, str | None, str]]:
    out: list[tuple[str, str | None, str]] = []
    event, ident, data = "message", None, ""
    for line in s.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("id: "):
            ident = line[4:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and data:
            out.append((event, ident, data))
            if event in ("done", "error"):
                break
            event, ident, data = "message", None, ""
    return out


def _text(frames: list[tuple[str, str | None, str]]) -> str:
    return "".join(json.loads(d)["text"] for e, _, d in frames if e == "text")


def _start_long(base: str, prompt: str, words: int, delay: float) -> tuple[str, dict[str, str]]:
    """Start the run task ``long`` over HTTP; (its id, the Authorization header of its token)."""
    r = httpx.post(base + "/runs", json={"task": "long", "state": {
        "prompt": prompt, "words": words, "delay": delay}}, headers={"X-Test-Auth": "yes"})
    assert r.status_code == 201, r.text
    return r.json()["run_id"], {"Authorization": f"Bearer {r.json()['token']}"}


def test_a_run_stream_cut_mid_answer_resumes_from_its_last_event_id(
        dsn: str, fleet: Any, tmp_path: Path) -> None:
    """A browser's connection drops mid-answer: reconnecting with the last frame's id as
    ``Last-Event-ID`` gets exactly the rest, live or stored, whatever the cursor (a
    row's end or inside a row's text, ``seq+n``); so does every id of a stored stream."""
    fleet.ready(fleet.start("a"))
    base = _serve(dsn, fleet, tmp_path) + "/agent"
    rid, auth = _start_long(base, "resume", 400, 0.01)
    url = f"{base}/runs/{rid}/stream"
    first: list[tuple[str, str | None, str]] = []
    with httpx.stream("GET", url, headers=auth, timeout=WAIT_LIMIT) as s:
        for frame in _frames(s):
            first.append(frame)
            if sum(e == "text" for e, _, _ in first) == 12:
                break  # the browser goes away mid-answer
    last_id = first[-1][1]
    assert last_id is not None and first[-1][0] == "text"
    with httpx.stream("GET", url, headers={**auth, "Last-Event-ID": last_id},
                      timeout=WAIT_LIMIT) as s:
        rest = _frames(s)
    assert rest[-1][0] == "done"
    whole = script("resume", 400)
    assert _text(first) + _text(rest) == whole  # no gap, no duplicate
    # the stored stream: from every id it gives, the rest of the text, exactly
    with httpx.stream("GET", url, headers=auth, timeout=WAIT_LIMIT) as s:
        stored = _frames(s)
    assert _text(stored) == whole
    ids = [(i, d) for i, (e, d, _) in enumerate(stored) if e == "text" and d is not None]
    assert len(ids) >= 3
    for i, cursor in ids[:: max(1, len(ids) // 5)]:
        with httpx.stream("GET", url, params={"after": cursor}, headers=auth,
                          timeout=WAIT_LIMIT) as s:
            assert _text(_frames(s)) == _text(stored[i + 1:]), cursor
    # a mid-row cursor (a live tail's id) resumes inside the row
    if "+" in last_id:
        seq, n = last_id.split("+")
        assert int(n) > 0 and seq


def test_quiet_streams_get_heartbeats_and_share_one_listen_connection(
        dsn: str, fleet: Any, tmp_path: Path) -> None:
    """Twelve browsers follow twelve quiet threads: each stream gets heartbeat comment
    lines (the server's heartbeat is 1 s here), and the server process holds one LISTEN
    connection for all of them (its notifier), never a connection per browser."""
    fleet.ready(fleet.start("a"))
    base = _serve(dsn, fleet, tmp_path) + "/agent"
    app = Durable(dsn)
    app.stream_secrets = [SECRET]
    streams = 12
    beats = [0] * streams
    stop = threading.Event()
    errors: list[BaseException] = []

    def follow(i: int) -> None:
        key = f"chat:quiet-{i}"
        token = app.stream_token(thread=key, scope="read")
        try:
            with httpx.stream("GET", f"{base}/threads/{key.replace(':', '%3A')}/stream",
                              headers={"Authorization": f"Bearer {token}"},
                              timeout=WAIT_LIMIT) as s:
                for line in s.iter_lines():
                    if line.startswith("data:"):
                        raise AssertionError(f"a quiet stream sent data: {line}")
                    if line == ": heartbeat":
                        beats[i] += 1
                    if stop.is_set():
                        return
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    readers = [threading.Thread(target=follow, args=(i,), daemon=True) for i in range(streams)]
    for t in readers:
        t.start()
    try:
        until_sync(lambda: bool(errors) or min(beats) >= 2, "two heartbeats on every stream")
        assert not errors, errors
        with psycopg.connect(dsn) as c:
            listening = c.execute(LISTENING + " AND application_name = %s",
                                  (HTTP_APP_NAME,)).fetchone()
            total = c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                              "current_database() AND application_name = %s",
                              (HTTP_APP_NAME,)).fetchone()
        assert listening == (1,)
        assert total is not None and total[0] < streams, total  # not one per browser
    finally:
        stop.set()
        for t in readers:
            t.join(timeout=WAIT_LIMIT)


def _history(dsn: str, thread: str) -> list[list[str]]:
    state = q1(dsn, "SELECT state FROM pgdurable.runs WHERE thread_key = %s "
                    "ORDER BY thread_no DESC LIMIT 1", (thread,))
    return [h["answered"] for h in (state or {}).get("history", [])]


def _race(dsn: str, fleet: Any, tmp_path: Path, thread: str, strategy: str,
          thread_strategy: str | None = None) -> list[str]:
    """m0 is being answered; two processes send m1 and m2 with ``strategy`` at once
    (``default``: none given, the thread's ``thread_strategy`` or its route's).
    Returns the senders' outputs (by message)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        if thread_strategy is not None:
            c.execute("SELECT pgdurable.set_double_text(%s, %s)", (thread, thread_strategy))
        c.execute("SELECT * FROM pgdurable.send_message_v2(%s, 'm0', '{\"text\": \"m0\", "
                  "\"words\": 150}', NULL, 'chat', '1', 'default', 0, 3, NULL, NULL, NULL, NULL)",
                  (thread,))
    until_sync(lambda: q1(dsn, "SELECT count(*) FROM pgdurable.run_events e JOIN pgdurable.runs r "
                               "ON r.id = e.run_id WHERE r.thread_key = %s", (thread,)) >= 2,
               "m0's answer streaming")
    go = tmp_path / f"go-{strategy}"
    senders = [fleet.spawn(f"send-{m}", "-m", "_stream_send", dsn, thread, m, strategy, str(go))
               for m in ("m1", "m2")]
    until_sync(lambda: all("ready" in p.log() for p in senders), "the senders")
    go.touch()
    for p in senders:
        assert p.wait() == 0, p.log()
    return [p.log().splitlines()[-1] for p in senders]


def _idle(dsn: str, thread: str) -> bool:
    return bool(q1(dsn, "SELECT run_status = 'waiting' AND inbox_depth = 0 "
                        "FROM pgdurable.thread_owners WHERE thread_key = %s", (thread,)))


def _markers(dsn: str, thread: str, kind: str) -> int:
    return int(q1(dsn, "SELECT count(*) FROM pgdurable.run_events e JOIN pgdurable.runs r "
                       "ON r.id = e.run_id WHERE r.thread_key = %s AND e.event->>'type' = %s",
                  (thread, kind)))


def _one_run(dsn: str, thread: str) -> None:
    assert q1(dsn, "SELECT count(*) FROM pgdurable.runs WHERE thread_key = %s", (thread,)) == 1


@pytest.mark.parametrize("strategy", ["reject", "enqueue", "interrupt", "rollback"])
def test_double_texting_two_racing_senders(dsn: str, fleet: Any, tmp_path: Path,
                                           strategy: str) -> None:
    fleet.ready(fleet.start("a", env={"STREAM_DELAY": "0.01"}))
    thread = f"chat:{strategy}"
    out = _race(dsn, fleet, tmp_path, thread, strategy)
    until_sync(lambda: _idle(dsn, thread), "the thread idle again")
    history = _history(dsn, thread)
    flat = [m for h in history for m in h]
    _one_run(dsn, thread)  # never two runs answering: the thread's one owner answered all
    if strategy == "reject":
        assert out == ["busy", "busy"]
        assert history == [["m0"]]
        assert q1(dsn, "SELECT count(*) FROM pgdurable.thread_messages WHERE thread_key = %s",
                  (thread,)) == 1
        return
    assert all(o.startswith("sent deliver") for o in out), out
    order = [r[0] for r in _rows(dsn, "SELECT message_id FROM pgdurable.thread_messages "
                                      "WHERE thread_key = %s ORDER BY seq", (thread,))]
    if strategy == "enqueue":
        assert flat == order  # each answered once, in the database's order
        assert history[0] == ["m0"] and _markers(dsn, thread, "interrupted") == 0
    elif strategy == "interrupt":
        # m0's answer was interrupted, and its step ran again with m0 and what came
        assert flat == order and history[0][0] == "m0" and len(history[0]) >= 2, history
        assert _markers(dsn, thread, "interrupted") >= 1
    else:
        last = order[-1]
        assert flat == [last]  # only the last message (by the database's order) is answered
        discarded = {r[0] for r in _rows(dsn, "SELECT message_id FROM pgdurable.thread_messages "
                                              "WHERE thread_key = %s AND discarded_at IS NOT NULL",
                                         (thread,))}
        assert discarded == set(order) - {last}
        assert _markers(dsn, thread, "rollback") >= 1


@pytest.mark.parametrize("where", ["thread", "route"])
def test_a_threads_or_routes_strategy_applies_and_a_message_overrides_it(
        dsn: str, fleet: Any, tmp_path: Path, where: str) -> None:
    """Senders that name no strategy get the thread's (``set_double_text``) or else
    its route's (``thread_task(..., double_text=)``): reject, both busy. A message that
    names one overrides them: enqueue, delivered and answered after."""
    fleet.ready(fleet.start("a", env={"STREAM_DELAY": "0.01"}))
    thread = "chat:by-thread" if where == "thread" else "strict:by-route"
    out = _race(dsn, fleet, tmp_path, thread, "default",
                "reject" if where == "thread" else None)
    assert out == ["busy", "busy"]
    until_sync(lambda: _idle(dsn, thread), "the thread idle again")
    assert _history(dsn, thread) == [["m0"]]
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT * FROM pgdurable.send_message_v2(%s, 'm3', '{\"text\": \"m3\", "
                  "\"words\": 1000}', NULL, 'chat', '1', 'default', 0, 3, NULL, NULL, NULL, NULL)",
                  (thread,))
    go = tmp_path / f"go-override-{where}"
    sender = fleet.spawn("send-m4", "-m", "_stream_send", dsn, thread, "m4", "enqueue", str(go))
    until_sync(lambda: "ready" in sender.log(), "the sender")
    until_sync(lambda: not _idle(dsn, thread), "m3 taken or being answered")
    go.touch()
    assert sender.wait() == 0, sender.log()
    assert sender.log().splitlines()[-1].startswith("sent deliver"), sender.log()
    assert not _idle(dsn, thread)  # m4 came while m3 was still being answered
    until_sync(lambda: _idle(dsn, thread) and len(_history(dsn, thread)) == 3, "m4 answered")
    assert _history(dsn, thread) == [["m0"], ["m3"], ["m4"]]
    _one_run(dsn, thread)


def _rows(dsn: str, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as c:
        return c.execute(sql, params).fetchall()


def test_rollback_stream_says_what_to_discard(dsn: str, fleet: Any, tmp_path: Path) -> None:
    """m0's stream ends at the rollback marker that discards its answer: once what the
    marker says is dropped, nothing of it is left; the answer that followed is in the
    answered message's own stream, exactly."""
    fleet.ready(fleet.start("a", env={"STREAM_DELAY": "0.01"}))
    thread = "chat:rb-stream"
    _race(dsn, fleet, tmp_path, thread, "rollback")
    until_sync(lambda: _idle(dsn, thread), "the thread idle again")
    last = _history(dsn, thread)[-1][0]

    async def main() -> tuple[str, list[str], tuple[str, list[str]]]:
        app = Durable(dsn)
        shown: list[tuple[str, str]] = []  # (cursor, text) as a client would keep them
        kinds: list[str] = []
        async with app:
            async for item in follow_thread(app, thread, until="m0"):
                if item.kind == "text":
                    shown.append((item.cursor, item.text))
                    continue
                kinds.append(str(item.event.get("type")))
                if item.event.get("type") == "rollback":
                    after = int(item.event["discard_after"])
                    shown = [(c, t) for c, t in shown if (int(c.split(":")[1].split("+")[0]) <= after
                             and "+" not in c.split(":")[1]) or
                             int(c.split(":")[1].split("+")[0]) < after]
            return "".join(t for _, t in shown), kinds, await _answer(app, thread, last)

    text0, kinds0, answer = asyncio.run(main())
    assert (text0, kinds0) == ("", ["rollback"])
    assert answer == (script(last, 60), [])


def test_stream_tick_is_one_statement_for_many_streams(dsn: str) -> None:
    app = Durable(dsn)

    @app.task("many")
    async def many(ctx: Any, state: Any) -> Any:
        from pgdurable import Done
        for i in range(40):
            await ctx.emit_text(f" t{i}")
            await asyncio.sleep(0.005)
        return Done(None)

    async def main() -> None:
        async with app:
            ids = [await app.start("many", {}) for _ in range(8)]
            w = app.worker(concurrency=8, poll_interval=0.1)
            t = asyncio.create_task(w.run())
            for rid in ids:
                await app.result(rid, timeout=WAIT_LIMIT)
            await w.stop()
            await t
            writer = text_mod.writer_for(app)
            # 8 streams x 40 tokens: far fewer ticks than tokens (one statement per tick)
            assert writer.ticks < 8 * 40 / 2, writer.ticks
            for rid in ids:
                assert await collect(app, rid) == "".join(f" t{i}" for i in range(40))

    asyncio.run(main())


def _send(dsn: str, thread: str, mid: str, words: int, strategy: str | None = None) -> None:
    payload = json.dumps({"text": mid, "words": words})
    task = thread.split(":")[0]  # chat: or once: (tests/_stream_app.py's routes)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT * FROM pgdurable.send_message_v2(%s, %s, %s, NULL, %s, '1', "
                  "'default', 0, 3, NULL, NULL, %s, NULL)", (thread, mid, payload, task, strategy))


async def _answer(app: Durable, thread: str, mid: str) -> tuple[str, list[str]]:
    """The text of message ``mid``'s stream and the types of its other events."""
    text, kinds = [], []
    async for item in follow_thread(app, thread, until=mid):
        if item.kind == "text":
            text.append(item.text)
        else:
            kinds.append(str(item.event.get("type")))
    return "".join(text), kinds


def _done(dsn: str, thread: str) -> bool:
    """Every message of the thread answered and its owner idle (parked or finished)."""
    return bool(q1(dsn, "SELECT bool_and(m.consumed_at IS NOT NULL) AND (SELECT r.status IN "
                        "('completed', 'waiting') FROM pgdurable.runs r WHERE r.thread_key = %s "
                        "ORDER BY r.thread_no DESC LIMIT 1) FROM pgdurable.thread_messages m "
                        "WHERE m.thread_key = %s", (thread, thread)))


def _thread_text(dsn: str, thread: str, before_marker: bool = False) -> str:
    """Every text row of the thread, in order (``before_marker``: those before its first
    ``interrupted`` marker)."""
    return str(q1(dsn, "SELECT coalesce(string_agg(e.event->>'text', '' ORDER BY r.thread_no, e.seq),"
                       " '') FROM pgdurable.run_events e JOIN pgdurable.runs r ON r.id = e.run_id"
                       " WHERE r.thread_key = %s AND e.event->>'type' = 'text' AND (NOT %s OR"
                       " e.seq < (SELECT min(x.seq) FROM pgdurable.run_events x WHERE x.run_id ="
                       " e.run_id AND x.event->>'type' = 'interrupted'))",
                  (thread, before_marker)))


@pytest.mark.parametrize("strategy", ["enqueue", "interrupt", "follow-up"])
def test_each_messages_stream_is_exactly_its_own_answer(dsn: str, fleet: Any,
                                                        strategy: str) -> None:
    """m1 is sent while m0's answer streams. Each message's stream (``until=``), read
    live from before m1 was sent and replayed after, carries exactly its own answer:
    enqueue, m0's whole answer then m1's (the run's next step); interrupt, m0's text up
    to its ``interrupted`` marker (where m0's stream ends), and the re-run step's answer
    to m0+m1 in m1's stream; follow-up (enqueue to a task whose run ends after each
    answer), m0's answer and its run's ``end``, then m1's from the run the thread's lease
    was transferred to, with that run's ``end``. Nothing of one answer is in the other's
    stream."""
    fleet.ready(fleet.start("a", env={"STREAM_DELAY": "0.01"}))
    thread = f"once:own-{strategy}" if strategy == "follow-up" else f"chat:own-{strategy}"

    async def main() -> list[tuple[str, list[str]]]:
        app = Durable(dsn)
        async with app:
            _send(dsn, thread, "m0", 150)
            live0 = asyncio.create_task(_answer(app, thread, "m0"))
            await asyncio.to_thread(until_sync, lambda: len(_thread_text(dsn, thread)) > 40,
                                    "m0's answer streaming")
            _send(dsn, thread, "m1", 40, "enqueue" if strategy == "follow-up" else strategy)
            live1 = asyncio.create_task(_answer(app, thread, "m1"))
            got = [await asyncio.wait_for(t, WAIT_LIMIT) for t in (live0, live1)]
            await asyncio.to_thread(until_sync, lambda: _done(dsn, thread), "the thread idle")
            for mid in ("m0", "m1"):  # replayed from the start once answered
                got.append(await asyncio.wait_for(_answer(app, thread, mid), WAIT_LIMIT))
            return got

    live0, live1, again0, again1 = asyncio.run(main())
    assert (again0, again1) == (live0, live1)
    (text0, kinds0), (text1, kinds1) = live0, live1
    if strategy == "follow-up":
        runs = _rows(dsn, "SELECT result FROM pgdurable.runs WHERE thread_key = %s "
                          "ORDER BY thread_no", (thread,))
        assert [r[0]["answered"] for r in runs] == [["m0"], ["m1"]]  # two runs, one each
        assert text0 == script("m0", 150) and kinds0 == ["end"]
        assert text1 == script("m1", 40) and kinds1 == ["end"]
        assert text0 + text1 == _thread_text(dsn, thread)
        return
    if strategy == "enqueue":
        assert _history(dsn, thread) == [["m0"], ["m1"]]
        assert text0 == script("m0", 150) and kinds0 == []
        assert text1 == script("m1", 40) and kinds1 == []
    else:
        assert _history(dsn, thread) == [["m0", "m1"]]
        cut = _thread_text(dsn, thread, before_marker=True)
        assert text0 == cut and kinds0 == ["interrupted"]  # ends at its marker
        assert 0 < len(cut) < len(script("m0", 150)) and script("m0", 150).startswith(cut)
        assert text1 == script("m0+m1", 40) and kinds1 == []
    assert text0 + text1 == _thread_text(dsn, thread)  # each answer once, none lost
    _one_run(dsn, thread)
