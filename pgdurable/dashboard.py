"""The public path of :mod:`pgdurable.ops.dashboard` (see there)."""

from .ops.dashboard import *  # noqa: F403
from .ops.dashboard import __all__ as __all__
