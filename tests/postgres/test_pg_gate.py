"""The gate of the PostgreSQL tests: with no server they skip, and with
BLOK_REQUIRE_POSTGRES=1 (CI) they fail, so CI cannot go green without running them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
A_TEST = "tests/postgres/test_pg_schema.py::test_migrations_apply_from_empty"


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_without_server(require: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "BLOK_REQUIRE_POSTGRES"}
    env["BLOK_TEST_POSTGRES"] = f"postgresql://postgres@127.0.0.1:{unused_port()}/test"
    if require:
        env["BLOK_REQUIRE_POSTGRES"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", A_TEST],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_a_server_the_tests_skip_with_the_reason() -> None:
    result = run_without_server(require=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert "no PostgreSQL server at postgresql://postgres@127.0.0.1:" in result.stdout


def test_when_required_a_missing_server_fails_the_run() -> None:
    result = run_without_server(require=True)
    assert result.returncode != 0
    assert "BLOK_REQUIRE_POSTGRES=1 but no PostgreSQL server at" in result.stdout
    assert "skipped" not in result.stdout
