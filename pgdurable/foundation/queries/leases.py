"""Leases (``sql/functions/leases.sql``): the five operations of the ``LeaseProvider``
contract and ``get_lease``, one SQL function call each (:mod:`pgdurable.foundation.leases`).

Server-side placeholders (``$n``): executed with a raw cursor, prepared, binary. Keys and
owners travel as UTF-8 bytes (``bytea``), so any string is one, exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .core import Query, Row, nullable, scalar, statement

__all__ = ["ACQUIRE", "GET_LEASE", "GET_OWNER", "RELEASE", "RENEW", "TRANSFER", "LeaseGrant",
           "decode_name"]


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """The answer of ``acquire_lease``.

    ``acquired`` says whether the caller holds the lease now. ``owner`` is the
    holder: the caller when acquired, else the live holder to route work to.
    ``token`` is the holder's fencing token and ``expires_at`` its expiry on
    the database clock (both ``None`` from the no-op provider).
    """

    acquired: bool
    owner: str | None
    token: int | None = None
    expires_at: datetime | None = None


def decode_name(value: bytes | None) -> str | None:
    """Bytes stored by :func:`~pgdurable.foundation.lease_core.encode_name` back to the
    exact string."""
    return None if value is None else bytes(value).decode("utf-8")


def _grant(r: Row) -> LeaseGrant:
    acquired, owner, token, expires_at = r
    return LeaseGrant(bool(acquired), decode_name(owner), token, expires_at)


def _held(r: Row) -> LeaseGrant:
    owner, token, expires_at = r
    return LeaseGrant(True, decode_name(owner), token, expires_at)


# -- acquire: grant or the live holder -> one LeaseGrant (acquired, owner, token, expires_at)
ACQUIRE = Query("SELECT * FROM pgdurable.acquire_lease($1, $2, $3)", _grant)
# -- owner: the live holder or NULL
GET_OWNER = nullable("SELECT pgdurable.get_lease_owner($1)", decode_name)
# -- the live grant (owner, token, expires_at) as a LeaseGrant, no row when free
GET_LEASE = Query("SELECT * FROM pgdurable.get_lease($1)", _held)
# -- release if held (by token when given)
RELEASE = statement("SELECT pgdurable.release_lease($1, $2, $3)")
# -- renew if held (by token when given) -> renewed?
RENEW = scalar("SELECT pgdurable.renew_lease($1, $2, $3, $4)", bool)
# -- transfer if held (by token when given) -> new token or NULL
TRANSFER = nullable("SELECT pgdurable.transfer_lease($1, $2, $3, $4, $5)", int)
