"""Connection plumbing shared by every module: DSN resolution and validation,
connections with library settings, and error translation at one choke point."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import conninfo as _conninfo

from . import pooler as _pooler
from .errors import InvalidInput, first_line, translate

__all__ = ["connect", "library_options", "resolve_dsn", "translated", "validate_dsn"]

def library_options(conninfo: str | None) -> str:
    """The caller's own ``options`` (from the DSN, else ``PGOPTIONS``), nothing of ours.

    Kept for code that still passes ``options=library_options(dsn)``: that is
    the same as passing nothing. Our session settings are no longer a startup
    parameter (PgBouncer refuses ``options``): library connections take
    :func:`pgdurable.pooler.connect_kwargs` and set up their session with
    :func:`pgdurable.pooler.configure` (see :mod:`pgdurable.pooler`).
    """
    try:
        params = _conninfo.conninfo_to_dict(conninfo or "")
    except psycopg.ProgrammingError:
        params = {}
    return str(params.get("options") or os.environ.get("PGOPTIONS") or "").strip()


_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def resolve_dsn(dsn: str | None = None) -> str | None:
    """The DSN to use: explicit, else ``PGDURABLE_DSN``, else ``DATABASE_URL``."""
    for candidate in (dsn, os.environ.get("PGDURABLE_DSN"), os.environ.get("DATABASE_URL")):
        if candidate:
            return candidate
    return None


def validate_dsn(dsn: str) -> str:
    """Check that ``dsn`` is a PostgreSQL conninfo or URL; return it unchanged.

    Raises :class:`InvalidInput` for a URL of another database (``mysql://``),
    an empty string or a conninfo that does not parse.
    """
    if not isinstance(dsn, str):
        raise TypeError(f"DSN must be a str, not {type(dsn).__name__}")
    if not dsn.strip():
        raise InvalidInput("DSN is empty")
    if "\x00" in dsn:
        raise InvalidInput("DSN contains a NUL character")
    m = _URL_SCHEME.match(dsn)
    if m and m.group(1).lower() not in ("postgres", "postgresql"):
        raise InvalidInput(
            f"DSN is not a PostgreSQL URL (scheme {m.group(1)!r}; expected postgresql://)"
        )
    try:
        _conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise InvalidInput(f"DSN does not parse: {first_line(str(exc))}") from None
    return dsn


def connect(dsn: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.Connection[Any]:
    """Open a sync connection with library settings; failures are typed errors."""
    return _pooler.connect(validate_dsn(dsn), autocommit=autocommit, **kwargs)


@contextmanager
def translated() -> Iterator[None]:
    """Re-raise psycopg errors as pgdurable errors (the one translation point)."""
    try:
        yield
    except psycopg.Error as exc:
        err = translate(exc)
        if err is exc:
            raise
        raise err from exc
