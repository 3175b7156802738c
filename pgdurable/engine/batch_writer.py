"""The worker's batched, fenced step writes (``pgdurable.write_steps``).

A Continue checkpoint or a Done completion is queued; while one batch is in
flight, the steps that finish meanwhile wait and go together in the next one:
one round trip and one commit for many steps (group commit from the client
side), and no added delay when the worker is quiet (a lone step is sent at
once). Each caller gets its own run's status; a run whose fence failed raises
:class:`~pgdurable.foundation.errors.LeaseLost` in its caller only.

One bad run cannot fail its neighbours: when a batch fails for anything but a
transient error (a value the database refuses, a trigger, ...), its runs are
written again one statement each, so only the run that fails alone gets the
error. A transient error (a lost connection, a deadlock, a statement timeout:
:func:`~pgdurable.foundation.retry.is_transient`) is not a failure of the step: the
caller writes again on a fresh connection while its lease is trusted, after
reading the run to see whether the lost write committed (``write_steps``
advances the step, so sending a committed Continue twice would skip a step).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..foundation.errors import LeaseLost
from ..foundation.queries import steps as sq
from ..foundation.queries.core import Database, first
from ..foundation.retry import backoff, is_transient

__all__ = ["StepWriter"]


@dataclass
class _Write:
    run_id: str  # the id's text
    token: int
    state_json: str
    spend: float
    result_json: str | None
    done: asyncio.Future[str]
    settles: str | None = None  # the step's buffered budget settlements (a JSON array)


class StepWriter:
    """Batches the fenced step writes of one worker (see the module docstring)."""

    def __init__(self, db: Database, owner: str, lock: asyncio.Lock) -> None:
        self._db = db
        self._owner = owner
        self._lock = lock  # shared with the heartbeat: one write statement at a time
        self._queue: list[_Write] = []
        self._flusher: asyncio.Task[None] | None = None
        self.count = 0  # statements sent (tests check the batching)

    async def write(
        self, run_id: str, token: int, step: int, state_json: str, spend: float,
        result_json: str | None, trusted: Callable[[], bool], settles: str | None = None,
    ) -> str:
        """Checkpoint step ``step`` (``result_json`` None) or complete the run ``run_id``
        (its id's text); its new status.

        ``settles``: the budget settlements the step buffered (a JSON array,
        :meth:`~pgdurable.runs.steps.RunContext._take_settles`), written in the
        same transaction (``write_steps_settling``). After a lost connection,
        looks whether the write applied and otherwise sends it again, while
        ``trusted()`` holds.
        """
        delays: Iterator[float] | None = None  # made on the first failure only (hot path)
        sent = False
        while True:
            try:
                if sent:
                    now = await first(self._db, sq.RUN_STEP, (run_id,))
                    status = self._applied(now, token, step)
                    if status is not None:
                        return self._checked(status, run_id, token)
                sent = True
                return self._checked(
                    await self._enqueue(run_id, token, state_json, spend, result_json, settles),
                    run_id, token,
                )
            except LeaseLost:
                raise
            except Exception as exc:
                if not is_transient(exc) or not trusted():
                    raise
            if delays is None:
                delays = backoff()
            await asyncio.sleep(next(delays))

    def _applied(self, now: sq.RunStep | None, token: int, step: int) -> str | None:
        """The status if the lost write of ``step`` applied, None if it did not, else 'lost'."""
        if now is None or now.lease_token != token:
            return "lost"
        if now.step == step + 1:  # applied: its verdict is the run's status now
            return "lost" if now.status == "leased" and now.lease_owner != self._owner \
                else str(now.status)
        if now.step == step and now.status == "leased" and now.lease_owner == self._owner:
            return None
        return "lost"

    @staticmethod
    def _checked(status: str, run_id: str, token: int) -> str:
        if status == "lost":
            raise LeaseLost(f"lease lost on run {run_id} (token {token})")
        return status

    async def _enqueue(
        self, run_id: str, token: int, state_json: str, spend: float,
        result_json: str | None, settles: str | None,
    ) -> str:
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._queue.append(_Write(run_id, token, state_json, spend, result_json, fut, settles))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        # shielded: a write that was sent is awaited to its end (it is fenced anyway)
        return await asyncio.shield(fut)

    async def _send(self, batch: list[_Write]) -> list[sq.StepWritten]:
        params = batch_params(self._owner, batch)
        query = sq.WRITE_STEPS
        settles = [b.settles[1:-1] for b in batch if b.settles]  # JSON arrays' elements
        if settles:
            query, params = sq.WRITE_STEPS_SETTLING, (*params, "[" + ",".join(settles) + "]")
        self.count += 1
        async with self._lock:
            return query.all(await self._db.fetchall(query.sql, params))

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    await self._write(batch)
                except BaseException:
                    for b in batch:  # cancelled mid-way: nobody waits forever
                        if not b.done.done():
                            b.done.cancel()
                    raise
        finally:
            self._flusher = None
            for b in self._queue:  # only if cancelled mid-way
                b.done.cancel()

    async def _write(self, batch: list[_Write]) -> None:
        """Send ``batch``; answer each of its futures with a status or an error."""
        try:
            written = await self._send(batch)
        except Exception as exc:
            if len(batch) == 1 or is_transient(exc):
                _settle(batch, exc)
                return
            # one run's value may have failed the whole statement: each alone
            for b in batch:
                try:
                    written = await self._send([b])
                except Exception as exc1:
                    _settle([b], exc1)
                    continue
                _answer([b], written)
            return
        _answer(batch, written)


def batch_params(owner: str, batch: list[_Write]) -> tuple[Any, ...]:
    """The parameters of :data:`~pgdurable.foundation.queries.steps.WRITE_STEPS` for ``batch``.

    The states and results are JSON texts already (encoded and validated by the
    worker): joined into one JSON array each, they cost one parameter and no
    per-character escaping (psycopg's text-array escaping took ~4 Python calls
    per double quote); ids, tokens and done flags are array literals.
    A result is ``null`` for a Continue step (ignored by ``write_steps``).
    """
    return (
        owner,
        "{" + ",".join([b.run_id for b in batch]) + "}",
        "{" + ",".join([str(b.token) for b in batch]) + "}",
        "[" + ",".join([b.state_json for b in batch]) + "]",
        [b.spend for b in batch],
        "{" + ",".join(["f" if b.result_json is None else "t" for b in batch]) + "}",
        "[" + ",".join(["null" if b.result_json is None else b.result_json
                        for b in batch]) + "]",
    )


def _answer(batch: list[_Write], written: list[sq.StepWritten]) -> None:
    got = {w.run_id: w.status for w in written}  # by the run id's text
    for b in batch:
        if not b.done.done():
            b.done.set_result(got.get(b.run_id, "lost"))


def _settle(batch: list[_Write], exc: Exception) -> None:
    for b in batch:
        if not b.done.done():
            b.done.set_exception(exc)
