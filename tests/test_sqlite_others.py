"""How a SQLite engine hears what other processes commit to its file.

By asking the file's data_version: every 50 ms while nothing here is waiting for others (what an
idle engine costs, next to a busy process too), every 5 ms while a job is awaited here or
another process's jobs keep waking this one's claims. And while it is busy so with another
process that writes, by watching the file (Linux's inotify, `FileChanges`): a write wakes it at
once. Before all this, a producer in one process and a worker in another heard each other only
every 50 ms: a job's round trip took 50 ms (19 jobs/s one at a time).

What the engine does is seen, not timed: the sleeps between its looks are recorded. Two engines
on one file are two processes to each other (each has its own connections)."""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from backends.builders import a_run
from support import Sleep, record_sleeps, until

import engine.backends.sqlite as sqlite_backend
import engine.backends.sqlite.file_changes as file_changes
from engine import Engine, RunStatus, Step, WorkerTrigger, Workflow
from engine.backends import Backend
from engine.backends.base import Pace
from engine.backends.sqlite import HEARD_EARLY_S, OTHERS_BUSY_POLL_S, OTHERS_POLL_S
from engine.backends.sqlite.file_changes import FileChanges

pytestmark = pytest.mark.anyio


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[Sleep]:
    """Every sleep of a SQLite backend's own code (its looks at the file, its paced waits)."""
    slept = record_sleeps(monkeypatch, sqlite_backend)
    monkeypatch.setattr(sqlite_backend, "OTHERS_BUSY_S", 0.3)  # back to idle sooner
    return slept


@pytest.fixture
def polled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file cannot be watched (not Linux, or no inotify instance left): it is polled."""
    monkeypatch.setattr(FileChanges, "open", classmethod(lambda cls, path: None))


@pytest.fixture
def watched() -> None:
    if file_changes.inotify_simple is None:
        pytest.skip("no inotify here (Linux only): the file is polled, as the tests above check")


def looks(sleeps: list[Sleep], backend: Backend, since: int = 0) -> list[float]:
    """The waits between `backend`'s looks at the file's data_version, from `since` on."""
    return [s.seconds for s in sleeps[since:] if s.backend is backend and s.where == "_hear_others"]


GATE: dict[str, anyio.Event] = {}


async def gated(ctx: Any) -> int:
    await GATE["job"].wait()
    return 1


@pytest.mark.usefixtures("polled")
async def test_an_engine_looks_often_only_while_another_process_works_for_it(
    tmp_path: Path, sleeps: list[Sleep]
) -> None:
    workflow = Workflow(
        name="gated",
        trigger=WorkerTrigger(queue="gated", provider="sqlite"),
        steps=[Step("gated", gated)],
    )
    gate = GATE["job"] = anyio.Event()
    database = tmp_path / "blok.db"
    async with (
        Engine(workflows=[workflow], database=database) as worker,
        Engine(database=database) as producer,
    ):
        # Nothing awaited, nothing coming: both look every OTHERS_POLL_S.
        await until(lambda: len(looks(sleeps, producer.backend)) >= 3)
        await until(lambda: len(looks(sleeps, worker.backend)) >= 3)
        assert set(looks(sleeps, producer.backend) + looks(sleeps, worker.backend)) == {
            OTHERS_POLL_S
        }
        job_id = await producer.enqueue("gated", {})
        mark = len(sleeps)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:

                async def wait() -> None:
                    run = await producer.wait_for_job(job_id)
                    assert run.status is RunStatus.COMPLETED

                group.start_soon(wait)
                # The worker heard the job (it woke its claim): it looks often for a while.
                await until(lambda: OTHERS_BUSY_POLL_S in looks(sleeps, worker.backend, mark))
                # The producer awaits the job's end: it looks often until it hears it.
                await until(lambda: OTHERS_BUSY_POLL_S in looks(sleeps, producer.backend, mark))
                gate.set()
        # Nothing awaited, nothing came for a while: back to OTHERS_POLL_S, both.
        mark = len(sleeps)
        await until(lambda: looks(sleeps, producer.backend, mark)[-2:] == [OTHERS_POLL_S] * 2)
        await until(lambda: looks(sleeps, worker.backend, mark)[-2:] == [OTHERS_POLL_S] * 2)


async def committed_while_waiting(
    backend: sqlite_backend.SqliteBackend,
    other: Engine,
    token: int,
    before: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Another engine (another process to `backend`) commits while `backend` waits for a
    change from `token`, once the wait is under way and `before` returned: the new token."""
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            moved: list[int] = []

            async def wait() -> None:
                moved.append(await backend.wait_for_change(token, 60))

            group.start_soon(wait)
            await until(lambda: backend._awaited > 0)  # so that the engine's ear hears it
            if before is not None:
                await before()
            other.backend.runs.save_run(a_run())
            await other.backend.runs.flush()
    assert moved and moved[0] != token
    return moved[0]


@pytest.mark.usefixtures("polled")
async def test_a_wait_that_begins_ends_the_engines_nap(
    tmp_path: Path, sleeps: list[Sleep], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that waited for nothing looks at the file every OTHERS_POLL_S (here a
    minute); a job's wait that begins looks every OTHERS_BUSY_POLL_S from then, not after the
    nap under way."""
    monkeypatch.setattr(sqlite_backend, "OTHERS_POLL_S", 60.0)
    database = tmp_path / "blok.db"
    async with Engine(database=database) as engine, Engine(database=database) as other:
        backend = engine.backend
        assert isinstance(backend, sqlite_backend.SqliteBackend)
        await until(lambda: 60.0 in looks(sleeps, backend))  # napping for a minute
        await committed_while_waiting(backend, other, await backend.change_token())


@pytest.mark.parametrize("hearing", ["polled", "watched"])
async def test_a_reader_with_a_pace_is_told_at_most_every_poll_and_one_without_at_once(
    tmp_path: Path, sleeps: list[Sleep], hearing: str, request: pytest.FixtureRequest
) -> None:
    """A worker's follow loop and a console's feed read all that changed at each change: at
    most every OTHERS_POLL_S, as when the engine looked no more often than that."""
    request.getfixturevalue(hearing)
    database = tmp_path / "blok.db"
    async with Engine(database=database) as engine, Engine(database=database) as other:
        backend = engine.backend
        stale = await backend.change_token()
        other.backend.runs.save_run(a_run())  # another process commits
        await other.backend.runs.flush()

        async def moved() -> bool:
            return await backend.change_token() != stale

        await until(moved)
        feed, mine = Pace(), Pace()
        assert await backend.wait_for_change(stale, 5, feed) != stale
        assert await backend.wait_for_change(stale, 5, feed) != stale  # told again: held back
        assert await backend.wait_for_change(stale, 5, mine) != stale  # its own pace
        assert await backend.wait_for_change(stale, 5) != stale  # a job's wait
        held = [s for s in sleeps if s.where == "wait_for_change" and s.pace in (feed, mine)]
        assert [s.pace for s in held] == [feed] and 0 < held[0].seconds <= OTHERS_POLL_S


async def quick(ctx: Any) -> int:
    return int(ctx.body["i"])


QUICK = Workflow(
    name="quick",
    trigger=WorkerTrigger(queue="quick", provider="sqlite"),
    steps=[Step("quick", quick)],
)


def watching(engine: Engine) -> FileChanges:
    backend = engine.backend
    assert isinstance(backend, sqlite_backend.SqliteBackend)
    assert backend.file_changes is not None
    return backend.file_changes


@pytest.mark.usefixtures("watched")
async def test_two_processes_working_together_hear_each_other_with_no_look(
    tmp_path: Path, sleeps: list[Sleep]
) -> None:
    """Once a producer and a worker have heard each other (by looking), each watches the file:
    jobs enqueued and awaited one at a time go through with no look by either."""
    database = tmp_path / "blok.db"
    async with (
        Engine(workflows=[QUICK], database=database) as worker,
        Engine(database=database) as producer,
    ):
        heard = {engine: watching(engine).heard for engine in (worker, producer)}
        for i in range(-10, 0):  # until each has seen the other write twice
            await producer.wait_for_job(await producer.enqueue("quick", {"i": i}), timeout=10)
            if watching(worker).listening and watching(producer).listening:
                break
        assert watching(worker).listening and watching(producer).listening
        mark = len(sleeps)
        for i in range(20):
            with anyio.fail_after(10):
                run = await producer.wait_for_job(await producer.enqueue("quick", {"i": i}))
            assert run.status is RunStatus.COMPLETED and run.output == i
        for engine in (worker, producer):
            assert watching(engine).listening
            assert watching(engine).heard >= heard[engine] + 20  # a job's end, or its enqueue
            assert set(looks(sleeps, engine.backend, mark)) <= {HEARD_EARLY_S}


@pytest.mark.usefixtures("watched")
async def test_an_engine_waits_for_nothing_does_not_watch_a_busy_file(tmp_path: Path) -> None:
    """A watch makes every write to the file cost its writer: an engine that waits for nothing
    from others (a console, an idle worker) looks every 50 ms instead, however busy the file.
    Nor does an engine alone on its file watch it, however many jobs it awaits."""
    database = tmp_path / "blok.db"
    async with (
        Engine(database=database) as idle,
        Engine(workflows=[QUICK], database=database) as busy,
    ):
        for i in range(30):
            run = await busy.wait_for_job(await busy.enqueue("quick", {"i": i}), timeout=10)
            assert run.status is RunStatus.COMPLETED
        assert not watching(busy).listening and watching(busy).heard == 0
        assert not watching(idle).listening and watching(idle).heard == 0


@pytest.mark.usefixtures("watched")
async def test_an_idle_worker_hears_a_job_sent_now_and_then_at_once(tmp_path: Path) -> None:
    """A worker idle on a file another process writes now and then (a web app's jobs) watches
    it, as a sentry: the next job wakes its claim at once."""
    database = tmp_path / "blok.db"
    async with (
        Engine(workflows=[QUICK], database=database) as worker,
        Engine(database=database) as producer,
    ):
        producer.backend.runs.save_run(a_run())  # another process writes, nothing for it
        await producer.backend.runs.flush()
        await until(lambda: watching(worker).listening)
        heard = watching(worker).heard
        run = await producer.wait_for_job(await producer.enqueue("quick", {"i": 1}), timeout=10)
        assert run.status is RunStatus.COMPLETED and run.output == 1
        assert watching(worker).heard > heard


@pytest.mark.usefixtures("watched")
async def test_a_sentry_that_heard_a_write_is_deaf_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Next to a process at work, a sentry that heard each of its writes would cost that
    process a microsecond a page written and itself a wake-up each: after a write it heard,
    it does not watch the file for OTHERS_DEAF_S (here a minute)."""
    monkeypatch.setattr(sqlite_backend, "OTHERS_DEAF_S", 60.0)
    database = tmp_path / "blok.db"
    async with (
        Engine(workflows=[QUICK], database=database) as worker,
        Engine(database=database) as other,
    ):

        async def commit() -> None:
            other.backend.runs.save_run(a_run())
            await other.backend.runs.flush()

        await commit()
        await until(lambda: watching(worker).listening)
        heard = watching(worker).heard
        await commit()
        await until(lambda: watching(worker).heard == heard + 1)
        await until(lambda: not watching(worker).listening)
        for _ in range(10):
            await commit()
        assert watching(worker).heard == heard + 1 and not watching(worker).listening


@pytest.mark.usefixtures("watched")
async def test_a_commit_heard_before_it_shows_is_read_again(
    tmp_path: Path, sleeps: list[Sleep], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel tells of SQLite's write before SQLite marks it committed: the first read of
    data_version after a write heard may still say nothing moved, and is made again."""
    database = tmp_path / "blok.db"
    async with Engine(database=database) as engine, Engine(database=database) as other:
        backend = engine.backend
        assert isinstance(backend, sqlite_backend.SqliteBackend)

        async def watched() -> None:
            await until(lambda: watching(engine).listening)
            monkeypatch.setattr(backend.db, "data_version", data_version)

        real = backend.db.data_version
        early = [True]

        def data_version() -> int:
            caller = sys._getframe(1)  # the engine's ear, just woken by a write it heard
            hearing = caller.f_code.co_name == "_hear_others" and caller.f_locals["heard"]
            if hearing and early and real() != caller.f_locals["version"]:
                early.clear()  # the commit has not shown yet, to the engine's ear, this once
                return int(caller.f_locals["version"])
            return real()

        token = await committed_while_waiting(backend, other, await backend.change_token())
        token = await committed_while_waiting(backend, other, token)  # at work: then watched
        mark = len(sleeps)
        await committed_while_waiting(backend, other, token, watched)
        assert not early
        assert HEARD_EARLY_S in looks(sleeps, backend, mark)


async def test_no_inotify_instance_left_means_polled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The user's inotify instances all in use (EMFILE): no watch, a line in the log, and the
    engine hears others by looking, as where there is no inotify at all."""
    if file_changes.inotify_simple is None:
        pytest.skip("no inotify here: there is nothing to run out of")

    def no_instance(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(file_changes.inotify_simple, "INotify", no_instance)
    caplog.set_level(logging.INFO, "blok.sqlite")
    database = tmp_path / "blok.db"
    async with Engine(database=database) as engine, Engine(database=database) as other:
        backend = engine.backend
        assert isinstance(backend, sqlite_backend.SqliteBackend)
        assert backend.file_changes is None
        token = await backend.change_token()
        other.backend.runs.save_run(a_run())
        await other.backend.runs.flush()
        with anyio.fail_after(5):
            assert await backend.wait_for_change(token, 60) != token
    assert "no file watch (Too many open files); polled instead" in caplog.text
