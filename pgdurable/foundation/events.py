"""Event parameters: the checks every sender and waiter makes before any SQL.

What an event is, and what sending one does, is in :mod:`pgdurable.runs.events`
and docs/events.md. Here: the name, data and id of an event (:func:`event_params`),
a wait's ``match`` (:func:`check_match`) and the dotted paths into an event
(:func:`check_path`); bad input raises ``TypeError``/``ValueError`` and nothing
is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import jsonb as _json
from .run_queries import check_name

__all__ = ["DEFAULT_MAX_EVENT_DATA", "check_match", "check_path", "check_scalar", "event_params",
           "match_json"]

#: Largest event data accepted by default (bytes of compact JSON).
DEFAULT_MAX_EVENT_DATA = 1024 * 1024

_SCALARS = (str, int, float, bool)


def check_path(path: object, what: str) -> str:
    """A dotted path into an event, ``data.`` then non-empty names, else TypeError/ValueError."""
    check_name(path, what)
    assert isinstance(path, str)
    if not path.startswith("data.") or "" in path[5:].split("."):
        raise ValueError(f"{what} must be a dotted path starting with 'data.' "
                         f"(e.g. 'data.order_id'), not {path!r}")
    return path


def check_scalar(value: object, what: str) -> None:
    """A match or cancel_on value: a str, int, finite float or bool; else TypeError/ValueError."""
    if not isinstance(value, _SCALARS) or (isinstance(value, float) and value != value):
        raise TypeError(f"{what} must be a str, int, float or bool, not {type(value).__name__}")
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        raise ValueError(f"{what} must be finite")


def check_match(match: object) -> dict[str, Any]:
    """A wait's match: a non-empty dict of dotted path -> scalar; else TypeError/ValueError."""
    if not isinstance(match, Mapping) or not match:
        raise TypeError("match must be a non-empty dict of 'data.path' -> value")
    for path, value in match.items():
        check_path(path, "match path")
        check_scalar(value, f"match[{path!r}]")
    return dict(match)


def match_json(match: object) -> str:
    """:func:`check_match`, as JSON text."""
    return _json.dumps(check_match(match), "match")


def event_params(name: object, data: object, event_id: object,
                 max_bytes: int | None = DEFAULT_MAX_EVENT_DATA) -> tuple[str, str, str | None]:
    """``send_event``'s parameters (name, data JSON, id), checked before any SQL: a
    non-empty name, data a JSON object (None: ``{}``) of at most ``max_bytes``, an id
    None or a non-empty str."""
    check_name(name, "event name")
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise TypeError(f"event data must be a dict (a JSON object), not {type(data).__name__}")
    if event_id is not None:
        check_name(event_id, "event id")
    try:
        data_json = _json.dumps(data, "event data", max_bytes=max_bytes)
    except RecursionError:
        raise ValueError("event data is nested too deeply") from None
    assert isinstance(name, str)
    return name, data_json, event_id if isinstance(event_id, str) else None
