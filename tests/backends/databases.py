"""The backends the contract suites run against: `DATABASES` is the one list.

Each entry says how a test gets a fresh database of that kind, which queue providers its
backend serves and whether several processes can share it. A new backend is one more entry
(as PostgreSQL's, with `fresh_database` from tests/pg.py), and every contract test in
tests/backends/ then runs against it too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from pg import fresh_database

Location = str | Path | None  # what `open_backend` takes: None (memory), a path, a URL


@dataclass(frozen=True)
class Database:
    """How a test gets a database of one kind, and what that kind offers."""

    fresh: Callable[[Path], AbstractAsyncContextManager[Location]]  # given the test's tmp_path
    providers: tuple[str, ...]  # the queue providers its backend serves
    multi_process: bool  # several processes (several backends) can open the same one


@asynccontextmanager
async def _in_memory(tmp_path: Path) -> AsyncIterator[Location]:
    yield None


@asynccontextmanager
async def _sqlite_file(tmp_path: Path) -> AsyncIterator[Location]:
    yield tmp_path / "blok.db"


DATABASES: dict[str, Database] = {
    "memory": Database(_in_memory, providers=("memory",), multi_process=False),
    "sqlite": Database(_sqlite_file, providers=("sqlite", "memory"), multi_process=True),
    # A database of its own per test on the server BLOK_TEST_POSTGRES names (tests/pg.py),
    # skipped with the reason where there is none (a failure where BLOK_REQUIRE_POSTGRES=1).
    "postgres": Database(
        lambda tmp_path: fresh_database(), providers=("postgres", "memory"), multi_process=True
    ),
}
MULTI_PROCESS = [kind for kind, database in DATABASES.items() if database.multi_process]


class QueueCase(NamedTuple):
    """One job queue under test: a provider's queue on a backend of one kind."""

    database: str
    provider: str

    def __str__(self) -> str:
        return f"{self.database}-{self.provider}"


QUEUES = [
    QueueCase(kind, provider)
    for kind, database in DATABASES.items()
    for provider in database.providers
]
# Queues whose jobs live in the database, where another process's backend sees them; a
# "memory" queue's jobs are its own process's only.
SHARED_QUEUES = [case for case in QUEUES if case.provider != "memory"]
