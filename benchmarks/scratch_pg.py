"""A fresh PostgreSQL database for one measurement, dropped afterwards.

Every measurement on PostgreSQL (blok and its peers alike) gets a database of its own, created
from the server URL given on the command line (its database part is only where the admin
connection goes), so that no run finds another's tables, rows or dead tuples.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


def database_url(url: str, name: str) -> str:
    """`url` pointing at database `name` instead (its query string kept)."""
    base, sep, query = url.partition("?")
    return f"{base.rsplit('/', 1)[0]}/{name}{sep}{query}"


@contextmanager
def scratch_database(url: str, prefix: str) -> Iterator[str]:
    """CREATE DATABASE <prefix>_<random>, yield its URL, DROP it (with FORCE) on the way out."""
    import psycopg
    from psycopg import sql

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(url, autocommit=True)
    except psycopg.OperationalError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SystemExit(f"PostgreSQL at {url} is not reachable: {first}") from None
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield database_url(url, name)
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            admin.execute(drop.format(sql.Identifier(name)))


def database_for(provider: str, url: str, prefix: str) -> AbstractContextManager[str]:
    """What a child measuring `provider` is given as its database: a scratch database on the
    server at `url` for PostgreSQL, else "-" (none: the child makes its own SQLite file or
    runs in memory)."""
    return scratch_database(url, prefix) if provider == "postgres" else nullcontext("-")
