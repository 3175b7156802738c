"""The package's import graph: no circle, and every import runs down the layers.

Pure ``ast`` (no database, nothing imported): every ``import`` of every module
counts -- at module level, inside functions and under ``TYPE_CHECKING``.
``from . import x`` counts as an import of the submodule ``x``. The layers are
the ones of docs/architecture.md; a new module must be placed in one (add it
to ``LAYERS`` here and to the module map there).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pgdurable"

#: The top-level modules besides ``__init__`` and ``__main__``: each only re-exports
#: a module of a layer under the documented path users import.
SHIMS = {"worker", "testing", "retention", "schedules", "partitions", "durable_runs",
         "dashboard", "webhooks", "http"}

#: Lowest first, one folder each. A module may import its own layer (without a
#: circle) and the layers below it, never one above. An entry ending in ".*" is a
#: package with everything under it; the top level (the package's ``__init__``,
#: ``__main__`` and the shims that keep documented paths working) imports anything.
LAYERS: list[tuple[str, set[str]]] = [
    ("foundation", {"foundation.*"}),
    ("runs", {"runs.*"}),
    ("engine", {"engine.*"}),
    ("models", {"models.*"}),
    ("app", {"app.*"}),
    ("operations", {"ops.*"}),
    ("contrib", {"contrib.*"}),
    ("public", {"", "__main__", *SHIMS}),
]

#: Imports inside a function that stay there, each for an optional dependency.
LATE_IMPORTS = {
    ("pgdurable.ops.cli", "pgdurable.ops.dashboard"),  # pgdurable[dashboard]: starlette, jinja2
    ("pgdurable.ops.demo", "pgdurable.ops.embedded"),  # pgdurable[embedded]: pgserver
    ("pgdurable.ops.testing", "pgdurable.ops.embedded"),  # pgdurable[embedded]: pgserver
}

APP_MODULE = "pgdurable.app.durable"  # Durable (it re-exports DurableClient)

#: The one import that runs up a layer: ``pgdurable.runs`` was the app's module before
#: the house change, and users import ``Durable`` and ``DurableClient`` from it. Its
#: ``__init__`` resolves them in a module ``__getattr__`` on first use (a late import):
#: importing the runs layer never imports the app. Nothing else may.
OLD_APP_PATH = ("pgdurable.runs", APP_MODULE)


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@functools.cache
def _modules() -> dict[str, Path]:
    return {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    mods = _modules()
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            parent = ".".join(base + ([node.module] if node.module else []))
        else:
            parent = node.module or ""
        names = [f"{parent}.{a.name}" if f"{parent}.{a.name}" in mods else parent
                 for a in node.names]
    found = []
    for name in names:
        while name and name not in mods:  # import a.b.c of a module a.b (an attribute c)
            name = name.rpartition(".")[0]
        if name.startswith("pgdurable") and name != module:
            found.append(name)
    return found


@functools.cache
def _graph() -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """module -> the modules it imports; and the (module, target) pairs imported in a function."""
    graph: dict[str, set[str]] = {m: set() for m in _modules()}
    late: set[tuple[str, str]] = set()
    for module, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        in_function: set[int] = set()
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                in_function.update(id(n) for n in ast.walk(fn))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(module, path, node):
                    graph[module].add(target)
                    if id(node) in in_function:
                        late.add((module, target))
    return graph, late


def _layer(module: str) -> int:
    short = module.removeprefix("pgdurable").removeprefix(".")
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            if short == member or (member.endswith(".*") and (
                    short == member[:-2] or short.startswith(member[:-1]))):
                return index
    raise AssertionError(
        f"{module} is in no layer: add it to LAYERS in tests/test_import_graph.py "
        "and to the module map of docs/architecture.md")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_every_kind_of_import() -> None:
    graph, late = _graph()
    assert "pgdurable.engine.worker" in graph["pgdurable.app.durable"]  # module level
    assert ("pgdurable.ops.cli", "pgdurable.ops.dashboard") in late  # inside a function
    assert "pgdurable.foundation.ports" in graph["pgdurable.runs.stream"]  # under TYPE_CHECKING
    assert "pgdurable.foundation.metrics" in graph["pgdurable.engine.claim"]  # from .. import x
    # from ..foundation import run_queries as q
    assert "pgdurable.foundation.run_queries" in graph["pgdurable.app.durable"]


def test_no_import_circle() -> None:
    graph, _ = _graph()
    cycles = _cycles(graph)
    described = [
        " <-> ".join(c) + ": " + "; ".join(
            f"{m} imports {', '.join(sorted(graph[m] & set(c)))}" for m in c)
        for c in cycles
    ]
    assert not cycles, "import circle(s):\n" + "\n".join(described)


def test_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_run_down_the_layers() -> None:
    graph, _ = _graph()
    upward = [
        f"{m} ({LAYERS[_layer(m)][0]}) imports {t} ({LAYERS[_layer(t)][0]})"
        for m in sorted(graph) for t in sorted(graph[m])
        if _layer(t) > _layer(m) and (m, t) != OLD_APP_PATH
    ]
    assert not upward, "imports that run up a layer:\n" + "\n".join(upward)


def test_engine_imports_no_model_or_app() -> None:
    graph, _ = _graph()
    engine = [m for m in graph if m.startswith("pgdurable.engine")]
    assert len(engine) >= 8
    above = {m for m in graph if _layer(m) > _layer("pgdurable.engine")}
    bad = {m: sorted(graph[m] & above) for m in engine if graph[m] & above}
    assert not bad, f"engine modules importing models/app/operations: {bad}"


def test_the_engine_imports_no_plug_in_service() -> None:
    """Periodic duties are services the app plugs into the worker (engine/services.py):
    no module of the engine imports the schedules, the event triggers or the fork
    registration, and the
    engine takes no app object (the ports' ``App``)."""
    graph, _ = _graph()
    engine = [m for m in graph if m.startswith("pgdurable.engine")]
    assert "pgdurable.engine.services" in engine
    services = {"pgdurable.runs.schedules", "pgdurable.runs.fork", "pgdurable.runs.events"}
    bad = {m: sorted(graph[m] & services) for m in engine if graph[m] & services}
    assert not bad, f"engine modules importing a service they should be handed: {bad}"
    # and the app plugs them in where it builds the worker
    assert services <= graph["pgdurable.app.durable"]


def test_the_engine_takes_no_app_object() -> None:
    """No engine module names the ports' ``App`` (the app object): the engine gets a
    narrow database object, the task registry and its settings."""
    found = []
    for path in sorted((PACKAGE / "engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and "ports" in node.module:
                found += [f"{path.name}: {a.name}" for a in node.names if a.name == "App"]
    assert not found, found


def test_only_the_top_imports_the_app() -> None:
    graph, _ = _graph()
    importers = sorted(m for m in graph if APP_MODULE in graph[m])
    below = [m for m in importers
             if _layer(m) < _layer(APP_MODULE) and (m, APP_MODULE) != OLD_APP_PATH]
    assert not below, f"{below} import {APP_MODULE} (Durable/DurableClient): take _ports.App"
    assert "pgdurable.ops.worker_process" in importers
    assert "pgdurable.engine.worker" not in importers


def test_late_imports_are_only_for_optional_dependencies() -> None:
    _, late = _graph()
    assert OLD_APP_PATH in late  # the old path's import stays inside __getattr__
    late = late - {OLD_APP_PATH}
    assert late == LATE_IMPORTS, (
        "an import of a pgdurable module inside a function (not for an optional "
        f"dependency): {sorted(late - LATE_IMPORTS)}; import it at module level")


def test_every_layer_is_a_folder_and_the_top_level_only_re_exports() -> None:
    """The layers are the folders: a module's folder says its layer, and the top level
    holds nothing but ``__init__``, ``__main__`` and the documented paths' shims."""
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == {"__init__", "__main__", *SHIMS}, top
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == {name.split(".")[0] for _, members in LAYERS for name in members
                       if name.endswith(".*")}
    for name in SHIMS:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
        body = [n for n in tree.body if not isinstance(n, ast.Expr)]  # the docstring
        assert all(isinstance(n, ast.ImportFrom | ast.If) for n in body), name
