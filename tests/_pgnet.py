"""Raw network access to the test server, for the tests' own TCP proxies."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from psycopg.conninfo import conninfo_to_dict, make_conninfo


async def open_server(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection to the PostgreSQL server at ``(host, port)``.

    libpq's rule: a host that is a directory (``/tmp/...``, the embedded
    pgserver's) or starts with ``@`` (an abstract namespace) names a unix
    socket ``<dir>/.s.PGSQL.<port>``; anything else is TCP.
    """
    if host.startswith(("/", "@")):
        path = ("\0" + host[1:] if host.startswith("@") else host) + f"/.s.PGSQL.{port}"
        return await asyncio.open_unix_connection(path)
    return await asyncio.open_connection(host, port)


class Proxy:
    """A TCP forwarder on 127.0.0.1 to the test server that drops every
    connection until ``forwarding`` is set (a database that is down).

    ``cut_on``: bytes that, in what a client sends, make the proxy close that
    connection (both ways) instead of passing them on, ``cuts_left`` times (a
    server or pooler that restarts under a statement); ``cut`` counts them.
    ``received``: how many bytes the server sent through it (what clients fetched).

    ``hold_on``: bytes that, in what a client sends, make the proxy hold that
    data (a statement stuck in the network), once: ``holding`` is set, and the
    data goes on when :meth:`release` is called. If the client closes its
    connection first, the held data is dropped: it never reaches the server."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.forwarding = False
        self.cut_on: bytes | None = None
        self.cuts_left = 0
        self.cut = 0
        self.received = 0  # bytes the server sent to the clients
        self.hold_on: bytes | None = None
        self.holding = threading.Event()
        self._released: asyncio.Event | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self.port = 0

    def _cuts(self, data: bytes) -> bool:
        """True (and counted) when client ``data`` holds the ``cut_on`` marker, while cuts are left."""
        if self.cut_on is None or self.cuts_left <= 0 or self.cut_on not in data:
            return False
        self.cuts_left -= 1
        self.cut += 1
        return True

    def release(self) -> None:
        """Let the held data go on (see ``hold_on``)."""
        assert self._released is not None
        self._loop.call_soon_threadsafe(self._released.set)

    def _holds(self, data: bytes) -> bool:
        """True (once) when client ``data`` holds the ``hold_on`` marker."""
        if self.hold_on is None or self.holding.is_set() or self.hold_on not in data:
            return False
        self.holding.set()
        return True

    async def _hold(self, r: asyncio.StreamReader, data: bytes) -> bytes | None:
        """Wait for :meth:`release`, reading what the client sends meanwhile:
        ``data`` and that, or None if the client closed its connection first."""
        assert self._released is not None
        released = asyncio.ensure_future(self._released.wait())
        try:
            while True:
                read = asyncio.ensure_future(r.read(65536))
                await asyncio.wait({released, read}, return_when=asyncio.FIRST_COMPLETED)
                if read.done():
                    more = read.result()
                    if not more:
                        return None
                    data += more
                    if not released.done():
                        continue
                else:
                    read.cancel()  # nothing was read: the client's data stays buffered
                    await asyncio.gather(read, return_exceptions=True)
                return data
        finally:
            released.cancel()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter,
                    client: asyncio.StreamWriter | None = None) -> None:
        """``r`` to ``w``; with ``client`` (client to server), both ends are closed at a cut."""
        try:
            while data := await r.read(65536):
                if client is not None and self._cuts(data):
                    client.close()
                    break
                if client is None:
                    self.received += len(data)
                if client is not None and self._holds(data):
                    held = await self._hold(r, data)
                    if held is None:
                        break
                    data = held
                w.write(data)
                await w.drain()
        except OSError:
            pass
        finally:
            w.close()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if not self.forwarding:
            w.close()
            return
        ur, uw = await open_server(*self.target)
        await asyncio.gather(self._pipe(r, uw, client=w), self._pipe(ur, w))

    async def _start(self) -> None:
        self._released = asyncio.Event()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def __enter__(self) -> Proxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            # end the connections' pipes here, not when the loop is collected
            # (their finally would then run on a closed loop: an unraisable error)
            pipes = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in pipes:
                t.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@contextlib.contextmanager
def proxied(dsn: str) -> Iterator[tuple[Proxy, str]]:
    """A :class:`Proxy` to the server of ``dsn`` (not forwarding yet) and the
    conninfo that reaches the server through it."""
    params = conninfo_to_dict(dsn)
    with Proxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)) as p:
        yield p, make_conninfo(dsn, host="127.0.0.1", port=str(p.port))
