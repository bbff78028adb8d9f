"""The backend contract suites run every test against every backend, through `open_backend`:
`database_kind` is parametrized over `databases.DATABASES` (the one place a backend is
named), and `backend` opens a fresh database of that kind. A module narrows the kinds by
parametrizing `database_kind` (or its own case fixture) indirectly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.backends import Backend, open_backend

from .databases import DATABASES, Location


@pytest.fixture(params=list(DATABASES))
def database_kind(request: pytest.FixtureRequest) -> str:
    """The kind of backend under test (a module may narrow it: parametrize indirectly)."""
    kind: str = request.param
    return kind


@pytest.fixture
async def database(database_kind: str, tmp_path: Path) -> AsyncIterator[Location]:
    async with DATABASES[database_kind].fresh(tmp_path) as location:
        yield location


@pytest.fixture
async def backend(database: Location) -> AsyncIterator[Backend]:
    async with open_backend(database) as opened:
        yield opened


@pytest.fixture
async def other_backend(
    database_kind: str, database: Location, backend: Backend
) -> AsyncIterator[Backend]:
    """A second backend on the same database: what another process sees and does."""
    if not DATABASES[database_kind].multi_process:
        pytest.fail(f"{database_kind} is one process's only: parametrize with MULTI_PROCESS")
    async with open_backend(database) as opened:
        yield opened
