"""No row of a query is read by position outside ``pgdurable/foundation/queries/``.

Pure ``ast`` (nothing imported, no database). A *row* is what ``fetchone()``
returns, an element of what ``fetchall()`` / ``fetchmany()`` returns or of a
cursor iterated, and any name ``row``; *rows* are what ``fetchall()`` returns
and any name ``rows``. Names assigned from those (``row = await cur.fetchone()``,
``for r in rows``, comprehensions) are followed inside a function. A subscript
of a row by a number or a slice (``row[1]``, ``fetchone()[0]``,
``(cur.fetchone() or (False,))[0]``, ``rows[0][0]``, ``row[2:]``) and the
unpacking of a row into a tuple (``a, b = row``, ``for s, f in rows``) fail
the test, listed by file and line. Rows are decoded once, next to their SQL,
into typed records (``foundation/queries/core.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pgdurable"

#: Where rows are decoded (the only place allowed to read by position).
QUERIES = "foundation/queries/"

#: Modules not under the rule yet: none (every module of the package is, since issue 39).
NOT_YET: set[str] = set()

#: Calls whose result is one row / a list (or cursor) of rows.
ROW_CALLS = {"fetchone", "_fetchone"}
ROWS_CALLS = {"fetchall", "fetchmany", "_fetchall", "rows_tuples", "execute"}

ROW, ROWS = "row", "rows"


def _call_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Await):
        node = node.value
    if not isinstance(node, ast.Call):
        return None
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


class _Scope(ast.NodeVisitor):
    """Finds positional reads of rows in one module (names followed per function)."""

    def __init__(self) -> None:
        self.kinds: list[dict[str, str]] = [{}]
        self.found: list[tuple[int, str]] = []

    # -- what an expression is: a row, rows, or neither
    def kind(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Await):
            return self.kind(node.value)
        name = _call_name(node)
        if name in ROW_CALLS:
            return ROW
        if name in ROWS_CALLS:
            return ROWS
        if isinstance(node, ast.BoolOp):  # (cur.fetchone() or (False,))
            kinds = {self.kind(v) for v in node.values} - {None}
            return ROW if ROW in kinds else ROWS if ROWS in kinds else None
        if isinstance(node, ast.Name):
            if node.id in self.kinds[-1]:
                return self.kinds[-1][node.id]
            return {"row": ROW, "rows": ROWS}.get(node.id)
        if isinstance(node, ast.Subscript) and self.kind(node.value) == ROWS \
                and not isinstance(node.slice, ast.Slice):
            return ROW  # rows[0] is a row
        return None

    def bind(self, target: ast.expr, kind: str | None, line: int, what: str) -> None:
        if isinstance(target, ast.Name):
            if kind is None:
                self.kinds[-1].pop(target.id, None)
            else:
                self.kinds[-1][target.id] = kind
        elif isinstance(target, ast.Tuple | ast.List) and kind == ROW:
            self.found.append((line, f"{what} unpacks a row by position"))

    # -- scopes: names are followed inside one function
    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self.kinds.append(dict(self.kinds[-1]))
        args = node.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            self.kinds[-1].pop(a.arg, None)
            if a.arg in ("row", "rows"):
                self.kinds[-1][a.arg] = ROW if a.arg == "row" else ROWS
        self.generic_visit(node)
        self.kinds.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    # -- bindings
    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        kind = self.kind(node.value)
        for t in node.targets:
            self.bind(t, kind, node.lineno, "assignment")

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        if node.value is not None:
            self.bind(node.target, self.kind(node.value), node.lineno, "assignment")

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.generic_visit(node)
        self.bind(node.target, self.kind(node.value), node.lineno, "assignment")

    def _loop(self, target: ast.expr, it: ast.expr, line: int) -> None:
        self.bind(target, ROW if self.kind(it) == ROWS else None, line, "loop")

    def visit_For(self, node: ast.For) -> None:
        self.visit(node.iter)
        self._loop(node.target, node.iter, node.lineno)
        for child in [*node.body, *node.orelse]:
            self.visit(child)

    visit_AsyncFor = visit_For  # type: ignore[assignment]

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp
                       | ast.DictComp) -> None:
        self.kinds.append(dict(self.kinds[-1]))
        for gen in node.generators:
            self.visit(gen.iter)
            self._loop(gen.target, gen.iter, node.lineno)
            for cond in gen.ifs:
                self.visit(cond)
        for part in ("elt", "key", "value"):
            if hasattr(node, part):
                self.visit(getattr(node, part))
        self.kinds.pop()

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    # -- the reads
    def visit_Subscript(self, node: ast.Subscript) -> None:
        self.generic_visit(node)
        positional = isinstance(node.slice, ast.Slice) or (
            isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int))
        if positional and self.kind(node.value) == ROW:
            self.found.append((node.lineno, f"{ast.unparse(node)} reads a row by position"))


def positional_reads(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for every positional read of a row in ``source``."""
    scope = _Scope()
    scope.visit(ast.parse(source))
    return sorted(set(scope.found))


def _checked(rel: str) -> bool:
    if rel.startswith(QUERIES):
        return False
    return not any(rel == m or (m.endswith("/") and rel.startswith(m)) for m in NOT_YET)


def test_no_row_is_read_by_position() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if _checked(rel):
            problems += [f"pgdurable/{rel}:{line}: {what}"
                         for line, what in positional_reads(path.read_text())]
    assert not problems, (
        "rows read by position (decode them once into a typed record in "
        "pgdurable/foundation/queries/<noun>.py):\n" + "\n".join(problems))


def test_the_exclusions_name_existing_modules() -> None:
    for m in NOT_YET:
        assert (PACKAGE / m).exists(), f"{m} is excluded but does not exist: drop it"


def test_the_scan_finds_every_kind_of_positional_read() -> None:
    source = '''
async def f(app, conn, cur):
    a = (await app.fetchone(Q, ()))[0]
    b = conn.execute(Q).fetchone()[1]
    c = (cur.fetchone() or (False,))[0]
    row = await cur.fetchone()
    d = row[2:]
    rows = app._fetchall(Q, ())
    e = rows[0][0]
    got = await app.fetchall(Q, ())
    ids = [r[0] for r in got]
    for s, t in conn.execute(Q):
        pass
    x, y = row
    fine = rows[0]  # a row, not a column
    name = payload.split(".")[1]  # not a row
def g(row):
    return row[3]
'''
    lines = [line for line, _ in positional_reads(source)]
    assert lines == [3, 4, 5, 7, 9, 11, 12, 14, 18], positional_reads(source)


#: What makes a module-level name of foundation/queries/ a named statement.
_MAKERS = {"Query", "Listing", "scalar", "nullable", "column", "statement", "record", "started"}
_SQL_START = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "CREATE", "DROP", "SET", "RESET")


def _is_statement(value: ast.expr) -> bool:
    if isinstance(value, ast.Call):
        f = value.func
        return (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute)
                else "") in _MAKERS
    text = value
    while isinstance(text, ast.BinOp):  # "..." "..." spans, or "..." + "..."
        text = text.left
    return (isinstance(text, ast.Constant) and isinstance(text.value, str)
            and text.value.strip().upper().startswith(_SQL_START))


def uncommented_statements(source: str) -> list[tuple[int, str]]:
    """Module-level named statements without a ``# --`` contract comment above them (a
    run of statements may share one)."""
    lines = source.splitlines()
    missing = []
    prev_end, prev_ok = 0, False
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else (
            node.target if isinstance(node, ast.AnnAssign) else None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and value is not None and _is_statement(value):
            between = lines[prev_end:node.lineno - 1]
            ok = any(line.strip().startswith("# --") for line in between) or (
                prev_ok and not between)
            if not ok:
                missing.append((node.lineno, target.id))
            prev_ok = ok
        else:
            prev_ok = False
        prev_end = node.end_lineno or node.lineno
    return missing


def test_every_named_query_has_a_contract_comment() -> None:
    problems = []
    for path in sorted((PACKAGE / QUERIES).glob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        problems += [f"pgdurable/{rel}:{line}: {name}"
                     for line, name in uncommented_statements(path.read_text())]
    assert not problems, ("named statements without a one-line contract comment "
                          "(# -- what it does; what it answers):\n" + "\n".join(problems))


def test_the_comment_check_sees_a_missing_comment() -> None:
    source = '''
# -- the run's id
A = scalar("SELECT 1", int)
B = scalar("SELECT 2", int)

C = statement("SELECT 3")
D = "SELECT 4"
def f() -> None: ...
# -- explained
E = Listing("SELECT 5")
'''
    assert [name for _, name in uncommented_statements(source)] == ["C", "D"]
