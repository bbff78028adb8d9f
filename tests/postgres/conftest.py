"""Fixtures for the tests that run against a real PostgreSQL server (see tests/pg.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib.util import find_spec
from typing import Any

import pytest
from pg import NO_DRIVER, fresh_database, required

# Without the driver the test modules skip (pytest.importorskip); where the tests are required
# (CI) that is a failure, before anything is collected.
if required() and find_spec("asyncpg") is None:
    raise pytest.UsageError(f"BLOK_REQUIRE_POSTGRES=1 but {NO_DRIVER}")


@pytest.fixture
async def pg_url(anyio_backend: str) -> AsyncIterator[str]:
    """The URL of an empty database of this test's own, dropped after it."""
    async with fresh_database() as url:
        yield url


@pytest.fixture
async def pg_schema(pg_url: str) -> AsyncIterator[str]:
    """`pg_url` with blok's schema applied."""
    from engine.backends.postgres.schema import migrate

    conn = await connect(pg_url)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    yield pg_url


async def connect(url: str) -> Any:
    """A connection as blok's own are made: blok's schema on the search path."""
    import asyncpg

    from engine.backends.postgres.connect import settings

    return await asyncpg.connect(url, server_settings=settings("test"))
