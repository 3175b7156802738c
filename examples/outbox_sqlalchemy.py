"""The outbox pattern with SQLAlchemy: the order row and its run commit together.

Run with a migrated database (``pgdurable migrate``, or the Alembic helper)::

    PGDURABLE_DSN=postgresql://postgres@127.0.0.1/mydb python examples/outbox_sqlalchemy.py

An order is inserted and its ``fulfil`` run started in ONE transaction
(``pgdurable.contrib.sqlalchemy.start_run``): if the transaction rolls back,
neither exists and no worker ever sees the run; on commit a listening worker
wakes at once. A payment webhook then signals the run inside the
transaction that records the payment.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from sqlalchemy import String, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import pgdurable
from pgdurable import Done, Durable, RunContext, Wait
from pgdurable.contrib.sqlalchemy import signal, start_run, url_from_dsn
from pgdurable.contrib.sqlalchemy.tables import runs


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "outbox_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(100))
    paid: Mapped[bool] = mapped_column(default=False)


app = Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL


@app.task("fulfil", revision="1")
async def fulfil(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Wait for the payment of the order, then ship it."""
    if ctx.wake is None:
        return Wait(("payment", str(state["order"])))
    return Done({"order": state["order"], "shipped": True, "amount": ctx.wake["payload"]["amount"]})


async def place_order(sessions: async_sessionmaker[AsyncSession], order_id: int, item: str,
                      *, fail: bool = False) -> str | None:
    """Insert the order and start its run in one transaction."""
    try:
        async with sessions() as session, session.begin():
            session.add(Order(id=order_id, item=item))
            run_id = await start_run(session, "fulfil", {"order": order_id}, app=app)
            if fail:
                raise RuntimeError("the business write failed after start_run")
        return run_id
    except RuntimeError:
        return None  # rolled back: no order, no run, no wake-up


async def payment_webhook(sessions: async_sessionmaker[AsyncSession], order_id: int,
                          amount: int) -> list[str]:
    """Record the payment and wake the order's run, atomically."""
    async with sessions() as session, session.begin():
        order = await session.get(Order, order_id)
        assert order is not None
        order.paid = True
        return await signal(session, "payment", str(order_id), {"amount": amount},
                            signal_id=f"payment-{order_id}")


async def wait_for(run_id: str, status: str) -> pgdurable.RunInfo:
    """Poll the run until it reaches ``status`` (a demo; real code reacts to events)."""
    for _ in range(1200):
        info = await app.get_run(run_id)
        if info.status == status:
            return info
        await asyncio.sleep(0.05)
    raise TimeoutError(run_id)


async def main() -> None:
    dsn = os.environ.get("PGDURABLE_DSN") or os.environ["DATABASE_URL"]
    engine = create_async_engine(url_from_dsn(dsn, async_=True))
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    async with engine.begin() as c:
        await c.run_sync(Base.metadata.create_all)
    async with app:
        worker = app.worker(queues=["default"], concurrency=4)
        worker_task = asyncio.create_task(worker.run())
        try:
            ok = await place_order(sessions, 1, "book")
            lost = await place_order(sessions, 2, "lamp", fail=True)
            assert ok is not None and lost is None
            await wait_for(ok, "waiting")
            print("woken:", await payment_webhook(sessions, 1, 42) == [ok])
            info = await wait_for(ok, "completed")
            print("result:", info.result)
            async with sessions() as session:
                orders = (await session.execute(select(Order.id, Order.paid))).all()
                count = await session.scalar(select(func.count()).select_from(runs))
            print("orders:", [tuple(o) for o in orders], "runs:", count)
        finally:
            await worker.stop(grace=5)
            await worker_task
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
