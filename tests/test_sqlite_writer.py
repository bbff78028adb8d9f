"""The SQLite writer: group commit without a timer, commits in the event loop's thread unless
another process holds the write lock (then in a thread that waits for it), checkpoints that let
the WAL restart, and point reads that see this process's queued writes."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import closing
from functools import partial
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from support import Turns, all_tasks_blocked

from engine.backends.sqlite import SqliteBackend, connection
from engine.backends.sqlite.db import (
    CHECKPOINT_EVERY,
    INLINE_WEIGHT,
    PAGE_SIZE,
    RESTART_EVERY,
    SqliteDatabase,
)
from engine.backends.sqlite.refusals import BRIEF_WAITS_S, begin_briefly
from engine.errors import DatabaseError
from engine.worker import LoopTurn

pytestmark = pytest.mark.anyio


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[SqliteBackend]:
    async with SqliteBackend(tmp_path / "blok.db") as opened:
        opened.db.write("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)", ())
        await opened.db.flush()
        yield opened


def insert(value: str, rows: int = 1) -> object:
    def fn(conn: sqlite3.Connection) -> int:
        conn.executemany("INSERT INTO t (v) VALUES (?)", [(value,)] * rows)
        return rows

    return fn


def count(path: Path) -> int:
    with closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("SELECT count(*) FROM t").fetchone()[0])


async def test_concurrent_callers_share_one_commit_made_in_the_loop(
    backend: SqliteBackend,
) -> None:
    db = backend.db
    batches, in_thread = db.batches, db.batches_in_thread

    async with anyio.create_task_group() as group:
        for n in range(8):
            group.start_soon(db.transaction, insert(f"caller {n}"))

    assert db.batches - batches == 1
    assert db.batches_in_thread == in_thread
    assert count(db.path) == 8


async def test_a_late_call_runs_after_the_other_calls_of_its_batch(
    backend: SqliteBackend,
) -> None:
    """A claim's look is late: it finds what the adds of its own transaction wrote, whichever
    was asked for first."""
    db = backend.db
    ran: list[str] = []

    def noted(name: str) -> Callable[[sqlite3.Connection], None]:
        def fn(conn: sqlite3.Connection) -> None:
            ran.append(name)

        return fn

    batches = db.batches
    async with anyio.create_task_group() as group:
        group.start_soon(partial(db.transaction, noted("look"), late=True))
        group.start_soon(db.transaction, noted("add 1"))
        group.start_soon(db.transaction, noted("add 2"))
    assert db.batches - batches == 1
    assert ran == ["add 1", "add 2", "look"]


async def test_a_lone_write_is_committed_without_a_thread(backend: SqliteBackend) -> None:
    db = backend.db
    batches, in_thread = db.batches, db.batches_in_thread

    assert await db.transaction(insert("alone")) == 1

    assert (db.batches - batches, db.batches_in_thread - in_thread) == (1, 0)
    assert count(db.path) == 1


async def test_a_heavy_batch_is_committed_in_a_thread(backend: SqliteBackend) -> None:
    db = backend.db
    in_thread = db.batches_in_thread

    await db.transaction(insert("bulk", INLINE_WEIGHT + 1), weight=INLINE_WEIGHT + 1)

    assert db.batches_in_thread == in_thread + 1
    assert count(db.path) == INLINE_WEIGHT + 1


async def while_another_process_holds_the_lock(
    db: SqliteDatabase, write: Callable[[], Awaitable[object]]
) -> None:
    """Run `write` while another process's write transaction holds the lock: it must wait for
    the lock in the writer's thread (the loop runs on meanwhile), and end once the other
    transaction commits."""
    other = sqlite3.connect(db.path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process's write transaction
    other.execute("INSERT INTO t (v) VALUES ('other')")
    in_thread = db.batches_in_thread
    done = anyio.Event()

    async def waited() -> None:
        await write()
        done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(waited)
        with anyio.fail_after(5):
            while db.batches_in_thread == in_thread:  # the loop gave up on the lock
                await anyio.lowlevel.checkpoint()
        await all_tasks_blocked()
        assert not done.is_set()  # waiting for the lock, in a thread: the loop runs on
        other.execute("COMMIT")
        with anyio.fail_after(5):
            await done.wait()
    other.close()


async def test_a_write_that_finds_the_lock_taken_waits_for_it_in_a_thread(
    backend: SqliteBackend,
) -> None:
    db = backend.db

    await while_another_process_holds_the_lock(db, lambda: db.transaction(insert("mine")))

    assert count(db.path) == 2


def test_a_lock_held_for_a_moment_is_waited_for_in_the_loop(tmp_path: Path) -> None:
    """Another process's transaction that ends within BRIEF_WAITS_S is waited for where the
    writer is (a hop to a thread and back costs more than it lasts); one that goes on longer is
    left to the thread, after one try per step."""
    path = tmp_path / "blok.db"
    with (
        closing(sqlite3.connect(path, isolation_level=None, timeout=0)) as mine,
        closing(sqlite3.connect(path, isolation_level=None, timeout=0)) as other,
    ):
        mine.execute("PRAGMA journal_mode = WAL")
        tries: list[str] = []
        mine.set_trace_callback(tries.append)
        other.execute("BEGIN IMMEDIATE")
        assert not begin_briefly(mine)  # held all along
        assert tries == ["BEGIN IMMEDIATE"] * (len(BRIEF_WAITS_S) + 1)
        other.execute("COMMIT")

        def ends_at_the_second_try(statement: str) -> None:
            tries.append(statement)
            if len(tries) == 2:
                other.execute("COMMIT")  # the other process's transaction ends meanwhile

        tries.clear()
        other.execute("BEGIN IMMEDIATE")
        mine.set_trace_callback(ends_at_the_second_try)
        assert begin_briefly(mine)
        assert tries == ["BEGIN IMMEDIATE"] * 2 and mine.in_transaction
        mine.execute("ROLLBACK")


def wal_salts(database: Path) -> bytes:
    """The WAL header's salts: SQLite draws new ones each time it restarts the log."""
    with open(f"{database}-wal", "rb") as wal:
        return wal.read(24)[16:24]


async def test_checkpoints_let_the_wal_restart(backend: SqliteBackend) -> None:
    db = backend.db
    await db.transaction(insert("first"))
    first = wal_salts(db.path)

    # Checkpoints beside the writer may take longer than many tiny commits: the writer's own
    # comes after RESTART_EVERY of them, whenever that is. Without it the WAL never restarts.
    commits = 1
    with anyio.fail_after(60):
        while wal_salts(db.path) == first:
            assert commits < 20 * RESTART_EVERY * CHECKPOINT_EVERY, "the WAL never restarted"
            await db.transaction(insert(f"row {commits}"))
            commits += 1
    assert count(db.path) == commits


async def test_the_wal_a_big_transaction_grew_is_cut_back_once_checkpointed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After a purge of 90,000 runs the WAL stayed at 147 MB beside a 130 MB file while the
    # worker ran: twice the disk, for as long as it ran.
    limit = 256 * 1024
    monkeypatch.setattr(connection, "WAL_SIZE_LIMIT", limit)
    async with SqliteBackend(tmp_path / "blok.db") as opened:
        db = opened.db
        db.write("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)", ())
        await db.flush()
        await db.transaction(insert("x" * 1000, rows=4000))  # some 4 MB of WAL at once
        wal = Path(f"{db.path}-wal")
        assert wal.stat().st_size > 8 * limit
        commits = 0
        with anyio.fail_after(60):
            while wal.stat().st_size > limit:  # the writer's checkpoints restart the WAL
                assert commits < 20 * RESTART_EVERY * CHECKPOINT_EVERY, "the WAL stayed big"
                await db.transaction(insert(f"row {commits}"))
                commits += 1


async def test_a_point_read_sees_this_processes_queued_write(tmp_path: Path) -> None:
    db = SqliteDatabase(tmp_path / "blok.db")
    await db.open()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(db.writer_loop)
            db.write("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)", ())
            await db.flush()
            db.write("INSERT INTO t (id, v) VALUES (1, 'queued')", (), key="t:1")
            await db.flush_for("t:1")
            assert db.read_one("SELECT v FROM t WHERE id = 1") is not None
            group.cancel_scope.cancel()
    finally:
        await db.close()


def page_size(path: Path) -> int:
    with closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("PRAGMA page_size").fetchone()[0])


async def test_a_new_database_gets_small_pages(tmp_path: Path) -> None:
    # Every commit appends each page it changed to the WAL, whole: small pages are what keep
    # a job's commits small (see PAGE_SIZE).
    async with SqliteBackend(tmp_path / "blok.db"):
        pass
    assert page_size(tmp_path / "blok.db") == PAGE_SIZE == 1024


async def test_a_database_made_with_other_pages_keeps_them_and_works(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    async with SqliteBackend(path) as opened:  # made, then converted as an older blok made it
        pass
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("PRAGMA page_size = 4096")
        conn.execute("VACUUM")
        conn.execute("PRAGMA journal_mode = WAL")
    assert page_size(path) == 4096
    async with SqliteBackend(path) as opened:
        opened.db.write("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)", ())
        await opened.db.transaction(insert("kept"))
    assert page_size(path) == 4096 and count(path) == 1


async def test_a_call_that_fails_alone_leaves_the_rest_of_its_batch_committed(
    backend: SqliteBackend,
) -> None:
    """Calls share one transaction: one that fails for its own reason (here: after writing
    a row) gets its error, and its writes are undone, while the calls and writes queued with
    it commit."""
    db = backend.db
    path = db.path
    batches = db.batches

    def write_then_fail(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO t (v) VALUES ('undone')")
        raise ValueError("this call's own mistake")

    outcomes: dict[str, object] = {}

    async def call(name: str, fn: object) -> None:
        try:
            outcomes[name] = await db.transaction(fn)  # type: ignore[arg-type]
        except ValueError as error:
            outcomes[name] = error

    db.write("INSERT INTO t (v) VALUES (?)", ("queued write",))
    async with anyio.create_task_group() as group:
        group.start_soon(call, "before", insert("before"))
        group.start_soon(call, "failing", write_then_fail)
        group.start_soon(call, "after", insert("after", rows=2))

    assert db.batches - batches == 1  # one batch, whatever was tried inside it
    assert outcomes["before"] == 1 and outcomes["after"] == 2
    assert isinstance(outcomes["failing"], ValueError)
    with closing(sqlite3.connect(path)) as conn:
        values = sorted(v for (v,) in conn.execute("SELECT v FROM t"))
    assert values == ["after", "after", "before", "queued write"]


async def test_a_lone_call_that_fails_gets_its_error_and_writes_nothing(
    backend: SqliteBackend,
) -> None:
    db = backend.db
    await db.flush()

    def write_then_fail(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO t (v) VALUES ('undone')")
        raise ValueError("this call's own mistake")

    with pytest.raises(ValueError, match="own mistake"):
        await db.transaction(write_then_fail)
    await db.transaction(insert("next"))  # the writer goes on
    assert count(db.path) == 1


async def test_a_flush_that_finds_the_writer_idle_commits_at_once(backend: SqliteBackend) -> None:
    # A slot starting a job claimed ahead flushes its run's start before the job's code runs:
    # with the writer idle it commits there and then, without waiting for the writer's task
    # and then for its own turn of the loop (engine/backends/sqlite/db.py _commit_inline).
    db = backend.db
    batches, in_thread = db.batches, db.batches_in_thread
    db.write("INSERT INTO t (v) VALUES ('started')", ())
    turn = LoopTurn()  # the loop goes round: a callback queued now has run

    await db.flush()

    assert not turn.came
    assert (db.batches - batches, db.batches_in_thread - in_thread) == (1, 0)
    assert count(db.path) == 1


async def test_a_flush_that_finds_the_lock_taken_leaves_its_writes_to_the_writer(
    backend: SqliteBackend,
) -> None:
    db = backend.db
    db.write("INSERT INTO t (v) VALUES ('mine')", ())

    await while_another_process_holds_the_lock(db, db.flush)

    assert count(db.path) == 2  # the write the flush could not make was the writer's


async def test_a_flush_whose_batch_fails_gets_the_error(tmp_path: Path) -> None:
    # As when the writer commits it: the error reaches whoever waits, and the writer ends.
    db = SqliteDatabase(tmp_path / "blok.db")
    await db.open()
    try:
        with pytest.raises(BaseExceptionGroup) as raised:
            async with anyio.create_task_group() as group:
                group.start_soon(db.writer_loop)
                db.write("INSERT INTO missing (v) VALUES (1)", ())
                with pytest.raises(DatabaseError, match="the writer failed"):
                    await db.flush()
        assert raised.group_contains(DatabaseError, match="no such table: missing")
    finally:
        await db.close()


async def test_a_call_awaited_soon_is_committed_by_its_caller_after_one_turn_of_the_loop(
    backend: SqliteBackend,
) -> None:
    # A producer's lone `enqueue` waited for the writer's task to wake, take its own turn and
    # commit, and then for its own turn after that; it now commits the batch itself once the
    # loop has gone round once (for callers woken with it to join), when the writer is idle.
    db = backend.db
    await db.flush()
    batches = db.batches
    turns = Turns()

    assert await db.outcome(db.call_soon(insert("alone")), soon=True) == 1

    assert turns.count <= 1
    assert db.batches - batches == 1
    assert count(db.path) == 1


async def test_callers_in_one_turn_share_a_commit_made_by_one_of_them(
    backend: SqliteBackend,
) -> None:
    db = backend.db
    await db.flush()
    batches = db.batches

    async def caller(i: int) -> None:
        await db.outcome(db.call_soon(insert(f"caller {i}")), soon=True)

    async with anyio.create_task_group() as group:
        for i in range(8):
            group.start_soon(caller, i)
    assert db.batches - batches == 1
    assert count(db.path) == 8
