"""Receiving NOTIFYs on a LISTEN connection with one reader for a whole window.

psycopg's ``AsyncConnection.notifies()`` waits for each arrival on its own:
it registers the socket with the event loop, arms a timer, and removes both
again, per notification (two ``epoll_ctl`` calls and a timer each). A
worker's listener hears one ``pgdurable_wake`` per started run, so under a
steady stream of starts that bookkeeping was about a seventh of the worker's
CPU (py-spy, benchmarks/RESULTS.md). :func:`receive` registers the socket once
for the window and hands every notification, as it is read, to the
connection's own notify handlers (``conn.add_notify_handler``): the same
handlers that get the notifications psycopg reads while it runs a statement on
the connection, so none is lost between windows.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

__all__ = ["receive"]


async def receive(conn: psycopg.AsyncConnection[Any], seconds: float,
                  until: asyncio.Future[Any] | None = None) -> int:
    """Read ``conn``'s notifications for ``seconds``, each handed at once to the
    handlers added with ``conn.add_notify_handler``; return how many arrived.

    The window ends early once ``until`` is done (at once if it already is:
    then only what libpq has buffered is handed on). Raises
    ``psycopg.OperationalError`` as soon as the connection is lost. The
    connection is held (its lock) for the window: nothing else may use it.
    """
    loop = asyncio.get_running_loop()
    pg = conn.pgconn
    lost: asyncio.Future[None] = loop.create_future()
    count = 0

    def drain() -> None:
        nonlocal count
        try:
            pg.consume_input()  # non-blocking: takes what the socket holds
            while (n := pg.notifies()) is not None:
                count += 1
                if pg.notify_handler is not None:
                    pg.notify_handler(n)  # psycopg's: the connection's notify handlers
        except Exception as exc:  # a lost connection (or a handler's bug): end the window
            loop.remove_reader(fd)
            if not lost.done():
                lost.set_exception(exc)

    def stop(_: object) -> None:
        if not lost.done():
            lost.set_result(None)

    async with conn.lock:
        fd = pg.socket
        drain()  # anything read into libpq's buffer before the window
        if until is not None and until.done():
            if lost.done():
                lost.result()  # the connection was lost (or a handler raised)
            return count
        loop.add_reader(fd, drain)
        if until is not None:
            until.add_done_callback(stop)
        try:
            async with asyncio.timeout(seconds):
                await lost
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(fd)
            if until is not None:
                until.remove_done_callback(stop)
    return count
