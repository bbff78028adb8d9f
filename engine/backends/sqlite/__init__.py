"""The SQLite backend: one file that the processes of one host share."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import anyio
from anyio.abc import TaskGroup

from ..database_backend import DatabaseBackend
from .db import SqliteDatabase
from .queue import SqliteQueue
from .shared import SqliteShared
from .store import SqliteRunStore


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

    async def __aenter__(self) -> SqliteBackend:
        await self.db.open()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self.db.writer_loop)
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

    async def change_token(self) -> int:
        return self.db.data_version()

    async def health(self) -> dict[str, Any]:
        row = await self.db.fetchone("PRAGMA quick_check")
        return {"ok": bool(row and row[0] == "ok"), "backend": "sqlite", "path": self.location}

    def flush_now(self) -> None:
        self.db.flush_now()
