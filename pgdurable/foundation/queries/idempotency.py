"""Idempotency keys (``sql/functions/idempotency.sql``): the statements of
:func:`~pgdurable.with_idempotency` (:mod:`pgdurable.foundation.effects`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .core import record, scalar, statement

__all__ = ["CLAIM", "FAIL", "FINISH", "RELEASE", "RENEW", "Claim"]


@dataclass(frozen=True, slots=True)
class Claim:
    """A key claimed, or as it stands: ``claimed`` (this owner may run ``fn`` now;
    ``unknown``: an earlier owner's outcome is unknown), else its ``status``
    (``succeeded`` with ``result``, ``failed`` with ``error``, ``running`` by ``owner``
    until ``expires_at``)."""

    claimed: bool
    status: str | None
    owner: str | None
    result: Any
    error: Any
    expires_at: datetime | None
    unknown: bool | None


# -- claim the key or read it as it stands: one Claim
CLAIM = record("SELECT * FROM pgdurable.idempotency_claim_v2(%s, %s, %s, %s)", Claim)
# -- extend the running claim; false when this owner lost it
RENEW = scalar("SELECT pgdurable.idempotency_renew(%s, %s, %s)", bool)
# -- store the result (owner only); false when this owner lost the claim
FINISH = scalar("SELECT pgdurable.idempotency_finish(%s, %s, %s::jsonb, %s)", bool)
# -- store the failure (owner only); false when this owner lost the claim
FAIL = scalar("SELECT pgdurable.idempotency_fail(%s, %s, %s, %s)", bool)
# -- give up the running claim without an outcome (owner only)
RELEASE = statement("SELECT pgdurable.idempotency_release(%s, %s)")
