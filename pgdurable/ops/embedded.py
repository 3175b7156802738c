"""An embedded PostgreSQL (pgserver) for the demo and for laptops without a server.

Install with ``pip install 'pgdurable[embedded]'``. The server lives in a data
directory (default ``.pgdurable/pgdata``) and is stopped when the process exits.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..foundation.errors import PgDurableError

__all__ = ["DEFAULT_DATA_DIR", "EmbeddedUnavailable", "start_embedded"]

DEFAULT_DATA_DIR = Path(os.environ.get("PGDURABLE_DATA_DIR", ".pgdurable/pgdata"))


class EmbeddedUnavailable(PgDurableError):
    """pgserver is not installed (``pip install 'pgdurable[embedded]'``) or failed to start."""


def start_embedded(data_dir: str | Path | None = None, *, cleanup: str | None = "stop") -> tuple[Any, str]:
    """Start (or attach to) an embedded server; return ``(server, dsn)``.

    ``cleanup`` is pgserver's mode: ``"stop"`` stops it when the last handle
    closes, ``"delete"`` also removes the data directory, ``None`` keeps it up.
    """
    try:
        from pgserver.postgres_server import get_server
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise EmbeddedUnavailable(
            "no DSN given and pgserver is not installed: pip install 'pgdurable[embedded]' "
            "or pass --dsn / set PGDURABLE_DSN"
        ) from exc
    path = Path(data_dir or DEFAULT_DATA_DIR).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        server = get_server(path, cleanup_mode=cleanup)
    except Exception as exc:  # pgserver raises plain exceptions
        raise EmbeddedUnavailable(f"embedded PostgreSQL failed to start: {exc}") from exc
    return server, str(server.get_uri())
