"""LangGraph checkpoint savers on pgdurable's tables, with one writer per thread.

:class:`AsyncPgDurableSaver` (async, the source) and :class:`PgDurableSaver`
(sync; its ``a*`` methods run the sync ones in a thread) implement LangGraph's
``BaseCheckpointSaver``: put, put_writes, get_tuple, list, delete_thread and
the extended delete_for_runs, copy_thread and prune. Every operation is one
SQL function call (``sql/*_langgraph.sql``); values go through the saver's
``serde`` (LangGraph's serializer protocol).

**One writer per thread.** ``hold_thread(thread_id, wait=True)`` takes the
thread's pgdurable lease (key ``langgraph:thread:<id>``) and renews it while
the block runs; every put/put_writes of that thread from this saver is then
*fenced*: the SQL checks that the lease (owner and token) is still live and
fails with :class:`~pgdurable.LeaseLost` otherwise, so a stalled writer whose
lease lapsed can never interleave checkpoints with its successor. A second
holder either waits (``wait=True``, up to ``max_wait`` seconds) or fails fast
with :class:`ThreadBusy`. A crashed holder's lease expires after ``ttl_ms``.
:func:`invoke_exclusive` / :func:`ainvoke_exclusive` wrap a graph call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ...foundation.db import acheck_connection, check_connection, translated
from ...foundation.errors import PgDurableError
from ...foundation.leases import AsyncPostgresLeaseProvider, PostgresLeaseProvider, keep_lease
from ...foundation.pooler import aconfigure, configure, connect_kwargs, connect_timeout
from ...foundation.queries import langgraph as lq
from ...foundation.queries.core import Query, first, first_sync, many, many_sync
from . import _sql as q

__all__ = [
    "AsyncPgDurableSaver",
    "PgDurableSaver",
    "ThreadBusy",
    "ainvoke_exclusive",
    "invoke_exclusive",
    "thread_lease_key",
]

R = TypeVar("R")

DEFAULT_TTL_MS = 30_000


class ThreadBusy(PgDurableError):
    """Another process holds this LangGraph thread (fail-fast ``hold_thread``, or
    ``wait=True`` whose ``max_wait`` passed). Nothing was written."""


def thread_lease_key(thread_id: str) -> str:
    """The pgdurable lease key of a LangGraph thread."""
    return f"langgraph:thread:{thread_id}"


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4()}"


def _kwargs(conninfo: str) -> dict[str, Any]:
    """A library connection's keyword arguments (pgdurable.pooler), with a connect timeout."""
    return {**connect_kwargs(), **connect_timeout(conninfo)}


def _retention_params(keep_last: int | None, max_age: timedelta | float | None) -> tuple[Any, ...]:
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int)
                                  or keep_last < 1):
        raise ValueError("keep_last must be an int >= 1 or None")
    if max_age is not None:
        if isinstance(max_age, int | float) and not isinstance(max_age, bool):
            max_age = timedelta(seconds=max_age)
        if not isinstance(max_age, timedelta) or max_age < timedelta(0):
            raise ValueError("max_age must be a non-negative timedelta (or seconds) or None")
    return (keep_last, max_age)


class _Fences:
    """The leases this saver holds, by thread id (puts of those threads are fenced)."""

    def __init__(self) -> None:
        self._by_thread: dict[str, q.Fence] = {}
        self._lock = threading.Lock()

    def get(self, config: RunnableConfig) -> q.Fence | None:
        return self._by_thread.get(str(config["configurable"]["thread_id"]))

    def set(self, thread_id: str, fence: q.Fence | None) -> None:
        with self._lock:
            if fence is None:
                self._by_thread.pop(thread_id, None)
            else:
                self._by_thread[thread_id] = fence


def _fence(key: str, owner: str, token: int) -> q.Fence:
    return (key.encode(), owner.encode(), token)


class AsyncPgDurableSaver(BaseCheckpointSaver[str]):
    """Async LangGraph checkpointer on pgdurable's tables (see the module docstring).

    ``conn`` is a DSN (the saver then owns a pool; use ``async with`` or
    :meth:`close`) or an ``AsyncConnectionPool`` of autocommit connections
    (used as is). The pgdurable migrations must be applied
    (``pgdurable migrate``).
    """

    def __init__(self, conn: str | AsyncConnectionPool[Any], *,
                 serde: SerializerProtocol | None = None, max_size: int = 4) -> None:
        super().__init__(serde=serde)
        if isinstance(conn, str):
            self.pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                conn, min_size=1, max_size=max_size, kwargs=_kwargs(conn), open=False,
                configure=aconfigure(), check=acheck_connection)
            self._owned = True
        elif isinstance(conn, AsyncConnectionPool):
            self.pool, self._owned = conn, False
        else:
            raise TypeError("AsyncPgDurableSaver needs a DSN or an AsyncConnectionPool")
        self._opened = False
        self._fences = _Fences()
        self._leases: AsyncPostgresLeaseProvider | None = None

    async def _ready(self) -> AsyncConnectionPool[Any]:
        if self._owned and not self._opened:
            self._opened = True
            await self.pool.open(wait=True)
        return self.pool

    async def close(self) -> None:
        """Close the owned pool (and lease provider)."""
        if self._leases is not None:
            await self._leases.close()
        if self._owned and self._opened:
            await self.pool.close()

    async def __aenter__(self) -> AsyncPgDurableSaver:
        await self._ready()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _one(self, query: Query[R], params: tuple[Any, ...]) -> R | None:
        pool = await self._ready()
        with translated():
            async with pool.connection() as conn:
                return await first(conn, query, params)

    async def _all(self, query: Query[R], params: tuple[Any, ...]) -> list[R]:
        pool = await self._ready()
        async with pool.connection() as conn:
            return await many(conn, query, params)

    # -- BaseCheckpointSaver ------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        params = q.get_params(config)
        stored = await self._one(lq.GET, params)
        return None if stored is None else q.to_tuple(self.serde, params[0], params[1], stored)

    async def alist(self, config: RunnableConfig | None, *,
                    filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        for c in await self._all(lq.LIST, q.list_params(config, filter, before, limit)):
            yield q.to_tuple(self.serde, c.thread_id, c.ns, c.checkpoint)

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        await self._one(lq.PUT, q.put_params(self.serde, config, checkpoint, metadata,
                                            self._fences.get(config)))
        return q.next_config(config, checkpoint)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._one(lq.PUT_WRITES, q.writes_params(self.serde, config, writes, task_id,
                                                      task_path, self._fences.get(config)))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._one(lq.DELETE_THREADS, ([str(thread_id)],))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._one(lq.DELETE_FOR_RUNS, (q.check_thread_ids(run_ids),))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._one(lq.COPY_THREAD, (str(source_thread_id), str(target_thread_id)))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        ids = q.check_thread_ids(thread_ids)
        q.check_strategy(strategy)
        if ids:
            await self._one(lq.DELETE_THREADS if strategy == "delete" else lq.PRUNE_KEEP_LATEST,
                            (ids,))

    # -- retention and leases -----------------------------------------------
    async def set_retention(self, *, keep_last: int | None = None,
                            max_age: timedelta | float | None = None) -> None:
        """Set the checkpoint retention policy applied by every ``pgdurable prune`` batch:
        keep the last ``keep_last`` checkpoints of each thread namespace, or those
        younger than ``max_age`` (both None: keep everything)."""
        await self._one(lq.SET_RETENTION, _retention_params(keep_last, max_age))

    @contextlib.asynccontextmanager
    async def hold_thread(self, thread_id: str, *, wait: bool = True,
                          max_wait: float | None = None,
                          ttl_ms: int = DEFAULT_TTL_MS) -> AsyncIterator[None]:
        """Hold ``thread_id``'s lease (one writer per thread) while the block runs.

        ``wait=False`` raises :class:`ThreadBusy` at once if another process
        holds it; ``wait=True`` retries until free (or ``max_wait`` seconds,
        then :class:`ThreadBusy`). The lease is renewed every ``ttl_ms/3``;
        if it is lost, the block is cancelled with :class:`~pgdurable.LeaseLost`.
        """
        thread_id = str(thread_id)
        if self._leases is None:
            leases = AsyncPostgresLeaseProvider(await self._ready())
            await leases.open()
            self._leases = leases
        key, owner = thread_lease_key(thread_id), _owner()
        loop = asyncio.get_running_loop()
        give_up = None if max_wait is None else loop.time() + max_wait
        pause = 0.02
        while True:
            grant = await self._leases.acquire_lease(key, owner, ttl_ms)
            if grant.acquired:
                break
            if not wait or (give_up is not None and loop.time() >= give_up):
                raise ThreadBusy(f"LangGraph thread {thread_id!r} is being run by {grant.owner}")
            await asyncio.sleep(pause)
            pause = min(pause * 2, ttl_ms / 4000)
        self._fences.set(thread_id, _fence(key, owner, int(grant.token or 0)))
        try:
            async with keep_lease(self._leases, key, owner, ttl_ms, token=grant.token):
                yield
        finally:
            self._fences.set(thread_id, None)
            with contextlib.suppress(Exception):
                await self._leases.release_lease(key, owner, token=grant.token)


class PgDurableSaver(BaseCheckpointSaver[str]):
    """Sync LangGraph checkpointer on pgdurable's tables (see the module docstring).

    ``conn`` is a DSN (the saver then owns a pool; use ``with`` or
    :meth:`close`) or a ``ConnectionPool`` of autocommit connections. Its
    ``a*`` methods run the sync ones in a thread.
    """

    def __init__(self, conn: str | ConnectionPool[Any], *,
                 serde: SerializerProtocol | None = None, max_size: int = 4) -> None:
        super().__init__(serde=serde)
        if isinstance(conn, str):
            self.pool: ConnectionPool[Any] = ConnectionPool(
                conn, min_size=1, max_size=max_size, kwargs=_kwargs(conn), open=True,
                configure=configure(), check=check_connection)
            self._owned = True
        elif isinstance(conn, ConnectionPool):
            self.pool, self._owned = conn, False
        else:
            raise TypeError("PgDurableSaver needs a DSN or a ConnectionPool")
        self._fences = _Fences()
        self._leases: PostgresLeaseProvider | None = None

    def close(self) -> None:
        """Close the owned pool (and lease provider)."""
        if self._leases is not None:
            self._leases.close()
        if self._owned:
            self.pool.close()

    def __enter__(self) -> PgDurableSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _one(self, query: Query[R], params: tuple[Any, ...]) -> R | None:
        with translated(), self.pool.connection() as conn:
            return first_sync(conn, query, params)

    # -- BaseCheckpointSaver ------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        params = q.get_params(config)
        stored = self._one(lq.GET, params)
        return None if stored is None else q.to_tuple(self.serde, params[0], params[1], stored)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        with self.pool.connection() as conn:
            listed = many_sync(conn, lq.LIST, q.list_params(config, filter, before, limit))
        for c in listed:
            yield q.to_tuple(self.serde, c.thread_id, c.ns, c.checkpoint)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        self._one(lq.PUT, q.put_params(self.serde, config, checkpoint, metadata,
                                      self._fences.get(config)))
        return q.next_config(config, checkpoint)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        self._one(lq.PUT_WRITES, q.writes_params(self.serde, config, writes, task_id, task_path,
                                                self._fences.get(config)))

    def delete_thread(self, thread_id: str) -> None:
        self._one(lq.DELETE_THREADS, ([str(thread_id)],))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._one(lq.DELETE_FOR_RUNS, (q.check_thread_ids(run_ids),))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._one(lq.COPY_THREAD, (str(source_thread_id), str(target_thread_id)))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        ids = q.check_thread_ids(thread_ids)
        q.check_strategy(strategy)
        if ids:
            self._one(lq.DELETE_THREADS if strategy == "delete" else lq.PRUNE_KEEP_LATEST, (ids,))

    # -- the async methods: the sync ones in a thread ---------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *,
                    filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        items = await asyncio.to_thread(
            lambda: [*self.list(config, filter=filter, before=before, limit=limit)])
        for item in items:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    # -- retention and leases -----------------------------------------------
    def set_retention(self, *, keep_last: int | None = None,
                      max_age: timedelta | float | None = None) -> None:
        """Sync :meth:`AsyncPgDurableSaver.set_retention`."""
        self._one(lq.SET_RETENTION, _retention_params(keep_last, max_age))

    @contextlib.contextmanager
    def hold_thread(self, thread_id: str, *, wait: bool = True, max_wait: float | None = None,
                    ttl_ms: int = DEFAULT_TTL_MS) -> Iterator[None]:
        """Sync :meth:`AsyncPgDurableSaver.hold_thread`: a daemon thread renews the
        lease; once it is lost, every fenced put of the thread raises
        :class:`~pgdurable.LeaseLost` (the block is not interrupted otherwise)."""
        thread_id = str(thread_id)
        if self._leases is None:
            self._leases = PostgresLeaseProvider(self.pool)
            self._leases.open()
        leases = self._leases
        key, owner = thread_lease_key(thread_id), _owner()
        give_up = None if max_wait is None else time.monotonic() + max_wait
        pause = 0.02
        while True:
            grant = leases.acquire_lease(key, owner, ttl_ms)
            if grant.acquired:
                break
            if not wait or (give_up is not None and time.monotonic() >= give_up):
                raise ThreadBusy(f"LangGraph thread {thread_id!r} is being run by {grant.owner}")
            time.sleep(pause)
            pause = min(pause * 2, ttl_ms / 4000)
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(ttl_ms / 3000):
                try:
                    if not leases.renew_lease(key, owner, ttl_ms, token=grant.token):
                        return
                except psycopg.Error:
                    continue
                except PgDurableError:
                    continue

        renewer = threading.Thread(target=renew, name=f"lease {key}", daemon=True)
        self._fences.set(thread_id, _fence(key, owner, int(grant.token or 0)))
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join()
            self._fences.set(thread_id, None)
            with contextlib.suppress(Exception):
                leases.release_lease(key, owner, token=grant.token)


def _thread_of(config: RunnableConfig) -> str:
    try:
        return str(config["configurable"]["thread_id"])
    except (KeyError, TypeError):
        raise ValueError("config needs {'configurable': {'thread_id': ...}}") from None


def invoke_exclusive(graph: Any, input: Any, config: RunnableConfig, *, wait: bool = True,
                     max_wait: float | None = None, ttl_ms: int = DEFAULT_TTL_MS) -> Any:
    """``graph.invoke(input, config)`` while holding the thread's lease (one writer per
    thread); ``graph.checkpointer`` must be a :class:`PgDurableSaver`."""
    saver = getattr(graph, "checkpointer", None)
    if not isinstance(saver, PgDurableSaver):
        raise TypeError("invoke_exclusive needs a graph compiled with a PgDurableSaver")
    with saver.hold_thread(_thread_of(config), wait=wait, max_wait=max_wait, ttl_ms=ttl_ms):
        return graph.invoke(input, config)


async def ainvoke_exclusive(graph: Any, input: Any, config: RunnableConfig, *,
                            wait: bool = True, max_wait: float | None = None,
                            ttl_ms: int = DEFAULT_TTL_MS) -> Any:
    """``await graph.ainvoke(input, config)`` while holding the thread's lease;
    ``graph.checkpointer`` must be an :class:`AsyncPgDurableSaver`."""
    saver = getattr(graph, "checkpointer", None)
    if not isinstance(saver, AsyncPgDurableSaver):
        raise TypeError("ainvoke_exclusive needs a graph compiled with an AsyncPgDurableSaver")
    async with saver.hold_thread(_thread_of(config), wait=wait, max_wait=max_wait, ttl_ms=ttl_ms):
        return await graph.ainvoke(input, config)
