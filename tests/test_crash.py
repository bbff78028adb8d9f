"""kill -9 of a real worker process, then a restart over the same SQLite file: nothing lost."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from blok_tui.run_text import run_text
from engine import Engine, JobState, Run, RunStatus

pytestmark = pytest.mark.anyio

WORKFLOW = textwrap.dedent(
    """
    import anyio
    from engine import Step, WorkerTrigger, Workflow

    async def work(ctx):
        await anyio.sleep(ctx.body.get("seconds", 0.05))
        return {"n": ctx.body["n"]}

    workflow = Workflow(
        name="crashy",
        trigger=WorkerTrigger(queue="crashy", concurrency=20),
        steps=[Step("work", work)],
    )
    """
)

WORKER = textwrap.dedent(
    """
    import sys, anyio
    from engine import Engine

    async def main():
        async with Engine(workflows=sys.argv[1], database=sys.argv[2]) as engine:
            print("ready", flush=True)
            await engine.serve_forever()

    anyio.run(main)
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "crashy.py").write_text(WORKFLOW)
    (tmp_path / "worker.py").write_text(WORKER)
    return tmp_path


def start_worker(project: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(project / "worker.py"),
            str(project / "workflows"),
            str(project / "blok.db"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def spawn_worker(project: Path) -> subprocess.Popen[str]:
    """A worker process, started, not waited for."""
    return subprocess.Popen(
        [
            sys.executable,
            str(project / "worker.py"),
            str(project / "workflows"),
            str(project / "blok.db"),
        ],
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


@contextmanager
def worker_process(project: Path) -> Iterator[subprocess.Popen[str]]:
    """A worker process, killed on the way out if the test left it alive."""
    worker = start_worker(project)
    try:
        yield worker
    finally:
        if worker.poll() is None:
            worker.kill()


def each_completed_once(runs: list[Run], jobs: list[str]) -> list[Run]:
    """Assert every run completed or crashed and every job completed exactly once; the
    crashed runs."""
    completed: dict[str, int] = {}
    for run in runs:
        assert run.status in (RunStatus.COMPLETED, RunStatus.CRASHED), run.status
        if run.status is RunStatus.COMPLETED:
            completed[run.job_id] = completed.get(run.job_id, 0) + 1
    assert sorted(completed) == sorted(jobs)
    assert set(completed.values()) == {1}, "a job completed more than once"
    return [run for run in runs if run.status is RunStatus.CRASHED]


async def wait_running(engine: Engine, at_least: int) -> None:
    # The runs start in another process: the shared file is all there is to watch.
    with anyio.fail_after(20):
        while len(await engine.runs(status="running", limit=1000)) < at_least:  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def test_kill_9_with_200_jobs_in_flight_loses_nothing(project: Path) -> None:
    db = project / "blok.db"
    with worker_process(project) as worker:
        # A client engine on the same file that only enqueues and reads (consume=False).
        async with Engine(workflows=project / "workflows", database=db, consume=False) as client:
            jobs = await client.enqueue_many(
                "crashy", [{"n": n, "seconds": 0.3} for n in range(200)]
            )
            await wait_running(client, 20)
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)
            crashed_before = [r.id for r in await client.runs(status="running", limit=1000)]
            assert crashed_before, "the worker died with runs in flight"

    async with Engine(workflows=project / "workflows", database=db) as engine:
        # Boot recovery: the dead worker's runs are crashed at once, with a reason.
        for run_id in crashed_before:
            run = await engine.get_run(run_id)
            assert run.status is RunStatus.CRASHED
            assert "died before the run finished" in (run.error or "")
        for job in jobs:
            await engine.wait_for_job(job, timeout=60)
        runs = await engine.runs(queue="crashy", limit=10_000)
    each_completed_once(runs, jobs)


async def test_crashed_run_is_flipped_on_boot_and_its_job_redelivered(project: Path) -> None:
    db = project / "blok.db"
    with worker_process(project) as worker:
        async with Engine(workflows=project / "workflows", database=db, consume=False) as client:
            job = await client.enqueue("crashy", {"n": 1, "seconds": 30})
            await wait_running(client, 1)
            [victim] = await client.runs(status="running")
            assert victim.worker and f":{worker.pid}:" in victim.worker
            killed_at = datetime.now(UTC)
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)
    async with Engine(workflows=project / "workflows", database=db) as engine:
        crashed = await engine.get_run(victim.id)
        assert crashed.status is RunStatus.CRASHED
        assert crashed.step("work").status == "failed"
        # It ended where its worker was last heard of, not when recovery found it dead (its
        # duration ran on to the next boot, or to a janitor round or a lease later).
        [attempt] = crashed.step("work").attempts
        assert crashed.started_at is not None and crashed.finished_at is not None
        assert crashed.started_at <= crashed.finished_at <= killed_at
        assert attempt.finished_at == crashed.finished_at == crashed.step("work").finished_at
        # Named as a failure's is: the step it was in, its attempt counted failed.
        assert crashed.error is not None
        assert crashed.error.startswith("[step 1/1] work: its worker process "), crashed.error
        assert (crashed.error_step, crashed.failed_attempts) == ("work", 1)
        redelivered = await engine.get_job(job)
        assert redelivered.run_id != victim.id  # a new run for the same job
        fresh = await engine.get_run(redelivered.run_id)
        with anyio.fail_after(10):
            while fresh.status is not RunStatus.RUNNING:  # claimed as the engine starts
                await anyio.sleep(0.02)
                fresh = await engine.get_run(redelivered.run_id)
        assert fresh.job_id == job
        assert any("previous run" in line.message for line in fresh.logs)
        await engine.cancel(fresh.id)
        assert (await engine.get_job(job)).state is JobState.CANCELLED


async def test_a_running_peer_on_the_machine_takes_a_killed_workers_job_before_its_lease(
    project: Path,
) -> None:
    """Only a worker that booted looked for the dead processes of its machine: a peer that was
    running waited for the killed worker's lease to run out (30 s), and a producer's
    `wait_for_job` with it, though it could see the pid was gone."""
    db = project / "blok.db"
    with worker_process(project) as first, worker_process(project) as second:
        async with Engine(database=db) as client:
            job = await client.enqueue("crashy", {"n": 1, "seconds": 30})
            await wait_running(client, 1)
            [victim] = await client.runs(status="running")
            holder, peer = (
                (first, second)
                if f":{first.pid}:" in str(victim.worker)
                else (
                    second,
                    first,
                )
            )
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=10)
            with anyio.fail_after(15):  # the lease is 30 s; a heartbeat 2 s
                while (await client.get_job(job)).run_id == victim.id:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            crashed = await client.get_run(victim.id)
            assert crashed.status is RunStatus.CRASHED
            assert "found by recovery" in (crashed.error or ""), crashed.error
            fresh = await client.get_run((await client.get_job(job)).run_id)
            with anyio.fail_after(10):
                while fresh.status is not RunStatus.RUNNING:
                    await anyio.sleep(0.05)
                    fresh = await client.get_run(fresh.id)
            assert f":{peer.pid}:" in str(fresh.worker)
            # Taken over, the killed worker stays listed, as gone: `workers` listed only the
            # survivor a second after the kill, and nothing said which one had died.
            states = {w.id: client.worker_state(w) for w in await client.workers()}
            assert states[str(victim.worker)] == "gone", states
            await client.cancel(fresh.id)


HELD_NOT_BEGUN = (
    "SELECT count(*) FROM jobs JOIN runs ON runs.id = jobs.run_id"
    " WHERE jobs.state = 'active' AND jobs.handed = 1 AND runs.status = 'queued'"
)


async def test_kill_9_holding_a_top_up_of_short_jobs_loses_and_doubles_nothing(
    project: Path,
) -> None:
    """A worker busy with short jobs tops up what it keeps ahead, and a top-up's jobs are
    `handed` (their slots start them without waiting for a commit of the run's start). Killed
    while it holds such jobs, it leaves them active under its lease with runs that say queued:
    the next worker records each of those runs crashed (it may have begun) and runs the job in
    a new run. Every job completes once."""
    db = project / "blok.db"
    with worker_process(project) as worker:
        async with Engine(workflows=project / "workflows", database=db, consume=False) as client:
            jobs = await client.enqueue_many(
                "crashy", [{"n": n, "seconds": 0.002} for n in range(3000)]
            )
            # Frozen (SIGSTOP: the file holds still) until it shows handed jobs whose runs
            # have not started, then killed there.
            held = 0
            with anyio.fail_after(30), closing(sqlite3.connect(db, timeout=30)) as conn:
                while True:
                    worker.send_signal(signal.SIGSTOP)
                    held = conn.execute(HELD_NOT_BEGUN).fetchone()[0]
                    if held >= 3:
                        break
                    worker.send_signal(signal.SIGCONT)
                    await anyio.sleep(0.002)
                worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)

    async with Engine(workflows=project / "workflows", database=db) as engine:
        for job in jobs:
            await engine.wait_for_job(job, timeout=60)
        runs = await engine.runs(queue="crashy", limit=10_000)
    crashed = each_completed_once(runs, jobs)
    assert len(crashed) >= held  # each held job's first run, and any begun when it died
    assert {run.job_id for run in crashed} <= set(jobs)


POISON = textwrap.dedent(
    """
    import os, signal
    from engine import Step, WorkerTrigger, Workflow

    def eat(ctx):
        os.kill(os.getpid(), signal.SIGKILL)  # takes its worker down, every time

    workflow = Workflow(name="poison", trigger=WorkerTrigger(queue="poison"), steps=[Step("eat", eat)])
    """
)


async def test_a_job_that_kills_every_worker_goes_to_the_dead_letter_queue(project: Path) -> None:
    """It was delivered again after each crash, whatever its retries: one such job took down
    every worker that started, for ever. After its third crash it is a dead letter."""
    (project / "workflows" / "poison.py").write_text(POISON)
    db = project / "blok.db"
    deaths = 0
    with worker_process(project) as first:
        async with Engine(database=db, create=False) as client:
            job_id = await client.enqueue("poison", {})
            assert first.wait(timeout=20) == -signal.SIGKILL
            deaths += 1
            survivor: subprocess.Popen[str] | None = None
            for _ in range(5):  # a worker's boot releases the dead one's job: it takes it
                worker = spawn_worker(project)  # not waited for: it may die first
                with anyio.fail_after(20):
                    while worker.poll() is None:
                        if (await client.get_job(job_id)).state is JobState.DEAD:
                            survivor = worker
                            break
                        await anyio.sleep(0.05)
                if survivor is not None:
                    break
                deaths += 1
            try:
                assert survivor is not None, f"still delivered after {deaths} crashes"
                assert survivor.poll() is None  # it never ran the job
                job = await client.get_job(job_id)
                runs = await client.runs(queue="poison")
            finally:
                if survivor is not None:
                    survivor.kill()
                    survivor.wait()
            # "Requeue it to try again": with a fresh budget, crashes included (it kept its
            # three, so the next crash made it a dead letter again at once).
            await client.requeue(job_id)
            requeued = await client.get_job(job_id)
    assert [requeued.state, requeued.deliveries, requeued.delivery_budget] == [
        JobState.WAITING,
        0,
        1,
    ]
    assert deaths == 3
    assert [run.status for run in runs] == [RunStatus.CRASHED] * 3
    # Crashes use no retry: each run is a delivery the job may take, the third its last (it
    # read "delivery 3 of 1").
    assert [job.delivery_budget, sorted(run.job_attempt for run in runs)] == [3, [1, 2, 3]]
    for run in runs:
        assert run.error is not None and "died before the run finished (found by recovery)" in (
            run.error
        )
        # Handed straight to a slot, its code ran before its start was recorded: said so
        # (`show` said "never started" of a run that had killed its process).
        if run.started_at is None:
            assert run.error.endswith(
                "; its start was not recorded, but the run may have begun there"
            )
            assert "(its start was not recorded)" in run_text(run, run.created_at)
    assert job.error == (
        "its runs crashed their workers 3 times: moved to the dead-letter queue so that it "
        "takes down no more (requeue it to try again)"
    )


SHOP = textwrap.dedent(
    """
    import os, pathlib, anyio
    from engine import Step, WorkerTrigger, Workflow

    CALLS = pathlib.Path(os.environ["BLOK_TEST_CALLS"])

    def called(name):
        with CALLS.open("a") as calls:
            calls.write(name + "\\n")

    async def charge(ctx):
        called("charge")
        return {"charged": ctx.body["amount"]}

    async def pack(ctx):
        called("pack")
        if ctx.job.delivery == 1:
            await anyio.sleep(60)  # its worker dies (or freezes) here
        return "packed"

    async def ship(ctx):
        return f"shipped {ctx.state['charge']['charged']}"

    workflow = Workflow(
        name="shop",
        trigger=WorkerTrigger(queue="shop"),
        steps=[Step("charge", charge), Step("pack", pack), Step("ship", ship)],
    )
    """
)

# The worker above, with a lease of 2 s: a frozen one loses its job to a live one's claim soon.
LEASED_WORKER = WORKER.replace("database=sys.argv[2])", 'database=sys.argv[2], lease="2s")')
assert LEASED_WORKER != WORKER


@pytest.mark.parametrize("how", ["killed", "frozen"])
async def test_the_next_run_of_a_crashed_one_goes_on_from_the_steps_it_completed(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed -9 (found dead by the next one's boot) or frozen past its lease (its job
    taken over by a live worker's claim) in the second of three steps: the job's next run ran
    all three again, and the card was charged twice. It goes on at the step that crashed now,
    the first one cached from the crashed run, its output in ctx.state as it was."""
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "shop.py").write_text(SHOP)
    (tmp_path / "worker.py").write_text(LEASED_WORKER)
    calls = tmp_path / "calls.txt"
    calls.touch()
    monkeypatch.setenv("BLOK_TEST_CALLS", str(calls))  # the worker's and this engine's
    db = tmp_path / "blok.db"
    with worker_process(tmp_path) as worker:
        async with Engine(database=db, create=False) as client:
            job_id = await client.enqueue("shop", {"amount": 42})
            with anyio.fail_after(20):
                while calls.read_text().split() != ["charge", "pack"]:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
        worker.send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        async with Engine(workflows=tmp_path / "workflows", database=db) as engine:
            run = await engine.wait_for_job(job_id, timeout=30)
            crashed = [r for r in await engine.runs(queue="shop") if r.id != run.id]
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.output == "shipped 42"
    assert calls.read_text().split() == ["charge", "pack", "pack"]  # charged once
    [before] = crashed
    assert before.status is RunStatus.CRASHED
    # Each way a job is taken from a worker that is gone: released by recovery, or taken over.
    said = "died before the run finished" if how == "killed" else "stopped renewing its lease"
    assert said in (before.error or ""), before.error
    charge = run.step("charge")
    assert (charge.status, charge.cached_from) == ("cached", before.id)
    assert [s.status for s in run.steps] == ["cached", "completed", "completed"]
    assert (
        f"resumes at step 'pack': the steps before it completed in run {before.id} (cached: "
        "not run again)"
    ) in [line.message for line in run.logs]


BATCH = textwrap.dedent(
    """
    import os, pathlib, anyio
    from engine import Step, WorkerTrigger, Workflow, for_each

    CALLS = pathlib.Path(os.environ["BLOK_TEST_CALLS"])

    async def resize(ctx, item):
        with CALLS.open("a") as calls:
            calls.write(f"{item}\\n")
        if ctx.job.delivery == 1 and item == 2:
            await anyio.sleep(60)  # its worker dies here
        return item * 10

    workflow = Workflow(
        name="batch",
        trigger=WorkerTrigger(queue="batch"),
        steps=[
            for_each("each", items="$.body.items", parallel=int(os.environ["BLOK_TEST_PARALLEL"]),
                     steps=[Step("resize", resize, inputs={"item": "$.state.each.item"})]),
            Step("sum", lambda ctx: sum(ctx.state["each"])),
        ],
    )
    """
)


async def items_done(client: Engine, job_id: str) -> dict[str, object]:
    """The items the for_each of the job's run has recorded done, by index."""
    run = await client.get_run((await client.get_job(job_id)).run_id)
    output = run.step("each").output
    return output.get("done", {}) if isinstance(output, dict) else {}


@pytest.mark.parametrize("parallel", [1, 2])
async def test_the_next_run_of_a_crashed_one_goes_on_after_the_items_a_for_each_finished(
    tmp_path: Path, parallel: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed -9 in the third of four items of a for_each: the next run did all four
    again. It goes on after the items that finished (in order, or side by side)."""
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "batch.py").write_text(BATCH)
    (tmp_path / "worker.py").write_text(WORKER)
    calls = tmp_path / "calls.txt"
    calls.touch()
    monkeypatch.setenv("BLOK_TEST_CALLS", str(calls))
    monkeypatch.setenv("BLOK_TEST_PARALLEL", str(parallel))
    db = tmp_path / "blok.db"
    finished_before = {1: ["0", "1", "2"], 2: ["0", "1", "2", "3"]}[parallel]
    with worker_process(tmp_path) as worker:
        async with Engine(database=db, create=False) as client:
            job_id = await client.enqueue("batch", {"items": [0, 1, 2, 3]})
            with anyio.fail_after(20):
                # Item 3, beside item 2, is done once its for_each's record says so.
                while sorted(calls.read_text().split()) != finished_before or (  # noqa: ASYNC110
                    parallel == 2 and "3" not in await items_done(client, job_id)
                ):
                    await anyio.sleep(0.05)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        async with Engine(workflows=tmp_path / "workflows", database=db) as engine:
            run = await engine.wait_for_job(job_id, timeout=30)
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.output == 60
    again = calls.read_text().split()[len(finished_before) :]
    assert again == (["2", "3"] if parallel == 1 else ["2"]), calls.read_text()
    done = 2 if parallel == 1 else 3
    assert any(
        f"resumes at step 'each' (after {done} of its 4 items)" in line.message for line in run.logs
    ), [line.message for line in run.logs]
