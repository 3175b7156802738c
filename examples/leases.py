"""Leases: one owner per resource across processes, fencing tokens, hand-over with no gap,
and concurrent callers sharing round trips (``pipeline=True``).

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/leases.py
"""

from __future__ import annotations

import asyncio
import os

from pgdurable import AsyncPostgresLeaseProvider, keep_lease


async def main() -> None:
    async with AsyncPostgresLeaseProvider(os.environ["PGDURABLE_DSN"]) as leases:
        key = "resource\x00thread-42"  # any string, NUL included
        me = await leases.acquire_lease(key, "run-1", 15_000)
        other = await leases.acquire_lease(key, "run-2", 15_000)
        print("run-1 acquired:", me.acquired, "token", me.token)
        print("run-2 acquired:", other.acquired, "-> route the work to", other.owner)
        assert me.acquired and not other.acquired and other.owner == "run-1"

        async with keep_lease(leases, key, "run-1", 15_000):  # renews every 5 s
            await asyncio.sleep(0.1)  # ... the agent's work

        # Hand over to the queued follow-up with no gap in which a third process gets in.
        assert await leases.transfer_lease(key, "run-1", "run-2", 15_000)
        grant = await leases.get_lease(key)
        print("after transfer:", grant.owner if grant else None, "token", grant.token if grant else None)
        assert grant is not None and grant.owner == "run-2" and grant.token > me.token

        await leases.release_lease(key, "run-1")  # not the owner: a no-op
        assert await leases.get_lease_owner(key) == "run-2"
        await leases.release_lease(key, "run-2")
        assert await leases.get_lease_owner(key) is None
        print("released")

    # Many concurrent callers in one process: pipeline=True makes their calls share
    # round trips and commits (one batch = one transaction; docs/performance-writes.md).
    async with AsyncPostgresLeaseProvider(os.environ["PGDURABLE_DSN"], pipeline=True) as piped:
        grants = await asyncio.gather(
            *(piped.acquire_lease(f"thread-{i % 4}", f"router-{i}", 15_000) for i in range(8)))
        winners = {g.owner for g in grants if g.acquired}
        print("8 concurrent acquires on 4 keys, one winner per key:", sorted(winners))
        assert len(winners) == 4 and all(g.owner in winners for g in grants)


if __name__ == "__main__":
    asyncio.run(main())
