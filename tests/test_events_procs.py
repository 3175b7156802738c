"""Events across processes (issue 43): worker processes, thousands of events over
many keys in bursts from concurrent senders, SIGKILLs while they run. Every event
is in exactly one window of each trigger and seen by exactly that window's run;
one run per window; no batch over its size; debounce due times from the database
clock. (The fleet: tests/fix_fleet.py; the app: tests/_events_app.py.)"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import psycopg
import pytest
from _waiting import until_sync
from fix_fleet import Fleet

from pgdurable import Durable

pytestmark = pytest.mark.fleet("_events_app:app", ttl=2.0, poll=1.0, concurrency=8, grace=1.0)

#: The issue's size: 10,000 events over 200 keys (45 s on the quiet 2-core test machine,
#: send and drain; marked slow, which `make test` runs: nothing deselects it).
#: EVENTS_N / EVENTS_KEYS change it for a quicker local run.
N = int(os.environ.get("EVENTS_N", "10000"))
KEYS = int(os.environ.get("EVENTS_KEYS", "200"))
SENDERS = 8
BATCH = 20  # the batch trigger's size (tests/_events_app.py)
SEEN = ("CREATE TABLE IF NOT EXISTS events_seen (trigger text NOT NULL, event_id bigint NOT NULL, "
        "run_id uuid NOT NULL, batch_size integer NOT NULL)")


def one(conn: psycopg.Connection[Any], query: str, *args: Any) -> Any:
    row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


async def _send_all(dsn: str, on_progress: Any) -> None:
    """N events over KEYS keys in bursts (a key's next 1-25 events at once), from
    SENDERS concurrent senders."""
    rng = random.Random(43)
    plan: list[tuple[str, int]] = []
    while len(plan) < N:
        key = f"k{rng.randrange(KEYS)}"
        plan += [(key, 0)] * rng.randint(1, 25)
    plan = [(k, i) for i, (k, _) in enumerate(plan[:N])]
    queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    for item in plan:
        queue.put_nowait(item)
    sent = 0
    async with Durable(dsn, pool_size=SENDERS) as app:

        async def sender() -> None:
            nonlocal sent
            while not queue.empty():
                key, i = queue.get_nowait()
                await app.send_event("msg", {"k": key, "i": i}, id=f"m-{i}")
                sent += 1
                if sent % 500 == 0:
                    on_progress(sent)
                if rng.random() < 0.01:
                    await asyncio.sleep(0.2)  # a quiet moment: debounce windows close

        await asyncio.gather(*[sender() for _ in range(SENDERS)])


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.timeout(900)  # the full size on a loaded 2-core machine: over the usual 300 s
def test_every_event_is_seen_by_exactly_one_run_under_sigkill(
        fleet: Fleet, conn: psycopg.Connection[Any], dsn: str) -> None:
    conn.execute(SEEN)
    workers = [fleet.start(name) for name in ("a", "b", "c", "d")]
    fleet.ready(*workers)
    assert one(conn, "SELECT count(*) FROM pgdurable.event_triggers") == 2
    kills = {N // 3: ("a", "e"), 2 * N // 3: ("b", "f")}

    held: dict[str, list[Any]] = {}
    killed_at: dict[str, Any] = {}  # the database clock just after each SIGKILL

    def progress(sent: int) -> None:
        for at, (victim, fresh) in list(kills.items()):
            if sent >= at:
                # kill it while it holds trigger runs (a handler mid-way), if it does
                # within a second: their leases lapse and other workers take them over
                end = time.monotonic() + 1.0
                while time.monotonic() < end:
                    held[victim] = [r[0] for r in conn.execute(
                        "SELECT id FROM pgdurable.runs WHERE status = 'leased' "
                        "AND lease_owner = %s", (victim,))]
                    if held[victim]:
                        break
                    time.sleep(0.005)
                next(w for w in workers if w.name == victim).kill()
                killed_at[victim] = one(conn, "SELECT clock_timestamp()")
                workers.append(fleet.start(fresh))
                del kills[at]

    t0 = time.monotonic()
    asyncio.run(_send_all(dsn, progress))
    sending = time.monotonic() - t0
    assert one(conn, "SELECT count(*) FROM pgdurable.events") == N

    def all_done() -> bool:
        return one(conn, "SELECT count(*) FROM pgdurable.event_windows w "
                   "JOIN pgdurable.runs r ON r.id = w.run_id "
                   "WHERE r.status <> 'completed'") == 0

    until_sync(all_done, "every window's run to complete")
    print(f"{N} events sent in {sending:.1f} s; drained {time.monotonic() - t0 - sending:.1f} s "
          "later; windows:", conn.execute("SELECT trigger, count(*), max(events) FROM "
                                          "pgdurable.event_windows GROUP BY 1").fetchall())
    # the database's record: each event in exactly one window of each trigger
    assert one(conn, """
        SELECT count(*) FROM pgdurable.events e CROSS JOIN pgdurable.event_triggers t
         WHERE (SELECT count(*) FROM pgdurable.event_window_events we
                  JOIN pgdurable.event_windows w ON w.id = we.window_id
                 WHERE we.event_id = e.id AND w.trigger = t.name) <> 1""") == 0
    # one run per window, and no run of a trigger's task without a window
    assert one(conn, "SELECT count(*) FROM pgdurable.runs") == \
        one(conn, "SELECT count(DISTINCT run_id) FROM pgdurable.event_windows") == \
        one(conn, "SELECT count(*) FROM pgdurable.event_windows")
    # what the handlers got: every event by exactly one run per trigger, that window's
    assert one(conn, """
        SELECT count(*) FROM (
          SELECT s.trigger, s.event_id FROM events_seen s GROUP BY 1, 2
          HAVING count(DISTINCT s.run_id) <> 1) x""") == 0
    assert one(conn, "SELECT count(DISTINCT (trigger, event_id)) FROM events_seen") == 2 * N
    assert one(conn, """
        SELECT count(*) FROM events_seen s
         WHERE NOT EXISTS (SELECT 1 FROM pgdurable.event_windows w
                             JOIN pgdurable.event_window_events we ON we.window_id = w.id
                            WHERE w.run_id = s.run_id AND we.event_id = s.event_id
                              AND w.trigger = s.trigger)""") == 0
    # no batch over its size
    assert one(conn, "SELECT max(events) FROM pgdurable.event_windows "
               "WHERE trigger = 'batch'") <= BATCH
    assert one(conn, "SELECT max(batch_size) FROM events_seen WHERE trigger = 'batch'") <= BATCH
    # debounce: due debounce after the window's last event, or max_wait after its first
    # (database clock), and read by its run after that; no window spans over max_wait
    bad = conn.execute("""
        SELECT w.id, w.due_at, max(e.created_at), w.opened_at, w.taken_at
          FROM pgdurable.event_windows w
          JOIN pgdurable.event_window_events we ON we.window_id = w.id
          JOIN pgdurable.events e ON e.id = we.event_id
         WHERE w.trigger = 'burst'
         GROUP BY w.id
        HAVING w.due_at <> least(max(e.created_at) + interval '0.3 s',
                                 w.opened_at + interval '1.5 s')
            OR w.opened_at <> min(e.created_at)
            OR w.taken_at < w.due_at
            OR w.due_at > w.opened_at + interval '1.5 s'""").fetchall()
    assert bad == []
    late = one(conn, "SELECT max(extract(epoch FROM taken_at - due_at)) "
               "FROM pgdurable.event_windows")
    print(f"latest start after a window's due time: {late:.2f} s (killed workers' leases: 2 s)")
    # the SIGKILLs landed on runs in flight, which other workers took over and finished
    # (a run also claims again after sleeping until its window is due)
    print(f"runs held by the killed workers: {held}; runs claimed more than once: "
          f"{one(conn, 'SELECT count(*) FROM pgdurable.runs WHERE claims > 1')}")
    # every victim completed: taken over (claimed again), or it finished its last write
    # between the read that found it held and the SIGKILL (before the kill, claimed once)
    for victim, ids in held.items():
        assert conn.execute(
            "SELECT id FROM pgdurable.runs WHERE id = ANY(%s) AND NOT (status = 'completed' "
            "AND (claims > 1 OR finished_at <= %s))", (ids, killed_at[victim])).fetchall() == []
