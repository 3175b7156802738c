"""The database clock (``sql/functions/clock.sql``): every time the library compares is
the database's, never the client's."""

from __future__ import annotations

from datetime import datetime

from .core import scalar

__all__ = ["NOW"]

# -- the database clock now (pgdurable.now(): a test may fake it with SET LOCAL)
NOW = scalar("SELECT pgdurable.now()", lambda value: _datetime(value))


def _datetime(value: object) -> datetime:
    assert isinstance(value, datetime)
    return value
