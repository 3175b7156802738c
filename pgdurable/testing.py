"""The public path of :mod:`pgdurable.ops.testing` (see there)."""

from .ops.testing import *  # noqa: F403
from .ops.testing import __all__ as __all__
