"""The SQLite backend: one file that the processes of one host share."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any, ClassVar

import anyio
from anyio.abc import TaskGroup

from ...errors import DatabaseError
from ..base import Pace
from ..database_backend import DatabaseBackend
from .db import SqliteDatabase
from .queue import SqliteQueue
from .shared import SqliteShared
from .store import SqliteRunStore

log = logging.getLogger("blok.sqlite")

# How often the file's data_version is asked whether another connection committed (another
# process's jobs, runs, signals): how late this process hears of them.
OTHERS_POLL_S = 0.05


class SqliteBackend(DatabaseBackend):
    kind: ClassVar[str] = "sqlite"
    name: ClassVar[str] = "SQLite"
    multi_process: ClassVar[bool] = True

    def __init__(self, path: Path, *, create: bool = True, lease_s: float = 30.0) -> None:
        self.location = str(path)
        self.db = SqliteDatabase(path, create=create)
        self.runs = SqliteRunStore(self.db)
        self.shared = SqliteShared(self.db)
        self._durable: SqliteQueue = SqliteQueue(self.db)
        self._memory = None
        self._tg: TaskGroup | None = None
        self._moved = anyio.Event()  # set when another connection committed (`_hear_others`)

    async def __aenter__(self) -> SqliteBackend:
        await self.db.open()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self.db.writer_loop)
        tg.start_soon(self._hear_others)
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self._tg is not None:
                try:
                    # While the writer still runs: afterwards `close` has nothing to flush.
                    with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                        await self.db.flush()
                finally:
                    self._tg.cancel_scope.cancel()
                    await self._tg.__aexit__(None, None, None)
        finally:
            await self.db.close()

    async def _hear_others(self) -> None:
        """Tell this process when another connection committed: one read of a counter every
        OTHERS_POLL_S for the whole engine. Before, each idle queue looked for jobs itself
        every 50 ms (a write transaction each), and each waiter for changes (the worker's
        signals and pauses, a console's feed) read the counter on its own."""
        version = self.db.data_version()
        while True:
            await anyio.sleep(OTHERS_POLL_S)
            moved = self.db.data_version()
            if moved != version:
                version = moved
                try:
                    self._durable.others_committed()
                except (sqlite3.Error, DatabaseError) as error:
                    # Which queues changed is unknown: every claim asleep looks for itself.
                    log.warning("%s: %s; every idle queue looks again", self.location, error)
                    self._durable.wake_all()
                self._moved.set()
                self._moved = anyio.Event()

    async def change_token(self) -> int:
        return self.db.data_version()

    async def change_mark(self) -> int:
        # The number `_hear_others` read at most OTHERS_POLL_S ago: the enqueue of a watched
        # job takes a mark, which its wait seldom needs (a job that ends here is not read),
        # and a PRAGMA in the event loop cost about 30 µs a job (benchmarks/statements.py).
        return self.db.known_version

    async def wait_for_change(self, token: int, timeout: float, pace: Pace | None = None) -> int:
        # Paced already: `_hear_others` reads the file's data_version every OTHERS_POLL_S.
        with anyio.move_on_after(timeout):
            while True:
                current = self.db.data_version()
                if current != token:
                    return current
                await self._moved.wait()
        return token

    async def health(self) -> dict[str, Any]:
        row = await self.db.fetchone("PRAGMA quick_check")
        return {"ok": bool(row and row[0] == "ok"), "backend": "sqlite", "path": self.location}

    def flush_now(self) -> None:
        self.db.flush_now()
