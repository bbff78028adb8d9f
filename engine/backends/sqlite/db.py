"""One SQLite file: its connections, its migrations, and the writer that batches every write.

Writes. Every write the engine makes goes through one writer task that batches them (group
commit, with no timer): a write that finds the writer idle is committed at once, and whatever
piles up meanwhile goes in the next transaction, so concurrent callers share a commit. A caller
that waits for everything queued so far (`flush`) and finds the writer idle commits it itself,
at once, rather than waiting for the writer's task to have its turn. A batch
writes, in this order: the latest state of every run saved since the last batch (one row per
table however often it changed), the queued statements, then the functions that must run inside
a transaction and see its result (claims, fenced transitions). A run's rows carry their fence:
they land only if the job is still at the epoch the writer of the run claimed it at, checked
inside the same transaction.

A batch is committed in the event loop's own thread. In WAL mode with synchronous=NORMAL a
commit appends a few pages to the WAL without an fsync: tens of microseconds, less than handing
the batch to a thread and back (and no fight for the GIL with a busy event loop). The two things
that could make a commit long never happen in the loop: a long wait for another process's write
lock (the writer's busy timeout is 0 there; a batch that still finds the lock taken after 0.3 ms,
`begin_briefly`, is committed in a thread that waits up to BUSY_TIMEOUT_MS), and checkpoints,
which fsync (the writer's automatic checkpoint is off; checkpoints run in threads, see
"checkpoints" below). A batch heavier than
INLINE_WEIGHT rows (a bulk enqueue, a purge) is committed in a thread too.

Reads. Point reads (a job, a run with its steps, a cache entry) run in the loop's thread too, on
a connection of their own: WAL readers never wait for a writer, and such a read costs less than
a hop to a thread. They wait only for this process's writes to the same record still queued
(`flush_for`), not for the whole writer. Scans (lists, counts, the feed) go through aiosqlite's
thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import aiosqlite
import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from ...errors import DatabaseError
from ...models import Run
from ..base import Fence
from ..rows import ATTEMPT_COLUMNS, RUN_COLUMNS, STEP_COLUMNS, attempt_row, run_row, step_row
from . import refusals
from .connection import PAGE_SIZE, connect
from .refusals import (
    Troubles,
    busy_timeout_ms,
    damaged,
    damaged_message,
    not_the_calls,
    quick_check,
    rollback,
    transient,
)
from .schema import MIGRATIONS, SCHEMA_VERSION

log = logging.getLogger("blok.sqlite")
T = TypeVar("T")

INLINE_WEIGHT = 512  # rows: a heavier batch is committed in a thread, off the event loop
CHECKPOINT_EVERY = 64  # batches between two checkpoints (about 1,000 WAL pages, as SQLite does)
RESTART_EVERY = 4  # every 4th checkpoint is the writer's own (see "checkpoints" below)
FENCE = " WHERE ?1 IS NULL OR (SELECT epoch FROM jobs WHERE id = ?1) = ?2"


def _fenced_insert(table: str, columns: tuple[str, ...]) -> str:
    """INSERT of one row that lands only if the fence holds: params (job id or NULL, epoch,
    then the row). A NULL job id means no fence."""
    values = ", ".join(f"?{i + 3}" for i in range(len(columns)))
    return f"INSERT INTO {table} ({', '.join(columns)}) SELECT {values}" + FENCE


# `rev` orders run changes across processes: every write of a run row takes max(rev) + 1 inside
# its transaction, so a follower reads the changed runs in commit order (`WHERE rev > ?`).
# A run's identity (its workflow, queue, job, parent and creation time) is fixed when it is made:
# rewriting those columns would rewrite their index entries at every save of the run (about a
# third of a finished run's commit), for values that never change.
FIXED_RUN_COLUMNS = ("id", "workflow_name", "queue", "job_id", "created_at", "parent_run_id")
UPSERT_RUN = (
    f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}, rev)"
    f" SELECT {', '.join(f'?{i + 3}' for i in range(len(RUN_COLUMNS)))},"
    " (SELECT coalesce(max(rev), 0) + 1 FROM runs)"
    + FENCE
    + " ON CONFLICT(id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in RUN_COLUMNS if c not in FIXED_RUN_COLUMNS)
    + ", rev = excluded.rev"
)
UPSERT_STEP = _fenced_insert("steps", STEP_COLUMNS).replace("INSERT INTO", "INSERT OR REPLACE INTO")
UPSERT_ATTEMPT = _fenced_insert("attempts", ATTEMPT_COLUMNS).replace(
    "INSERT INTO", "INSERT OR REPLACE INTO"
)
INSERT_LOG = _fenced_insert("logs", ("run_id", "step_idx", "ts", "level", "message"))


def run_rows(
    run: Run, fence: Fence | None
) -> tuple[tuple[Any, ...], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The run's rows (run, steps, attempts), each with its fence in front."""
    head = (fence.job_id, fence.epoch) if fence is not None else (None, None)
    steps: list[tuple[Any, ...]] = []
    attempts: list[tuple[Any, ...]] = []
    for step in run.steps:
        steps.append((*head, *step_row(run.id, step)))
        for attempt in step.attempts:
            attempts.append((*head, *attempt_row(run.id, step.index, attempt)))
    return (*head, *run_row(run)), steps, attempts


def write_runs(conn: sqlite3.Connection, runs: list[tuple[Run, Fence | None]]) -> None:
    if not runs:
        return
    rows, steps, attempts = [], [], []
    for run, fence in runs:
        row, run_steps, run_attempts = run_rows(run, fence)
        rows.append(row)
        steps.extend(run_steps)
        attempts.extend(run_attempts)
    for sql, params in ((UPSERT_RUN, rows), (UPSERT_STEP, steps), (UPSERT_ATTEMPT, attempts)):
        if len(params) == 1:
            conn.execute(sql, params[0])
        elif params:
            conn.executemany(sql, params)


# A queued statement: SQL, parameters, and whom to tell whether it changed a row.
Op = tuple[str, tuple[Any, ...], Callable[[bool], None] | None]


@dataclass
class InTransaction(Generic[T]):
    """A function riding in the writer's next transaction; `done` once it committed."""

    fn: Callable[[sqlite3.Connection], T]
    weight: int = 1
    done: asyncio.Event = field(default_factory=asyncio.Event)  # (see `_wake`)
    late: bool = False  # runs after the batch's other calls (`SqliteDatabase.call_soon`)
    result: T | None = None
    error: BaseException | None = None


@dataclass
class _Batch:
    """A batch taken by the writer; `committed` once written (by the writer or flush_now)."""

    runs: list[tuple[Run, Fence | None]]
    ops: list[Op]
    calls: list[InTransaction[Any]]
    weight: int = 0
    committed: bool = False
    # A call of this batch failed on its own: from then on each call runs in a savepoint of
    # its own (see `_commit_begun`).
    careful: bool = False
    # The ops that asked to be told whether they changed a row, with the answer: told once
    # the batch is committed.
    told: list[tuple[Callable[[bool], None], bool]] = field(default_factory=list)


def schema_version(conn: sqlite3.Connection) -> int | None:
    """The file's blok schema version, None if it has no blok tables (a read: no lock)."""
    known = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if known is None:
        return None
    return int(conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0)


def migrate(conn: sqlite3.Connection, path: Path, *, create: bool) -> None:
    """Create or upgrade the schema. A file that is current is only read: a command on it
    does not need the write lock (another process may hold it for long)."""
    found = schema_version(conn)
    if found is None:
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if not create or tables:
            # Another program's database (left exactly as it was: not even its journal
            # mode changes), or a new one that a command which only reads must not make.
            raise DatabaseError(
                f"{path}: not a blok database"
                + (
                    f" (it holds {tables} other table(s); blok will not add its own)"
                    if tables
                    else " (start a worker on it first: blok-tui worker --db PATH)"
                )
            )
    if found is None:
        # A new file (nothing written yet): its page size, which only a VACUUM changes later.
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    conn.execute("PRAGMA journal_mode = WAL")
    if found == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")  # busy: the caller waits and tries again
    try:
        known = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        ).fetchone()
        if known is None:
            conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        current = row[0] or 0
        if current > SCHEMA_VERSION:
            raise DatabaseError(
                f"{path}: written by a newer blok-tui (schema {current}, this one knows "
                f"{SCHEMA_VERSION}); upgrade blok-tui"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise


class SqliteDatabase:
    """The file: a batching writer and point reads in the event loop's thread, scans through
    aiosqlite, checkpoints in a thread."""

    def __init__(self, path: Path, *, create: bool = True, serving: bool = False) -> None:
        self.path = path
        self.create = create
        self.serving = serving  # a worker's: the file is checked at open whatever its size
        self._writer: sqlite3.Connection | None = None
        self._point: sqlite3.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._runs: dict[str, tuple[Run, Fence | None]] = {}
        self._ops: list[Op] = []
        self._calls: list[InTransaction[Any]] = []
        self._late_calls: list[InTransaction[Any]] = []  # after the others (`call_soon`)
        self._weight = 0
        # The records (run ids, job ids, cache keys) the queued writes touch, and those of the
        # batch being committed in a thread: a point read of one of them waits for the commit.
        self._keys: set[str] = set()
        self._inflight_keys: set[str] = set()
        self._flushers: list[asyncio.Event] = []
        # asyncio's events, not anyio's (six calls to make, two to set), for what the writer
        # hears and tells: a few a job. The writer runs on asyncio anyway (aiosqlite).
        self._wake = asyncio.Event()
        self._failure: BaseException | None = None
        self._inflight: _Batch | None = None
        self._committing = False  # a batch taken but not committed yet: flush waits for it
        self._limiter = anyio.CapacityLimiter(1)
        self._lock = threading.Lock()  # the writer connection: loop, commit thread, flush_now
        self._checkpoint_at = CHECKPOINT_EVERY  # batches
        self._checkpoints = 0
        self._checkpointing = False  # one beside the writer is under way
        self._checkpointer: sqlite3.Connection | None = None
        self._checkpoint_lock = threading.Lock()
        self.known_version = 0  # data_version's last answer (not asked again: cheap, maybe old)
        self._troubles = Troubles(self.path, "the next write")
        self.batches = 0
        self.batches_in_thread = 0
        self.committed_here: Callable[[], None] = lambda: None  # after a commit in the loop

    # ---- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        if self.path.is_dir():  # `--db workflows/`: SQLite's own word was "unable to open"
            raise DatabaseError(f"{self.path}: a folder, not a database file (--db FILE)")
        if not self.create and not self.path.is_file():
            raise DatabaseError(
                f"{self.path}: no such database (start a worker on it first: "
                f"blok-tui worker --db {self.path})"
            )
        try:
            if not self.path.parent.exists():
                self.path.parent.mkdir(parents=True, mode=0o700)
        except OSError as error:
            raise DatabaseError(f"{self.path.parent}: cannot create folder ({error})") from error
        if self.path.exists() and not os.access(self.path, os.W_OK):
            raise DatabaseError(f"{self.path}: the database file is not writable")
        if not os.access(self.path.parent, os.W_OK):
            raise DatabaseError(
                f"{self.path.parent}: the database folder is not writable "
                "(SQLite needs to create its -wal and -shm files there)"
            )
        new = not self.path.exists()
        try:
            self._writer = await self._patiently(lambda: connect(self.path), "opening it")
            writer = self._writer
            await self._patiently(
                lambda: migrate(writer, self.path, create=self.create), "opening it"
            )
            await self._patiently(
                lambda: quick_check(writer, self.path, self.serving), "opening it"
            )
            # In the loop, a commit must not wait for another process's lock (see above), and
            # checkpoints are the writer loop's, in a thread.
            writer.execute("PRAGMA busy_timeout = 0")
            writer.execute("PRAGMA wal_autocheckpoint = 0")
            self._point = await self._patiently(lambda: connect(self.path), "opening it")
        except sqlite3.Error as error:
            self._close_connections()
            if damaged(error):
                raise DatabaseError(damaged_message(self.path, error)) from None
            raise DatabaseError(f"{self.path}: not a usable SQLite database ({error})") from None
        except BaseException:
            self._close_connections()
            raise
        if new:
            for suffix in ("", "-wal", "-shm"):
                target = Path(f"{self.path}{suffix}")
                if target.exists():
                    target.chmod(stat.S_IRUSR | stat.S_IWUSR)
        else:
            self._warn_if_shared()  # a blok database now known: say if others can read it
        timeout_ms = busy_timeout_ms()
        self._reader = await aiosqlite.connect(self.path, timeout=timeout_ms / 1000)
        await self._reader.execute(f"PRAGMA busy_timeout = {timeout_ms}")
        self._reader.row_factory = sqlite3.Row

    async def _patiently(self, fn: Callable[[], T], what: str) -> T:
        """`fn` in a thread, tried again while the database is busy or full (logged once)."""
        troubles = Troubles(self.path, what)
        while True:
            try:
                result = await anyio.to_thread.run_sync(fn)
            except sqlite3.Error as error:
                kind = transient(error)
                if kind is None:
                    raise
                await anyio.sleep(troubles.failed(error, kind))
                continue
            troubles.cleared()
            return result

    def _warn_if_shared(self) -> None:
        """Runs hold their inputs, outputs and logs: a database others can read leaks them."""
        try:
            mode = self.path.stat().st_mode
        except OSError:
            return
        readers = [who for who, bit in (("group", 0o040), ("others", 0o004)) if mode & bit]
        if readers:
            log.warning(
                "%s is readable by %s (mode %s): it holds run inputs, outputs and logs; "
                "chmod 600 %s",
                self.path,
                " and ".join(readers),
                oct(stat.S_IMODE(mode)),
                self.path,
            )

    def _close_connections(self) -> None:
        for name in ("_point", "_writer"):
            conn = getattr(self, name)
            if conn is not None:
                conn.close()
                setattr(self, name, None)
        with self._checkpoint_lock:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None

    async def close(self) -> None:
        # Closed while the engine's task group is being cancelled: the reader's close is
        # shielded, as an aiosqlite connection left open keeps its non-daemon thread alive and
        # the process never exits.
        try:
            if self._writer is not None and self._failure is None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                    await self.flush()
        finally:
            # Cancelled (the process is going down) or not, what is pending gets committed.
            self.flush_now()
            if self._reader is not None:
                with anyio.CancelScope(shield=True):
                    await self._reader.close()
                self._reader = None
            self._close_connections()

    # ---- writes ----------------------------------------------------------------------------
    def write(
        self,
        sql: str,
        params: tuple[Any, ...],
        key: str | None = None,
        changed: Callable[[bool], None] | None = None,
    ) -> None:
        """Queue one statement for the next batch; `key`: the record it writes (a run id, a
        job id), which a point read of that record waits for; `changed`: told, once the batch
        is committed, whether the statement changed a row."""
        self._ops.append((sql, params, changed))
        self._weight += 1
        if key is not None:
            self._keys.add(key)
        self._wake.set()

    def save(self, run: Run, fence: Fence | None) -> None:
        """Queue the run's rows (its latest state when the batch is written)."""
        if run.id not in self._runs:
            self._weight += 1 + len(run.steps)
        self._runs[run.id] = (run, fence)
        self._keys.add(run.id)
        self._wake.set()

    async def transaction(
        self, fn: Callable[[sqlite3.Connection], T], weight: int = 1, *, late: bool = False
    ) -> T:
        """Run `fn` inside the next write transaction and return its result once committed.
        An error it raises is its caller's; the rest of the batch still commits. `weight`:
        about how many rows it writes (a heavy batch is committed in a thread). `late`: after
        the batch's other calls (see `call_soon`)."""
        return await self.outcome(self.call_soon(fn, weight, late=late))

    def call_soon(
        self, fn: Callable[[sqlite3.Connection], T], weight: int = 1, *, late: bool = False
    ) -> InTransaction[T]:
        """`transaction` in two halves: `fn` queued for the next write transaction, and its
        outcome awaited (`outcome`), by whoever needs it (`done` is set in any case).

        The calls of a batch were all asked for before it began, none waiting for another, so
        any order of them is one they could have had. A `late` one runs after the others: a
        claim's look, so that it finds the jobs added in its own transaction (and the callers
        of the others hear first that theirs committed)."""
        call: InTransaction[T] = InTransaction(fn, weight, late=late)
        (self._late_calls if late else self._calls).append(call)
        self._weight += weight
        self._wake.set()
        return call

    async def outcome(self, call: InTransaction[T], *, soon: bool = False) -> T:
        """The result of a queued call once committed; its error, raised.

        `soon`: after one turn of the loop (the callers woken with this one queue theirs, and
        share the commit) the caller commits what is queued itself when the writer is idle, as
        a flush does. A lone `enqueue` from a process that claims nothing from the queue (a
        producer) waited for the writer's task to wake, take its own turn and commit, then for
        its own turn after that: two turns more, 6 % of its instructions (726,000 a call
        against 686,000, counted by callgrind). A worker's own adds wait for the writer: those
        turns let a slot just freed join the add and be handed its job
        (`database_queue.PendingAdd`), where half of them then had to claim it."""
        if soon and not call.done.is_set():
            await anyio.lowlevel.checkpoint()
            if not call.done.is_set():  # else the writer took it first, or a flush did
                self._commit_inline()  # nothing, if the writer is committing it right now
        await call.done.wait()
        if call.error is not None:
            if isinstance(call.error, sqlite3.Error):
                raise DatabaseError(self._describe(call.error)) from call.error
            raise call.error
        return call.result  # type: ignore[return-value]

    def _describe(self, error: BaseException) -> str:
        if damaged(error):
            return damaged_message(self.path, error)
        return f"{self.path}: {error}"

    def _pending(self) -> bool:
        calls = self._calls or self._late_calls
        return bool(self._ops or calls or self._runs or self._flushers or self._committing)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise DatabaseError(f"{self.path}: the writer failed") from self._failure

    async def flush(self) -> None:
        """Wait until everything queued so far is committed: at once, by the caller, when the
        writer is idle (see `_commit_inline`)."""
        self._raise_failure()
        if not self._pending():
            return
        if self._commit_inline():
            await anyio.lowlevel.checkpoint_if_cancelled()
            return
        done = asyncio.Event()
        self._flushers.append(done)
        self._wake.set()
        await done.wait()
        self._raise_failure()

    async def flush_for(self, key: str) -> None:
        """Wait until this process's queued writes to one record are committed (all of them,
        if it has any): read-your-writes for a point read, without waiting on the writer
        otherwise."""
        if key in self._keys or key in self._inflight_keys:
            await self.flush()
        else:
            self._raise_failure()

    def _commit_inline(self) -> bool:
        """Commit what is queued here and now, in the caller's task, as the writer would; False,
        with everything left queued for the writer, if the writer is committing a batch, the
        batch is heavy, a checkpoint is due, or the write lock is another process's.

        A caller that must see its writes committed before it goes on (a slot whose job was
        claimed ahead commits its run's start before the job's code runs) would otherwise
        wait for the writer's task to wake, gather and commit, and then for its own turn: two
        or three turns of a loop that other slots keep busy, four times the commit itself
        (about 1 ms against 0.25 with eight slots of 10 ms jobs)."""
        if (
            self._committing
            or self._failure is not None
            or self._weight > INLINE_WEIGHT
            or self.batches + 1 >= self._checkpoint_at
        ):
            return False
        batch = self._take()
        keys, self._keys = self._keys, set()
        flushers, self._flushers = self._flushers, []
        try:
            committed = self._commit_here(batch)
        except Exception:
            # Rolled back, nothing written: the writer meets the same error with the same
            # batch, and ends on it as it does for any batch (every waiter told).
            committed = False
        if not committed:
            # Nothing was written: all of it goes back, as it was (nothing was queued since:
            # nothing here awaits).
            self._runs = {run.id: (run, fence) for run, fence in batch.runs}
            self._ops, self._weight = batch.ops, batch.weight
            self._calls = [call for call in batch.calls if not call.late]
            self._late_calls = [call for call in batch.calls if call.late]
            self._keys, self._flushers = keys, flushers
            return False
        self.batches += 1
        self._committed(batch, flushers)
        return True

    def _committed(self, batch: _Batch, flushers: list[asyncio.Event]) -> None:
        """Tell whoever waits on a committed batch."""
        for changed, answer in batch.told:
            changed(answer)
        for call in batch.calls:
            call.done.set()
        for flusher in flushers:
            flusher.set()

    def _take(self) -> _Batch:
        runs = list(self._runs.values())
        self._runs = {}
        ops, self._ops = self._ops, []
        calls, self._calls = self._calls, []
        if self._late_calls:
            calls += self._late_calls
            self._late_calls = []
        weight, self._weight = self._weight, 0
        return _Batch(runs, ops, calls, weight)

    async def writer_loop(self) -> None:
        """The one task that commits; run it in the backend's task group."""
        async with anyio.create_task_group() as group:
            await self._write_batches(group)

    async def _write_batches(self, group: TaskGroup) -> None:
        while True:
            await self._wake.wait()
            # One turn of the event loop first: the tasks woken with us (a finished job's
            # worker slot, the claim loop it pokes, concurrent callers) add their writes to
            # this batch instead of waiting a whole commit for the next one.
            await anyio.lowlevel.checkpoint()
            self._wake = asyncio.Event()
            batch = self._take()
            keys, self._keys = self._keys, set()
            flushers, self._flushers = self._flushers, []
            if batch.runs or batch.ops or batch.calls:
                self._committing = True
                self._inflight = batch
                try:
                    if batch.weight > INLINE_WEIGHT or not self._commit_here(batch):
                        self._inflight_keys = keys
                        self.batches_in_thread += 1
                        await self._commit_patiently(batch)
                except BaseException as error:
                    if isinstance(error, sqlite3.Error):
                        error = DatabaseError(self._describe(error))
                    self._failure = error
                    for call in batch.calls:
                        call.error = error
                        call.done.set()
                    for flusher in flushers:
                        flusher.set()
                    for _, _, changed in batch.ops:
                        if changed is not None:
                            changed(False)
                    raise error from None
                finally:
                    self._committing = False
                    self._inflight_keys = set()
                self.batches += 1
            self._committed(batch, flushers)
            if self.batches >= self._checkpoint_at and not self._checkpointing:
                self._checkpoint_at = self.batches + CHECKPOINT_EVERY
                self._checkpoints += 1
                if self._checkpoints % RESTART_EVERY == 0:
                    # The writer's own, between two batches: writes made meanwhile wait for
                    # it (little is left to copy), then go in one batch.
                    await anyio.to_thread.run_sync(self._checkpoint, limiter=self._limiter)
                else:
                    self._checkpointing = True
                    group.start_soon(self._checkpoint_beside)

    def _commit_here(self, batch: _Batch) -> bool:
        """Commit the batch in this (the loop's) thread; False, with nothing written, if the
        write lock is another process's right now (or the connection busy in a thread)."""
        conn = self._writer
        assert conn is not None
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if batch.committed:
                return True
            if not refusals.begin_briefly(conn):
                return False
            try:
                self._commit_begun(conn, batch)
            except sqlite3.Error as error:
                if transient(error) is None:
                    raise
                return False  # rolled back: the thread path waits, and logs, and tries again
            batch.committed = True
            self.committed_here()
            return True
        finally:
            self._lock.release()

    def _commit(self, batch: _Batch) -> None:
        """Commit the batch from a thread, waiting for the write lock if need be."""
        conn = self._writer
        assert conn is not None
        with self._lock:
            # flush_now() may have committed this batch already, to keep the order of writes.
            if not batch.committed:
                self._commit_waiting(conn, batch)
                batch.committed = True

    @classmethod
    def _commit_waiting(cls, conn: sqlite3.Connection, batch: _Batch) -> None:
        conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms()}")
        try:
            conn.execute("BEGIN IMMEDIATE")
            cls._commit_begun(conn, batch)
        finally:
            conn.execute("PRAGMA busy_timeout = 0")

    @classmethod
    def _commit_begun(cls, conn: sqlite3.Connection, batch: _Batch) -> None:
        """Write the batch in the transaction just begun, and commit it. A batch tried again
        (the database was busy or full) runs its calls again: their earlier answers went with
        the rollback.

        A call's own failure is its caller's alone: its writes are undone, the rest of the
        batch commits. Calls seldom fail, so they run bare first (a savepoint around each cost
        ~14 µs a job, two statements a call); when one does fail, the batch is rolled back and
        written again with a savepoint around each call."""
        batch.told = []
        for call in batch.calls:
            call.result, call.error = None, None
        try:
            write_runs(conn, batch.runs)
            # Consecutive statements with the same SQL go in one executemany.
            ops = batch.ops
            i = 0
            while i < len(ops):
                sql, params, changed = ops[i]
                if changed is not None:
                    batch.told.append((changed, conn.execute(sql, params).rowcount == 1))
                    i += 1
                    continue
                j = i + 1
                while j < len(ops) and ops[j][0] == sql and ops[j][2] is None:
                    j += 1
                if j == i + 1:
                    conn.execute(sql, params)
                else:
                    conn.executemany(sql, [op[1] for op in ops[i:j]])
                i = j
            calls = batch.calls
            if not batch.careful:
                for call in calls:
                    try:
                        call.result = call.fn(conn)
                    except Exception as error:
                        if not_the_calls(conn, error):
                            raise
                        rollback(conn)
                        if len(calls) == 1 and not batch.runs and not ops:
                            # Alone in its transaction: the rollback undid its writes only.
                            call.error = error
                            return
                        batch.careful = True
                        # In the loop's thread, a BUSY here sends the batch to the thread path,
                        # still careful.
                        conn.execute("BEGIN IMMEDIATE")
                        cls._commit_begun(conn, batch)
                        return
            else:
                for call in calls:
                    conn.execute("SAVEPOINT call")
                    try:
                        call.result = call.fn(conn)
                    except Exception as error:
                        if not_the_calls(conn, error):
                            raise
                        # A call's own failure is its caller's: its writes are undone, the
                        # batch still commits.
                        conn.execute("ROLLBACK TO call")
                        call.error = error
                    conn.execute("RELEASE call")
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise

    async def _commit_patiently(self, batch: _Batch) -> None:
        """Commit the batch in a thread; while the database refuses it for a reason that may
        pass (busy, disk full), keep it and try again, logging once (the engine keeps running)."""
        troubles = self._troubles
        while True:
            try:
                await anyio.to_thread.run_sync(self._commit, batch, limiter=self._limiter)
            except sqlite3.Error as error:
                kind = transient(error)
                if kind is None:
                    raise
                await anyio.sleep(troubles.failed(error, kind))
                if kind == "full":
                    await anyio.to_thread.run_sync(self._truncate_wal, limiter=self._limiter)
                continue
            troubles.cleared()
            return

    def _truncate_wal(self) -> None:
        """Move the write-ahead log into the file and truncate it: the log holds every
        version of the pages written since the last checkpoint, and giving its space back is
        often enough for the next write to fit on a full disk."""
        conn = self._writer
        if conn is None:
            return
        with self._lock:
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.Error as error:
                log.debug("checkpoint on a full disk failed too: %s", error)

    # ---- checkpoints -----------------------------------------------------------------------
    # Checkpoints copy the WAL back into the database file and fsync it: always in a thread.
    # Most run on a connection of their own, beside the writer, which goes on committing. But
    # the WAL restarts (is written from its start again) only once a checkpoint caught up with
    # it, which one running beside a busy writer never does: left at that, the WAL would grow
    # without end, and every commit with it. So every RESTART_EVERY-th checkpoint is the
    # writer's own, between two batches, with little left to copy.
    async def _checkpoint_beside(self) -> None:
        try:
            await anyio.to_thread.run_sync(self._checkpoint_other)
        finally:
            self._checkpointing = False

    def _checkpoint_other(self) -> None:
        with self._checkpoint_lock:
            if self._writer is None:  # closed meanwhile
                return
            try:
                if self._checkpointer is None:
                    self._checkpointer = connect(self.path)
                self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error as error:  # the next one tries again
                log.warning("%s: checkpoint failed: %s", self.path, error)

    def _checkpoint(self) -> None:
        conn = self._writer
        if conn is None:
            return
        with self._lock:
            try:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error as error:  # the next one tries again
                log.warning("%s: checkpoint failed: %s", self.path, error)

    def flush_now(self) -> None:
        """Commit everything pending from the calling thread, without the event loop: for a
        process that is going down (an unhandled error, a cancelled close)."""
        conn = self._writer
        if conn is None or self._failure is not None:
            return
        batch = self._take()
        self._keys = set()
        calls, batch.calls = batch.calls, []  # nobody is left to read their results
        try:
            with self._lock:
                # The writer thread may hold an older batch it has not committed yet: it goes
                # first, or its stale rows would land on top of these.
                inflight = self._inflight
                if inflight is not None and not inflight.committed:
                    self._commit_waiting(conn, inflight)
                    inflight.committed = True
                if batch.runs or batch.ops:
                    self._commit_waiting(conn, batch)
        except sqlite3.Error as error:
            # Going down, with no time to wait: the leases of its jobs run out and another
            # worker takes them over, as after a crash.
            log.error("%s: the last writes could not be made (%s)", self.path, error)
        for call in calls:
            call.error = DatabaseError(f"{self.path}: closed before the write was made")

    # ---- reads -----------------------------------------------------------------------------
    def read(self, fn: Callable[[sqlite3.Connection], T], *, snapshot: bool = True) -> T:
        """A point read: `fn` in the calling (the loop's) thread, in one read transaction (one
        snapshot of the file). Keep it to rows found by key.

        On the writer's connection when it is idle (it is, between two batches, unless one is
        committed or checkpointed in a thread): its page cache holds what the last batches
        wrote, where another connection would find its cache stale after every commit and
        read every page again. Else on the point reader's own connection. `snapshot=False`:
        `fn` runs one statement, which is a snapshot of its own."""
        if self._lock.acquire(blocking=False):
            try:
                conn = self._writer
                if conn is not None:
                    return self._read_on(conn, fn, snapshot)
            finally:
                self._lock.release()
        conn = self._point
        if conn is None:
            raise DatabaseError(f"{self.path}: database is not open")
        return self._read_on(conn, fn, snapshot)

    @staticmethod
    def _read_on(
        conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T], snapshot: bool
    ) -> T:
        if not snapshot:
            return fn(conn)
        conn.execute("BEGIN")
        try:
            return fn(conn)
        finally:
            conn.execute("COMMIT")

    def read_one(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Row | None:
        """One row found by key, read in the calling thread (see `read`)."""
        rows = self.read(lambda conn: conn.execute(sql, params).fetchall(), snapshot=False)
        return rows[0] if rows else None

    @property
    def reader(self) -> aiosqlite.Connection:
        if self._reader is None:
            raise DatabaseError(f"{self.path}: database is not open")
        return self._reader

    # Each scan is one call into the reader's thread that runs the statement to its end: a
    # cursor left open between calls would pin the connection's snapshot, and the other tasks'
    # reads interleaved meanwhile would miss what was committed after it opened.
    async def fetchall(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        troubles: Troubles | None = None
        while True:
            try:
                rows = list(await self.reader.execute_fetchall(sql, params))
            except sqlite3.Error as error:
                if transient(error) != "busy":
                    raise DatabaseError(self._describe(error)) from error
                troubles = troubles or Troubles(self.path, "reading it")
                await anyio.sleep(troubles.failed(error, "busy"))
                continue
            if troubles is not None:
                troubles.cleared()
            return rows

    async def fetchone(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Row | None:
        """The first row of a query that returns one (it reads them all)."""
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    def data_version(self) -> int:
        """A number that moves when another connection (another process, another engine)
        committed: asked of the writer's connection, so this process's own batches do not
        move it. Non-blocking: while a batch commits in a thread, the last number read stands."""
        conn = self._writer
        if conn is None or not self._lock.acquire(blocking=False):
            return self.known_version
        try:
            self.known_version = int(conn.execute("PRAGMA data_version").fetchone()[0])
        finally:
            self._lock.release()
        return self.known_version
