"""Attaching to a database that a `blok-tui worker` subprocess serves: an `Engine` with no
workflows (a client) and the console on top of it."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from cli_helpers import Worker, blok, start_worker, write_workflows
from support import run_events_until

from engine import (
    AttemptStatus,
    Engine,
    EngineError,
    Event,
    LogRecorded,
    QueueChanged,
    RunFinished,
    RunQueued,
    RunStarted,
    RunStatus,
    StepFinished,
    StepStarted,
    StepStatus,
    UnknownQueue,
)
from engine.events import WorkflowReloaded
from engine.reload import wait_until_watching

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Worker]]:
    root = tmp_path_factory.mktemp("attach")
    database = root / "blok.db"
    worker = start_worker(database, write_workflows(root / "workflows"))
    yield database, worker
    assert worker.stop() == 0, worker.stderr()


@pytest.fixture
async def attached(served: tuple[Path, Worker]) -> AsyncIterator[Engine]:
    async with Engine(database=served[0], create=False) as engine:
        yield engine


async def test_attached_engine_shows_what_the_worker_serves(
    served: tuple[Path, Worker], attached: Engine
) -> None:
    _, worker = served
    queues = {q.name: q for q in await attached.queues()}
    assert set(queues) == {"naps", "single"}
    assert queues["naps"].workflow_name == "test.nap"
    assert (queues["naps"].provider, queues["naps"].concurrency) == ("sqlite", 4)
    assert [w.id for w in await attached.live_workers()] == [worker.id]
    assert {w.name for w in await attached.workflows()} == {"test.nap", "test.single"}
    assert attached.reload_errors == {}
    with pytest.raises(UnknownQueue, match="unknown queue 'nowhere'"):
        await attached.queue_stats("nowhere")


async def test_events_follow_a_run_that_another_process_runs(
    served: tuple[Path, Worker], attached: Engine
) -> None:
    database, worker = served
    events = attached.events()
    done = await anyio.run_process(
        [*_blok_argv(), "enqueue", "naps", '{"seconds": 0.05}', "--db", str(database)]
    )
    job_id = done.stdout.decode().strip()
    run_id = (await attached.get_job(job_id)).run_id
    seen = await run_events_until(events, run_id, RunFinished, timeout=10)
    kinds = [type(e) for e in seen]
    assert kinds[0] is RunQueued
    assert kinds.index(RunStarted) < kinds.index(StepStarted) < kinds.index(StepFinished)
    assert LogRecorded in kinds
    assert [(e.index, e.attempt) for e in seen if isinstance(e, StepStarted)] == [(0, 1)]
    assert [e.status for e in seen if isinstance(e, StepFinished)] == ["completed"]
    log_line = next(e for e in seen if isinstance(e, LogRecorded))
    assert log_line.message == "napping 0.05 s"
    finished = seen[-1]
    assert isinstance(finished, RunFinished) and finished.status == "completed"
    # Each names the run's job: a console reads what it keeps of the job again.
    told = [e for e in seen if isinstance(e, (RunQueued, RunStarted, RunFinished))]
    assert {e.job_id for e in told} == {job_id}, told
    run = await attached.get_run(run_id)
    assert run.worker == worker.id
    stats = await attached.queue_stats("naps")
    assert stats.completed >= 1


async def test_cancel_from_the_attached_client_stops_the_workers_step(
    attached: Engine,
) -> None:
    events = attached.events()
    job_id = await attached.enqueue("naps", {"seconds": 30})
    run_id = (await attached.get_job(job_id)).run_id
    await run_events_until(events, run_id, StepStarted, timeout=10)
    started = time.monotonic()
    run = await attached.cancel(run_id)
    took = time.monotonic() - started
    assert run.status is RunStatus.CANCELLED
    assert took < 1.5, f"cancel took {took:.2f}s"
    step = run.steps[0]
    assert step.status is StepStatus.CANCELLED
    assert step.attempts[-1].status is AttemptStatus.CANCELLED
    finished = await run_events_until(events, run_id, RunFinished, timeout=10)
    assert isinstance(finished[-1], RunFinished) and finished[-1].status == "cancelled"
    # The step was already reported started; only its end is news (log lines aside).
    finished = [e for e in finished if not isinstance(e, LogRecorded)]
    assert [type(e) for e in finished] == [StepFinished, RunFinished]
    assert isinstance(finished[0], StepFinished) and finished[0].status == "cancelled"
    with pytest.raises(EngineError, match="has already ended"):
        await attached.cancel(run_id)


async def test_replay_and_pause_go_through_the_worker(attached: Engine) -> None:
    job_id = await attached.enqueue("naps", {"seconds": 0})
    source = await attached.wait_for_job(job_id, timeout=10)
    assert source.status is RunStatus.COMPLETED
    events = attached.events()
    new_id = await attached.replay(source.id, input={"seconds": 0.01})
    await run_events_until(events, new_id, RunFinished, timeout=10)
    replayed = await attached.get_run(new_id)
    assert (replayed.replay_of, replayed.input) == (source.id, {"seconds": 0.01})

    await attached.pause("single")
    try:
        assert next(q for q in await attached.queues() if q.name == "single").paused
        with anyio.fail_after(5):
            async for event in events:
                if isinstance(event, QueueChanged) and event.queue == "single":
                    break
        held = await attached.enqueue("single", {"seconds": 0})
        await anyio.sleep(0.6)  # long enough for a claim that should not happen
        assert (await attached.get_job(held)).state == "waiting"
    finally:
        await attached.resume("single")
    assert (await attached.wait_for_job(held, timeout=10)).status is RunStatus.COMPLETED


async def test_attached_console_cancels_a_run_of_the_worker(attached: Engine) -> None:
    from blok_tui.app import BlokApp
    from blok_tui.confirm_screen import ConfirmScreen
    from blok_tui.run_screen import RunScreen

    events = attached.events()
    job_id = await attached.enqueue("naps", {"seconds": 30})
    run_id = (await attached.get_job(job_id)).run_id
    await run_events_until(events, run_id, StepStarted, timeout=10)
    app = BlokApp(attached)
    async with app.run_test(size=(150, 45)) as pilot:
        with anyio.fail_after(10):
            await app.ready.wait()
        app.open_run(run_id)
        with anyio.fail_after(10):
            while not (isinstance(app.screen, RunScreen) and app.screen.run is not None):
                await pilot.pause(0.02)
        await pilot.press("c")
        with anyio.fail_after(10):
            while not isinstance(app.screen, ConfirmScreen):
                await pilot.pause(0.02)
        await pilot.press("y")
        with anyio.fail_after(5):
            while (await attached.get_run(run_id)).status != "cancelled":
                await pilot.pause(0.05)
        # The run view hears of it through the attached client's events, and shows it.
        screen = app.screen
        assert isinstance(screen, RunScreen)
        with anyio.fail_after(5):
            while not (screen.idle and screen.run is not None and screen.run.terminal):
                await pilot.pause(0.02)
        assert screen.run.status is RunStatus.CANCELLED
    run = await attached.get_run(run_id)
    assert run.steps[0].status is StepStatus.CANCELLED


def test_the_attach_command_refuses_a_missing_database(tmp_path: Path) -> None:
    done = blok("attach", "--db", tmp_path / "none.db")
    assert done.returncode == 1
    assert "no such database" in done.stderr
    # Refused before anything was made: a mistyped path left its folders and a blok.log.
    typo = blok("attach", "--db", tmp_path / "typo" / "sub" / "blok.db")
    assert typo.returncode == 1 and "no such database" in typo.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_consoles_log_is_its_owners_only(tmp_path: Path) -> None:
    """Its folder was made 0755 and its blok.log 0644, holding runs' errors, where the
    database's folder is 0700 and its file 0600."""
    from blok_tui.cli import _log_quietly

    handler = _log_quietly(tmp_path / "state" / "blok.db")
    try:
        assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
        assert (tmp_path / "state" / "blok.log").stat().st_mode & 0o777 == 0o600
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def _blok_argv() -> list[str]:
    import sys

    return [sys.executable, "-m", "blok_tui"]


async def test_reload_errors_and_reloads_of_the_worker_reach_the_attached_client(
    tmp_path: Path,
) -> None:
    folder = write_workflows(tmp_path / "workflows")
    broken = folder / "broken.py"
    broken.write_text("from engine import Workflow\n\nworkflow = Workflow(name=)\n")
    worker = start_worker(tmp_path / "blok.db", folder)
    try:
        async with Engine(database=tmp_path / "blok.db", create=False) as attached:
            (path, message), *_ = attached.reload_errors.items()
            assert path == str(broken.resolve())
            assert message.startswith(f"{broken.resolve()}:3: ")
            events = attached.events()
            broken.write_text(
                "from engine import Step, Workflow, WorkerTrigger\n\n"
                "workflow = Workflow(name='test.fixed', trigger=WorkerTrigger(queue='fixed'),"
                " steps=[Step('noop', lambda ctx: 1)])\n"
            )
            seen: list[Event] = []
            with anyio.fail_after(10):
                async for event in events:
                    seen.append(event)
                    if isinstance(event, QueueChanged) and event.queue == "fixed":
                        break
            assert attached.reload_errors == {}
            assert "fixed" in {q.name for q in await attached.queues()}
            assert any(type(e).__name__ == "ReloadErrorCleared" for e in seen)
    finally:
        assert worker.stop() == 0


async def test_an_attached_client_shows_no_load_error_of_a_worker_that_stopped(
    tmp_path: Path,
) -> None:
    # A worker whose only file failed to load, then stopped, left its catalog (it shared no
    # workflow with a live one): an attached console showed its error for minutes, over
    # workers that load the fixed file.
    folder = tmp_path / "workflows"
    folder.mkdir()
    shop = folder / "shop.py"
    shop.write_text("from engine import Workflow\n\nworkflow = Workflow(name=)\n")
    database = tmp_path / "blok.db"
    async with Engine(workflows=folder, database=database) as stopped:
        assert str(shop.resolve()) in stopped.reload_errors
    shop.write_text(
        "from engine import Step, Workflow, WorkerTrigger\n\n"
        "workflow = Workflow(name='shop', trigger=WorkerTrigger(queue='shop'),"
        " steps=[Step('noop', lambda ctx: 1)])\n"
    )
    async with (
        Engine(workflows=folder, database=database) as serving,
        Engine(database=database, create=False) as attached,
    ):
        assert serving.reload_errors == {}
        assert attached.reload_errors == {}


async def test_an_attached_client_says_reloaded_only_of_the_file_that_was(tmp_path: Path) -> None:
    # A mixed fleet (two workers serving pay.py at two versions): an edit of ship.py on one
    # made the attached console say "Reloaded pay.py" too, with the other worker's version:
    # the versions of every worker were compared merged by workflow name.
    def source(name: str, label: str) -> str:
        return (
            "from engine import Step, WorkerTrigger, Workflow\n\n"
            f"workflow = Workflow(name={name!r}, trigger=WorkerTrigger(queue={name!r}),"
            f" steps=[Step({label!r}, lambda ctx: 1)])\n"
        )

    first, second = tmp_path / "first", tmp_path / "second"
    for folder, label in ((first, "v1"), (second, "v2")):
        folder.mkdir()
        (folder / "pay.py").write_text(source("pay", label))
        (folder / "ship.py").write_text(source("ship", "v1"))
    database = tmp_path / "blok.db"
    async with (
        Engine(workflows=first, database=database, watch=True) as one,
        Engine(workflows=second, database=database),
        Engine(database=database, create=False) as attached,
    ):
        await wait_until_watching(one)
        events = attached.events()
        await attached.flush()
        (first / "ship.py").write_text(source("ship", "v2"))
        seen: list[WorkflowReloaded] = []
        with anyio.fail_after(10):
            async for event in events:
                if isinstance(event, WorkflowReloaded):
                    seen.append(event)
                    if event.path == str((first / "ship.py").resolve()):
                        break
        assert [Path(e.path).name for e in seen] == ["ship.py"], seen
