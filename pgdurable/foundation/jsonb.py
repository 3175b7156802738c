"""JSON values crossing into JSONB: validated in Python before any SQL runs.

PostgreSQL ``jsonb`` cannot hold NaN/Infinity or ``\\u0000`` in strings, a
lone surrogate (``"\\ud800"``, common in truncated LLM output) cannot even be
encoded as UTF-8 to send it, and Python's ``json`` silently turns tuples into
lists and int keys into strings.
pgdurable refuses all of that with a ``TypeError``/``ValueError`` that names the
path of the offending value (``state['messages'][3]['text']``), so bad input
changes nothing.

Size: a value whose JSON text is over :data:`DEFAULT_MAX_BYTES` (64 MiB) raises
:class:`~pgdurable.ValueTooLarge` (a ``ValueError``) naming the value, its size
and the limit: a run's state, result or error, a start's state, a signal's
payload. jsonb itself would take up to 255 MiB; a checkpoint that large is
rewritten at every step and read back at every claim.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import ValueTooLarge

__all__ = [
    "DEFAULT_MAX_BYTES", "dumps", "exc_message", "jsonb_str", "loads", "reject_lone_surrogates",
    "validate",
]

# one encoder for every dumps(): json.dumps() with options builds a new one per call
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)

#: The largest JSON text :func:`dumps` lets through by default, in bytes (64 MiB;
#: jsonb's own limit is 255 MiB). Read at each call.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 512  # nesting; Python's json cannot (de)serialise ~1,000 levels anyway


def _path(root: str, parts: list[str]) -> str:
    return root + "".join(parts)


def reject_lone_surrogates(text: str, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` if ``text`` holds a lone surrogate.

    A lone surrogate (U+D800..U+DFFF outside a pair) is not valid Unicode:
    ``text`` cannot be encoded as UTF-8, so the database never receives it.
    The value itself is not repeated in the message.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} contains a lone surrogate ({text[exc.start]!a} at index {exc.start}), "
            "which is not valid Unicode and cannot be stored"
        ) from None


def _plain(value: Any) -> bool:
    """True if ``value`` is certainly plain JSON (see :func:`validate`); False
    if it may not be. The fast path: level by level, exact types only, no path
    kept. A subclass, a value met twice (shared or circular), an odd string or
    too deep a nesting answers False and :func:`_validate` looks closely."""
    seen: set[int] = set()
    level = [value]
    depth = 0  # of the values in ``level``; a container is allowed below MAX_DEPTH
    while level:
        below: list[Any] = []
        for v in level:
            t = type(v)
            if t is str:
                if "\x00" in v or (not v.isascii() and _surrogate(v)):
                    return False
            elif t is dict:
                if depth >= MAX_DEPTH or id(v) in seen:
                    return False
                seen.add(id(v))
                for k in v:
                    if type(k) is not str or "\x00" in k or (not k.isascii() and _surrogate(k)):
                        return False
                below.extend(v.values())
            elif t is list:
                if depth >= MAX_DEPTH or id(v) in seen:
                    return False
                seen.add(id(v))
                below.extend(v)
            elif t is float:
                if not math.isfinite(v):
                    return False
            elif not (v is None or t is int or t is bool):
                return False
        level = below
        depth += 1
    return True


def _surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def validate(value: Any, what: str = "value") -> None:
    """Raise ``TypeError``/``ValueError`` naming the path if ``value`` is not plain JSON.

    Plain JSON: ``None``, ``bool``, ``int``, finite ``float``, ``str`` without
    NUL or lone surrogates, ``list``, and ``dict`` with ``str`` keys (without
    NUL or lone surrogates), nested at most
    :data:`MAX_DEPTH` levels; the same value may appear in several places.
    A value that passes the fast check (:func:`_plain`, the common case) is
    not walked again; any other is walked with its paths (:func:`_validate`).
    """
    if not _plain(value):
        _validate(value, what)


def _validate(value: Any, what: str) -> None:
    """:func:`validate`'s close look: the path of the first value that is not JSON."""
    # depth-first; a container's id is on ``path`` while its children are
    # checked (an exit marker pops it), so a value shared by two branches is
    # fine and only a container inside itself is circular
    stack: list[tuple[Any, list[str], bool]] = [(value, [], False)]
    path: set[int] = set()
    while stack:
        v, parts, leaving = stack.pop()
        if leaving:
            path.discard(id(v))
            continue
        if v is None or isinstance(v, bool | int):
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError(f"{_path(what, parts)} is {v!r}: JSON has no NaN or Infinity")
            continue
        if isinstance(v, str):
            if "\x00" in v:
                raise ValueError(
                    f"{_path(what, parts)} contains a NUL character (\\x00), which "
                    "PostgreSQL jsonb cannot store"
                )
            reject_lone_surrogates(v, _path(what, parts))
            continue
        if isinstance(v, list | dict):
            if len(parts) >= MAX_DEPTH:
                raise ValueError(f"{what} is nested too deeply (more than {MAX_DEPTH} levels)")
            if id(v) in path:
                raise ValueError(f"{_path(what, parts)} is a circular reference")
            path.add(id(v))
            stack.append((v, parts, True))
            if isinstance(v, list):
                stack.extend((item, [*parts, f"[{i}]"], False) for i, item in enumerate(v))
            else:
                for k, item in v.items():
                    if not isinstance(k, str):
                        raise TypeError(
                            f"{_path(what, parts)} has a key {k!r} of type "
                            f"{type(k).__name__}: JSON object keys must be str"
                        )
                    if "\x00" in k:
                        raise ValueError(f"{_path(what, parts)} has a key containing NUL (\\x00)")
                    reject_lone_surrogates(k, f"{_path(what, parts)} key {k!a}")
                    stack.append((item, [*parts, f"[{k!r}]"], False))
            continue
        raise TypeError(
            f"{_path(what, parts)} is a {type(v).__name__}, which is not JSON "
            "(use dict, list, str, int, float, bool or None)"
        )


class _Default:
    """The default of :func:`dumps`'s ``max_bytes``: :data:`DEFAULT_MAX_BYTES` as it is
    at the call."""


_DEFAULT = _Default()


def dumps(value: Any, what: str = "value", *,
          max_bytes: int | _Default | None = _DEFAULT) -> str:
    """Validate ``value`` and serialise it compactly.

    JSON text over ``max_bytes`` (default :data:`DEFAULT_MAX_BYTES`; None: no
    limit) raises :class:`~pgdurable.ValueTooLarge` naming ``what``, the size
    and the limit."""
    validate(value, what)
    try:
        text = _ENCODER.encode(value)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply to serialise as JSON") from None
    limit = DEFAULT_MAX_BYTES if isinstance(max_bytes, _Default) else max_bytes
    if limit is not None and len(text) > limit and (size := len(text.encode())) > limit:
        raise ValueTooLarge(f"{what} is {size} bytes of JSON; the limit is {limit} bytes"
                            + _mib(limit))
    return text


def _mib(n: int) -> str:
    """`` (64 MiB)`` for a whole number of MiB, else nothing."""
    mib, rest = divmod(n, 1024 * 1024)
    return f" ({mib} MiB)" if mib and not rest else ""


def loads(text: str | bytes | None) -> Any:
    """Parse JSON text from the database (``None`` stays ``None``)."""
    return None if text is None else json.loads(text)


def jsonb_str(text: str) -> str:
    """``text`` that jsonb can store: NUL and lone surrogates escaped."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def exc_message(exc: BaseException) -> str:
    """``str(exc)`` that jsonb can store (a broken ``__str__`` is named, not raised)."""
    try:
        return jsonb_str(str(exc))
    except Exception:  # a broken __str__ must not lose the error
        return f"<str() of {type(exc).__name__} failed>"
