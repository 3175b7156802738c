"""Thread keys as stored: any non-empty ``str`` (NUL included) in a ``text`` column.

PostgreSQL ``text`` cannot hold NUL, so the ``thread_key`` columns store an
escaped form (:func:`encode_thread_key`), and :func:`decode_thread_key`
reverses it; they are the only conversion, used at every boundary (see
:mod:`pgdurable.runs.threads`).
"""

from __future__ import annotations

import re

__all__ = ["decode_thread_key", "encode_thread_key"]

_ESCAPE = re.compile(r"\\(.?)", re.DOTALL)  # a backslash and the char after it (if any)


def encode_thread_key(thread_key: object) -> str:
    """A thread key as stored in the ``thread_key`` columns: ``\\`` -> ``\\\\``, NUL -> ``\\0``.

    Any non-empty ``str`` is a key; ``TypeError`` for a non-str, ``ValueError``
    for ``""`` or a lone surrogate (not encodable as UTF-8). The result has no
    NUL, and a prefix of a key that does not end inside an escape encodes to
    a prefix of the key's encoding. :func:`decode_thread_key` reverses it.

    Thread keys have no length limit of their own (a 10 kB key works): the
    database indexes them compressed, and a key too large even so (several kB
    of incompressible text) is refused by the database as
    :class:`~pgdurable.InvalidInput`, with nothing written.
    """
    if not isinstance(thread_key, str):
        raise TypeError(f"thread_key must be a str, not {type(thread_key).__name__}")
    if not thread_key:
        raise ValueError("thread_key must be a non-empty string")
    try:
        thread_key.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("thread_key is not valid Unicode (it contains a lone surrogate)") from None
    return thread_key.replace("\\", "\\\\").replace("\x00", "\\0")


def _unescape(m: re.Match[str]) -> str:
    if m[1] == "\\":
        return "\\"
    if m[1] == "0":
        return "\x00"
    escape = "\\" + m[1]
    raise ValueError(f"not an escaped thread key: {escape!r} (the escapes are \\\\ and \\0)")


def decode_thread_key(stored: str) -> str:
    """The original key of a stored (escaped) thread key; ``ValueError`` if malformed."""
    return _ESCAPE.sub(_unescape, stored) if "\\" in stored else stored
