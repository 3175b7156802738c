"""The built wheel ships the SQL and migrates an empty database from a fresh virtualenv."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import psycopg
import pytest

from pgdurable.foundation import migrations

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (whl,) = out.glob("pgdurable-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_contains_every_migration_and_py_typed(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for m in migrations.load_migrations():
        assert f"pgdurable/sql/{m.name}" in names
    for d in migrations.load_definitions():
        assert f"pgdurable/sql/{d.path}" in names
    assert "pgdurable/py.typed" in names

    # the dashboard's templates and assets ship in the package (no build step, no CDN)
    root = Path(__file__).resolve().parent.parent / "pgdurable" / "ops" / "dashboard"
    for sub in ("templates", "static"):
        for f in (root / sub).iterdir():
            assert f"pgdurable/ops/dashboard/{sub}/{f.name}" in names


@pytest.mark.slow
def test_wheel_migrates_an_empty_database_from_a_fresh_venv(
    wheel: Path, empty_dsn: str, tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=600,
                   capture_output=True)
    # Run from a directory without the source tree so that only the wheel is importable.
    r = subprocess.run([str(env_dir / "bin" / "pgdurable"), "migrate", "--dsn", empty_dsn],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with psycopg.connect(empty_dsn) as c:
        versions = [v for (v,) in c.execute("SELECT version FROM pgdurable.schema_migrations")]
    assert versions == [m.version for m in migrations.load_migrations()]
    with psycopg.connect(empty_dsn) as c:
        paths = [p for (p,) in c.execute("SELECT path FROM pgdurable.schema_definitions ORDER BY 1")]
    assert paths == sorted(d.path for d in migrations.load_definitions())
    where = subprocess.run([str(py), "-c", "import pgdurable, sys; print(pgdurable.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert str(env_dir) in where
