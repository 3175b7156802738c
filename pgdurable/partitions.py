"""The public path of :mod:`pgdurable.ops.partitions` (see there)."""

from .ops.partitions import *  # noqa: F403
from .ops.partitions import __all__ as __all__
