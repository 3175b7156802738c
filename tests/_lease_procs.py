"""Subprocess helpers for tests/test_leases_concurrency.py.

Run as ``python tests/_lease_procs.py <command> <dsn> <key> <owner> [n]``.
Each command uses a real :class:`pgdurable.PostgresLeaseProvider` (its own
connection) and prints one JSON line with what it saw.

* ``acquire``: one acquire_lease (after printing ``ready``); prints the grant.
* ``hammer``: acquire_lease in a loop until stdin closes (prints ``ready`` after
  the first call); prints counts, including wins and ``owner=None`` losses.
* ``flip``: n times acquire_lease and, when won, release_lease; prints how
  often a loss named no owner.
"""

from __future__ import annotations

import json
import sys
import threading

from pgdurable import PostgresLeaseProvider

TTL_MS = 60_000


def _say(obj: object) -> None:
    print(json.dumps(obj), flush=True)


def acquire(p: PostgresLeaseProvider, key: str, owner: str) -> None:
    _say("ready")
    g = p.acquire_lease(key, owner, TTL_MS)
    _say({"acquired": g.acquired, "owner": g.owner, "token": g.token})


def hammer(p: PostgresLeaseProvider, key: str, owner: str) -> None:
    stop = threading.Event()

    def wait_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_eof, daemon=True).start()
    counts = {"attempts": 0, "won": 0, "none_owner": 0}
    owners: set[str] = set()
    first = True
    while not stop.is_set():
        g = p.acquire_lease(key, owner, TTL_MS)
        counts["attempts"] += 1
        if g.acquired:
            counts["won"] += 1
        elif g.owner is None:
            counts["none_owner"] += 1
        else:
            owners.add(g.owner)
        if first:
            _say("ready")
            first = False
    _say({**counts, "distinct_owners": len(owners)})


def flip(p: PostgresLeaseProvider, key: str, owner: str, n: int) -> None:
    _say("ready")
    counts = {"attempts": 0, "won": 0, "none_owner": 0}
    for _ in range(n):
        g = p.acquire_lease(key, owner, TTL_MS)
        counts["attempts"] += 1
        if g.acquired:
            counts["won"] += 1
            p.release_lease(key, owner, token=g.token)
        elif g.owner is None:
            counts["none_owner"] += 1
    _say(counts)


def main(argv: list[str]) -> None:
    cmd, dsn, key, owner = argv[:4]
    with PostgresLeaseProvider(dsn, min_size=1, max_size=1) as p:
        if cmd == "acquire":
            acquire(p, key, owner)
        elif cmd == "hammer":
            hammer(p, key, owner)
        elif cmd == "flip":
            flip(p, key, owner, int(argv[4]))
        else:
            raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
