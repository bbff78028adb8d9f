"""One PostgreSQL database: the writer that batches every write, a pool for reads and claims,
and the listener that turns NOTIFY into wake-ups.

Group commit, as the SQLite writer: every write goes to one writer task, and whatever piled up
while the previous batch was committing is written in the next transaction, in order. A lone
write does not wait for company: the writer takes its batch once the event loop has turned
twice without a new write (microseconds), gathering meanwhile what the tasks woken with it add.
A batch is one transaction and writes, in this order: the latest state of every run saved since
the last batch (one row per table however often it changed, each fenced on its job's epoch) in
one statement that also announces the batch; the queued statements (consecutive ones with the
same SQL together: job settles in one statement, others in one pipelined `executemany`); then
the functions that run inside the transaction and see its result (enqueues, fenced transitions,
slots, windows), each under a savepoint so that one's failure is its own (released with the
next one's, the last with the COMMIT). A busy worker's runs, log lines and job settles are one
statement (WRITE_BATCH), which also says which settles landed, for the ones whose submitter
waits to know (a `wait_for_job` in this process); the enqueues that came meanwhile ride in it
(WRITE_BATCH_ENQUEUE). A batch that is one statement goes alone, without BEGIN and COMMIT (one
round trip instead of three): it commits by itself, and leaves the writer's mark, its number in
`writer_marks`.

Nothing is lost when the connection drops (a server restart, `pg_terminate_backend`): the batch
is run again on a new connection, after a backoff. A batch whose COMMIT was under way when the
connection dropped is looked up by its transaction id (`pg_xact_status`) first, and a batch
whose lone statement was under way by the writer's mark, once the statement's session is gone
from the server (ended if need be), so it is never applied twice. A deadlock or a
serialization failure runs the batch again. A statement the server refuses for its data (which
retrying cannot fix) is found by running the batch again one write at a time: that write is
dropped with a logged error, the others commit.

Reads, claims and lease renewals go through a small pool beside the writer, retried the same
way. The listener holds one more connection: LISTEN on blok's channels, a keep-alive query
every few seconds, and a reconnect (with a wake-up of everything, since notifications may have
been missed) when it drops.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import asyncpg
import asyncpg.exceptions as pgerr
from asyncpg.exceptions import ConnectionDoesNotExistError

from ...clock import Clock
from ...errors import DatabaseError
from ...models import Run
from ..base import Fence
from . import sql
from .batch import (
    Batch,
    Conn,
    Fn,
    InTransaction,
    Params,
    folds,
    latest,
    run_params,
    run_rows,
    settled,
    update_jobs,
    write_batch_params,
)
from .connect import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    REFUSED_AT_CONNECT,
    WRITER,
    conflict,
    connect,
    connection_lost,
    explain,
    idle_limit,
    retryable,
    settings,
)
from .listener import Listener
from .schema import SchemaError, migrate

log = logging.getLogger("blok.postgres")
T = TypeVar("T")

POOL_SIZE = 3  # reads, claims, renewals; with the writer and the listener, 5 connections
FLUSH_NOW_TIMEOUT_S = 15.0  # flush_now in all (its connection, the writer's end, the commit)
ANSWER_S = 3.0  # a server that has not answered a connection in this long is gone (at close)
# flush_now: how long the writer's session, once ended, may take to go (within the above).
SESSION_END_WAIT_S = 5.0
HOT = (sql.INSERT_LOG, sql.UPDATE_JOB)  # what WRITE_BATCH writes besides runs
GATHER_TURNS = 50  # at most this many turns of the event loop gather a batch
CLOCK_READINGS = 3  # the server's clock is read this many times; the quickest round trip counts
CLOCK_EVERY_S = 60.0  # and read again this often: either clock may be stepped


class SessionStays(DatabaseError):
    """flush_now: the writer's session was ended and is still there; what it writes may
    still commit, so nothing is written over it."""


def _dead(conn: Conn) -> bool:
    """The connection is closed, or the pool already took it back (it died under a query)."""
    try:
        return conn.is_closed()
    except pgerr.InterfaceError:
        return True


async def _keep_session(conn: Conn) -> None:
    """The pool's reset of a connection given back: nothing to do (an open transaction is
    rolled back by asyncpg before this)."""


class Unavailable(Exception):
    """The server could not be reached before the caller's deadline."""


class PostgresDatabase:
    def __init__(
        self,
        url: str,
        location: str,
        *,
        create: bool = True,
        lease_s: float = 30.0,
        kind: str = "producer",
    ) -> None:
        self.url = url
        self.kind = kind  # "worker" or "producer", in the connections' names
        self.idle_s = idle_limit(lease_s)
        self.clock = Clock()  # the server's, as this process reads it (`read_clock`)
        self.location = location
        self.create = create
        self._writer: asyncpg.Connection | None = None
        self._pool: asyncpg.Pool | None = None
        self._closing = False
        self.gone: str | None = None  # why a close found the server gone: no goodbyes then
        # The next batch.
        self._runs: dict[str, tuple[Run, Fence | None]] = {}
        self._ops: list[tuple[str, Params]] = []
        self._settles: list[tuple[int, Callable[[bool], None]]] = []
        self._calls: list[InTransaction[Any]] = []
        self._after: list[Callable[[], None]] = []
        self._feed = False
        self._flushers: list[anyio.Event] = []
        self._wake = anyio.Event()
        self._inflight: Batch | None = None
        self._committing = False
        self.batches = 0
        self._writes = 0  # writes queued so far (the writer gathers while this grows)
        self.last_xid = 0  # of this process's last committed batch
        # The writer's mark (sql._mark): who it is, the next batch's number, and its session
        # on the server (pid, start) for ending it when its connection is lost mid-statement.
        self._writer_id = uuid.uuid4().hex
        self._marks = itertools.count(1)
        self._session: tuple[int, Any] | None = None
        # Connections of this backend, by server pid: their own notifications are not news.
        self.own_pids: set[int] = set()
        self.down_since: float | None = None  # a connection was lost, and none made since
        self.listener = Listener(url, location, self.own_pids, kind)

    # ---- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        try:
            self._writer = await connect(self.url, WRITER, self.idle_s, kind=self.kind)
        except Exception as error:
            raise explain(self.location, error) from None
        try:
            await migrate(self._writer, create=self.create)
            await self._writer.execute(sql.FORGET_OLD_MARKS)
            await self._note_session(self._writer)
            await self.read_clock(self._writer)
        except SchemaError as error:
            await self._writer.close()
            raise DatabaseError(f"{self.location}: {error}") from None
        except asyncpg.PostgresError as error:
            await self._writer.close()
            raise explain(self.location, error) from None
        self.own_pids.add(self._writer.get_server_pid())
        try:
            self._pool = await asyncpg.create_pool(
                self.url,
                min_size=1,
                max_size=POOL_SIZE,
                timeout=5.0,
                server_settings=settings("pool", self.idle_s, self.url, self.kind),
                init=self._init_pooled,
                reset=_keep_session,  # nothing here changes a session: no reset round trip
            )
        except Exception as error:
            await self._writer.close()
            raise explain(self.location, error) from None

    async def _note_session(self, writer: Conn) -> None:
        row = await writer.fetchrow(sql.SESSION)
        assert row is not None  # a session sees itself
        self._session = (row["pid"], row["backend_start"])

    async def _forget_mark(self) -> None:
        """The writer's mark row goes with it (rows of writers that could not clear theirs go
        a day later: FORGET_OLD_MARKS)."""
        writer = self._writer
        if writer is None or writer.is_closed() or writer.is_in_transaction():
            return
        try:
            with anyio.fail_after(2):
                await writer.execute(sql.FORGET_MARK, self._writer_id)
        except Exception as error:  # unanswered: the other goodbyes are not waited for either
            self.gone = "no answer to a goodbye" if isinstance(error, TimeoutError) else self.gone
            log.info("%s: left the writer's mark for later (%s)", self.location, self.gone or error)

    async def read_clock(self, conn: Conn) -> None:
        """Measure how far the server's clock is from this process's. A reading is bounded by
        its round trip; the quickest of a few is kept."""
        readings = []
        for _ in range(CLOCK_READINGS):
            sent = time.time()
            server = await conn.fetchval(f"SELECT {sql.CLOCK}")
            readings.append((time.time() - sent, sent, float(server)))
        took, sent, server = min(readings)
        self.clock.measured(sent, server, sent + took)

    async def clock_loop(self) -> None:
        """Read the server's clock again every CLOCK_EVERY_S (a reader waits out an outage)."""
        while True:
            await anyio.sleep(CLOCK_EVERY_S)
            await self.pooled(self.read_clock)

    async def _init_pooled(self, conn: Conn) -> None:
        self.own_pids.add(conn.get_server_pid())

    async def close(self) -> None:
        self._closing = True
        with anyio.CancelScope(shield=True):
            if self.gone is None:  # a server found gone gets no goodbyes: each would wait
                await self._forget_mark()
            conn = self._writer
            if conn is not None and self.gone is not None:
                conn.terminate()
            elif conn is not None and not conn.is_closed():
                try:
                    with anyio.fail_after(2):
                        await conn.close()
                except Exception:
                    conn.terminate()
            self._writer = None
            await self.listener.close(gone=self.gone is not None)
            if self._pool is not None and self.gone is not None:
                self._pool.terminate()
            elif self._pool is not None:
                try:
                    with anyio.fail_after(5):
                        await self._pool.close()
                except Exception:
                    self._pool.terminate()
            self._pool = None

    # ---- connection trouble ----------------------------------------------------------------
    def _lost(self, what: str, error: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            # A full server is not a lost one: the operator's fix is max_connections.
            full = isinstance(error, pgerr.TooManyConnectionsError)
            trouble = "the server is full" if full else "lost the database"
            cause = f"{type(error).__name__}: {error}"
            again = "retrying" if full else "reconnecting"
            log.warning(
                "%s: %s (%s) during %s; %s with backoff", self.location, trouble, cause, what, again
            )

    def _back(self) -> None:
        if self.down_since is not None:
            log.warning(
                "%s: reconnected after %.1fs", self.location, time.monotonic() - self.down_since
            )
            self.down_since = None

    # ---- writes ----------------------------------------------------------------------------
    def write(
        self,
        statement: str,
        params: Params,
        *,
        feed: bool = False,
        landed: Callable[[bool], None] | None = None,
    ) -> None:
        """Queue one statement for the next batch. `landed` (a job's settle, UPDATE_JOB only):
        told once the batch committed whether the settle moved the job on, or found it at
        another epoch."""
        if landed is not None:
            assert statement is sql.UPDATE_JOB, "only a job's settle says whether it landed"
            self._settles.append((len(self._ops), landed))
        self._ops.append((statement, params))
        self._writes += 1
        self._feed = self._feed or feed
        self._wake.set()

    def save(self, run: Run, fence: Fence | None) -> None:
        """Queue the run's rows (its latest state when the batch is taken)."""
        self._runs[run.id] = (run, fence)
        self._writes += 1
        self._wake.set()

    def call_soon(self, fn: Fn[T], then: Callable[[T | None, BaseException | None], None]) -> None:
        """Run `fn` inside the next write transaction without waiting for it; `then` is told
        its result (or its error) once the batch committed."""
        call: InTransaction[T] = InTransaction(fn, False)
        self._writes += 1
        self._calls.append(call)
        self._after.append(lambda: then(call.result, call.error))
        self._wake.set()

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call `callback` once what is queued now has committed."""
        self._after.append(callback)
        self._wake.set()

    async def transaction(
        self,
        fn: Fn[T],
        *,
        feed: bool = False,
        enqueue: tuple[list[Params], list[Params]] | None = None,
    ) -> T:
        """Run `fn` inside the next write transaction and return its result once committed.
        An error it raises is its caller's; the rest of the batch still commits. `enqueue`:
        `fn` runs ENQUEUE with these job and run rows, and nothing else (see InTransaction)."""
        call: InTransaction[T] = InTransaction(fn, feed, enqueue)
        self._writes += 1
        self._calls.append(call)
        self._wake.set()
        await call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]

    def _pending(self) -> bool:
        return bool(self._ops or self._calls or self._runs or self._after or self._committing)

    async def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        if not self._pending():
            return
        done = anyio.Event()
        self._flushers.append(done)
        self._wake.set()
        await done.wait()

    def _take(self) -> Batch:
        runs, steps, attempts = run_rows(self._runs.values())
        feed = self._feed or bool(runs) or any(call.feed for call in self._calls)
        batch = Batch(
            runs, steps, attempts, self._ops, self._calls, self._after, feed, self._settles
        )
        self._runs, self._ops, self._calls, self._after, self._feed = {}, [], [], [], False
        self._settles = []
        return batch

    async def writer_loop(self) -> None:
        """The one task that commits; run it in the backend's task group."""
        while True:
            await self._wake.wait()
            # Turns of the event loop first, as long as they bring more writes: the tasks
            # woken with us (worker slots whose job started or ended, the claim loop they
            # poke) add theirs to this batch instead of waiting a whole commit for the next
            # one. A lone write waits two idle turns of the loop, microseconds.
            quiet = 0
            for _ in range(GATHER_TURNS):
                before = self._writes
                await anyio.lowlevel.checkpoint()
                quiet = quiet + 1 if self._writes == before else 0
                if quiet == 2:
                    break
            self._wake = anyio.Event()
            batch = self._take()
            flushers, self._flushers = self._flushers, []
            if batch:
                self._committing = True
                self._inflight = batch
                try:
                    await self._commit(batch)
                finally:
                    self._committing = False
                    self._inflight = None
                self.batches += 1
            batch.tell_landed()
            for call in batch.calls:
                call.done.set()
            for callback in batch.after:
                callback()
            for flusher in flushers:
                flusher.set()

    async def _writer_connection(self) -> asyncpg.Connection:
        delay = BACKOFF_MIN_S
        while self._writer is None or self._writer.is_closed():
            try:
                self._writer = await connect(self.url, WRITER, self.idle_s, kind=self.kind)
                self.own_pids.add(self._writer.get_server_pid())
                await self._note_session(self._writer)
                self._back()
            except Exception as error:
                if isinstance(error, REFUSED_AT_CONNECT):
                    raise explain(self.location, error) from None  # one line, as pooled's
                if not connection_lost(error):
                    raise
                self._lost("a write", error)
                await anyio.sleep(delay)
                delay = min(2 * delay, BACKOFF_MAX_S)
        return self._writer

    async def _commit(self, batch: Batch) -> None:
        """Commit the batch, however many connections and tries it takes."""
        delay = BACKOFF_MIN_S
        one_by_one = False
        while not batch.committed:
            conn = await self._writer_connection()
            session = self._session
            batch.xid = None
            batch.commit_sent = False
            batch.landed = set()
            try:
                if one_by_one:
                    await self._run_one_by_one(conn, batch)
                else:
                    await self._run(conn, batch)
                batch.committed = True
                if batch.xid is not None:
                    self.last_xid = max(self.last_xid, batch.xid)
                return
            except Exception as error:
                if batch.committed:  # by flush_now, which ended this session to do it
                    conn.terminate()
                    return
                if connection_lost(error):
                    conn.terminate()
                elif not conn.is_closed() and conn.is_in_transaction():
                    try:
                        await conn.execute("ROLLBACK")
                    except Exception:
                        conn.terminate()
                if connection_lost(error):
                    self._lost("a write", error)
                    if batch.commit_sent and await self._committed_before(batch, session):
                        batch.answer_lost()
                        return
                elif conflict(error):
                    log.info("%s: batch ran into %s; running it again", self.location, error)
                elif not one_by_one:
                    log.warning(
                        "%s: the server refused a batch (%s: %s); writing it one write at a time",
                        self.location,
                        type(error).__name__,
                        error,
                    )
                    one_by_one = True
                    continue
                else:
                    raise
                batch.commit_sent = False
                await anyio.sleep(delay)
                delay = min(2 * delay, BACKOFF_MAX_S)

    async def _committed_before(self, batch: Batch, session: tuple[int, Any] | None) -> bool:
        """The connection dropped during the batch's COMMIT, or during its one statement (which
        commits by itself): did it happen?"""
        if batch.xid is None:
            assert session is not None  # noted with the connection
            return await self._marked(batch, *session)
        while True:
            try:
                status = await self.pooled(lambda c: c.fetchval(sql.XACT_STATUS, batch.xid))
            except Exception as error:
                if not retryable(error):
                    raise
                await anyio.sleep(BACKOFF_MIN_S)
                continue
            if status != "in progress":  # the server is still ending the dropped session
                return bool(status == "committed")
            await anyio.sleep(BACKOFF_MIN_S)

    async def _marked(self, batch: Batch, pid: int, started: Any) -> bool:
        """Whether the batch's one statement committed, its connection lost before the answer:
        the statement's session is ended on the server if it is still there (it may still be
        running the statement, and commit it after a look), and once it is gone, the writer's
        mark says (the statement wrote the batch's number there, in its own transaction)."""

        async def look(conn: Conn) -> tuple[bool, Any]:
            await conn.execute(sql.END_SESSION, pid, started)
            if not await conn.fetchval(sql.SESSION_GONE, pid, started):
                return False, None
            return True, await conn.fetchval(sql.WRITER_MARK, self._writer_id)

        while True:
            try:
                gone, mark = await self.pooled(look)
            except Exception as error:
                if not retryable(error):
                    raise
                gone, mark = False, None
            if gone:
                return bool(mark == batch.mark)
            await anyio.sleep(BACKOFF_MIN_S)

    def _mark_params(self, batch: Batch) -> list[Any]:
        """The parameters of the writer's mark (sql._mark) for the batch."""
        if not batch.mark:
            batch.mark = next(self._marks)
        return [self._writer_id, batch.mark]

    async def _alone(self, conn: Conn, batch: Batch, statement: str, params: list[Any]) -> Any:
        """The batch's one statement, without BEGIN and COMMIT (two round trips fewer): it
        commits by itself, and leaves the writer's mark, which says whether it did if the
        connection drops before the answer (`_marked`). Its row."""
        batch.commit_sent = True
        row = await conn.fetchrow(statement, *params, *self._mark_params(batch))
        assert row is not None  # one row, whatever was written
        return row

    async def _run(
        self, conn: Conn, batch: Batch, *, calls: bool = True, fold: bool = True
    ) -> None:
        """The batch: one statement on its own if it can be (`_alone`), otherwise in one
        transaction; `calls=False`: without its functions (one of them failed, and the rest of
        the batch is written again without it); `fold=False`: its enqueues are not folded into
        WRITE_BATCH (that statement failed)."""
        hot = all(op[0] in HOT for op in batch.ops)
        enqueues = folds(batch) if calls and fold and hot else None
        if enqueues is not None:
            await self._run_folded(conn, batch, *enqueues)
            return
        if hot and (batch.runs or batch.ops) and not (calls and batch.calls):
            # The usual batch of a busy worker (runs, their lines, their jobs' settles).
            row = await self._alone(conn, batch, sql.WRITE_BATCH, write_batch_params(batch))
            batch.xid = row["x"]
            batch.landed |= settled(row["ids"], row["epochs"])
            return
        await conn.execute("BEGIN")
        if not (batch.runs or batch.ops) or not hot:
            if batch.runs:
                batch.xid = await conn.fetchval(sql.WRITE_RUNS, *run_params(batch))
            ops = batch.ops
        else:
            # The usual batch of a busy worker (runs, their lines, their jobs' settles) in one
            # statement; functions in the transaction (an enqueue) come after it, as they
            # would after those writes one by one.
            row = await conn.fetchrow(
                sql.WRITE_BATCH, *write_batch_params(batch), *self._mark_params(batch)
            )
            assert row is not None  # one row, whatever was written
            batch.xid = row["x"]
            batch.landed |= settled(row["ids"], row["epochs"])
            ops = []
        i = 0
        while i < len(ops):
            statement = ops[i][0]
            j = i
            while j < len(ops) and ops[j][0] == statement:
                j += 1
            if statement is sql.UPDATE_JOB:
                batch.landed |= await update_jobs(conn, [params for _, params in ops[i:j]])
            elif j - i == 1:
                await conn.execute(statement, *ops[i][1])
            else:
                await conn.executemany(statement, [params for _, params in ops[i:j]])
            i = j
        if calls and len(batch.calls) == 1:
            # A lone function (a batch's usual enqueue) needs no savepoint, a round trip: on
            # a failure of its own, the rest of the batch is written again without it.
            [call] = batch.calls
            call.error = None
            try:
                call.result = await call.fn(conn)
            except Exception as error:
                if retryable(error):
                    raise
                await conn.execute("ROLLBACK")
                call.error = error
                if not (batch.runs or batch.ops):
                    batch.committed = True
                    return
                batch.xid = None
                batch.landed = set()
                await self._run(conn, batch, calls=False)
                return
            await self._finish(conn, batch)
            return
        held = await self._calls_in_savepoints(conn, batch.calls if calls else [])
        await self._finish(conn, batch, release=held)

    async def _run_folded(
        self, conn: Conn, batch: Batch, job_rows: list[Params], run_rows_: list[Params]
    ) -> None:
        """The batch and its enqueues (their rows, from `folds`) in one statement on its own
        (WRITE_BATCH_ENQUEUE, or ENQUEUE_ANNOUNCED when enqueues are all there is; `_alone`):
        one round trip, against BEGIN, WRITE_BATCH, then a savepoint and an ENQUEUE each, and
        COMMIT. If the statement fails for its data, the batch is run again the usual way,
        which finds whose failure it was."""
        statement, params = sql.ENQUEUE_ANNOUNCED, []
        if batch.runs or batch.ops:
            statement, params = sql.WRITE_BATCH_ENQUEUE, write_batch_params(batch)
        try:
            row = await self._alone(conn, batch, statement, [*params, job_rows, run_rows_])
        except Exception as error:
            if retryable(error):
                raise
            batch.commit_sent = False  # it did not commit: the server refused it
            await self._run(conn, batch, fold=False)
            return
        batch.xid = row["x"]
        batch.landed |= settled(row["ids"], row["epochs"])
        added = set(row["added"])
        for call in batch.calls:
            assert call.enqueue is not None
            call.error = None
            call.result = [job[0] for job in call.enqueue[0] if job[0] in added]

    async def _calls_in_savepoints(self, conn: Conn, calls: list[InTransaction[Any]]) -> bool:
        """Each call under a savepoint, so that its failure is its own; whether the last
        savepoint is still open (the COMMIT releases it). A savepoint is released with the
        next one, in the same round trip."""
        held = False
        for call in calls:
            call.error = None
            await conn.execute(
                "RELEASE SAVEPOINT call; SAVEPOINT call" if held else "SAVEPOINT call"
            )
            held = True
            try:
                call.result = await call.fn(conn)
            except Exception as error:
                if retryable(error):
                    raise
                # A call's own failure is its caller's: its writes are undone, the batch goes on.
                await conn.execute("ROLLBACK TO SAVEPOINT call")
                call.error = error
        return held

    async def _finish(self, conn: Conn, batch: Batch, *, release: bool = False) -> None:
        """Announce the batch (other processes' change tokens move; with runs or log lines,
        the payload is the transaction's id, for the feed's readers), then COMMIT, after
        releasing the savepoint `call` if it is still open (`release`). (A batch with runs was
        announced by the statement that wrote them.)"""
        if batch.xid is None:
            channel = sql.RUNS_CHANNEL if batch.feed else sql.SHARED_CHANNEL
            batch.xid = await conn.fetchval(sql.ANNOUNCE, channel)
        batch.commit_sent = True
        await conn.execute("RELEASE SAVEPOINT call; COMMIT" if release else "COMMIT")

    async def _run_one_by_one(self, conn: Conn, batch: Batch) -> None:
        """The batch again, each write under its own savepoint: a write the server refuses for
        its data is dropped with a logged error instead of taking the others with it."""
        batch.xid = None
        await conn.execute("BEGIN")
        items: list[tuple[str, str, list[Params]]] = []
        items += [("run", sql.UPSERT_RUN, [row]) for row in batch.runs]
        items += [("step", sql.UPSERT_STEP, [row]) for row in batch.steps]
        items += [("attempt", sql.UPSERT_ATTEMPT, [row]) for row in batch.attempts]
        items += [("statement", statement, [params]) for statement, params in batch.ops]
        for what, statement, rows in items:
            await conn.execute("SAVEPOINT item")
            try:
                if statement is sql.UPDATE_JOB:
                    batch.landed |= await update_jobs(conn, rows)
                else:
                    await conn.executemany(statement, rows)
            except Exception as error:
                if retryable(error):
                    raise
                await conn.execute("ROLLBACK TO SAVEPOINT item")
                log.error(
                    "%s: the server refused a %s write, which is dropped: %s: %s (%s)",
                    self.location,
                    what,
                    type(error).__name__,
                    error,
                    str(rows[0][0])[:80],
                )
            await conn.execute("RELEASE SAVEPOINT item")
        held = await self._calls_in_savepoints(conn, batch.calls)
        await self._finish(conn, batch, release=held)

    # ---- reads and single statements: the pool ---------------------------------------------
    async def pooled(self, fn: Fn[T], *, deadline: float | None = None) -> T:
        """`fn` on a pooled connection, tried again (after a backoff) when the connection
        drops or the statement loses a race; `deadline` (time.monotonic): raise `Unavailable`
        rather than wait past it."""
        delay = BACKOFF_MIN_S
        while True:
            if self._pool is None:
                raise DatabaseError(f"{self.location}: the database is not open")
            try:
                async with self._pool.acquire() as conn:
                    try:
                        result = await fn(conn)
                    except Exception as error:
                        if _dead(conn) or isinstance(error, pgerr.InternalClientError):
                            # The session was ended while the connection sat in the pool
                            # (asyncpg may then be out of step with it): never reuse it.
                            with suppress(pgerr.InterfaceError):
                                conn.terminate()
                            raise ConnectionDoesNotExistError(str(error)) from error
                        raise
                self._back()
                return result
            except Exception as error:
                if isinstance(error, REFUSED_AT_CONNECT):
                    # The pool could not open a connection for a reason waiting does not mend
                    # (the database was dropped, the role or its password changed): one line
                    # to the user, not the driver's traceback.
                    raise explain(self.location, error) from None
                if self._closing or not retryable(error):
                    raise
                if connection_lost(error):
                    self._lost("a read", error)
            if deadline is not None and time.monotonic() + delay > deadline:
                raise Unavailable(self.location)
            await anyio.sleep(delay)
            delay = min(2 * delay, BACKOFF_MAX_S)

    async def fetch(self, statement: str, *args: Any) -> list[asyncpg.Record]:
        return await self.pooled(lambda c: c.fetch(statement, *args))

    async def fetchrow(self, statement: str, *args: Any) -> asyncpg.Record | None:
        return await self.pooled(lambda c: c.fetchrow(statement, *args))

    async def fetchval(self, statement: str, *args: Any) -> Any:
        return await self.pooled(lambda c: c.fetchval(statement, *args))

    # ---- a process going down --------------------------------------------------------------
    def flush_now(self, unreachable: str | None = None) -> None:
        """Commit what is pending from the calling thread, without the event loop: for a
        process going down on an unhandled error (the loop is blocked meanwhile), and a close
        whose writer could not. `unreachable`: why the server cannot take it (nothing tried).

        asyncpg connections belong to the event loop, so this opens a fresh connection from a
        thread of its own. A batch the writer was committing goes first, or its older rows
        would land on top of these: its session is ended (`pg_terminate_backend`, which rolls
        it back unless its COMMIT got through, which `pg_xact_status` tells) and the batch is
        committed again here, with what is pending, in one transaction. Functions queued
        after it (an enqueue, an operator's transition) are refused: nobody is left to wait for
        their results. Gives up when its connection is refused or not made within ANSWER_S,
        after FLUSH_NOW_TIMEOUT_S, or when the writer's session is still there SESSION_END_WAIT_S
        after it was ended (its batch could commit after any look at it), saying what was lost;
        the jobs' leases then run out, and the workers that take them over record the runs."""
        if self._pool is None:
            return
        inflight = self._inflight if self._inflight and not self._inflight.committed else None
        pending = self._take()
        dropped, pending.calls = pending.calls, []
        batches = [b for b in (inflight, pending) if b]
        # The writer's session on the server, to end if a batch was in flight on it.
        session = self._session if inflight and self._writer is not None else None
        outcome: dict[str, BaseException | None] = {"error": None}
        written: list[Batch] = []  # what _flush_fresh wrote, in one transaction
        if batches and unreachable is None:

            def commit() -> None:
                try:
                    written.extend(asyncio.run(self._flush_fresh(batches, session)))
                except BaseException as error:
                    outcome["error"] = error

            thread = threading.Thread(target=commit, name="blok-flush-now", daemon=True)
            thread.start()
            thread.join(FLUSH_NOW_TIMEOUT_S)
            if thread.is_alive():
                unreachable = f"not done within {FLUSH_NOW_TIMEOUT_S:g}s"
            elif (error := outcome["error"]) is not None:  # asyncio's timeout has no text
                unreachable = str(error) or f"no answer within {ANSWER_S:g}s"
            else:
                for batch in batches:
                    batch.committed = True
                for merged in written:  # here, in the event loop's thread, as the writer does
                    merged.tell_landed()
        if batches and unreachable is not None:
            # A batch left to a session that would not end may still land: not counted.
            left = isinstance(outcome["error"], SessionStays)
            lost = [b for b in batches if not (left and b is inflight)]
            runs = sorted({str(row[0]) for b in lost for row in b.runs})
            log.error(
                "%s: could not commit %d pending write(s) before going down%s: %s",
                self.location,
                sum(len(b.runs) + len(b.ops) + len(b.calls) for b in lost),
                f" (the latest state of run(s) {', '.join(runs)})" if runs else "",
                unreachable,
            )
        for call in dropped:
            call.error = DatabaseError(f"{self.location}: closed before the write was made")
            call.done.set()
        for callback in pending.after:
            callback()

    async def _flush_fresh(
        self, batches: list[Batch], session: tuple[int, Any] | None
    ) -> list[Batch]:
        """The batches in one transaction on a fresh connection (see `flush_now`); what was
        written (one batch, or none if nothing was left to write)."""
        conn = await asyncio.wait_for(connect(self.url, "flush", kind=self.kind), ANSWER_S)
        try:
            inflight_done = False
            if session is not None:
                await conn.execute(sql.END_SESSION, *session)
                deadline = time.monotonic() + SESSION_END_WAIT_S
                while not await conn.fetchval(sql.SESSION_GONE, *session):
                    if time.monotonic() > deadline:
                        # Its batch may still commit after any look at it: writing it again
                        # here could apply it twice, and land its older rows on these.
                        raise SessionStays(
                            f"the writer's session (pid {session[0]}) did not end within "
                            f"{SESSION_END_WAIT_S:g} s, so what it was writing may still "
                            "commit; nothing is written over it"
                        )
                    await asyncio.sleep(0.02)
                first = batches[0]
                if first.commit_sent and first.xid is not None:
                    status = await conn.fetchval(sql.XACT_STATUS, first.xid)
                    inflight_done = status == "committed"
                elif first.commit_sent:  # its one statement (`_alone`): the mark says
                    mark = await conn.fetchval(sql.WRITER_MARK, self._writer_id)
                    inflight_done = mark == first.mark
            todo = batches[1:] if inflight_done else batches
            ops: list[tuple[str, Params]] = []
            settles: list[tuple[int, Callable[[bool], None]]] = []
            for b in todo:
                settles += [(len(ops) + i, landed) for i, landed in b.settles]
                ops += b.ops
            merged = Batch(
                latest([r for b in todo for r in b.runs], 1),
                latest([r for b in todo for r in b.steps], 2),
                latest([r for b in todo for r in b.attempts], 3),
                ops,
                [c for b in todo for c in b.calls],
                [],
                any(b.feed for b in todo),
                settles,
            )
            if not merged:
                return []
            await self._run(conn, merged)
            return [merged]
        finally:
            await conn.close()
