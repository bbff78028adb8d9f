from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Refuse `--snapshot-update` in several processes: each xdist worker sees only the
    snapshots of the tests it ran, so syrupy (4.8) cannot tell which snapshots are unused and
    would keep or delete the wrong ones. Update in one process, without `-n`."""
    workers = config.getoption("numprocesses", default=None)
    if config.getoption("--snapshot-update", default=False) and workers not in (None, 0):
        raise pytest.UsageError(
            f"--snapshot-update with -n {workers}: update the snapshots in one process"
            " (python -m pytest tests/console --snapshot-update)"
        )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
