"""The import paths of the old architecture that users relied on still resolve, to the
same objects as their new homes (docs/architecture.md, "Moved in the house change").

``pgdurable.runs`` held the app before the house change (issue 39); it is now the runs
layer's package, and re-exports the app's names: those of the foundation at import, the
app's own (``Durable``, ``DurableClient``) through a module ``__getattr__`` on first use.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

#: old path -> (the module of its new home, the name there)
OLD_PATHS = {
    "pgdurable.runs.Durable": ("pgdurable.app.durable", "Durable"),
    "pgdurable.runs.DurableClient": ("pgdurable.app.client", "DurableClient"),
    "pgdurable.runs.RunInfo": ("pgdurable.app.durable", "RunInfo"),
    "pgdurable.runs.Task": ("pgdurable.foundation.registry", "Task"),
    "pgdurable.runs.TaskRegistry": ("pgdurable.foundation.registry", "TaskRegistry"),
    "pgdurable.runs.start_params": ("pgdurable.foundation.registry", "start_params"),
    "pgdurable.runs.RETRY": ("pgdurable.app.durable", "RETRY"),
}


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_an_old_path_is_the_same_object(old: str) -> None:
    module, name = old.rsplit(".", 1)
    home, home_name = OLD_PATHS[old]
    got = getattr(importlib.import_module(module), name)
    assert got is getattr(importlib.import_module(home), home_name)
    assert name in importlib.import_module(module).__all__


def test_the_public_names_are_the_old_paths_objects() -> None:
    import pgdurable
    import pgdurable.runs as runs

    for name in ("Durable", "DurableClient", "RunInfo", "Task"):
        assert getattr(runs, name) is getattr(pgdurable, name), name


def test_from_import_works_in_a_fresh_process() -> None:
    """``from pgdurable.runs import Durable, ...`` as a user's first line (nothing imported
    before it), and a name that never existed is still an AttributeError."""
    code = (
        "from pgdurable.runs import Durable, DurableClient, RunInfo, Task, TaskRegistry, "
        "start_params\n"
        "import pgdurable.runs, pgdurable.app.durable as d\n"
        "assert (Durable, DurableClient, RunInfo, Task, TaskRegistry, start_params) == "
        "(d.Durable, d.DurableClient, d.RunInfo, d.Task, d.TaskRegistry, d.start_params)\n"
        "try:\n"
        "    pgdurable.runs.NoSuchName\n"
        "except AttributeError as e:\n"
        "    print('refused:', e)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    assert "refused: module 'pgdurable.runs' has no attribute 'NoSuchName'" in p.stdout


def test_the_runs_submodules_still_import() -> None:
    """The module ``__getattr__`` answers only its own names: ``pgdurable.runs.stream``
    and the other capability modules are still found as submodules."""
    from pgdurable.runs import stream, threads

    assert stream.__name__ == "pgdurable.runs.stream"
    assert threads.__name__ == "pgdurable.runs.threads"
