"""Raw network access to the test server, for the tests' own TCP proxies."""

from __future__ import annotations

import asyncio


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
