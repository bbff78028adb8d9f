from __future__ import annotations

import logging
import os
import sys

import pytest


class _BeforeAnExit(logging.Handler):
    """An engine in the tests' own process that ends it (a stop whose run did not stop:
    `os._exit`) takes its captured output with it: xdist says only "node down: Not properly
    terminated". These lines go straight to the process's stderr, so CI's log says why."""

    def __init__(self, config: pytest.Config) -> None:
        super().__init__(logging.ERROR)
        self.capture = config.pluginmanager.getplugin("capturemanager")

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.CRITICAL or "this process must exit" in str(record.msg)

    def emit(self, record: logging.LogRecord) -> None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        test = os.environ.get("PYTEST_CURRENT_TEST", "?")
        with self.capture.global_and_fixture_disabled():  # pytest's capture dies with it
            print(f"[{worker}] {test}: {self.format(record)}", file=sys.stderr, flush=True)


def pytest_configure(config: pytest.Config) -> None:
    """Say why a test process ended (above), and refuse `--snapshot-update` in several
    processes: each xdist worker sees only the snapshots of the tests it ran, so syrupy (4.8)
    cannot tell which snapshots are unused and would keep or delete the wrong ones. Update in
    one process, without `-n`."""
    logging.getLogger("blok").addHandler(_BeforeAnExit(config))
    workers = config.getoption("numprocesses", default=None)
    if config.getoption("--snapshot-update", default=False) and workers not in (None, 0):
        raise pytest.UsageError(
            f"--snapshot-update with -n {workers}: update the snapshots in one process"
            " (python -m pytest tests/console --snapshot-update)"
        )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
