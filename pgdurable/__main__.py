"""``python -m pgdurable``: the command line (:mod:`pgdurable.ops.cli`)."""

from .ops.cli import main

if __name__ == "__main__":
    main()
