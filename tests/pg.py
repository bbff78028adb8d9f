"""A fresh PostgreSQL database for a test, on the server the tests are pointed at.

`BLOK_TEST_POSTGRES` names the server (a URL to a database the user may connect to and create
databases from; default `postgresql://postgres@127.0.0.1:5432/test`). Each test gets a database
of its own, `blok_test_<random>`, dropped afterwards. Where no server answers, or the driver is
not installed, the tests that need one skip with the reason; with `BLOK_REQUIRE_POSTGRES=1` (as
CI sets) they fail instead, so a green run cannot have skipped them.

    from pg import fresh_database
    async with fresh_database() as url:
        ...
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
NO_DRIVER = 'asyncpg is not installed (pip install -e ".[postgres]")'
CONNECT_TIMEOUT = 3.0


def server_url() -> str:
    return os.environ.get("BLOK_TEST_POSTGRES", DEFAULT_URL)


def required() -> bool:
    return os.environ.get("BLOK_REQUIRE_POSTGRES", "") == "1"


def database_url(url: str, database: str) -> str:
    """`url` with its database replaced (the query string, if any, is kept)."""
    base, sep, query = url.partition("?")
    scheme_host = re.match(r"^(postgres(?:ql)?://[^/]*)", base)
    if scheme_host is None:
        raise ValueError(f"not a postgresql:// URL: {url!r}")
    return f"{scheme_host.group(1)}/{database}{sep}{query}"


async def _probe(url: str) -> str | None:
    try:
        import asyncpg
    except ImportError:
        return NO_DRIVER
    try:
        conn = await asyncpg.connect(url, timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError, asyncpg.PostgresError) as error:
        return f"no PostgreSQL server at {url}: {type(error).__name__}: {error}"
    await conn.close()
    return None


_probed: dict[str, str | None] = {}


async def unavailable() -> str | None:
    """Why the tests cannot have a server (None: they can). Asked once per session."""
    url = server_url()
    if url not in _probed:
        _probed[url] = await _probe(url)
    return _probed[url]


async def need_server() -> None:
    """Skip the calling test when there is no server, or fail it when one is required."""
    reason = await unavailable()
    if reason is None:
        return
    if required():
        pytest.fail(f"BLOK_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
    pytest.skip(reason)


async def drop_under_its_users(url: str) -> None:
    """Drop the database of `url` with its connections open (an outage: what the engine using
    it meets next is the test's)."""
    import asyncpg

    admin = await asyncpg.connect(server_url(), timeout=CONNECT_TIMEOUT)
    try:
        await admin.execute(f'DROP DATABASE "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
    finally:
        await admin.close()


@asynccontextmanager
async def fresh_database(prefix: str = "blok_test") -> AsyncIterator[str]:
    """Create an empty database, yield its URL, drop it (with any connection left to it)."""
    import asyncpg

    await need_server()
    name = f"{prefix}_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(server_url(), timeout=CONNECT_TIMEOUT)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield database_url(server_url(), name)
        finally:
            with anyio.CancelScope(shield=True):
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        with anyio.CancelScope(shield=True):
            await admin.close()
