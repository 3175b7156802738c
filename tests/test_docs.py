"""The docs cannot drift from the code: every code block in README.md, SECURITY.md and
docs/**/*.md is checked against the real thing, every relative link resolves, and the
site builds with ``mkdocs build --strict``.

What is checked, per kind of block, and why that much:

* ``python``: every block compiles (``ast.parse``; top-level ``await`` is allowed, since
  many blocks are fragments of an ``async def``). Every ``pgdurable`` name it imports or
  uses (``from pgdurable.x import Y``, ``pgdurable.X.Y``) must exist. Methods and
  attributes used on the names the docs use by convention for pgdurable's objects
  (``app`` a ``Durable``, ``client`` a ``DurableClient``, ``worker`` a ``Worker``,
  ``ctx`` one of the step contexts) must exist on that class, unless the block binds the
  name to something else. Fragments are not run: they use names defined elsewhere.
* A python block that is a complete program (a top-level ``asyncio.run(...)`` or an
  ``if __name__ == "__main__":``) is run, each in its own fresh migrated database given
  as ``PGDURABLE_DSN``, and must exit 0. A block that embeds a file with
  ``--8<-- "examples/x.py"`` (pymdownx.snippets) is that file, which
  tests/test_examples.py runs; the embed only has to name an existing file. The README,
  which GitHub shows without snippets, may copy an example in a block titled
  ``title="examples/x.py"``: the copy must equal the file.
* ``sh``/``bash``/``console`` blocks: every ``pgdurable ...`` command line is checked
  against the CLI's own click command tree (the subcommand exists, and so does every
  ``--flag``); ``python -m pgdurable.worker`` lines against that module's ``--help``;
  ``pip install 'pgdurable[extra]'`` against the package's declared extras. Nothing is
  executed: the commands need servers, roles and other processes.
* ``sql`` blocks: every ``pgdurable.<name>`` must be a relation or function of a migrated
  database; then every ``SELECT``/``WITH`` statement without a placeholder (``'…'``,
  ``'...'``, ``'RUN_ID'``, ``<each>``) is executed in order, per block, in a transaction
  that is rolled back, so column names, argument lists and types are checked by
  PostgreSQL itself. Other statements (``GRANT`` on roles the reader creates) are only
  name-checked.
* Other languages (``text``, ``ini``, ``ts``, ...) are not checked here; the TypeScript
  client has its own tests.
* Inline code in the prose: a whole ``pgdurable ...`` command is checked like a shell
  line; a call ``pgdurable.f(...)`` must be a SQL function or relation or a Python name;
  ``app.x``/``ctx.x``/``client.x`` must exist as in code blocks. Other
  dotted ``pgdurable.*`` spans are OpenTelemetry attributes, wait kinds and the like.
* Every relative link resolves (to a file, and an ``#anchor`` to a heading of a Markdown
  file); every page is in mkdocs.yml's nav and on the README's map.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.metadata
import inspect
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import typer.main

import pgdurable

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", ROOT / "SECURITY.md", *DOCS.rglob("*.md")])
SNIPPET = re.compile(r'^\s*-{1,}8<-{1,}\s+"([^"]+)"\s*$')
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)(?P<info>.*)$")
TITLE = re.compile(r'title="([^"]+)"')


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    info: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def snippets(self) -> list[str]:
        """The files this block embeds, if it is nothing but snippet lines."""
        lines = [ln for ln in self.text.splitlines() if ln.strip()]
        found = [m[1] for ln in lines if (m := SNIPPET.match(ln))]
        return found if found and len(found) == len(lines) else []


def blocks(path: Path) -> Iterator[Block]:
    """The fenced code blocks of a Markdown file (fences may be indented, in lists)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (
            lines[j].strip().startswith(fence) and set(lines[j].strip()) == {fence[0]}
        ):
            line = lines[j]
            body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
            j += 1
        yield Block(path, i + 1, m["lang"].lower(), m["info"], "\n".join(body) + "\n")
        i = j + 1


def outside_blocks(path: Path) -> Iterator[tuple[int, str]]:
    """The numbered lines of a Markdown file that are not in a fenced block."""
    fenced: set[int] = set()
    for b in blocks(path):
        fenced.update(range(b.line, b.line + b.text.count("\n") + 2))
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if n not in fenced:
            yield n, line


ALL = [b for p in PAGES for b in blocks(p)]
PYTHON = [b for b in ALL if b.lang in ("python", "py")]
SHELL = [b for b in ALL if b.lang in ("sh", "bash", "console", "shell")]
SQL = [b for b in ALL if b.lang == "sql"]


def ids(bs: list[Block]) -> list[str]:
    return [b.where for b in bs]


def test_the_docs_have_blocks_of_every_checked_kind() -> None:
    assert len(PYTHON) > 30 and len(SHELL) > 10 and len(SQL) > 10
    assert {p.name for p in PAGES} >= {"README.md", "index.md", "getting-started.md"}


# ---------------------------------------------------------------------------- python


def is_program(tree: ast.Module) -> bool:
    """A top-level ``asyncio.run(...)`` or ``if __name__ == "__main__":``."""
    for node in tree.body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            return True
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "asyncio.run"):
            return True
    return False


def resolve(dotted: str) -> object:
    """``pgdurable.a.b`` as an object: attributes, or submodules imported on the way."""
    parts = dotted.split(".")
    obj: object = importlib.import_module(parts[0])
    for i, name in enumerate(parts[1:], 1):
        if hasattr(obj, name):
            obj = getattr(obj, name)
            continue
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ModuleNotFoundError as exc:
            raise AttributeError(f"{dotted}: no {name!r} in {'.'.join(parts[:i])}") from exc
    return obj


@functools.cache
def attributes(cls: type) -> frozenset[str]:
    """Names an instance of ``cls`` has: class attributes, dataclass fields, slots,
    annotations and every ``self.x = ...`` in the source of a class of its MRO."""
    names: set[str] = set(dir(cls))
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            continue
        names.update(getattr(klass, "__annotations__", {}))
        names.update(getattr(klass, "__dataclass_fields__", {}))
        try:
            src = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        names.update(re.findall(r"\bself\.(\w+)\s*(?::[^=\n]+)?=(?!=)", src))
    return frozenset(names)


def conventional_names() -> dict[str, tuple[type, ...]]:
    from pgdurable.models.durable_runs import DurableRunContext

    contexts: tuple[type, ...] = (pgdurable.RunContext, pgdurable.WorkflowContext,
                                  DurableRunContext, pgdurable.DurableContext)
    try:  # a durable MCP tool's body gets a TaskContext (pgdurable[mcp], docs/mcp.md)
        from pgdurable.contrib.mcp import TaskContext

        contexts += (TaskContext,)
    except ImportError:
        pass
    return {
        "app": (pgdurable.Durable,),
        "client": (pgdurable.DurableClient,),
        "worker": (pgdurable.Worker,),
        "ctx": contexts,
    }


def rebound(tree: ast.Module, name: str, classes: tuple[type, ...]) -> bool:
    """Does the block bind ``name`` to something that is not one of ``classes``?"""
    expected = {c.__name__ for c in classes}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                value = node.value
                called = ast.unparse(value.func).split(".")[-1] if isinstance(value, ast.Call) else ""
                if called not in expected and called != "worker":  # app.worker() -> Worker
                    return True
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                var = item.optional_vars
                if isinstance(var, ast.Name) and var.id == name:
                    return True
    return False


def pgdurable_names(tree: ast.Module) -> Iterator[str]:
    """Every dotted pgdurable name the block imports or uses."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "pgdurable":
                    yield a.name
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else "pgdurable"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pgdurable":
            for a in node.names:
                yield f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            dotted = ast.unparse(node)
            head = dotted.split(".")[0]
            if head in aliases and re.fullmatch(r"[\w.]+", dotted):
                yield aliases[head] + dotted[len(head):]


@pytest.mark.parametrize("block", PYTHON, ids=ids(PYTHON))
def test_python_block(block: Block) -> None:
    if block.snippets:
        for name in block.snippets:
            assert (ROOT / name).is_file(), f"{block.where}: embeds missing {name}"
        return
    title = TITLE.search(block.info)
    if title:  # a copy of an example (the README, which GitHub shows without snippets)
        copied = ROOT / title[1]
        assert copied.is_file(), f"{block.where}: no file {title[1]}"
        assert block.text == copied.read_text(encoding="utf-8"), (
            f"{block.where}: this copy of {title[1]} differs from the file; copy it again"
        )
    try:
        tree = ast.parse(block.text)
    except SyntaxError as exc:
        pytest.fail(f"{block.where}: does not compile: {exc}")
    for dotted in set(pgdurable_names(tree)):
        try:
            resolve(dotted)
        except (AttributeError, ImportError) as exc:
            pytest.fail(f"{block.where}: {dotted} does not exist ({exc})")
    conventions = conventional_names()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in conventions):
            classes = conventions[node.value.id]
            if rebound(tree, node.value.id, classes):
                continue
            assert any(node.attr in attributes(c) for c in classes), (
                f"{block.where}: {node.value.id}.{node.attr}: no such attribute on "
                + " / ".join(c.__name__ for c in classes)
            )


def program(block: Block) -> bool:
    try:
        return not block.snippets and is_program(ast.parse(block.text))
    except SyntaxError:  # reported by test_python_block
        return False


PROGRAMS = [b for b in PYTHON if program(b)]


def test_complete_programs_run(pg_server: Any, template_db: str) -> None:
    """Each complete program in the docs runs to exit 0 on its own migrated database."""
    assert PROGRAMS, "the docs have complete programs"
    janitors = []
    procs = []
    try:
        for i, block in enumerate(PROGRAMS):
            name = f"pgd_docs_{os.getpid()}_{i}"
            janitor = pg_server.janitor(name, template_dbname=template_db)
            janitor.init()
            janitors.append(janitor)
            env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
            env["PGDURABLE_DSN"] = pg_server.dsn_for(name)
            procs.append(subprocess.Popen(
                [sys.executable, "-c", block.text], cwd=ROOT, env=env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            ))
        failed = []
        for block, proc in zip(PROGRAMS, procs, strict=True):
            out, err = proc.communicate(timeout=120)
            if proc.returncode != 0:
                failed.append(f"{block.where} exited {proc.returncode}:\n{out[-1500:]}{err[-3000:]}")
        assert not failed, "\n\n".join(failed)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for janitor in janitors:
            janitor.drop()


# ----------------------------------------------------------------------------- shell


@functools.cache
def cli_root() -> Any:
    """The click command tree behind the ``pgdurable`` console script (typer's own click:
    a group is a command with ``.commands``)."""
    (ep,) = importlib.metadata.entry_points(group="console_scripts", name="pgdurable")
    module = importlib.import_module(ep.value.split(":")[0])
    root = typer.main.get_command(module.app)
    assert hasattr(root, "commands")
    return root


@functools.cache
def worker_module_flags() -> frozenset[str]:
    p = subprocess.run([sys.executable, "-m", "pgdurable.worker", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, check=True)
    return frozenset(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", p.stdout))


def command_lines(text: str) -> Iterator[str]:
    """Logical command lines: backslash continuations joined, and an indented line that
    starts with ``[`` or ``-`` (an option listing) added to the command above it."""
    current = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.startswith("$ "):
            line = line[2:]
        if current.endswith("\\"):
            current = current[:-1] + " " + line.strip()
            continue
        if current and raw[:1].isspace() and line.strip()[:1] in ("[", "-"):
            current += " " + line.strip()
            continue
        if current:
            yield current
        current = line
    if current:
        yield current


def words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote in prose-like usage: split plainly
        return line.split("#")[0].split()


def commands(line: str) -> Iterator[list[str]]:
    """The simple commands of a shell line (split at ``&&``, ``||``, ``;``)."""
    current: list[str] = []
    for w in words(line):
        if w in ("&&", "||", ";"):
            if current:
                yield current
            current = []
        else:
            current.append(w)
    if current:
        yield current


def option_names(cmd: Any) -> set[str]:
    names = {"--help"}
    for p in cmd.params:
        names.update(getattr(p, "opts", []))
        names.update(getattr(p, "secondary_opts", []))
    return names


def check_pgdurable(argv: list[str], where: str) -> list[str]:
    """``argv`` after ``pgdurable``: its (sub)command exists and so does every flag.

    Usage notation is understood: ``[...]`` and ``(...)`` mark optional or grouped parts,
    ``…``/``...`` elide, and `` | `` separates alternatives: before an option it is an
    alternative option (``(--cron EXPR | --every 10m)``), before a sibling subcommand it
    is an alternative subcommand (``schedule pause NAME | resume NAME``). Any other
    `` | `` is a shell pipe, and what follows it is returned for checking as a command.
    """
    tokens = [s for s in (t.strip("[]()") for t in argv) if s and s not in ("…", "...")]
    root = cli_root()
    if not tokens or tokens[0].startswith("-"):
        return []
    sub = tokens[0]
    assert sub in root.commands, f"{where}: no command `pgdurable {sub}`"
    group, cmd, path = None, root.commands[sub], sub
    rest = tokens[1:]
    if hasattr(cmd, "commands"):
        if not rest:  # `pgdurable schedule ...`: elided
            return []
        assert rest[0] in cmd.commands, (
            f"{where}: `pgdurable {sub}` needs one of {sorted(cmd.commands)}, not {rest[0]!r}"
        )
        group, cmd, path = cmd, cmd.commands[rest[0]], f"{sub} {rest[0]}"
        rest = rest[1:]
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok == "|":
            nxt = rest[i + 1] if i + 1 < len(rest) else ""
            if group is not None and nxt in group.commands:
                cmd, path = group.commands[nxt], f"{sub} {nxt}"
                i += 2
                continue
            if not nxt.startswith("-"):
                return rest[i + 1:]  # a shell pipe
        elif tok.startswith("--") or re.fullmatch(r"-[a-zA-Z]", tok):
            flag = tok.split("=")[0]
            known = option_names(cmd)
            assert flag in known, (
                f"{where}: `pgdurable {path}` has no option {flag} (it has {sorted(known)})"
            )
        i += 1
    return []


def extras() -> set[str]:
    meta = importlib.metadata.metadata("pgdurable")
    return {e.replace("_", "-") for e in meta.get_all("Provides-Extra") or []}


def check_shell_line(line: str, where: str) -> int:
    """Check the pgdurable commands of one logical line; return how many were checked."""
    checked = 0
    for argv in commands(line):
        while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):  # VAR=value cmd
            argv = argv[1:]
        if not argv:
            continue
        prog = argv[0].rsplit("/", 1)[-1]
        if prog == "pgdurable":
            piped = check_pgdurable(argv[1:], where)
            checked += 1
            if piped:
                checked += check_shell_line(shlex.join(piped), where)
        elif prog.startswith("python") and argv[1:3] == ["-m", "pgdurable.worker"]:
            for t in argv[3:]:
                flag = t.strip("[]").split("=")[0]
                if flag.startswith("--"):
                    assert flag in worker_module_flags(), (
                        f"{where}: python -m pgdurable.worker has no option {flag}"
                    )
            checked += 1
        elif prog == "pip" and "install" in argv:
            for t in argv:
                m = re.fullmatch(r"pgdurable\[([\w,-]+)\]", t)
                if m:
                    missing = set(m[1].split(",")) - extras()
                    assert not missing, f"{where}: pgdurable has no extra {sorted(missing)}"
                    checked += 1
    return checked


@pytest.mark.parametrize("block", SHELL, ids=ids(SHELL))
def test_shell_block(block: Block) -> None:
    for line in command_lines(block.text):
        check_shell_line(line, block.where)


def test_shell_checks_catch_mistakes() -> None:
    """The checker itself: a wrong subcommand, flag or extra is caught."""
    assert check_shell_line("pgdurable runs --status failed --json", "t") == 1
    assert check_shell_line("PGOPTIONS='-c role=o' pgdurable migrate  # as the owner", "t") == 1
    assert check_shell_line("pgdurable schedule pause NAME | resume NAME | delete NAME", "t") == 1
    assert check_shell_line("pgdurable runs --json | pgdurable stats --json", "t") == 2
    for bad in ("pgdurable runz", "pgdurable runs --statuz failed",
                "pgdurable schedule list | add | pause NAME --nope",
                "pgdurable schedule add N (--cron E | --evry 1m)",
                "pgdurable runs --json | pgdurable stats --nope",
                "pip install 'pgdurable[nosuchextra]'",
                "python -m pgdurable.worker mod:app --no-such-flag"):
        with pytest.raises(AssertionError):
            check_shell_line(bad, "t")


def test_pgdurable_commands_in_prose() -> None:
    """Inline code in the prose that spells a whole `pgdurable ...` command is checked too."""
    span = re.compile(r"(?<!`)`(pgdurable [a-z][^`]*)`(?!`)")
    checked = 0
    for path in PAGES:
        for n, line in outside_blocks(path):
            for m in span.finditer(line):
                checked += check_shell_line(m[1], f"{path.relative_to(ROOT)}:{n}")
    assert checked > 20


# ------------------------------------------------------------------------------- sql

PLACEHOLDER = re.compile(r"'(?:…|\.\.\.|[A-Z][A-Z_]*)'|<[^>]*>|…")


def statements(sql: str) -> list[str]:
    """Split on ``;`` outside quotes; comments dropped."""
    out, current, quote = [], [], ""
    for line in sql.splitlines():
        i = 0
        while i < len(line):
            ch = line[i]
            if quote:
                current.append(ch)
                if ch == quote:
                    quote = ""
            elif ch in ("'", '"'):
                quote = ch
                current.append(ch)
            elif line.startswith("--", i):
                break
            elif ch == ";":
                out.append("".join(current).strip())
                current = []
            else:
                current.append(ch)
            i += 1
        current.append("\n")
    tail = "".join(current).strip()
    if tail:
        out.append(tail)
    return [s for s in out if s]


@pytest.fixture(scope="module")
def docs_db(pg_server: Any, template_db: str) -> Iterator[str]:
    """One fresh migrated database for this module's SQL checks."""
    name = f"pgd_docs_sql_{os.getpid()}"
    janitor = pg_server.janitor(name, template_dbname=template_db)
    janitor.init()
    try:
        yield pg_server.dsn_for(name)
    finally:
        janitor.drop()


@pytest.fixture(scope="module")
def catalog(docs_db: str) -> set[str]:
    """Relations and functions of schema pgdurable in a migrated database."""
    with psycopg.connect(docs_db) as c:
        rows = c.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'pgdurable'::regnamespace"
            " UNION SELECT proname FROM pg_proc WHERE pronamespace = 'pgdurable'::regnamespace"
        ).fetchall()
    return {r[0] for r in rows}


@pytest.mark.parametrize("block", SQL, ids=ids(SQL))
def test_sql_block(block: Block, catalog: set[str], docs_db: str) -> None:
    names = set(re.findall(r"\bpgdurable\.(\w+)", block.text))
    missing = names - catalog
    assert not missing, f"{block.where}: no pgdurable.{', pgdurable.'.join(sorted(missing))}"
    runnable = [s for s in statements(block.text)
                if re.match(r"(?is)\s*(select|with)\b", s) and not PLACEHOLDER.search(s)]
    with psycopg.connect(docs_db) as c:  # one transaction, rolled back: nothing is kept
        try:
            for s in runnable:
                try:
                    c.execute(s)
                except psycopg.Error as exc:
                    pytest.fail(f"{block.where}: {s!r} fails: {exc}")
        finally:
            c.rollback()


def test_api_names_in_prose(catalog: set[str]) -> None:
    """Inline code in the prose: a call ``pgdurable.name(...)`` names a SQL function or
    relation of the migrated schema or a Python callable, and ``app.x``, ``ctx.x`` and
    ``client.x`` exist on their classes (as in code blocks). Other dotted
    ``pgdurable.*`` spans are OpenTelemetry attribute names, wait kinds and the like."""
    conventions = conventional_names()
    span = re.compile(r"(?<!`)`([^`]+)`(?!`)")
    wrong, checked = [], 0
    for path in PAGES:
        for n, line in outside_blocks(path):
            where = f"{path.relative_to(ROOT)}:{n}"
            for m in span.finditer(line):
                for dotted in re.findall(r"(?<![\w.])(pgdurable(?:\.\w+)+)\(", m[1]):
                    checked += 1
                    if dotted.count(".") == 1 and dotted.split(".")[1] in catalog:
                        continue
                    try:
                        resolve(dotted)
                    except (AttributeError, ImportError):
                        wrong.append(f"{where}: {dotted}: neither SQL nor Python")
                if "/" in m[1] or ".py" in m[1]:  # a file, not an object
                    continue
                # (`worker.Worker` in prose is the module pgdurable.worker: not checked here)
                for name, attr in re.findall(r"(?<![\w.])(app|ctx|client)\.(\w+)", m[1]):
                    checked += 1
                    if not any(attr in attributes(c) for c in conventions[name]):
                        wrong.append(f"{where}: {name}.{attr}: no such attribute")
    assert checked > 100
    assert not wrong, "\n".join(wrong)


# ----------------------------------------------------------------------------- links

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """The lines of a Markdown file outside fenced blocks, inline code blanked."""
    for n, line in outside_blocks(path):
        yield n, re.sub(r"`[^`]*`", "``", line)


def slug(heading: str) -> str:
    """The anchor MkDocs (markdown's toc) gives a heading; GitHub's agrees for ours."""
    from markdown.extensions.toc import slugify

    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return str(slugify(text.replace("*", ""), "-"))


def anchors(path: Path) -> set[str]:
    return {slug(line.lstrip("#").strip()) for _, line in outside_blocks(path)
            if re.match(r"#{1,6} ", line)}


def test_relative_links_resolve() -> None:
    broken = []
    checked = 0
    for path in PAGES:
        for n, line in prose(path):
            for m in LINK.finditer(line):
                target = m["target"]
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, ...
                    continue
                file, _, anchor = target.partition("#")
                dest = (path.parent / file).resolve() if file else path
                checked += 1
                if not dest.exists():
                    broken.append(f"{path.relative_to(ROOT)}:{n}: {target} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{path.relative_to(ROOT)}:{n}: {target} (no such heading)")
    assert checked > 100
    assert not broken, "\n".join(broken)


# ------------------------------------------------------------------------ the site


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "search" / "search_index.js").is_file()  # offline search
    html = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "fonts.googleapis" not in html and "unpkg.com" not in html  # nothing from a CDN
    linked = set(re.findall(r'<td><a href="([\w/-]+)\.html"', html))  # the map's pages
    assert {p for p in linked if not p.startswith("repo/")} == {p[:-3] for p in nav_pages()} - {"index"}


def nav_pages() -> set[str]:
    from mkdocs.config import load_config

    config = load_config(str(ROOT / "mkdocs.yml"))

    def walk(items: Any) -> Iterator[str]:
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                yield from walk(value)
            else:
                yield value

    return set(walk(config["nav"]))


def test_the_readme_map_lists_every_page_and_the_site_index_shows_it() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("| capability | page | example |"):].split("\n\n")[0]
    mapped = set(re.findall(r"\]\(docs/([^)#]+\.md)\)", table))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert nav_pages() == pages, "every page under docs/ is in mkdocs.yml's nav, and only those"
    assert mapped == pages - {"index.md"}, "every page is on the README's map"
    # the site's index shows the README's map (docs/hooks/repo_files.py puts it in)
    assert "<!-- map: README.md -->" in (DOCS / "index.md").read_text(encoding="utf-8")


def test_the_two_commands_are_on_the_front_door() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make demo" in readme and "make test" in readme
    assert "embedded" in readme and len(readme.splitlines()) < 300

