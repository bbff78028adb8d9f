from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.backends import open_backend
from engine.backends.base import Backend


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["memory", "sqlite"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """Each contract test runs on every backend (PostgreSQL joins when it lands)."""
    database = None if request.param == "memory" else tmp_path / "contract.db"
    async with open_backend(database) as opened:
        yield opened
