"""The PostgreSQL writer and its connections: group commit, a lone write not kept waiting, and
nothing lost when a connection drops (pg_terminate_backend: between batches, in the middle of
one, during its COMMIT; a relay cut after a lone statement committed), nothing written twice, a
deadlock run again, a process going down (flush_now), a restart of the server."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import suppress
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest
from pg import NO_DRIVER
from support import until

asyncpg = pytest.importorskip("asyncpg", reason=NO_DRIVER)

from backends.builders import QUEUE, a_run, job_and_run, line

from engine import Engine, RunStatus, Step, WorkerTrigger, Workflow
from engine.backends import open_backend
from engine.backends.base import JobUpdate, Transition
from engine.backends.postgres import PostgresBackend
from engine.backends.postgres import db as pg_db
from engine.backends.postgres import listener as pg_listener
from engine.backends.postgres import sql as pg_sql
from engine.filters import RunFilter
from engine.models import JobState

from .conftest import connect
from .server import private_server

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _writer_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="blok.postgres")


async def terminate(url: str, role: str) -> int:
    """End blok's `role` sessions on the database (as an operator would); how many."""
    conn = await connect(url)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name LIKE $1",
                f"blok-tui %/{role} %",
            )
        )
    finally:
        await conn.close()


async def count(url: str, statement: str, *args: Any) -> int:
    conn = await connect(url)
    try:
        return int(await conn.fetchval(statement, *args))
    finally:
        await conn.close()


def hold_row_lock(url: str, job_id: str, seconds: float) -> threading.Event:
    """Lock a job's row from another thread (another client) for `seconds`; the event is set
    once the lock is held. The test's event loop may be blocked meanwhile."""
    held = threading.Event()

    async def hold() -> None:
        conn = await connect(url)
        try:
            async with conn.transaction():
                await conn.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", job_id)
                held.set()
                await asyncio.sleep(seconds)
        finally:
            await conn.close()

    threading.Thread(target=asyncio.run, args=(hold(),), daemon=True).start()
    return held


async def test_many_small_writes_ride_one_transaction(pg_schema: str) -> None:
    async with open_backend(pg_schema) as backend:
        assert isinstance(backend, PostgresBackend)
        before = backend.db.batches
        runs = [a_run() for _ in range(300)]

        async def write(n: int) -> None:
            backend.runs.save_run(runs[n])
            backend.runs.add_log(runs[n].id, line(f"line {n}"))
            await backend.runs.flush()

        async with anyio.create_task_group() as tg:
            for n in range(len(runs)):
                tg.start_soon(write, n)
        assert backend.db.batches - before <= 3
    assert await count(pg_schema, "SELECT count(*) FROM runs") == 300
    assert await count(pg_schema, "SELECT count(*) FROM logs") == 300


async def test_a_lone_write_is_not_kept_waiting(pg_schema: str) -> None:
    async with open_backend(pg_schema) as backend:
        assert isinstance(backend, PostgresBackend)
        before = backend.db.batches
        started = time.monotonic()
        for _ in range(20):
            backend.runs.save_run(a_run())
            await backend.runs.flush()
        elapsed = time.monotonic() - started
        assert backend.db.batches - before == 20  # each committed at once, alone
        assert elapsed < 2.0, f"20 lone writes took {elapsed:.2f}s"


@pytest.mark.parametrize("batch", ["one statement", "statements", "one write at a time"])
async def test_settles_say_whether_they_landed_whatever_way_their_batch_is_written(
    pg_schema: str, batch: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A settle whose submitter waits for it (a `wait_for_job` here) rides in the batch like
    any other; the batch tells which jobs it moved on. The batch is one statement (runs, lines
    and settles; a function in the transaction, here an enqueue, after it), or one statement a
    kind when it holds a write of another kind, or, once the server refused one of its writes,
    one write at a time."""
    async with open_backend(pg_schema) as backend:
        queue = backend.queue("postgres")
        made = [job_and_run() for _ in range(2)]
        await queue.add([job for job, _ in made], [run for _, run in made])
        [(job, run), (other, _)] = made
        [lost] = await queue.claim(QUEUE, 1, "w1", 0.05)
        await anyio.sleep(0.1)  # the lease runs out
        taken = {c.job.id: c for c in await queue.claim(QUEUE, 2, "w2", 30.0)}
        told: list[tuple[str, bool]] = []
        batches = backend.db.batches

        def settle(name: str, holder: Any, job_id: str) -> None:
            finished = run.model_copy(update={"status": RunStatus.COMPLETED})
            transition = Transition(
                job_id, holder.job.epoch, JobUpdate(state=JobState.COMPLETED), (finished,)
            )
            transition.landed = lambda landed: told.append((name, landed))
            queue.submit(transition)

        settle("lost", lost, job.id)
        settle("taken", taken[job.id], job.id)
        settle("other", taken[other.id], other.id)
        if batch == "statements":
            backend.shared.release_slot(run.id)  # a write WRITE_BATCH does not hold
        elif batch == "one write at a time":
            backend.runs.add_log(run.id, line("out of range", step=2**40))  # refused
        late, late_run = job_and_run()
        enqueue = queue.add([late], [late_run])  # rides in the same batch
        added = await enqueue

        assert told == [("lost", False), ("taken", True), ("other", True)]
        assert added == [late.id]
        assert backend.db.batches - batches == 1
        refused = [r for r in caplog.records if "one write at a time" in r.getMessage()]
        assert len(refused) == (batch == "one write at a time")
        for job_id in (job.id, other.id):
            stored = await queue.get_job(job_id)
            assert stored is not None and stored.state is JobState.COMPLETED


@pytest.mark.parametrize("failing_at", [0, 1, 2])
async def test_a_call_that_fails_leaves_the_rest_of_its_batch_committed(
    pg_schema: str, failing_at: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Functions in one write transaction each run under a savepoint: one that fails for its
    own reason (here: after writing a row) gets its error, and its write is undone, while the
    calls and writes queued with it commit, wherever it falls among them (the savepoint of
    one call is released with the next's, the last with the COMMIT)."""
    async with open_backend(pg_schema) as backend:
        assert isinstance(backend, PostgresBackend)
        db = backend.db
        await db.fetch("CREATE TABLE t (v text)")  # through the pool: committed at once
        batches = db.batches

        def call(name: str) -> Any:
            async def fn(conn: Any) -> str:
                await conn.execute("INSERT INTO t (v) VALUES ($1)", name)
                if name == f"call {failing_at}":
                    raise ValueError("this call's own mistake")
                return name

            return fn

        outcomes: dict[str, object] = {}

        async def run(name: str) -> None:
            try:
                outcomes[name] = await db.transaction(call(name))
            except ValueError as error:
                outcomes[name] = error

        backend.runs.save_run(saved := a_run())
        async with anyio.create_task_group() as group:
            for n in range(3):
                group.start_soon(run, f"call {n}")

        assert db.batches - batches == 1  # one batch, whatever was tried inside it
        # ... in one try: not refused and written again one write at a time.
        assert not [r for r in caplog.records if "one write at a time" in r.getMessage()]
        names = [f"call {n}" for n in range(3)]
        assert all(isinstance(outcomes[n], ValueError) is (n == names[failing_at]) for n in names)
        kept = [n for n in names if n != names[failing_at]]
        assert sorted(r[0] for r in await db.fetch("SELECT v FROM t")) == kept
        assert [r.id for r in await backend.runs.runs_by_id([saved.id])] == [saved.id]


async def test_a_lone_call_that_fails_leaves_the_writes_of_its_batch_committed(
    pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch's one function runs without a savepoint (a round trip fewer for the usual
    enqueue): when it fails for its own reason, after writing a row, the run saved with it is
    written again without it and commits; the function gets its error and its row is gone."""
    async with open_backend(pg_schema) as backend:
        assert isinstance(backend, PostgresBackend)
        db = backend.db
        await db.fetch("CREATE TABLE t (v text)")
        batches = db.batches

        async def fn(conn: Any) -> str:
            await conn.execute("INSERT INTO t (v) VALUES ('lone')")
            raise ValueError("this call's own mistake")

        backend.runs.save_run(saved := a_run())
        with pytest.raises(ValueError, match="own mistake"):
            await db.transaction(fn)

        assert db.batches - batches == 1
        assert not [r for r in caplog.records if "one write at a time" in r.getMessage()]
        assert await db.fetch("SELECT v FROM t") == []
        assert [r.id for r in await backend.runs.runs_by_id([saved.id])] == [saved.id]


async def test_enqueues_in_one_batch_ride_its_one_statement(
    pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Enqueues in one batch with a run riding along are written by the batch's one statement
    (WRITE_BATCH_ENQUEUE): each caller hears which of its jobs were added, a job known already
    is not added again, and the jobs' order is the calls' order."""
    async with open_backend(pg_schema) as backend:
        assert isinstance(backend, PostgresBackend)
        queue = backend.queue("postgres")
        known, known_run = job_and_run()
        await queue.add([known], [known_run])
        batches = backend.db.batches
        made = {f"call {n}": [job_and_run() for _ in range(n)] for n in (1, 2, 3)}
        made["again"] = [(known, known_run)]
        added: dict[str, list[str]] = {}

        async def enqueue(name: str) -> None:
            pairs = made[name]
            added[name] = await queue.add([job for job, _ in pairs], [run for _, run in pairs])

        backend.runs.save_run(saved := a_run())
        async with anyio.create_task_group() as group:
            for name in made:
                group.start_soon(enqueue, name)

        assert backend.db.batches - batches == 1
        assert not [r for r in caplog.records if "one write at a time" in r.getMessage()]
        fresh = {name: [job.id for job, _ in pairs] for name, pairs in made.items()}
        assert added == {**fresh, "again": []}
        in_order = [job_id for name in made for job_id in added[name]]
        rows = await backend.db.fetch("SELECT id FROM jobs WHERE id <> $1 ORDER BY seq", known.id)
        assert [row["id"] for row in rows] == in_order
        for name in made:
            runs = await backend.runs.runs_by_id([run.id for _, run in made[name]])
            assert len(runs) == len(made[name])
        assert [r.id for r in await backend.runs.runs_by_id([saved.id])] == [saved.id]


async def test_a_job_enqueued_twice_in_one_batch_is_added_once(pg_schema: str) -> None:
    """As if one enqueue ran after the other: the first caller adds the job, the second
    hears it was known already."""
    async with open_backend(pg_schema) as backend:
        queue = backend.queue("postgres")
        job, run = job_and_run()
        added: list[list[str]] = []

        async def enqueue() -> None:
            added.append(await queue.add([job], [run]))

        async with anyio.create_task_group() as group:
            group.start_soon(enqueue)
            group.start_soon(enqueue)

        assert sorted(added) == [[], [job.id]]
        assert await backend.db.fetch("SELECT count(*) FROM jobs") == [(1,)]


async def test_an_enqueue_refused_for_its_data_fails_alone_in_a_folded_batch(
    pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The batch's one statement fails for one enqueue's data: the batch is written again the
    usual way, where that enqueue fails alone and the others and the runs commit."""
    async with open_backend(pg_schema) as backend:
        assert isinstance(backend, PostgresBackend)
        queue = backend.queue("postgres")
        good, good_run = job_and_run()
        bad, bad_run = job_and_run(priority=2**70)  # past bigint
        outcomes: dict[str, object] = {}
        batches = backend.db.batches

        async def enqueue(name: str, job: Any, run: Any) -> None:
            try:
                outcomes[name] = await queue.add([job], [run])
            except Exception as error:
                outcomes[name] = error

        backend.runs.save_run(saved := a_run())
        async with anyio.create_task_group() as group:
            group.start_soon(enqueue, "good", good, good_run)
            group.start_soon(enqueue, "bad", bad, bad_run)

        assert backend.db.batches - batches == 1
        # ... written again the usual way, not one write at a time (that is for the writes).
        assert not [r for r in caplog.records if "one write at a time" in r.getMessage()]
        assert outcomes["good"] == [good.id]
        assert isinstance(outcomes["bad"], Exception)
        assert await queue.get_job(bad.id) is None
        assert [r.id for r in await backend.runs.runs_by_id([saved.id])] == [saved.id]


async def test_writes_survive_the_writers_connection_being_ended(pg_schema: str) -> None:
    async with open_backend(pg_schema) as backend:
        backend.runs.save_run(first := a_run())
        await backend.runs.flush()
        assert await terminate(pg_schema, "writer") == 1
        backend.runs.save_run(second := a_run())
        with anyio.fail_after(10):
            await backend.runs.flush()
        assert {r.id for r in await backend.runs.runs_by_id([first.id, second.id])} == {
            first.id,
            second.id,
        }


async def test_a_batch_cut_off_mid_way_is_run_again_once(pg_schema: str) -> None:
    """The writer's batch waits on a row another client locked; its session is ended under
    it. The batch is run again on a new connection: every write of it lands, once."""
    job, run = job_and_run()
    async with open_backend(pg_schema) as backend:
        queue = backend.queue(None)
        await queue.add([job], [run])
        [claim] = await queue.claim(QUEUE, 1, "w1", 30.0)
        held = hold_row_lock(pg_schema, job.id, 1.5)
        await anyio.to_thread.run_sync(held.wait)
        run.status = RunStatus.RUNNING
        queue.record(run, claim.fence)
        queue.record_log(run.id, line("once"), claim.fence)
        with anyio.fail_after(15):
            flushing = anyio.Event()

            async def flush() -> None:
                await backend.runs.flush()
                flushing.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(flush)
                await until(lambda: count_blocked(pg_schema), timeout=5)
                assert await terminate(pg_schema, "writer") == 1
        stored = await backend.runs.get_run(run.id)
        assert stored is not None and stored.status is RunStatus.RUNNING
        assert [entry.message for entry in stored.logs] == ["once"]


async def count_blocked(url: str) -> bool:
    return bool(
        await count(
            url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE 'blok-tui %/writer %' AND wait_event_type = 'Lock'",
        )
    )


async def test_a_batch_whose_commit_was_cut_off_is_looked_up_then_run_again(
    pg_schema: str,
) -> None:
    """The session ends while the batch's COMMIT runs (a deferred trigger makes it slow): the
    writer asks the server whether that transaction committed (it did not) and runs the
    batch again — once. (A batch of more than one statement: one alone has no COMMIT.)"""
    conn = await connect(pg_schema)
    try:
        await conn.execute(
            "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN IF NEW.message = 'slow' THEN PERFORM pg_sleep(2); END IF;"
            " RETURN NULL; END $$"
        )
        await conn.execute(
            "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON logs DEFERRABLE INITIALLY"
            " DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()"
        )
    finally:
        await conn.close()
    run = a_run()
    async with open_backend(pg_schema) as backend:
        backend.runs.save_run(run)
        backend.runs.add_log(run.id, line("slow"))
        backend.shared.release_slot(run.id)  # a write WRITE_BATCH does not hold
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(backend.runs.flush)

                async def committing() -> bool:
                    return bool(
                        await count(
                            pg_schema,
                            "SELECT count(*) FROM pg_stat_activity WHERE datname ="
                            " current_database() AND application_name LIKE 'blok-tui %/writer %'"
                            " AND query = 'COMMIT' AND state = 'active'",
                        )
                    )

                await until(committing, timeout=5)
                assert await terminate(pg_schema, "writer") == 1
        stored = await backend.runs.get_run(run.id)
        assert stored is not None
        assert [entry.message for entry in stored.logs] == ["slow"]


class CuttingRelay:
    """A TCP relay between blok and the server that can cut a connection between a statement
    and its answer: once a connection's index (in the order they were made) is in `held`,
    what the server says to it is kept back; `cut` then closes both sides, so the client sees
    its connection lost, never having heard how its statement ended, while the server ran it
    to the end."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self.url = url
        self.sides: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self.held: set[int] = set()
        self.hanging_up = False  # new connections are closed at once, and counted
        self.hung_up = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> CuttingRelay:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        parts = urlsplit(self.url)
        netloc = parts.netloc.rsplit("@", 1)
        at = f"{netloc[0]}@" if len(netloc) == 2 else ""
        self.url = urlunsplit(parts._replace(netloc=f"{at}127.0.0.1:{port}"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for client, server in self.sides:
            client.close()
            server.close()

    async def _relay(self, client_in: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        if self.hanging_up:
            self.hung_up += 1
            client.transport.abort()
            return
        server_in, server = await asyncio.open_connection(*self.target)
        index = len(self.sides)
        self.sides.append((client, server))

        async def pump(
            source: asyncio.StreamReader, sink: asyncio.StreamWriter, back: bool
        ) -> None:
            while data := await source.read(65536):
                if back and index in self.held:
                    continue  # kept back: the answer never arrives
                sink.write(data)
                await sink.drain()

        with suppress(ConnectionError):
            await asyncio.gather(pump(client_in, server, False), pump(server_in, client, True))

    def cut(self, index: int) -> None:
        client, server = self.sides[index]
        client.transport.abort()
        server.transport.abort()


async def test_a_lone_statement_whose_answer_was_lost_after_it_committed_is_not_run_again(
    pg_schema: str,
) -> None:
    """A batch that is one statement runs without BEGIN and COMMIT: it commits by itself. Its
    connection is cut after the server committed it, before the answer arrived: the writer
    finds its mark on the server, knows the batch landed, and does not write it again (its
    log line would be there twice)."""
    run = a_run()
    async with CuttingRelay(pg_schema) as relay, open_backend(relay.url) as backend:
        writer = 0  # the writer connects first (and migrates), then the pool
        backend.runs.save_run(run)
        await backend.runs.flush()
        relay.held.add(writer)
        run.status = RunStatus.RUNNING
        backend.runs.save_run(run)
        backend.runs.add_log(run.id, line("once"))
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(backend.runs.flush)

                async def committed() -> bool:
                    return bool(
                        await count(
                            pg_schema, "SELECT count(*) FROM logs WHERE run_id = $1", run.id
                        )
                    )

                await until(committed, timeout=5)
                relay.cut(writer)
        stored = await backend.runs.get_run(run.id)
        assert stored is not None and stored.status is RunStatus.RUNNING
        assert [entry.message for entry in stored.logs] == ["once"]
        # The writer carries on, on a new connection.
        backend.runs.add_log(run.id, line("after"))
        await backend.runs.flush()
        stored = await backend.runs.get_run(run.id)
        assert stored is not None
        assert [entry.message for entry in stored.logs] == ["once", "after"]


async def test_an_enqueue_whose_answer_was_lost_after_it_committed_returns_its_job(
    pg_schema: str,
) -> None:
    """An enqueue rides in the writer's one statement; its connection is cut after the server
    committed it, before the answer arrived. The writer finds the batch landed, but the ids
    the statement added came with its answer: `enqueue` raised a TypeError (its result was
    None), for a job that was there and ran. Its caller, told it failed, enqueued it again."""
    job, run = job_and_run()
    async with CuttingRelay(pg_schema) as relay, open_backend(relay.url) as backend:
        writer = 0  # the writer connects first (and migrates), then the pool
        queue = backend.queue("postgres")
        assert await queue.add(*map(list, zip(job_and_run(), strict=True))) != []
        relay.held.add(writer)
        added: list[list[str]] = []

        async def enqueue() -> None:
            added.append(await queue.add([job], [run]))

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(enqueue)

                async def committed() -> bool:
                    return bool(
                        await count(pg_schema, "SELECT count(*) FROM jobs WHERE id = $1", job.id)
                    )

                await until(committed, timeout=5)
                relay.cut(writer)
        assert added == [[job.id]]
        stored = await queue.get_job(job.id)
        assert stored is not None and stored.state is JobState.WAITING


async def test_the_writers_mark_goes_with_it_and_marks_of_writers_long_gone_are_cleared(
    pg_schema: str,
) -> None:
    """`writer_marks` holds a row a writer while it writes; a writer that closes takes its own
    with it, and a process opening the database clears the rows of writers gone a day (killed
    before they could), so the table does not grow with every process ever started."""
    conn = await connect(pg_schema)
    try:
        await conn.execute(
            "INSERT INTO writer_marks (writer, mark, at) VALUES"
            " ('killed long ago', 7, extract(epoch FROM now()) - 2 * 86400),"
            " ('killed just now', 3, extract(epoch FROM now()) - 60)"
        )
        async with open_backend(pg_schema) as backend:
            backend.runs.save_run(a_run())
            await backend.runs.flush()
            rows = await conn.fetch("SELECT writer, mark FROM writer_marks ORDER BY writer")
            writers = [row["writer"] for row in rows]
            assert "killed long ago" not in writers
            assert "killed just now" in writers  # it may still be looking its mark up
            [own] = [row for row in rows if row["writer"] != "killed just now"]
            assert own["mark"] >= 1
        left = await conn.fetch("SELECT writer FROM writer_marks")
        assert [row["writer"] for row in left] == ["killed just now"]
    finally:
        await conn.close()


async def test_a_batch_chosen_as_a_deadlock_victim_is_run_again(
    pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer's batch and another client lock two jobs in opposite orders; the server
    ends the batch's transaction as the deadlock's victim (the one that waited first runs the
    deadlock check first); the writer runs it again."""
    (a, run_a), (b, run_b) = job_and_run(), job_and_run()
    async with open_backend(pg_schema) as backend:
        queue = backend.queue(None)
        await queue.add([a, b], [run_a, run_b])
        claims = {c.job.id: c for c in await queue.claim(QUEUE, 2, "w1", 30.0)}
        other = await connect(pg_schema)
        try:
            await other.execute("BEGIN")
            await other.execute("UPDATE jobs SET error = 'x' WHERE id = $1", b.id)
            # The batch: a's records (locks a), then b's settle (waits for b).
            run_a.status = RunStatus.RUNNING
            queue.record(run_a, claims[a.id].fence)
            queue.submit(
                Transition(b.id, claims[b.id].job.epoch, JobUpdate(state=JobState.COMPLETED))
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(backend.runs.flush)
                await until(lambda: count_blocked(pg_schema), timeout=5)
                # Waits for a, which the batch holds, until the batch gives way.
                await other.execute("UPDATE jobs SET error = 'y' WHERE id = $1", a.id)
                await other.execute("ROLLBACK")
        finally:
            await other.close()
        assert "deadlock detected" in caplog.text and "running it again" in caplog.text
        assert (await queue.get_job(b.id)).state is JobState.COMPLETED  # type: ignore[union-attr]
        assert (await backend.runs.get_run(run_a.id)).status is RunStatus.RUNNING  # type: ignore[union-attr]


async def test_reads_survive_the_pools_connections_being_ended(pg_schema: str) -> None:
    run = a_run()
    async with open_backend(pg_schema) as backend:
        backend.runs.save_run(run)
        assert await backend.runs.get_run(run.id) is not None
        assert await terminate(pg_schema, "pool") >= 1
        with anyio.fail_after(10):
            assert await backend.runs.get_run(run.id) is not None
            assert await backend.runs.count_runs() == 1


async def test_the_listener_reconnects_and_wakes_the_waiters(pg_schema: str) -> None:
    async with open_backend(pg_schema) as backend, open_backend(pg_schema) as other:
        token = await backend.change_token()
        assert await terminate(pg_schema, "listener") == 2  # both backends'
        with anyio.fail_after(10):
            # Reconnected: what was notified meanwhile is unknown, so the token moves.
            token = await backend.wait_for_change(token, timeout=10)
            assert isinstance(backend, PostgresBackend)
            await until(lambda: backend.db.listener.listening)
            token = await backend.change_token()
            other.runs.save_run(a_run())
            await other.runs.flush()
            assert await backend.wait_for_change(token, timeout=5) != token


async def crash_with_a_batch_in_flight(
    url: str, lock_s: float, *, wait_for_the_batch: bool
) -> tuple[str, str, list[bool]]:
    """The crash path: the writer's batch (a run `running`, line "in flight") is in flight,
    held on its job's row lock for `lock_s`; then the event loop stops turning while the run
    is recorded `crashed` (line "pending") and its job settled, and `flush_now` is called.
    With `wait_for_the_batch`, the writer's own flush is let finish afterwards. The run's and
    job's ids, and what the settle was told."""
    job, run = job_and_run()
    told: list[bool] = []
    async with open_backend(url) as backend:
        queue = backend.queue(None)
        await queue.add([job], [run])
        [claim] = await queue.claim(QUEUE, 1, "w1", 30.0)
        held = hold_row_lock(url, job.id, lock_s)
        await anyio.to_thread.run_sync(held.wait)
        run.status = RunStatus.RUNNING
        queue.record(run, claim.fence)
        queue.record_log(run.id, line("in flight"), claim.fence)
        flushing = anyio.Event()

        async def flush() -> None:
            flushing.set()
            await backend.runs.flush()

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(flush)
                await flushing.wait()
                await until(lambda: count_blocked(url), timeout=5)
                # Now the loop stops turning: the crash path.
                crashed = run.model_copy(deep=True)
                crashed.status = RunStatus.CRASHED
                queue.record(crashed, claim.fence)
                queue.record_log(run.id, line("pending"), claim.fence)
                settle = Transition(job.id, claim.job.epoch, JobUpdate(state=JobState.FAILED))
                settle.landed = told.append
                queue.submit(settle)
                backend.flush_now()
                if not wait_for_the_batch:
                    tg.cancel_scope.cancel()
    return run.id, job.id, told


async def stored(url: str, run_id: str, job_id: str) -> tuple[str, list[str], str]:
    """The run's status, its lines and its job's state, as the database has them."""
    conn = await connect(url)
    try:
        status = await conn.fetchval("SELECT status FROM runs WHERE id = $1", run_id)
        lines = await conn.fetch("SELECT message FROM logs WHERE run_id = $1 ORDER BY id", run_id)
        state = await conn.fetchval("SELECT state FROM jobs WHERE id = $1", job_id)
    finally:
        await conn.close()
    return status, [r[0] for r in lines], state


async def test_flush_now_commits_from_a_blocked_event_loop(pg_schema: str) -> None:
    """A process going down on an error: the event loop does not turn again, yet what is
    pending commits, and a batch the writer had in flight goes first (its older state does
    not land on top of the newer). A settle among what is pending is told that it landed."""
    run_id, job_id, told = await crash_with_a_batch_in_flight(
        pg_schema, 1.0, wait_for_the_batch=False
    )
    assert await stored(pg_schema, run_id, job_id) == (
        "crashed",
        ["in flight", "pending"],
        "failed",
    )
    assert told == [True]


async def test_flush_now_writes_nothing_over_a_writer_session_that_does_not_end(
    pg_schema: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process going down while its writer's session will not end (here: ending it is made a
    no-op): the batch in flight there may still commit, so `flush_now` writes nothing over it
    and says so. That batch lands once (the writer goes on once the lock is let go), and what
    was pending is reported lost, not written on top of it (its job's lease runs out, and
    whoever takes the job over records the run)."""
    monkeypatch.setattr(pg_sql, "END_SESSION", "SELECT $1::int, $2::timestamptz")
    monkeypatch.setattr(pg_db, "SESSION_END_WAIT_S", 0.5)
    run_id, job_id, told = await crash_with_a_batch_in_flight(
        pg_schema, 2.0, wait_for_the_batch=True
    )
    assert "could not commit 3 pending write(s)" in caplog.text
    assert "did not end within 0.5 s" in caplog.text
    assert await stored(pg_schema, run_id, job_id) == ("running", ["in flight"], "active")
    assert told == []


async def test_a_worker_rides_out_a_server_restart() -> None:
    """A worker runs jobs while the server restarts (every session ended, the server gone for
    a moment): every job completes once, nothing is recorded crashed, nothing is lost."""
    done: list[int] = []

    async def work(ctx: Any, n: int) -> int:
        await anyio.sleep(0.02)
        done.append(n)
        return n

    flow = Workflow(
        name="steady",
        trigger=WorkerTrigger(queue="steady", concurrency=4),
        steps=[Step("work", work, inputs={"n": "$.body.n"})],
    )
    with private_server() as server:
        async with Engine(workflows=[flow], database=server.url) as engine:
            ids = await engine.enqueue_many("steady", [{"n": n} for n in range(60)])
            await until(lambda: len(done) >= 10, timeout=20)
            await anyio.to_thread.run_sync(server.restart)
            for job_id in ids:
                run = await engine.wait_for_job(job_id, timeout=60)
                assert run.status is RunStatus.COMPLETED
            assert sorted(done) == list(range(60))
            assert await engine.count_runs() == 60
            assert await engine.runs(status="crashed") == []


FROZEN_IN_A_TRANSACTION = """
import os, signal, sys

import anyio

from engine.backends import open_backend
from engine.backends.base import Fence


async def main() -> None:
    async with open_backend(sys.argv[1], lease_s=1.0) as backend:
        queue = backend.queue(None)
        [claim] = await queue.claim(sys.argv[2], 1, "frozen", 1.0)

        async def freeze(conn) -> None:
            # The writer's transaction holds the job's row (as a batch's fence does), then the
            # process stops dead in the middle of it.
            await conn.execute("SELECT 1 FROM jobs WHERE id = $1 FOR SHARE", claim.job.id)
            print("frozen", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

        await backend.db.transaction(freeze)


anyio.run(main)
"""


def start_frozen(folder: Any, url: str) -> subprocess.Popen[str]:
    script = folder / "frozen.py"
    script.write_text(FROZEN_IN_A_TRANSACTION)
    return subprocess.Popen(
        [sys.executable, str(script), url, QUEUE], stdout=subprocess.PIPE, text=True
    )


async def test_a_process_frozen_inside_a_transaction_does_not_keep_its_jobs(
    pg_schema: str, tmp_path: Any
) -> None:
    """A worker frozen (SIGSTOP) in the middle of its writer's transaction keeps no lock past
    half a lease: the server ends the idle session, and another worker takes the job over once
    the lease ran out (SKIP LOCKED would pass over it for as long as the lock was held)."""
    job, run = job_and_run()
    async with open_backend(pg_schema) as backend:
        queue = backend.queue(None)
        await queue.add([job], [run])
        child = start_frozen(tmp_path, pg_schema)
        try:
            assert child.stdout is not None
            line = await anyio.to_thread.run_sync(child.stdout.readline)
            assert line.strip() == "frozen"
            with anyio.fail_after(10):
                while not (claims := await queue.claim(QUEUE, 1, "survivor", 30.0, timeout=0.2)):
                    pass
            assert claims[0].job.id == job.id and claims[0].taken_from == "frozen"
        finally:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait()


@pytest.mark.parametrize("statement", ["WRITE_BATCH", "WRITE_BATCH_ENQUEUE", "WRITE_RUNS"])
async def test_the_writers_plans_made_on_an_empty_table_find_jobs_by_key(
    pg_schema: str, statement: str
) -> None:
    """The server keeps a prepared statement's generic plan for the session, made with the
    tables as they were then: the writer's, made on a new database's empty `jobs`, must still
    look its jobs up by key rather than scan the table (which grows with every job)."""
    import re

    from engine.backends.postgres import sql
    from engine.backends.postgres.connect import WRITER
    from engine.backends.postgres.connect import connect as blok_connect

    text = getattr(sql, statement)
    count = max(int(n) for n in re.findall(r"\$(\d+)", text))
    values = ["'{}'"] * count
    if "writer_marks" in text:
        values[-2:] = ["'writer'", "1"]  # the writer's mark: who, the batch's number
    empty = ", ".join(values)
    conn = await blok_connect(pg_schema, WRITER)
    try:
        # What the server does on its own after a few runs of the same statement.
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE batch AS {text}")
        await conn.execute(f"EXECUTE batch({empty})")  # the plan is made here, on no jobs
        await conn.execute(
            "INSERT INTO jobs (id, queue, workflow_name, state, run_id, created_at)"
            " SELECT 'job_' || i, 'q', 'w', 'completed', 'run_' || i, 0"
            " FROM generate_series(1, 2000) AS i"
        )
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN EXECUTE batch({empty})"))
    finally:
        await conn.close()
    assert "Seq Scan on jobs" not in plan, plan
    assert "on jobs" in plan  # the plan does look at jobs: by an index


async def test_connections_keep_the_urls_application_name_and_name_their_host(
    pg_schema: str,
) -> None:
    """`?application_name=webapp` was replaced by blok's own name, "blok-tui pool pid 14034": a
    DBA could not tell a web app's producer from a worker, nor one machine from another. An
    engine that runs jobs names its connections a worker's; one that only enqueues, a
    producer's."""
    url = f"{pg_schema}{'&' if '?' in pg_schema else '?'}application_name=webapp"
    async with open_backend(url) as backend:
        backend.runs.save_run(a_run())
        await backend.runs.flush()
        await backend.runs.list_runs(RunFilter.of(), limit=1)  # a pooled connection
        conn = await connect(pg_schema)
        try:
            names = {
                row[0]
                for row in await conn.fetch(
                    "SELECT application_name FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            }
        finally:
            await conn.close()
    where = f"{socket.gethostname()}:{os.getpid()}"
    assert f"webapp (blok-tui producer/writer {where})" in names, names
    assert f"webapp (blok-tui producer/pool {where})" in names, names
    for consume, kind in ((True, "worker"), (False, "producer")):
        async with Engine(
            workflows=[Workflow(name="w", trigger=WorkerTrigger(queue=QUEUE), steps=[idle])],
            database=url,
            consume=consume,
        ):
            assert f"webapp (blok-tui {kind}/listener {where})" in await names_now(pg_schema)


async def _idle(ctx: Any) -> None:
    """A node for a workflow that only has to be served."""


idle = Step("idle", _idle)


async def names_now(url: str) -> set[str]:
    """The application names of the sessions on the test's database, but the caller's."""
    conn = await connect(url)
    try:
        rows = await conn.fetch(
            "SELECT application_name FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    finally:
        await conn.close()
    return {row[0] for row in rows}


def test_the_drivers_pool_retries_log_one_line_not_a_traceback(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncpg's pool, restoring its connections through an outage, logged a 25-line traceback
    of its internals each time (every 2 to 8 s), in every application that embeds a producer
    engine. One line now, once a minute."""
    import asyncpg.pool

    # What other tests made it say (the module, not the function `connect` it is shadowed by).
    pg_connect = sys.modules["engine.backends.postgres.connect"]
    monkeypatch.setattr(pg_connect, "_driver_said", {})
    caplog.set_level(logging.WARNING, logger="asyncpg.pool")
    for _ in range(3):
        try:
            raise ConnectionError("unexpected connection_lost() call")
        except ConnectionError:
            asyncpg.pool.logger.warning(
                "Failed to restore the pool connection floor", exc_info=True
            )
    [record] = caplog.records
    assert record.exc_info is None and "Traceback" not in caplog.text
    assert record.getMessage() == (
        "Failed to restore the pool connection floor "
        "(ConnectionError: unexpected connection_lost() call)"
    )


async def test_an_outage_of_the_listener_is_logged_once_not_at_every_try(
    pg_schema: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener tries to reconnect every 2 s at most during an outage; it says it lost
    its connection once, and once that it is back, with how long it was out."""
    monkeypatch.setattr(pg_listener, "KEEPALIVE_S", 0.2)  # the drop is found sooner
    caplog.set_level(logging.INFO, logger="blok.postgres")
    async with CuttingRelay(pg_schema) as relay, anyio.create_task_group() as tg:
        listener = pg_listener.Listener(relay.url, "the test's database", set(), "worker")
        await tg.start(listener.run)
        relay.hanging_up = True
        relay.cut(0)
        with anyio.fail_after(10):
            await until(lambda: relay.hung_up >= 4)  # four tries to reconnect, refused
        lost = [r for r in caplog.messages if "the listener lost its connection" in r]
        assert len(lost) == 1, caplog.messages
        relay.hanging_up = False
        with anyio.fail_after(10):
            await until(lambda: listener.listening)
        back = [r for r in caplog.messages if "the listener is back after" in r]
        assert len(back) == 1, caplog.messages
        tg.cancel_scope.cancel()


def test_a_server_that_is_full_is_not_called_lost(caplog: pytest.LogCaptureFixture) -> None:
    """A connection refused for max_connections is the server's limit, not an outage: the
    operator's fix is there."""
    db = pg_db.PostgresDatabase("postgresql://127.0.0.1/x", "the test's database")
    full = asyncpg.exceptions.TooManyConnectionsError("sorry, too many clients already")
    with caplog.at_level(logging.WARNING, logger="blok.postgres"):
        db._lost("a write", full)
    assert caplog.messages == [
        "the test's database: the server is full (TooManyConnectionsError: sorry, too many"
        " clients already) during a write; retrying with backoff"
    ]
