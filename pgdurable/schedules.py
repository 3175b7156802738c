"""The public path of :mod:`pgdurable.runs.schedules` (see there)."""

from .runs.schedules import *  # noqa: F403
from .runs.schedules import __all__ as __all__
