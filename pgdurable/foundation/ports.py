"""The small protocols the lower layers take instead of the app object.

The engine (claim, write, heartbeat, listen, park) and the capability modules
(streams, threads, children, schedules, fork, results, tracing ...) need a few
things of an app: run one statement on its pool, its task registry, where to
LISTEN and its notifier (the process's one LISTEN connection). They take these protocols, never :class:`pgdurable.Durable` or
:class:`pgdurable.DurableClient`, which satisfy them and sit in the layer
above (see ``docs/architecture.md``): nothing below the app imports the app.
"""

from __future__ import annotations

from typing import Any, Protocol

from psycopg_pool import AsyncConnectionPool

from .notifier import Notifier
from .pooler import Pooler
from .registry import Task, TaskRegistry

__all__ = ["App", "AppSettings", "Database", "StepContext", "SyncDatabase"]


class Database(Protocol):
    """One statement on a pooled connection, errors translated (``Durable.fetchone``)."""

    async def fetchone(
        self, sql: str, params: tuple[Any, ...], *, prepare: bool | None = True
    ) -> tuple[Any, ...] | None: ...

    async def fetchall(
        self, sql: str, params: tuple[Any, ...], *, prepare: bool | None = True
    ) -> list[tuple[Any, ...]]: ...


class App(Database, Protocol):
    """What workers and capabilities use of an app (:class:`pgdurable.Durable` is one)."""

    _registry: TaskRegistry
    open_timeout: float

    @property
    def tasks(self) -> dict[str, Task]: ...

    @property
    def pool(self) -> AsyncConnectionPool[Any]: ...

    async def open(self) -> None: ...

    def listen_conninfo(self) -> str | None: ...

    def notifier(self) -> Notifier | None: ...


class AppSettings(Protocol):
    """What :class:`pgdurable.DurableClient` takes of an app passed as ``app=``
    (:class:`pgdurable.Durable` is one): where and how it connects, its tasks."""

    conninfo: str | None
    pooler: Pooler | None
    listen_dsn: str | None
    schema: str
    _registry: TaskRegistry


class SyncDatabase(Protocol):
    """The sync twin of :class:`Database` (:class:`pgdurable.DurableClient` is one)."""

    def fetchone(
        self, sql: str, params: tuple[Any, ...], *, prepare: bool | None = True
    ) -> tuple[Any, ...] | None: ...

    def fetchall(
        self, sql: str, params: tuple[Any, ...], *, prepare: bool | None = True
    ) -> list[tuple[Any, ...]]: ...


class StepContext(Protocol):
    """What streams, threads and liveness use of a step's :class:`pgdurable.RunContext`."""

    run_id: str
    step: int
    token: int
    thread_key: str | None
    _app: Any
    _owner: str | None
    _emitted: int
    _text: Any  # the step's text stream (pgdurable.runs.text.StepText) or None
    _liveness: Any

    def _attached(self) -> tuple[Any, str]: ...
