"""The public path of :mod:`pgdurable.ops.webhooks` (see there)."""

from .ops.webhooks import *  # noqa: F403
from .ops.webhooks import __all__ as __all__
