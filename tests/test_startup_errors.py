"""What starting says when the database is not there or not migrated: at once
(within the connect timeout, never the pool's 30 s), naming what did not answer
(host and port, the password masked), and from the command line in one line
with exit 2 (docs/cli.md). The messages themselves prove that nothing waited
for the pool: "pool initialization incomplete" is what a pool says when its
open timeout has run out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pgdurable import DatabaseUnavailable, Durable, DurableClient, SchemaVersionMismatch

ROOT = Path(__file__).resolve().parent.parent
NOWHERE = "postgresql://app:hunter2@127.0.0.1:1/app"  # nothing listens on port 1


async def test_durable_says_at_once_what_did_not_answer() -> None:
    app = Durable(NOWHERE)
    app.open_timeout = 3600.0  # a pool that waited would wait an hour
    with pytest.raises(DatabaseUnavailable) as info:
        await app.open()
    message = str(info.value)
    assert message.startswith("nothing answers at 127.0.0.1:1 (connection refused)"), message
    assert "password=***" in message and "hunter2" not in message
    assert "pool initialization" not in message
    await app.close()


def test_the_sync_client_says_it_too() -> None:
    client = DurableClient(NOWHERE)
    client.open_timeout = 3600.0
    with pytest.raises(DatabaseUnavailable, match=r"^nothing answers at 127\.0\.0\.1:1 "):
        client.start("t", {}, revision="1")
    client.close()


def test_an_unknown_host_is_named() -> None:
    client = DurableClient("postgresql://app@no-such-host.invalid:6543/app")
    with pytest.raises(DatabaseUnavailable, match=r"^nothing answers at no-such-host\.invalid:6543"):
        client.open()
    client.close()


async def test_an_unmigrated_database_says_migrate(empty_dsn: str) -> None:
    with pytest.raises(SchemaVersionMismatch, match="run `pgdurable migrate`"):
        async with Durable(empty_dsn):
            pass


def _one_line(p: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    for needle in needles:
        assert needle in p.stderr, (needle, p.stderr)
    assert "hunter2" not in p.stderr and "pool initialization" not in p.stderr


@pytest.mark.parametrize("command", [["-m", "pgdurable", "worker"], ["-m", "pgdurable.worker"]])
def test_a_worker_that_cannot_start_says_why_in_one_line(empty_dsn: str,
                                                         command: list[str]) -> None:
    code = 2 if command[1] == "pgdurable" else 1  # the CLI's bad-input code; SystemExit's
    for dsn, needle in ((NOWHERE, "nothing answers at 127.0.0.1:1 (connection refused)"),
                        (empty_dsn, "has no pgdurable schema; run `pgdurable migrate`")):
        p = subprocess.run([sys.executable, *command, "tests._ops_procs:app"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env={"PATH": "/usr/bin:/bin", "PGDURABLE_DSN": dsn})
        _one_line(p, code, "the worker cannot start: ", needle)
