"""The SQLite backend: one file that the processes of one host share."""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from pathlib import Path
from typing import Any, ClassVar

import anyio
from anyio.abc import TaskGroup

from ...clock import Clock
from ...errors import DatabaseError
from ..base import Pace
from ..database_backend import DatabaseBackend
from . import refusals
from .db import SqliteDatabase
from .file_changes import FileChanges
from .filesystem import warn_if_networked
from .queue import SqliteQueue
from .shared import SqliteShared
from .store import SqliteRunStore

log = logging.getLogger("blok.sqlite")

# How this process hears that another connection committed (another process's jobs, runs,
# signals). While it is busy with another process (a job awaited here, `wait_for_job`, now or
# within OTHERS_POLL_S; or a commit over there woke a claim here within OTHERS_BUSY_S) and that
# process writes (twice within OTHERS_BUSY_S), the file is watched (`FileChanges`, Linux): a write
# wakes this process at once, and the two hear each other at once while they work together.
# Otherwise, or where the file cannot be watched, its data_version is asked every OTHERS_POLL_S
# (what an idle engine costs, next to a busy process too), or every OTHERS_BUSY_POLL_S while
# busy.
# A worker idle on a file that another process wrote within OTHERS_KNOWN_S (a producer that
# sends a job now and then) watches it too, to hear the next job at once, and after each write
# it hears, none for OTHERS_DEAF_S.
OTHERS_POLL_S = 0.05
OTHERS_BUSY_POLL_S = 0.005
OTHERS_BUSY_S = 1.0
OTHERS_KNOWN_S = 60.0
OTHERS_DEAF_S = 0.05
# A write heard before its commit showed (see file_changes.py) is read again this much later.
HEARD_EARLY_S = 0.001


class SqliteBackend(DatabaseBackend):
    kind: ClassVar[str] = "sqlite"
    name: ClassVar[str] = "SQLite"
    multi_process: ClassVar[bool] = True

    def __init__(
        self, path: Path, *, create: bool = True, lease_s: float = 30.0, worker: bool = False
    ) -> None:
        self.location = str(path)
        self.clock = Clock()  # one machine's: SQLite is never shared between machines
        self.db = SqliteDatabase(path, create=create, serving=worker)
        self.runs = SqliteRunStore(self.db)
        self.shared = SqliteShared(self.db)
        self._durable: SqliteQueue = SqliteQueue(self.db)
        self._memory = None
        self._tg: TaskGroup | None = None
        self._moved = anyio.Event()  # set when another connection committed (`_hear_others`)
        self._awaited = 0  # waits for changes with no pace under way (`OTHERS_BUSY_POLL_S`)
        self._awaited_at = -math.inf  # when the last of them ended
        self._napping: anyio.CancelScope | None = None  # `_hear_others` between two looks
        self._heard_version = 0  # the file's data_version `_hear_others` last acted on
        self.file_changes: FileChanges | None = None  # the file's watch, where there is one

    async def __aenter__(self) -> SqliteBackend:
        await self.db.open()
        warn_if_networked(self.db.path)
        self.file_changes = FileChanges.open(self.db.path)
        if self.file_changes is not None:
            self.db.committed_here = self._committed_here
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
            if self.file_changes is not None:
                self.file_changes.close()
            await self.db.close()

    async def _hear_others(self) -> None:
        """Tell this process when another connection committed, for the whole engine (see
        OTHERS_POLL_S). Before, each idle queue looked for jobs itself every 50 ms (a write
        transaction each), and each waiter for changes (the worker's signals and pauses, a
        console's feed) read the counter on its own."""
        version = self._heard_version = self.db.data_version()
        woke_at = -math.inf  # when a commit over there last woke a claim here
        # When the last two commits over there were seen: two within OTHERS_BUSY_S say another
        # process is at work (not just beating its heart every few seconds).
        others_at = others_before = -math.inf
        deaf = False
        changes = self.file_changes
        while True:
            now = time.monotonic()
            busy = (
                self._awaited
                or now - self._awaited_at < OTHERS_POLL_S
                or now - woke_at < OTHERS_BUSY_S
            )
            # A worker whose claims wait for jobs that another process sends now and then.
            sentry = not busy and now - others_at < OTHERS_KNOWN_S and self._durable.sleeping()
            if deaf:
                heard = deaf = False  # look now: what was written while deaf
            elif (
                changes is not None
                and (sentry or (busy and now - others_before < OTHERS_BUSY_S))
                and changes.listen()
            ):
                # A look every OTHERS_BUSY_POLL_S too while busy: a write whose report was read
                # with this process's own (`_committed_here`) before it showed.
                heard = await changes.wait(OTHERS_POLL_S if sentry else OTHERS_BUSY_POLL_S)
            else:
                if changes is not None:
                    changes.stop()
                # A wait that begins ends a long nap (not a busy one: one wake-up a job).
                with anyio.CancelScope() as nap:
                    self._napping = None if busy else nap
                    await anyio.sleep(OTHERS_BUSY_POLL_S if busy else OTHERS_POLL_S)
                self._napping = None
                heard = False
            moved = self.db.data_version()
            if moved == version and heard:
                # This process's own commits are heard too, and need nothing; another's may
                # have been heard before it showed.
                await anyio.sleep(HEARD_EARLY_S)
                moved = self.db.data_version()
            if moved != version:
                version = self._heard_version = moved
                others_before, others_at = others_at, time.monotonic()
                try:
                    if self._durable.others_committed():
                        woke_at = others_at
                except (sqlite3.Error, DatabaseError) as error:
                    # Which queues changed is unknown: every claim asleep looks for itself.
                    log.warning("%s: %s; every idle queue looks again", self.location, error)
                    self._durable.wake_all()
                self._moved.set()
                self._moved = anyio.Event()
            if sentry and heard and changes is not None:
                # Heard at once; then none for OTHERS_DEAF_S, in which the file is not watched:
                # next to a process at work, a sentry that heard each of its writes would cost
                # it a microsecond a page and this process a wake-up each.
                changes.stop()
                deaf = True
                await anyio.sleep(OTHERS_DEAF_S)

    def _committed_here(self) -> None:
        """Right after this process's commit, in the loop's thread: the writes reported so far
        are that commit's (no other process writes while this one holds the write lock), or
        another's made since, which data_version shows. Read here, they do not wake the loop
        for nothing."""
        changes = self.file_changes
        assert changes is not None
        if changes.listening and changes.drain() and self.db.data_version() != self._heard_version:
            changes.tell()

    async def change_token(self) -> int:
        return self.db.data_version()

    async def change_mark(self) -> int:
        # The number `_hear_others` read at most OTHERS_POLL_S ago: the enqueue of a watched
        # job takes a mark, which its wait seldom needs (a job that ends here is not read),
        # and a PRAGMA in the event loop cost about 30 µs a job (benchmarks/statements.py).
        return self.db.known_version

    async def wait_for_change(self, token: int, timeout: float, pace: Pace | None = None) -> int:
        deadline = time.monotonic() + timeout
        if pace is not None:
            # A reader of everything that changed (a worker's signals and pauses, a console's
            # feed) is told at most every OTHERS_POLL_S, however fast `_hear_others` polls
            # while another process works (that is for the waits of jobs and of claims).
            gap = pace.last_return + OTHERS_POLL_S - time.monotonic()
            if gap > 0:
                await anyio.sleep(min(gap, timeout))
        current = token
        awaited = pace is None  # a job's wait, an operator's: heard within a few ms
        self._awaited += awaited
        if awaited and self._napping is not None:
            self._napping.cancel()  # looked for at OTHERS_BUSY_POLL_S from now, not after a nap
        try:
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                while (current := self.db.data_version()) == token:
                    await self._moved.wait()
        finally:
            self._awaited -= awaited
            if awaited:
                self._awaited_at = time.monotonic()
        if pace is not None:
            pace.last_return = time.monotonic()
        return current

    async def health(self) -> dict[str, Any]:
        # A large file is not read whole at every look (refusals.QUICK_CHECK_MAX_BYTES): one
        # read of the schema says it opens; a damaged page is said when something reads it.
        if self.db.path.stat().st_size > refusals.QUICK_CHECK_MAX_BYTES:
            row = await self.db.fetchone("SELECT 'ok' FROM schema_version LIMIT 1")
        else:
            row = await self.db.fetchone("PRAGMA quick_check")
        return {"ok": bool(row and row[0] == "ok"), "backend": "sqlite", "path": self.location}

    def flush_now(self) -> None:
        self.db.flush_now()
