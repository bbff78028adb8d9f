"""Fixtures for the tests that run against a real PostgreSQL server (see tests/pg.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pg import fresh_database


@pytest.fixture
async def pg_url(anyio_backend: str) -> AsyncIterator[str]:
    """The URL of an empty database of this test's own, dropped after it."""
    async with fresh_database() as url:
        yield url


@pytest.fixture
async def pg_schema(pg_url: str) -> AsyncIterator[str]:
    """`pg_url` with blok's schema applied."""
    import asyncpg

    from engine.backends.postgres.schema import migrate

    conn = await asyncpg.connect(pg_url)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    yield pg_url
