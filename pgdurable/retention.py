"""The public path of :mod:`pgdurable.ops.retention` (see there)."""

from .ops.retention import *  # noqa: F403
from .ops.retention import __all__ as __all__
