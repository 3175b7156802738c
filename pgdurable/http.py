"""The public path of :mod:`pgdurable.ops.http` (see there)."""

from .ops.http import *  # noqa: F403
from .ops.http import __all__ as __all__
