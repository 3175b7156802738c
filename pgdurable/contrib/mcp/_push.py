"""``notifications/tasks/status`` (2025-11-25) pushed from LISTEN/NOTIFY.

A 2025-11-25 client on a stateful Streamable HTTP session (or stdio) that
created a task hears of its status changes on the session's standalone stream.
The hints come through the process's one notifier
(:meth:`pgdurable.Durable.notifier`, never a connection per session), on the
payload of the task's run id: ``pgdurable_mcp`` (``mcp_task_ask`` and
``mcp_task_update``: ``input_required`` and back) and ``pgdurable_done`` (the
run ended: ``completed``, ``failed``, ``cancelled``). A hint is only a reason to
look: the pusher reads the task (``mcp_task_get``) and sends it when its status
or status message differs from what that session was last sent, and stops
watching once the task is terminal or the session's connection closes. A
notifier reconnect (notifications may have been missed) re-reads every watched
task. Pushes are best-effort, as the protocol's notifications are: a client
still polls ``tasks/get``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp_types import TaskStatusNotificationParams

from ...app.durable import Durable
from ...foundation.notifier import Subscription
from . import _sql
from ._wire import TERMINAL, legacy_task

__all__ = ["STATUS_METHOD", "CHANNELS", "Pusher"]

log = logging.getLogger("pgdurable.mcp")

STATUS_METHOD = "notifications/tasks/status"
#: The channels whose payload is a task's run id.
CHANNELS = ("pgdurable_mcp", "pgdurable_done")


@dataclass(eq=False)
class _Watch:
    sub: Subscription
    sessions: dict[int, tuple[Any, tuple[str, str | None]]] = field(default_factory=dict)


class Pusher:
    """Pushes the status of watched tasks to the sessions that created them."""

    def __init__(self, app: Durable) -> None:
        self.app = app
        self._watches: dict[str, _Watch] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.pushed = 0  # notifications sent (tests)

    def watch(self, task_id: str, connection: Any, first: Mapping[str, Any]) -> bool:
        """Push ``task_id``'s changes to ``connection`` (the SDK's ``Connection``;
        ``first`` is the task it was answered). False when nothing can LISTEN
        here (behind a pooler without ``listen_dsn``): the client polls."""
        notifier = self.app.notifier()
        if notifier is None:
            return False
        w = self._watches.get(task_id)
        if w is None:
            mark: Callable[..., None] = lambda *_: self._mark(task_id)  # noqa: E731
            w = _Watch(notifier.subscribe(CHANNELS, mark, mark, key=task_id))
            self._watches[task_id] = w
        w.sessions[id(connection)] = (connection, (str(first.get("status")),
                                                   first.get("statusMessage")))
        stack = getattr(connection, "exit_stack", None)
        if stack is not None:  # the session ends: stop pushing to it
            stack.callback(self._unwatch, task_id, connection)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="pgdurable-mcp-status")
        return True

    @property
    def watched(self) -> int:
        """How many tasks are watched (tests, diagnostics)."""
        return len(self._watches)

    def _mark(self, task_id: str) -> None:
        self._dirty.add(task_id)
        self._wake.set()

    def _unwatch(self, task_id: str, connection: Any) -> None:
        w = self._watches.get(task_id)
        if w is None:
            return
        w.sessions.pop(id(connection), None)
        if not w.sessions:
            self._drop(task_id)

    def _drop(self, task_id: str) -> None:
        w = self._watches.pop(task_id, None)
        if w is not None:
            w.sub.cancel()

    async def _run(self) -> None:
        while self._watches:
            await self._wake.wait()
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            for task_id in dirty:
                try:
                    await self._push(task_id)
                except Exception:  # the database away: the next hint or recheck reads again
                    log.warning("task %s: status not pushed", task_id, exc_info=True)

    async def _push(self, task_id: str) -> None:
        if task_id not in self._watches:
            return
        row = await _sql.fetch_task(self.app, task_id)
        w = self._watches.get(task_id)
        if w is None:
            return
        if row is None or row.expired:
            self._drop(task_id)
            return
        task = legacy_task(row)
        params = TaskStatusNotificationParams.model_validate(task).model_dump(
            by_alias=True, mode="json")  # the SDK's shape of it
        seen = (task["status"], task.get("statusMessage"))
        for key, (connection, last) in list(w.sessions.items()):
            if last == seen:
                continue
            w.sessions[key] = (connection, seen)
            await connection.notify(STATUS_METHOD, params)
            self.pushed += 1
        if task["status"] in TERMINAL:
            self._drop(task_id)
