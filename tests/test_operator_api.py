"""The operator API, one suite run five ways: on the in-process engine (memory, SQLite and
PostgreSQL), and from an attached client — an Engine with no workflows on the same database
(SQLite, PostgreSQL), whose actions on runs a worker holds are signals that worker picks up."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import a_database, until

from engine import (
    Engine,
    EngineError,
    JobState,
    ReplayedAlready,
    Retry,
    RunFilter,
    RunStatus,
    Step,
    StepStatus,
    UnknownJob,
    UnknownQueue,
    UnknownRun,
    WorkerTrigger,
    Workflow,
)

pytestmark = pytest.mark.anyio


@dataclass
class Controls:
    """What the nodes wait on, so the tests decide when a step ends."""

    release: anyio.Event = field(default_factory=anyio.Event)
    attempts: dict[str, int] = field(default_factory=dict)


def workflows(controls: Controls) -> list[Workflow]:
    async def hold(ctx: Any) -> str:
        await controls.release.wait()
        return "released"

    async def echo(ctx: Any, value: Any) -> Any:
        return value

    async def fail(ctx: Any) -> None:
        raise RuntimeError("always")

    async def picky(ctx: Any, ok: bool) -> bool:
        if not ok:
            raise ValueError("not ok")
        return ok

    async def flaky(ctx: Any) -> int:
        controls.attempts[ctx.run_id] = controls.attempts.get(ctx.run_id, 0) + 1
        if ctx.attempt == 1:
            raise ConnectionError("first attempt fails")
        return ctx.attempt

    async def second_time(ctx: Any) -> int:
        assert ctx.job is not None
        if ctx.job.delivery == 1:
            raise RuntimeError("the first delivery fails")
        return int(ctx.job.delivery)

    return [
        Workflow(
            name="second",
            trigger=WorkerTrigger(queue="second", retries=1, delay=10),
            steps=[Step("try", second_time)],
        ),
        Workflow(
            name="holding",
            trigger=WorkerTrigger(queue="hold", concurrency=4),
            steps=[Step("hold", hold)],
        ),
        Workflow(
            name="echoing",
            trigger=WorkerTrigger(queue="echo", concurrency=4),
            steps=[
                Step("first", echo, inputs={"value": "$.body.value"}),
                Step("second", echo, inputs={"value": "$.state.first"}),
            ],
        ),
        Workflow(
            name="failing",
            trigger=WorkerTrigger(queue="fail", retries=1, delay=10),
            steps=[Step("fail", fail)],
        ),
        Workflow(
            name="picky",
            trigger=WorkerTrigger(queue="picky"),
            steps=[Step("check", picky, inputs={"ok": "$.body.ok"})],
        ),
        Workflow(
            name="retrying",
            trigger=WorkerTrigger(queue="retry"),
            steps=[Step("flaky", flaky, retry=Retry(2, min_timeout="60s"))],
        ),
    ]


@dataclass
class Setup:
    worker: Engine  # runs the workflows
    actor: Engine  # what the tests act through
    controls: Controls


@pytest.fixture(
    params=[
        "local-memory",
        "local-sqlite",
        "attached-sqlite",
        "local-postgres",
        "attached-postgres",
    ]
)
async def setup(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Setup]:
    controls = Controls()
    async with (
        a_database(request.param.split("-")[1], tmp_path) as database,
        Engine(workflows=workflows(controls), database=database, grace_period=0.5) as worker,
    ):
        if request.param.startswith("attached"):
            await worker.flush()  # what it serves is in the file before the client reads it
            async with Engine(database=database, create=False) as client:
                assert not client.capabilities.runs_workflows
                yield Setup(worker, client, controls)
        else:
            yield Setup(worker, worker, controls)
        controls.release.set()


async def status_of(engine: Engine, run_id: str, wanted: RunStatus, timeout: float = 10) -> None:
    async def reached() -> bool:
        return (await engine.get_run(run_id)).status is wanted

    await until(reached, timeout)


async def run_of(engine: Engine, job_id: str) -> str:
    return (await engine.get_job(job_id)).run_id


async def test_enqueue_wait_and_read(setup: Setup) -> None:
    actor = setup.actor
    job = await actor.enqueue("echo", {"value": 7})
    run = await actor.wait_for_job(job, timeout=10)
    assert (run.status, run.output) == (RunStatus.COMPLETED, 7)
    assert [s.status for s in run.steps] == [StepStatus.COMPLETED] * 2
    assert (await actor.get_run(run.id)).steps[1].output == 7
    assert [r.id for r in await actor.runs(queue="echo")] == [run.id]
    assert await actor.count_runs(RunFilter.of("completed", queue="echo")) == 1
    assert (await actor.queue_stats("echo")).completed == 1
    assert {q.name for q in await actor.queues()} == {
        "hold",
        "echo",
        "fail",
        "picky",
        "retry",
        "second",
    }
    assert {w.name for w in await actor.workflows()} >= {"echoing", "holding"}


async def test_runs_since_a_moment_are_those_created_from_it(setup: Setup) -> None:
    actor = setup.actor
    before = await actor.wait_for_job(await actor.enqueue("echo", {"value": 1}), timeout=10)
    since = actor.now()  # the clock the runs' times are on (the server's, on PostgreSQL)
    after = await actor.wait_for_job(await actor.enqueue("echo", {"value": 2}), timeout=10)
    assert [r.id for r in await actor.runs(queue="echo", since=since)] == [after.id]
    assert {r.id for r in await actor.runs(queue="echo")} == {before.id, after.id}
    assert await actor.count_runs(RunFilter.of(queue="echo", since=since)) == 1


async def test_a_wait_that_runs_out_says_which_job_how_long_and_what_its_run_does(
    setup: Setup,
) -> None:
    actor = setup.actor
    job = await actor.enqueue("hold", {})
    run_id = await run_of(actor, job)
    await status_of(actor, run_id, RunStatus.RUNNING)
    with pytest.raises(TimeoutError) as raised:
        await actor.wait_for_job(job, timeout=0.3)
    assert (
        str(raised.value) == f"job {job} did not finish within 0.3s (its run {run_id} is running)"
    )
    # A run held back says by what: it said "is queued" of a paused queue, or one no worker serves.
    await actor.pause("echo")
    held = await actor.enqueue("echo", {"value": 1})
    with pytest.raises(TimeoutError) as raised:
        await actor.wait_for_job(held, timeout=0.3)
    assert str(raised.value) == (
        f"job {held} did not finish within 0.3s (its run {await run_of(actor, held)} is queued: "
        "queue 'echo' is paused: nothing new starts)"
    )
    for bad, shown in ((-1, "-1"), (float("nan"), "nan"), ("10s", "'10s'")):
        with pytest.raises(
            EngineError, match=f"^wait_for_job: timeout must be a number of seconds.*not {shown}$"
        ):
            await actor.wait_for_job(job, timeout=bad)  # type: ignore[arg-type]
    # A wait of 0 looks once: the job has ended, or the time is up at once.
    with pytest.raises(TimeoutError, match="within 0s"):
        await actor.wait_for_job(job, timeout=0)


async def test_unknown_names_are_refused_in_one_line(setup: Setup) -> None:
    actor = setup.actor
    with pytest.raises(UnknownQueue, match="unknown queue 'nope'"):
        await actor.enqueue("nope", {})
    # A typo is named, as `runs --queue` named it (enqueue and dead did not).
    with pytest.raises(UnknownQueue, match=r"^unknown queue 'echoo': did you mean 'echo'\? \("):
        await actor.enqueue("echoo", {})
    with pytest.raises(UnknownRun, match="unknown run 'run_x'"):
        await actor.cancel("run_x")
    with pytest.raises(UnknownJob, match="unknown job 'job_x'"):
        await actor.requeue("job_x")
    with pytest.raises(UnknownQueue):
        await actor.pause("nope")


async def test_the_start_of_several_run_ids_names_the_one_still_going_when_asked(
    setup: Setup,
) -> None:
    # The console's "1a24c873" of a stuck run (short among the runs it listed) was the start
    # of 40 runs in the database: `where` and `cancel` refused it as ambiguous.
    actor = setup.actor
    done = await actor.wait_for_job(await actor.enqueue("echo", {"value": 1}), timeout=10)
    held = await run_of(actor, await actor.enqueue("hold", {}))
    await status_of(actor, held, RunStatus.RUNNING)
    shared = next(n for n, (a, b) in enumerate(zip(done.id, held, strict=True)) if a != b)
    word = held[:shared].removeprefix("run_")
    assert len(word) >= 4, (done.id, held)  # made within the same minutes: time-first ids
    with pytest.raises(EngineError, match=f"^'{word}' is the start of "):
        await actor.find_run(word)
    assert (await actor.find_run(word, going=True)).id == held
    await actor.cancel(held)


async def test_a_job_is_found_by_the_start_of_its_id(setup: Setup) -> None:
    # `show job_1a24d10d5db6` (a job's id cut as the runs view shows ids) was refused as an
    # unknown job, where the start of a run's id finds its run.
    actor = setup.actor
    first = await actor.enqueue("echo", {"value": 1})
    second = await actor.enqueue("echo", {"value": 2})
    for job_id in (first, second):
        await actor.wait_for_job(job_id, timeout=10)
    shared = next(n for n, (a, b) in enumerate(zip(first, second, strict=True)) if a != b)
    assert (await actor.find_run(first[: shared + 1])).job_id == first
    with pytest.raises(EngineError, match=f"^'{first[:shared]}' is the start of 2 job ids"):
        await actor.find_run(first[:shared])
    with pytest.raises(UnknownJob):
        await actor.find_run("job_zzzz")


async def test_cancel_a_running_run_held_by_the_worker(setup: Setup) -> None:
    actor = setup.actor
    job = await actor.enqueue("hold", {})
    run_id = await run_of(actor, job)
    await status_of(actor, run_id, RunStatus.RUNNING)
    run = await actor.cancel(run_id)
    assert run.status is RunStatus.CANCELLED
    assert run.steps[0].status is StepStatus.CANCELLED
    assert (await actor.get_job(job)).state is JobState.CANCELLED
    with pytest.raises(EngineError, match="has already ended"):
        await actor.cancel(run_id)


async def test_cancel_a_queued_run_and_pause_resume(setup: Setup) -> None:
    actor = setup.actor
    await actor.pause("echo")
    assert next(q for q in await actor.queues() if q.name == "echo").paused
    kept = await actor.enqueue("echo", {"value": 1})
    dropped = await actor.enqueue("echo", {"value": 2})
    cancelled = await actor.cancel(await run_of(actor, dropped))
    assert cancelled.status is RunStatus.CANCELLED
    assert (await actor.get_job(kept)).state is JobState.WAITING  # paused: nobody took it
    await actor.resume("echo")
    assert (await actor.wait_for_job(kept, timeout=10)).status is RunStatus.COMPLETED
    assert (await actor.get_job(dropped)).state is JobState.CANCELLED


async def test_replay_and_replay_from_a_step(setup: Setup) -> None:
    actor = setup.actor
    source = await actor.wait_for_job(await actor.enqueue("echo", {"value": "a"}), timeout=10)
    again = await actor.get_run(await actor.replay(source.id, input={"value": "b"}))
    assert again.replay_of == source.id
    done = await actor.wait_for_job(again.job_id, timeout=10)
    assert done.output == "b"
    tail = await actor.get_run(await actor.replay(source.id, from_step="second"))
    done = await actor.wait_for_job(tail.job_id, timeout=10)
    assert done.output == "a"
    first = done.step("first")
    assert (first.status, first.cached_from) == (StepStatus.CACHED, source.id)


async def test_dead_letters_and_a_requeue_with_a_fresh_budget(setup: Setup) -> None:
    actor = setup.actor
    job = await actor.enqueue("fail", {})
    assert (await actor.wait_for_job(job, timeout=10)).status is RunStatus.FAILED
    assert [d.job_id for d in await actor.dead_letters("fail")] == [job]
    assert await actor.count_runs(RunFilter.of(queue="fail")) == 2  # retries=1: two runs
    assert await actor.requeue(job) == job
    assert (await actor.wait_for_job(job, timeout=10)).status is RunStatus.FAILED
    # A fresh budget: two more runs, not one.
    assert await actor.count_runs(RunFilter.of(queue="fail")) == 4
    assert (await actor.get_job(job)).state is JobState.DEAD
    fine = await actor.enqueue("echo", {"value": 1})
    await actor.wait_for_job(fine, timeout=10)
    with pytest.raises(EngineError, match="only dead or failed jobs"):
        await actor.requeue(fine)


async def test_a_dead_letter_a_replay_completed_is_requeued_only_when_forced(
    setup: Setup,
) -> None:
    # The console's requeue (one, or all of a queue) ran such a job again: a charge twice.
    actor = setup.actor
    job = await actor.enqueue("picky", {"ok": False})
    dead = await actor.wait_for_job(job, timeout=10)
    assert (await actor.get_job(job)).state is JobState.DEAD
    # Replayed, failed again; that replay replayed with a fixed input, completed.
    failed = await actor.get_run(await actor.replay(dead.id))
    assert (await actor.wait_for_job(failed.job_id, timeout=10)).status is RunStatus.FAILED
    fixed = await actor.get_run(await actor.replay(failed.id, input={"ok": True}))
    assert (await actor.wait_for_job(fixed.job_id, timeout=10)).status is RunStatus.COMPLETED

    with pytest.raises(ReplayedAlready, match=f"replayed as run {fixed.id}, which completed"):
        await actor.requeue(job)
    bulk = await actor.requeue_dead("picky")
    # The failed replay's own job is a dead letter too, and its replay completed as well.
    assert (bulk.ids, sorted(bulk.skipped_ids)) == ([], sorted([job, failed.job_id])), bulk
    assert "which completed" in bulk.skipped_ids[job]
    assert (await actor.get_job(job)).state is JobState.DEAD
    assert await actor.requeue(job, force=True) == job
    assert (await actor.wait_for_job(job, timeout=10)).status is RunStatus.FAILED


async def test_a_dead_letter_whose_replay_has_not_ended_is_requeued_only_when_forced(
    setup: Setup,
) -> None:
    # A replay held back (a rate limit, a pause) was not "completed": the requeue beside it
    # went ahead, and both runs charged the order.
    actor = setup.actor
    job = await actor.enqueue("picky", {"ok": False})
    dead = await actor.wait_for_job(job, timeout=10)
    await actor.pause("picky")
    pending = await actor.get_run(await actor.replay(dead.id, input={"ok": True}))
    assert pending.status is RunStatus.QUEUED
    with pytest.raises(
        ReplayedAlready,
        match=f"replayed as run {pending.id}, which is queued and has not ended; a requeue "
        "would run the job twice$",
    ):
        await actor.requeue(job)
    bulk = await actor.requeue_dead("picky")
    assert (bulk.ids, list(bulk.skipped_ids)) == ([], [job]), bulk
    assert (await actor.get_job(job)).state is JobState.DEAD
    await actor.resume("picky")
    assert (await actor.wait_for_job(pending.job_id, timeout=10)).status is RunStatus.COMPLETED
    with pytest.raises(ReplayedAlready, match="which completed"):
        await actor.requeue(job)


async def test_a_replay_warning_says_what_a_replay_would_do_again(setup: Setup) -> None:
    # `r` on a failed run whose job a later delivery completed charged the order twice; the
    # console and the command line ask first, with this.
    actor = setup.actor
    job = await actor.enqueue("second", {})
    done = await actor.wait_for_job(job, timeout=10)
    assert (done.status, done.output) == (RunStatus.COMPLETED, 2)
    [first] = [r for r in await actor.runs(queue="second") if r.id != done.id]
    assert await actor.replay_warning(first.id) == (
        f"its job {job} completed on a later delivery (run {done.id})"
    )
    assert await actor.replay_warning(done.id) is None  # replaying a completed run is asked for
    await actor.pause("second")
    pending = await actor.replay(done.id)
    assert await actor.replay_warning(done.id) == (
        f"it was replayed as run {pending}, which is queued and has not ended"
    )
    await actor.resume("second")


async def test_a_discarded_dead_letter_leaves_the_queue_and_its_runs_stay(setup: Setup) -> None:
    # Dead letters could only be requeued: failures nobody meant to retry stayed in the queue
    # for ever (the janitor keeps a dead letter), and the console's list with them.
    actor = setup.actor
    jobs = [await actor.enqueue("fail", {"n": n}) for n in range(3)]
    for job in jobs:
        assert (await actor.wait_for_job(job, timeout=10)).status is RunStatus.FAILED
    died = await actor.get_job(jobs[0])
    assert await actor.discard(jobs[0]) == jobs[0]
    gone = await actor.get_job(jobs[0])
    assert (gone.state, gone.error, gone.run_id) == (JobState.CANCELLED, died.error, died.run_id)
    assert sorted(d.job_id for d in await actor.dead_letters("fail")) == sorted(jobs[1:])
    stats = await actor.queue_stats("fail")
    assert (stats.dead, stats.cancelled) == (2, 1)
    last = await actor.get_run(gone.run_id)  # still there, still failed, and says why it stays
    assert last.status is RunStatus.FAILED
    assert "taken out of the dead-letter queue" in last.logs[-1].message
    assert await actor.wait_for_job(jobs[0], timeout=10) == last
    with pytest.raises(EngineError, match="only dead letters are discarded"):
        await actor.discard(jobs[0])
    with pytest.raises(EngineError, match="only dead or failed jobs are requeued"):
        await actor.requeue(jobs[0])
    with pytest.raises(UnknownJob):
        await actor.discard("nope")
    bulk = await actor.discard_dead("fail")
    assert sorted(bulk.ids) == sorted(jobs[1:]) and not bulk.skipped_ids, bulk
    assert await actor.dead_letters("fail") == []
    assert (await actor.queue_stats("fail")).cancelled == 3
    again = await actor.discard_many(jobs[:2])
    assert (again.ids, sorted(again.skipped_ids)) == ([], sorted(jobs[:2])), again


async def test_retry_now_starts_a_delayed_run_and_cuts_a_step_backoff(setup: Setup) -> None:
    actor = setup.actor
    delayed = await actor.enqueue("echo", {"value": 1}, delay="1h")
    run_id = await run_of(actor, delayed)
    assert (await actor.get_run(run_id)).status is RunStatus.DELAYED
    assert await actor.retry_now(run_id) == run_id
    assert (await actor.wait_for_job(delayed, timeout=10)).status is RunStatus.COMPLETED
    backing_off = await actor.enqueue("retry", {})
    run_id = await run_of(actor, backing_off)

    async def backing_off_now() -> bool:  # the first attempt failed; the next is a minute away
        run = await actor.get_run(run_id)
        return any(a.backoff_ms for s in run.steps for a in s.attempts)

    await until(backing_off_now)
    assert await actor.retry_now(run_id) == run_id
    run = await actor.wait_for_job(backing_off, timeout=10)
    assert (run.status, run.output) == (RunStatus.COMPLETED, 2)


async def test_bulk_cancel_and_replay(setup: Setup) -> None:
    actor = setup.actor
    held = [await actor.enqueue("hold", {"n": n}) for n in range(3)]
    for job in held:
        await status_of(actor, await run_of(actor, job), RunStatus.RUNNING)
    result = await actor.cancel_many(RunFilter.of("running", queue="hold"))
    assert (result.touched, result.skipped) == (3, 0)
    replayed = await actor.replay_many(RunFilter.of("cancelled", queue="hold"))
    assert replayed.touched == 3 and set(replayed.replayed) == set(result.ids)
    setup.controls.release.set()
    for new_run in replayed.replayed.values():
        run = await actor.wait_for_job((await actor.get_run(new_run)).job_id, timeout=10)
        assert run.status is RunStatus.COMPLETED


async def test_finding_a_served_queue_makes_as_many_calls_whatever_the_workflows_served() -> None:
    """Every enqueue looks its queue up: a lookup that went through every workflow served made
    an engine of 200 workflows enqueue at 0.61x the speed of one with a single workflow
    (benchmarks/many_queues.py). Counted in calls, not timed."""

    async def noop(ctx: Any) -> None:
        return None

    def served(w: int) -> list[Workflow]:
        return [
            Workflow(
                name=f"wf{k}",
                steps=[Step("a", noop)],
                trigger=WorkerTrigger(queue=f"q{k}", provider="memory"),
            )
            for k in range(w)
        ]

    calls: dict[int, int] = {}
    for w in (1, 100):
        async with Engine(workflows=served(w), consume=False) as engine:
            await engine.operator.target("q0")  # whatever a first lookup sets up
            counted = 0

            def count(frame: Any, event: str, arg: Any) -> None:
                nonlocal counted
                counted += event == "call"

            sys.setprofile(count)
            try:
                await engine.operator.target("q0")
            finally:
                sys.setprofile(None)
            calls[w] = counted
    assert calls[100] == calls[1], calls


async def test_find_run_takes_an_id_its_start_or_its_job(setup: Setup) -> None:
    """One rule for what an operator types to name a run: the console's `:run` and every
    RUN_ID of the command line."""
    engine = setup.actor
    target = await engine.wait_for_job(await engine.enqueue("echo", {"value": 1}), timeout=10)
    # Newer runs whose input holds the target's id: a search of the runs' text (newest first)
    # would find these, not the target; the start of an id is looked for in ids alone.
    newer = [await engine.enqueue("echo", {"value": target.id}) for _ in range(21)]
    short = target.id.removeprefix("run_")[:16]
    for word in (target.id, short, f"run_{short}", short.upper(), target.job_id):
        assert (await engine.find_run(word)).id == target.id, word
    assert (await engine.find_run(target.id)).steps  # the whole record, as get_run gives it
    last = await run_of(engine, newer[-1])
    same = next(n for n, (a, b) in enumerate(zip(target.id, last, strict=True)) if a != b)
    with pytest.raises(EngineError, match=r"is the start of more than 5 run ids \(.*\): give"):
        await engine.find_run(target.id[:same])
    with pytest.raises(UnknownRun, match=r"^unknown run 'zzzz': no run id starts with it$"):
        await engine.find_run("zzzz")
    with pytest.raises(UnknownJob):
        await engine.find_run("job_nope")
