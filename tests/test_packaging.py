"""Both packages are publishable, and what they install works outside the checkout.

* ``python -m build`` makes an sdist and, from it, a wheel; ``twine check``
  accepts both; the wheel ships the SQL, the dashboard's files and py.typed.
* The wheel, with its ``embedded`` extra, installs into a fresh virtualenv and,
  run from a directory without the source tree, migrates an empty database and
  runs ``pgdurable demo`` (on its own embedded server), whose closing hint is a
  command that works after the demo ended.
* The README's install line lists the real dependencies.
* ``npm pack`` of clients/mastra makes a tarball that installs into an empty
  Node project, where its example runs (skipped, with the reason, without npm);
  so does clients/client's (@pgdurable/client), which a user's file imports by its
  name and whose shipped types a TypeScript user's file compiles against (its
  transport is the AI SDK's ``ChatTransport``).

Slow (a build, a virtualenv, an npm install): marked ``slow``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgdurable.foundation import migrations

ROOT = Path(__file__).resolve().parent.parent
MASTRA = ROOT / "clients" / "mastra"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build``: the sdist, and the wheel built from it."""
    out = tmp_path_factory.mktemp("dist")
    p = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (whl,) = dist.glob("pgdurable-*.whl")
    return whl


@pytest.fixture(scope="module")
def fresh_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv with the wheel and its ``embedded`` extra, nothing else."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(env_dir)
    p = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                        f"{wheel}[embedded]"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return env_dir


def test_wheel_contains_every_migration_and_py_typed(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for m in migrations.load_migrations():
        assert f"pgdurable/sql/{m.name}" in names
    for d in migrations.load_definitions():
        assert f"pgdurable/sql/{d.path}" in names
    assert "pgdurable/py.typed" in names

    # the dashboard's templates and assets ship in the package (no build step, no CDN)
    root = ROOT / "pgdurable" / "ops" / "dashboard"
    for sub in ("templates", "static"):
        for f in (root / sub).iterdir():
            assert f"pgdurable/ops/dashboard/{sub}/{f.name}" in names


def test_sdist_and_wheel_pass_twine_check(dist: Path) -> None:
    if shutil.which("twine") is None and not _has_module("twine"):
        pytest.skip("twine is not installed (pip install twine, or make install)")
    files = sorted(str(f) for f in dist.iterdir())
    assert any(f.endswith(".tar.gz") for f in files) and any(f.endswith(".whl") for f in files)
    p = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *files],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("PASSED") == len(files), p.stdout


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_wheel_migrates_an_empty_database_from_a_fresh_venv(
    fresh_venv: Path, empty_dsn: str, tmp_path: Path
) -> None:
    py = fresh_venv / "bin" / "python"
    # Run from a directory without the source tree, and without a PYTHONPATH that names
    # one, so that only the wheel is importable.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(fresh_venv / "bin" / "pgdurable"), "migrate", "--dsn", empty_dsn],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    with psycopg.connect(empty_dsn) as c:
        versions = [v for (v,) in c.execute("SELECT version FROM pgdurable.schema_migrations")]
    assert versions == [m.version for m in migrations.load_migrations()]
    with psycopg.connect(empty_dsn) as c:
        paths = [p for (p,) in c.execute("SELECT path FROM pgdurable.schema_definitions ORDER BY 1")]
    assert paths == sorted(d.path for d in migrations.load_definitions())
    where = subprocess.run([str(py), "-c", "import pgdurable, sys; print(pgdurable.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True,
                           env=env).stdout
    assert str(fresh_venv) in where


@pytest.mark.crash
def test_the_wheel_runs_the_demo_on_its_embedded_server(fresh_venv: Path, tmp_path: Path
                                                        ) -> None:
    """What a user who installed the wheel gets from ``pgdurable demo``: every check
    passes (exit 0), and the closing hint, run as printed, shows the finished run."""
    cli = str(fresh_venv / "bin" / "pgdurable")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PGDURABLE_DSN", "DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{fresh_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    p = subprocess.run([cli, "demo", "--data-dir", str(tmp_path / "pgdata")], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    assert "demo passed" in p.stdout and "starting an embedded PostgreSQL" in p.stdout
    hint = next(line for line in p.stdout.splitlines() if line.startswith("inspect it: "))
    command = hint.removeprefix("inspect it: ").split()
    assert command[:2] == ["pgdurable", "embedded"], hint
    shown = subprocess.run([cli, *command[1:]], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "demo.research_agent" in shown.stdout and "completed" in shown.stdout
    assert "recovered from  LeaseExpired" in shown.stdout  # worker-1 was killed mid-step


def test_the_readme_names_the_real_dependencies() -> None:
    """The README's install line lists what pip installs (pyproject's dependencies)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[\[<>=!~ ;]", d, maxsplit=1)[0].lower() for d in deps}
    readme = (ROOT / "README.md").read_text()
    line = next(x for x in readme.splitlines() if "pip install" in x and "dist/pgdurable-" in x)
    listed = {n.strip().lower().replace("psycopg 3", "psycopg")
              for n in line.split("#", 1)[1].split(",")}
    assert listed == names, (listed, names)


# -- the Mastra package -----------------------------------------------------------------

def _url(dsn: str) -> str:
    """``dsn`` as a postgresql:// URL (node-postgres reads URLs, not key=value pairs)."""
    from urllib.parse import quote

    d = conninfo_to_dict(dsn)
    auth = quote(str(d.get("user", "postgres"))) + (
        f":{quote(str(d['password']))}" if d.get("password") else "")
    # a unix socket's directory (the embedded server) goes percent-encoded in the host part,
    # which node-postgres decodes back to the path
    host = quote(str(d.get("host", "127.0.0.1")), safe="")
    return (f"postgresql://{auth}@{host}:{d.get('port', 5432)}/"
            f"{quote(str(d.get('dbname', 'postgres')))}")


def _packed_into_a_new_project(package: Path, tarball_glob: str, peer: str, tmp_path: Path,
                                 ignore: tuple[str, ...] = ()) -> Path:
    """Build and ``npm pack`` ``package`` from a copy (the checkout's dist/ is left to its
    own build), then install the tarball and ``peer`` (at the version the package is
    tested with: its lock) into an empty Node project, returned. Skips, with
    the reason, without npm or without the package's node_modules."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed (Node.js 20+)")
    if not (package / "node_modules").is_dir():
        pytest.skip(f"{package.relative_to(ROOT)} has no node_modules: run npm ci there "
                    "first (.ci/run does)")
    source = tmp_path / package.name
    shutil.copytree(package, source, symlinks=True,
                    ignore=shutil.ignore_patterns("node_modules", "dist", "*.tgz", *ignore))
    (source / "node_modules").symlink_to(package / "node_modules")
    build = subprocess.run([npm, "run", "build"], cwd=source, capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    packed = subprocess.run([npm, "pack", "--pack-destination", str(tmp_path)], cwd=source,
                            capture_output=True, text=True, timeout=300)
    assert packed.returncode == 0, packed.stderr[-2000:]
    (tarball,) = tmp_path.glob(tarball_glob)
    project = tmp_path / "app"
    project.mkdir()
    (project / "package.json").write_text('{"name": "app", "private": true, "type": "module"}')
    installed = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefer-offline", str(tarball), peer],
        cwd=project, capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return project


def test_npm_pack_installs_into_an_empty_project_and_its_example_runs(
        dsn: str, tmp_path: Path) -> None:
    project = _packed_into_a_new_project(MASTRA, "pgdurable-mastra-*.tgz",
                                         "@mastra/core@1.71.0", tmp_path)
    shipped = project / "node_modules" / "@pgdurable" / "mastra"
    assert (shipped / "dist" / "esm" / "index.js").exists()
    assert not (shipped / "src").exists() and not (shipped / "test").exists()
    example = shipped / "examples" / "thread-owner.mjs"
    assert example.exists(), "the example ships in the tarball"
    run = subprocess.run(["node", str(example)], cwd=project, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "DATABASE_URL": _url(dsn)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "runs started: 1 (expected 1)" in run.stdout, run.stdout
    # and as a user's own file, importing the package by its name
    mine = project / "owner.mjs"
    mine.write_text(example.read_text())
    run = subprocess.run(["node", str(mine)], cwd=project, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "DATABASE_URL": _url(dsn)})
    assert run.returncode == 0 and "runs started: 1 (expected 1)" in run.stdout, run.stderr


# -- the browser and Node client ---------------------------------------------------------

CLIENT = ROOT / "clients" / "client"
#: a user's file: the package by its name, a stream over a fetch of its own, UI chunks
_CLIENT_USE = """
import { PgDurableClient, PgDurableChatTransport, answerId } from "@pgdurable/client";
const sse = "id: 1\\nevent: text\\ndata: {\\"run_id\\":\\"r\\",\\"text\\":\\"hi\\"}\\n\\nevent: done\\ndata: {}\\n\\n";
const fetch = async () => new Response(sse, { headers: { "X-PgDurable-Message": "u1" } });
const client = new PgDurableClient({ api: "http://x/agent", fetch });
let text = "";
for await (const item of client.streamRun("r")) if (item.kind === "text") text += item.text;
const t = new PgDurableChatTransport({ api: "http://x/agent", threadId: "chat:1", fetch });
const chunks = [];
for await (const c of await t.reconnectToStream({ chatId: "c" })) chunks.push(c.type);
console.log(JSON.stringify({ text, chunks, id: answerId("u1") }));
"""
#: a user's TypeScript: the shipped types, and the transport is the AI SDK's ChatTransport
_CLIENT_TYPES = """
import { PgDurableChatTransport, type StreamItem } from "@pgdurable/client";
import type { ChatTransport, UIMessage } from "ai";
export const transport: ChatTransport<UIMessage> = new PgDurableChatTransport({ api: "/agent" });
export const item: StreamItem = { kind: "done" };
"""


def test_npm_pack_of_the_client_installs_into_an_empty_project_and_imports(
        tmp_path: Path) -> None:
    project = _packed_into_a_new_project(CLIENT, "pgdurable-client-*.tgz", "ai@7.0.173",
                                         tmp_path, ignore=("bundle.js",))
    shipped = project / "node_modules" / "@pgdurable" / "client"
    assert (shipped / "dist" / "index.js").exists() and (shipped / "dist" / "index.d.ts").exists()
    assert not (shipped / "src").exists() and not (shipped / "test").exists()
    (project / "use.mjs").write_text(_CLIENT_USE)
    run = subprocess.run(["node", "use.mjs"], cwd=project, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.strip() == (
        '{"text":"hi","chunks":["start","start-step","text-start","text-delta","text-end",'
        '"finish-step","finish"],"id":"answer-u1"}'), run.stdout
    # its types, as a TypeScript user sees them (the checkout's compiler)
    (project / "use.ts").write_text(_CLIENT_TYPES)
    tsc = subprocess.run(
        [str(CLIENT / "node_modules" / ".bin" / "tsc"), "--noEmit", "--strict",
         "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022",
         "--lib", "es2023,dom", "--skipLibCheck", "use.ts"],
        cwd=project, capture_output=True, text=True, timeout=300)
    assert tsc.returncode == 0, tsc.stdout[-3000:] + tsc.stderr[-3000:]
