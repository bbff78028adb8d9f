"""A PostgreSQL server of a test's own, for what must not be done to the shared one: restart it.

`initdb` into a scratch folder, `pg_ctl start` on a free port (trust auth, fsync off: only the
restart is under test), stopped and removed afterwards. Run as the `postgres` user when the
tests run as root (initdb refuses root). Where the server binaries are missing, the test skips
with the reason (it cannot fall back to the shared server).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest


def _bindir() -> Path | None:
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    candidates = [Path(out.stdout.strip())]
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for path in candidates:
        if (path / "initdb").exists() and (path / "pg_ctl").exists():
            return path
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PrivateServer:
    bindir: Path
    data: Path
    port: int
    as_user: list[str]

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, *args: str) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            [
                *self.as_user,
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.data),
                "-o",
                options,
                "-l",
                str(self.data / "server.log"),
                "-w",
                "-t",
                "30",
                *args,
            ],
            check=True,
            capture_output=True,
        )

    def restart(self) -> None:
        """A fast restart: every session is ended, the server comes back on the same port."""
        self.ctl("-m", "fast", "restart")

    def stop(self) -> None:
        self.ctl("-m", "fast", "stop")

    def start(self) -> None:
        self.ctl("start")


@contextmanager
def private_server() -> Iterator[PrivateServer]:
    bindir = _bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) to start a private server")
    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: initdb refuses root")
        as_user = ["runuser", "-u", "postgres", "--"]
    folder = Path(tempfile.mkdtemp(prefix="blok-pg-"))
    data = folder / "data"
    if as_user:
        shutil.chown(folder, "postgres")
    server = PrivateServer(bindir, data, _free_port(), as_user)
    subprocess.run(
        [*as_user, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
    )
    server.start()
    try:
        yield server
    finally:
        with suppress(subprocess.CalledProcessError):  # already stopped by the test
            server.ctl("-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)
