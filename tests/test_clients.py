"""Engines with no workflows: a producer (a web app) and an operator client (the attached
console, the CLI) over a database that worker processes serve — or that no worker serves."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import blok, start_worker, write_workflows
from support import expect_events

from engine import (
    DatabaseError,
    Engine,
    JobState,
    RunStatus,
    RunStatusChanged,
    Step,
    UnknownQueue,
    WorkerTrigger,
    Workflow,
    subworkflow,
)

pytestmark = pytest.mark.anyio


async def test_a_producer_engine_enqueues_to_a_worker_process(tmp_path: Path) -> None:
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"))
    try:
        async with Engine(database=database) as producer:
            assert not producer.capabilities.runs_workflows
            job = await producer.enqueue("naps", {"seconds": 0.01})
            run = await producer.wait_for_job(job, timeout=10)
            assert run.status is RunStatus.COMPLETED
            assert run.worker == worker.id  # run by the worker process, not here
            assert run.output == {"slept": 0.01}
            with pytest.raises(UnknownQueue, match=r"queues: naps, single"):
                await producer.enqueue("nope", {})
            # A producer registers no worker: it serves nothing.
            assert [w.id for w in await producer.workers()] == [worker.id]
    finally:
        assert worker.stop() == 0, worker.stderr()


async def test_a_producer_on_a_database_no_worker_uses_names_it(tmp_path: Path) -> None:
    """A mistyped path gives a producer a database of its own, empty: the error says which."""
    typo = tmp_path / "blok.bd"
    async with Engine(database=typo) as producer:
        with pytest.raises(UnknownQueue) as unknown:
            await producer.enqueue("orders", {})
    assert str(unknown.value) == (
        "unknown queue 'orders' (queues: none; a queue is known once a worker serving it has "
        f"started on this database, {typo})"
    )


async def test_a_queue_with_runs_that_no_worker_serves_now_says_what_may_have_happened(
    tmp_path: Path,
) -> None:
    """Its workflow file removed under a worker, a queue with runs was "unknown ... a queue is
    known once a worker serving it has started", though one had."""
    database = tmp_path / "blok.db"

    def served_on(queue: str) -> Workflow:
        return Workflow(
            name="reports", trigger=WorkerTrigger(queue=queue), steps=[Step("one", lambda ctx: 1)]
        )

    async with Engine(workflows=[served_on("reports")], database=database) as first:
        await first.wait_for_job(await first.enqueue("reports", {}), timeout=10)
    async with Engine(workflows=[served_on("monthly")], database=database) as second:
        with pytest.raises(UnknownQueue) as unknown:
            await second.enqueue("reports", {})
    assert str(unknown.value) == (
        "unknown queue 'reports' (queues: monthly; it has runs, but no worker serves it: was its "
        "workflow file removed, or its queue renamed?)"
    )


def parent_and_child() -> list[Workflow]:
    async def never(ctx: object) -> None:
        raise AssertionError("the child must not run: its queue is paused")

    child = Workflow(
        name="child",
        trigger=WorkerTrigger(queue="children"),
        steps=[Step("never", never)],
    )
    parent = Workflow(
        name="parent",
        trigger=WorkerTrigger(queue="parents"),
        steps=[subworkflow("call", workflow="child")],
    )
    return [child, parent]


async def test_an_attached_cancel_of_a_parent_cancels_its_child_with_no_worker_alive(
    tmp_path: Path,
) -> None:
    database = tmp_path / "blok.db"
    async with Engine(workflows=parent_and_child(), database=database) as engine:
        await engine.pause("children")  # the child stays queued, the parent waits on it
        waiting = lambda e: e.queue == "parents" and e.status == "waiting"  # noqa: E731
        async with expect_events(engine, RunStatusChanged, where=waiting):
            job = await engine.enqueue("parents", {})
        parent_id = (await engine.get_job(job)).run_id
        child_id = (await engine.get_run(parent_id)).step("call").child_run_id
        assert child_id is not None
    # No worker alive now: the attached console (an Engine with no workflows) acts alone.
    async with Engine(database=database, create=False) as attached:
        assert await attached.live_workers() == []
        parent = await attached.cancel(parent_id)
        assert parent.status is RunStatus.CANCELLED
        child = await attached.get_run(child_id)
        assert child.status is RunStatus.CANCELLED
        assert (await attached.get_job(child.job_id)).state is JobState.CANCELLED


async def test_a_client_engine_never_creates_or_adopts_a_database(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="no such database"):
        async with Engine(database=tmp_path / "missing.db", create=False):
            pass
    assert not (tmp_path / "missing.db").exists()
    other = tmp_path / "notes.db"
    import sqlite3

    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    with pytest.raises(DatabaseError, match="not a blok database"):
        async with Engine(database=other, create=False):
            pass
    with sqlite3.connect(other) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master")]
    assert tables == ["notes"], "a refused database was changed"


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("postgresql:/postgres@127.0.0.1/test", "looks like a database URL but is not one"),
        ("postgres:postgres@127.0.0.1/test", "looks like a database URL but is not one"),
        (" postgresql://postgres@127.0.0.1/test", "has spaces around it"),
        ("postgresql://postgres@127.0.0.1/test\n", "has spaces around it"),
        ("postgresql://ann:p@ss@127.0.0.1/test", "holds an '@': write it %40"),
    ],
)
async def test_a_mistyped_database_url_is_refused_not_made_a_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, said: str
) -> None:
    """One slash short, or a space from a .env file: the value was taken for a file path, a
    SQLite database made in a folder named after the URL, and a worker served it."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatabaseError, match=said):
        async with Engine(database=given):
            pass
    assert list(tmp_path.iterdir()) == []


def test_a_database_url_is_never_taken_for_a_file_name(tmp_path: Path) -> None:
    done = blok("runs", "--db", "mysql://root@127.0.0.1/test")
    assert done.returncode == 1
    assert "unsupported database URL scheme 'mysql'" in done.stderr
    assert not Path("mysql:").exists()
