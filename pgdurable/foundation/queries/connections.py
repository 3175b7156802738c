"""What every library connection runs once it is open (:mod:`pgdurable.foundation.pooler`)."""

from __future__ import annotations

__all__ = ["SESSION_SETUP"]

# -- after connect: a 60 s idle-in-transaction timeout unless one is set already
# -- (PITFALLS #15); its answer (the setting, or no row) is not read
SESSION_SETUP = (
    "SELECT pg_catalog.set_config('idle_in_transaction_session_timeout', '60000', false)"
    " WHERE pg_catalog.current_setting('idle_in_transaction_session_timeout') = '0'"
)
