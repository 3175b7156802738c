"""``python -m pgdurable.worker module:app``: the public path of
:mod:`pgdurable.ops.worker_process` (see there)."""

from .ops.worker_process import *  # noqa: F403
from .ops.worker_process import __all__ as __all__
from .ops.worker_process import main

if __name__ == "__main__":
    main()
