"""One SQLite file shared by the run store and the queue: schema, migrations and the writer.

Every write the engine makes goes through one writer that batches them: whatever piled up while
the previous batch was being committed is written in the next transaction, in order, in a single
hop to the writer thread. A finished run's record and its job's acknowledgement are queued
together, so they commit together. Claims ride in the same transaction as the writes.
Reads go through aiosqlite on their own connection; WAL lets them run beside the writer.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import anyio.lowlevel

log = logging.getLogger("blok.sqlite")

SCHEMA_VERSION = 3

MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        workflow_name TEXT NOT NULL,
        workflow_version TEXT NOT NULL,
        queue TEXT NOT NULL,
        job_id TEXT NOT NULL,
        status TEXT NOT NULL,
        input TEXT,
        headers TEXT,
        output TEXT,
        error TEXT,
        error_step TEXT,
        priority INTEGER NOT NULL DEFAULT 0,
        job_attempt INTEGER NOT NULL DEFAULT 1,
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        run_at REAL,
        wait_until REAL,
        replay_of TEXT,
        replay_from_step TEXT,
        parent_run_id TEXT,
        depth INTEGER NOT NULL DEFAULT 0,
        worker TEXT,
        cursor TEXT,
        state TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        failed_attempts INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX runs_created ON runs(created_at DESC);
    CREATE INDEX runs_status ON runs(status, created_at DESC);
    CREATE INDEX runs_workflow ON runs(workflow_name, created_at DESC);
    CREATE INDEX runs_queue ON runs(queue, created_at DESC);
    CREATE INDEX runs_job ON runs(job_id);
    CREATE INDEX runs_finished ON runs(finished_at) WHERE finished_at IS NOT NULL;
    CREATE INDEX runs_parent ON runs(parent_run_id) WHERE parent_run_id IS NOT NULL;

    CREATE TABLE steps (
        run_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        started_at REAL,
        finished_at REAL,
        input TEXT,
        output TEXT,
        error TEXT,
        max_attempts INTEGER NOT NULL,
        cached_from TEXT,
        wait_until REAL,
        timed_out INTEGER NOT NULL DEFAULT 0,
        tags TEXT,
        parent INTEGER,
        child_run_id TEXT,
        PRIMARY KEY (run_id, idx)
    ) WITHOUT ROWID;

    CREATE TABLE attempts (
        run_id TEXT NOT NULL,
        step_idx INTEGER NOT NULL,
        number INTEGER NOT NULL,
        status TEXT NOT NULL,
        started_at REAL NOT NULL,
        finished_at REAL,
        error TEXT,
        error_type TEXT,
        traceback TEXT,
        backoff_ms INTEGER,
        PRIMARY KEY (run_id, step_idx, number)
    ) WITHOUT ROWID;

    CREATE TABLE logs (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        step_idx INTEGER,
        ts REAL NOT NULL,
        level TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX logs_run ON logs(run_id, id);

    CREATE TABLE idempotency (
        workflow TEXT NOT NULL,
        step TEXT NOT NULL,
        key TEXT NOT NULL,
        output TEXT,
        run_id TEXT NOT NULL,
        expires_at REAL NOT NULL,
        PRIMARY KEY (workflow, step, key)
    ) WITHOUT ROWID;

    CREATE TABLE jobs (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        queue TEXT NOT NULL,
        workflow_name TEXT NOT NULL,
        payload TEXT,
        headers TEXT,
        priority INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL,
        run_at REAL,
        attempts INTEGER NOT NULL DEFAULT 0,
        max_retries INTEGER NOT NULL DEFAULT 0,
        run_id TEXT NOT NULL,
        created_at REAL NOT NULL,
        finished_at REAL,
        error TEXT,
        worker TEXT,
        lease_until REAL,
        resume INTEGER NOT NULL DEFAULT 0,
        meta TEXT
    );
    CREATE INDEX jobs_ready ON jobs(queue, priority DESC, seq)
        WHERE state IN ('waiting', 'delayed');
    CREATE INDEX jobs_leases ON jobs(lease_until) WHERE state = 'active';
    CREATE INDEX jobs_state ON jobs(queue, state);
    CREATE INDEX jobs_run ON jobs(run_id);

    CREATE TABLE control (
        id INTEGER PRIMARY KEY,
        action TEXT NOT NULL,
        run_id TEXT,
        target TEXT,
        payload TEXT,
        created_at REAL NOT NULL,
        taken_by TEXT,
        result TEXT
    );

    CREATE INDEX control_open ON control(id) WHERE taken_by IS NULL;

    CREATE TABLE workers (
        id TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        started_at REAL NOT NULL,
        heartbeat_at REAL NOT NULL
    );

    CREATE TABLE paused_queues (queue TEXT PRIMARY KEY);
    """,
    # Attach mode: `rev` orders run changes across processes (every write of a run row takes
    # max(rev) + 1 inside its transaction), so an attached console reads only what changed;
    # `worker_catalog` holds what each worker serves (queues, workflows, reload errors).
    2: """
    ALTER TABLE runs ADD COLUMN rev INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX runs_rev ON runs(rev);

    CREATE TABLE worker_catalog (
        worker TEXT PRIMARY KEY,
        queues TEXT NOT NULL,
        workflows TEXT NOT NULL,
        reload_errors TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
    # Scheduling gates (engine/gates.py): concurrency-key slots, each under its worker's lease,
    # and the open debounce windows, so that both survive a restart and are shared between
    # processes on one file.
    3: """
    CREATE TABLE concurrency_slots (
        workflow TEXT NOT NULL,
        key TEXT NOT NULL,
        run_id TEXT NOT NULL,
        worker TEXT NOT NULL,
        lease_until REAL NOT NULL,
        PRIMARY KEY (workflow, key, run_id)
    ) WITHOUT ROWID;
    CREATE INDEX concurrency_slots_run ON concurrency_slots(run_id);
    CREATE INDEX concurrency_slots_worker ON concurrency_slots(worker);

    CREATE TABLE debounce_windows (
        workflow TEXT NOT NULL,
        key TEXT NOT NULL,
        mode TEXT NOT NULL,
        run_id TEXT NOT NULL,
        job_id TEXT NOT NULL,
        created_at REAL NOT NULL,
        opened_at REAL NOT NULL,
        until REAL NOT NULL,
        PRIMARY KEY (workflow, key)
    ) WITHOUT ROWID;
    """,
}


class DatabaseError(RuntimeError):
    """The database file cannot be used: not SQLite, not writable, from a newer version."""


@dataclass
class Claim:
    """A claim riding in the writer's next transaction; `fn` runs inside it."""

    fn: Callable[[sqlite3.Connection], Any]
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Any = None
    error: BaseException | None = None


@dataclass
class _Pending:
    """A batch taken by the writer; `done` once committed (by the writer or by flush_now)."""

    batch: list[tuple[str, list[tuple[Any, ...]]]]
    ops: list[tuple[str, tuple[Any, ...]]]
    claims: list[Claim]
    done: bool = False


def _secure_parent(path: Path) -> None:
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10)
    conn.execute("PRAGMA busy_timeout = 10000")
    conn.execute("PRAGMA journal_mode = WAL")
    # NORMAL in WAL mode: a commit survives a process crash (kill -9); only an OS crash or
    # power loss may lose the last transactions. fsync on every batch would cap throughput.
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = OFF")
    return conn


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.DatabaseError as error:
        raise DatabaseError(f"{path}: not a usable SQLite database ({error})") from error
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
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
        conn.execute("ROLLBACK")
        raise


class SqliteDatabase:
    """The shared file: a batching writer on one connection, reads on an aiosqlite one."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._writer: sqlite3.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._ops: list[tuple[str, tuple[Any, ...]]] = []
        self._row_sources: list[Callable[[], list[tuple[str, list[tuple[Any, ...]]]]]] = []
        self._claims: list[Claim] = []
        self._flushers: list[anyio.Event] = []
        self._wake = anyio.Event()
        self._closing = False
        self._limiter = anyio.CapacityLimiter(1)
        self._failure: BaseException | None = None
        self._inflight: _Pending | None = None
        # A batch taken from the queues but not committed yet: a flush must wait for it too.
        self._committing = False
        self.batches = 0
        self._lock = threading.Lock()

    # ---- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        try:
            _secure_parent(self.path)
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
            self._writer = await anyio.to_thread.run_sync(_connect, self.path)
            await anyio.to_thread.run_sync(migrate, self._writer, self.path)
        except sqlite3.DatabaseError as error:
            raise DatabaseError(f"{self.path}: not a usable SQLite database ({error})") from error
        if new:
            for suffix in ("", "-wal", "-shm"):
                target = Path(f"{self.path}{suffix}")
                if target.exists():
                    target.chmod(stat.S_IRUSR | stat.S_IWUSR)
        self._reader = await aiosqlite.connect(self.path, timeout=10)
        await self._reader.execute("PRAGMA busy_timeout = 10000")
        self._reader.row_factory = sqlite3.Row

    async def close(self) -> None:
        # The engine closes the file while its task group is being cancelled: the reader's close
        # is shielded, as an aiosqlite connection left open keeps its non-daemon thread alive
        # and the process never exits.
        try:
            await self.flush()
        finally:
            self._closing = True
            # Cancelled (the process is going down) or not, what is pending gets committed.
            self.flush_now()
            if self._reader is not None:
                with anyio.CancelScope(shield=True):
                    await self._reader.close()
                self._reader = None
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    # ---- writes ----------------------------------------------------------------------------
    def write(self, sql: str, params: tuple[Any, ...]) -> None:
        """Queue one statement for the next batch."""
        self._ops.append((sql, params))
        self._wake.set()

    def add_row_source(self, source: Callable[[], list[tuple[str, list[tuple[Any, ...]]]]]) -> None:
        """A callback asked at each batch for (sql, rows) to write first (coalesced state)."""
        self._row_sources.append(source)

    def mark_dirty(self) -> None:
        self._wake.set()

    async def run_claim(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run `fn` inside the next write transaction and return its result."""
        claim = Claim(fn)
        self._claims.append(claim)
        self._wake.set()
        await claim.done.wait()
        if claim.error is not None:
            raise claim.error
        return claim.result

    async def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        if self._failure is not None:
            raise DatabaseError(f"{self.path}: the writer failed") from self._failure
        if not (
            self._ops or self._claims or self._pending_rows() or self._flushers or self._committing
        ):
            return
        done = anyio.Event()
        self._flushers.append(done)
        self._wake.set()
        await done.wait()
        if self._failure is not None:
            raise DatabaseError(f"{self.path}: the writer failed") from self._failure

    def _pending_rows(self) -> bool:
        # A source is a bound method (the store's `_rows`): its owner says whether it has rows.
        return any(
            getattr(getattr(source, "__self__", source), "pending", lambda: True)()
            for source in self._row_sources
        )

    async def writer_loop(self) -> None:
        """The one task that commits; run it in the engine's task group."""
        while True:
            await self._wake.wait()
            # One turn of the event loop first: the tasks woken with us (a finished job's
            # worker slot, the claim loop it pokes) add their claims to this batch instead of
            # waiting a whole commit for the next one.
            await anyio.lowlevel.checkpoint()
            self._wake = anyio.Event()
            batch: list[tuple[str, list[tuple[Any, ...]]]] = []
            for source in self._row_sources:
                batch.extend(source())
            ops, self._ops = self._ops, []
            claims, self._claims = self._claims, []
            flushers, self._flushers = self._flushers, []
            if batch or ops or claims:
                self._committing = True
                pending = _Pending(batch, ops, claims)
                self._inflight = pending
                try:
                    await anyio.to_thread.run_sync(self._commit, pending, limiter=self._limiter)
                except BaseException as error:
                    self._failure = error
                    for claim in claims:
                        claim.error = error
                        claim.done.set()
                    for flusher in flushers:
                        flusher.set()
                    raise
                finally:
                    self._committing = False
                self.batches += 1
            for claim in claims:
                claim.done.set()
            for flusher in flushers:
                flusher.set()

    def _commit(self, pending: _Pending) -> None:
        conn = self._writer
        assert conn is not None
        with self._lock:
            # flush_now() may have committed this batch already, to keep the order of writes.
            if not pending.done:
                self._commit_locked(conn, pending.batch, pending.ops, pending.claims)
                pending.done = True

    @staticmethod
    def _commit_locked(
        conn: sqlite3.Connection,
        batch: list[tuple[str, list[tuple[Any, ...]]]],
        ops: list[tuple[str, tuple[Any, ...]]],
        claims: list[Claim],
    ) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for sql, rows in batch:
                if rows:
                    conn.executemany(sql, rows)
            # Consecutive statements with the same SQL go in one executemany.
            i = 0
            while i < len(ops):
                sql = ops[i][0]
                j = i
                while j < len(ops) and ops[j][0] == sql:
                    j += 1
                conn.executemany(sql, [params for _, params in ops[i:j]])
                i = j
            for claim in claims:
                try:
                    claim.result = claim.fn(conn)
                except sqlite3.Error as error:
                    # A claim's own failure is its caller's; the batch still commits.
                    claim.error = error
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def flush_now(self) -> None:
        """Commit everything pending from the calling thread, without the event loop: for a
        process that is going down (an unhandled error, a cancelled close)."""
        conn = self._writer
        if conn is None or self._failure is not None:
            return
        batch: list[tuple[str, list[tuple[Any, ...]]]] = []
        for source in self._row_sources:
            batch.extend(source())
        ops, self._ops = self._ops, []
        with self._lock:
            # The writer thread may hold an older batch it has not committed yet: it goes
            # first, or its stale rows would land on top of these.
            inflight = self._inflight
            if inflight is not None and not inflight.done:
                self._commit_locked(conn, inflight.batch, inflight.ops, inflight.claims)
                inflight.done = True
            if batch or ops:
                self._commit_locked(conn, batch, ops, [])

    def write_now(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Synchronous write on the writer connection, for a dying process (crash flip)."""
        conn = self._writer
        if conn is None:
            return None
        with self._lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return result

    # ---- reads -----------------------------------------------------------------------------
    @property
    def reader(self) -> aiosqlite.Connection:
        if self._reader is None:
            raise DatabaseError(f"{self.path}: database is not open")
        return self._reader

    # Each read is one call into the reader's thread that runs the statement to its end: a
    # cursor left open between calls would pin the connection's snapshot, and the other tasks'
    # reads interleaved meanwhile would miss what was committed after it opened.
    async def fetchall(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        return list(await self.reader.execute_fetchall(sql, params))

    async def fetchone(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Row | None:
        """The first row of a query that returns one (it reads them all)."""
        rows = list(await self.reader.execute_fetchall(sql, params))
        return rows[0] if rows else None

    async def data_version(self) -> int:
        row = await self.fetchone("PRAGMA data_version")
        return int(row[0]) if row else 0
