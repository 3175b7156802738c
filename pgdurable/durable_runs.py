"""The public path of :mod:`pgdurable.models.durable_runs` (see there)."""

from .models.durable_runs import *  # noqa: F403
from .models.durable_runs import __all__ as __all__
