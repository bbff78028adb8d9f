"""Operator power tools over SQLite: pause/resume, bulk actions, replay from a step, edit and
replay, retry now, and the stuck / retrying / error-text filters."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import until

from engine import (
    AttemptFailed,
    Engine,
    EngineError,
    JobState,
    QueueChanged,
    Retry,
    RunFilter,
    RunQueued,
    RunStatus,
    Step,
    StepStatus,
    WorkerTrigger,
    Workflow,
    filters,
)
from engine.operations import BulkProgress
from engine.reload import reload_paths

pytestmark = pytest.mark.anyio

NOT_CLAIMED_WINDOW = 0.4  # how long a paused queue is watched for a claim that must not come


@pytest.fixture(params=["sqlite", "memory"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """For the tests that also cover the memory queue's take / make_due."""
    return tmp_path / "blok.db" if request.param == "sqlite" else None


def flow(name: str, *steps: Step, queue: str | None = None, **trigger: Any) -> Workflow:
    return Workflow(
        name=name, trigger=WorkerTrigger(queue=queue or name, **trigger), steps=list(steps)
    )


async def noop(ctx: Any) -> str:
    return "ok"


class Gate:
    """A node that reports it started, then holds until released."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.release = anyio.Event()

    def rearm(self) -> None:
        self.started = anyio.Event()
        self.release = anyio.Event()

    async def __call__(self, ctx: Any) -> str:
        self.started.set()
        await self.release.wait()
        return "released"


async def run_of(engine: Engine, job_id: str):
    return await engine.get_run((await engine.get_job(job_id)).run_id)


async def not_finished_within(engine: Engine, job_id: str, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        await engine.wait_for_job(job_id)
        return False
    return True


async def queue_paused(engine: Engine, name: str) -> bool:
    return next(q for q in await engine.queues() if q.name == name).paused


async def first(events: AsyncIterator[Any], kind: type, **fields: Any) -> Any:
    async for event in events:
        if isinstance(event, kind) and all(getattr(event, k) == v for k, v in fields.items()):
            return event
    raise AssertionError(f"the event stream ended before a {kind.__name__}")


# ---- pause / resume -------------------------------------------------------------------------
async def test_pause_lets_running_jobs_finish_claims_nothing_and_survives_restart(
    tmp_path: Path,
) -> None:
    db = tmp_path / "blok.db"
    gate = Gate()
    wf = flow("orders", Step("work", gate))
    async with Engine(workflows=[wf], database=db) as engine:
        running = await engine.enqueue("orders")
        with anyio.fail_after(10):
            await gate.started.wait()
        await engine.pause("orders")
        assert await queue_paused(engine, "orders")
        later = await engine.enqueue("orders")  # enqueue still works while paused
        gate.release.set()
        assert (await engine.wait_for_job(running, timeout=5)).status is RunStatus.COMPLETED
        assert await not_finished_within(engine, later, NOT_CLAIMED_WINDOW)
        assert (await run_of(engine, later)).status is RunStatus.QUEUED

    # The pause is stored: a new engine on the file claims nothing, even at boot.
    async with Engine(workflows=[wf], database=db) as engine:
        assert await queue_paused(engine, "orders")
        assert await not_finished_within(engine, later, NOT_CLAIMED_WINDOW)
        assert (await engine.get_job(later)).state is JobState.WAITING
        await engine.resume("orders")
        assert not await queue_paused(engine, "orders")
        assert (await engine.wait_for_job(later, timeout=5)).status is RunStatus.COMPLETED

    async with Engine(workflows=[wf], database=db) as engine:
        assert not await queue_paused(engine, "orders")


async def test_forced_enqueue_and_replay_run_on_a_paused_queue(database: Path | None) -> None:
    wf = flow("orders", Step("work", noop))
    async with Engine(workflows=[wf], database=database) as engine:
        done = await engine.wait_for_job(await engine.enqueue("orders"), timeout=5)
        await engine.pause("orders")
        waiting = await engine.enqueue("orders")
        injected = await engine.enqueue("orders", {"inject": 1}, force=True)
        assert (await engine.wait_for_job(injected, timeout=5)).status is RunStatus.COMPLETED
        replay_id = await engine.replay(done.id, force=True)
        replayed = await engine.wait_for_job((await engine.get_run(replay_id)).job_id, timeout=5)
        assert replayed.id == replay_id
        assert replayed.status is RunStatus.COMPLETED
        assert replayed.replay_of == done.id
        # Only what the operator asked for ran: the queue itself is still paused.
        assert (await run_of(engine, waiting)).status is RunStatus.QUEUED
        assert await queue_paused(engine, "orders")


async def test_a_pause_made_by_another_process_is_followed(tmp_path: Path) -> None:
    db = tmp_path / "blok.db"
    wf = flow("orders", Step("work", noop))
    async with (
        Engine(workflows=[wf], database=db) as worker,
        Engine(workflows=[wf], database=db, consume=False) as console,
    ):
        events = worker.events()
        await console.pause("orders")
        with anyio.fail_after(5):
            await first(events, QueueChanged, queue="orders")  # the worker polls the table
        await events.aclose()
        assert await queue_paused(worker, "orders")
        job = await console.enqueue("orders")
        assert await not_finished_within(console, job, NOT_CLAIMED_WINDOW)
        # A forced run from the console goes to the worker, which runs it despite the pause.
        forced = await console.enqueue("orders", force=True)
        assert (await console.wait_for_job(forced, timeout=5)).status is RunStatus.COMPLETED
        assert (await run_of(console, job)).status is RunStatus.QUEUED
        await console.resume("orders")
        assert (await console.wait_for_job(job, timeout=5)).status is RunStatus.COMPLETED


# ---- bulk actions ---------------------------------------------------------------------------
async def test_cancel_many_cancels_a_filtered_set(tmp_path: Path) -> None:
    gate = Gate()
    flows = [flow("a", Step("work", gate), concurrency=2), flow("b", Step("work", noop))]
    async with Engine(workflows=flows, database=tmp_path / "blok.db") as engine:
        finished = await engine.enqueue("a")
        gate.release.set()
        await engine.wait_for_job(finished, timeout=5)
        gate.rearm()
        await engine.pause("a")
        await engine.pause("b")
        running = await engine.enqueue("a", force=True)
        with anyio.fail_after(10):
            await gate.started.wait()
        queued_a = await engine.enqueue_many("a", [{"n": n} for n in range(60)])
        queued_b = await engine.enqueue_many("b", [{"n": n} for n in range(5)])

        reports: list[BulkProgress] = []
        result = await engine.cancel_many(RunFilter.of(queue="a"), progress=reports.append)

        assert result.total == 62
        assert result.touched == 61
        assert result.reasons == {"already ended": 1}
        assert (await run_of(engine, finished)).id in result.skipped_ids
        assert (await run_of(engine, running)).status is RunStatus.CANCELLED
        assert await engine.count_runs(RunFilter.of("cancelled", queue="a")) == 61
        assert await engine.count_runs(RunFilter.of("queued", queue="b")) == 5
        assert reports[-1] == BulkProgress("cancel", 62, 62, 61, 1)
        assert len(reports) >= 2  # progress came while it went, not only at the end
        for job_id in queued_a:
            assert (await engine.get_job(job_id)).state is JobState.CANCELLED

        # Marked rows: explicit run ids, one of them unknown.
        marked = [(await run_of(engine, queued_b[0])).id, "run_nope"]
        result = await engine.cancel_many(marked)
        assert (result.touched, result.reasons) == (1, {"unknown run": 1})
        assert await engine.count_runs(RunFilter.of("queued", queue="b")) == 4


async def test_replay_many_replays_the_failed_runs(tmp_path: Path) -> None:
    async def charge(ctx: Any) -> dict:
        if ctx.body["fail"]:
            raise ValueError(f"card {ctx.body['n']} declined")
        return {"charged": ctx.body["n"]}

    wf = flow("orders", Step("charge", charge))
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        jobs = await engine.enqueue_many("orders", [{"n": n, "fail": n % 3 == 0} for n in range(9)])
        sources = [await engine.wait_for_job(job, timeout=5) for job in jobs]
        failed = {run.id for run in sources if run.status is RunStatus.FAILED}
        assert len(failed) == 3

        result = await engine.replay_many(RunFilter.of("failed", workflow="orders"))

        assert (result.total, result.touched, result.skipped) == (3, 3, 0)
        assert set(result.replayed) == failed
        for source_id, new_id in result.replayed.items():
            new = await engine.wait_for_job((await engine.get_run(new_id)).job_id, timeout=5)
            source = await engine.get_run(source_id)
            assert new.replay_of == source_id
            assert new.input == source.input
            assert new.status is RunStatus.FAILED  # same input, same code: fails again
        # The same filter again: each line's newest run (the replays, failed again) is
        # replayed, not the runs replayed already: run twice, "replay every failed run" ran
        # each failed input twice more (a charge twice), and so on with every run of it.
        again = await engine.replay_many(RunFilter.of("failed", workflow="orders"))
        assert set(again.replayed) == set(result.replayed.values())
        assert again.reasons == {"replayed already": 3}
        by_id = await engine.replay_many(sorted(failed))  # ids, as the console's marked rows
        assert (by_id.touched, by_id.reasons) == (0, {"replayed already": 3})
        # A run still going is skipped, with the reason.
        await engine.pause("orders")
        pending = await run_of(engine, await engine.enqueue("orders", {"n": 99, "fail": False}))
        result = await engine.replay_many([pending.id])
        assert (result.touched, result.reasons) == (0, {"not finished yet": 1})


async def test_requeue_dead_letters_in_bulk(tmp_path: Path) -> None:
    healthy = {"yes": False}

    async def flaky(ctx: Any) -> str:
        if not healthy["yes"]:
            raise ConnectionError("gateway down")
        return "sent"

    wf = flow("mail", Step("send", flaky), retries=1, delay="10ms")
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        jobs = await engine.enqueue_many("mail", [{"n": n} for n in range(8)])
        for job in jobs:
            await engine.wait_for_job(job, timeout=5)
        assert len(await engine.dead_letters("mail")) == 8
        healthy["yes"] = True
        ok = await engine.enqueue("mail")
        await engine.wait_for_job(ok, timeout=5)

        result = await engine.requeue_dead("mail")

        assert (result.total, result.touched) == (8, 8)
        assert sorted(result.ids) == sorted(jobs)
        assert await engine.dead_letters("mail") == []
        for job in jobs:
            assert (await engine.wait_for_job(job, timeout=5)).status is RunStatus.COMPLETED
        # Through a filter or explicit ids: jobs that are not dead are skipped, with a reason.
        result = await engine.requeue_many([ok, "job_nope"])
        assert result.touched == 0
        assert result.reasons["unknown job"] == 1
        assert any("only dead or failed" in reason for reason in result.reasons)


# ---- replay from a step, edit and replay ----------------------------------------------------
FLOW_FILE = """
from engine import Step, WorkerTrigger, Workflow

async def fetch(ctx, order_id):
    ctx.logger.info("fetching %s", order_id)
    return {{"order": order_id, "amount": 5}}

async def charge(ctx, order):
    {charge_body}

async def notify(ctx):
    return "told " + ctx.state["charge"]["by"]

workflow = Workflow(
    name="orders",
    trigger=WorkerTrigger(queue="orders"),
    steps=[
        Step("fetch", fetch, inputs={{"order_id": "$.body.order_id"}}),
        Step("charge", charge, inputs={{"order": "$.state.fetch"}}),
        Step("notify", notify),
    ],
)
"""
BROKEN = 'raise RuntimeError("charge is broken")'
FIXED = 'return {"charged": order["amount"], "by": "v2"}'


async def test_replay_from_the_failed_step_runs_the_fixed_code(tmp_path: Path) -> None:
    folder = tmp_path / "workflows"
    folder.mkdir()
    path = folder / "orders.py"
    path.write_text(FLOW_FILE.format(charge_body=BROKEN))
    async with Engine(workflows=folder, database=tmp_path / "blok.db") as engine:
        source = await engine.wait_for_job(
            await engine.enqueue("orders", {"order_id": "A1"}), timeout=5
        )
        assert source.status is RunStatus.FAILED
        assert source.error_step == "charge"

        # The fix-and-rerun loop: edit the file, reload (what the watcher does), replay.
        path.write_text(FLOW_FILE.format(charge_body=FIXED))
        await reload_paths(engine, folder, {path})
        new_id = await engine.replay(source.id, from_step="charge")
        run = await engine.wait_for_job((await engine.get_run(new_id)).job_id, timeout=5)

        assert run.status is RunStatus.COMPLETED
        assert run.replay_of == source.id
        assert run.replay_from_step == "charge"
        assert run.workflow_version != source.workflow_version
        fetch = run.step("fetch")
        assert fetch.status is StepStatus.CACHED
        assert fetch.cached_from == source.id
        assert fetch.output == source.step("fetch").output == {"order": "A1", "amount": 5}
        assert fetch.attempts == [] and fetch.logs == []  # not run again
        assert run.step("charge").status is StepStatus.COMPLETED
        assert run.step("charge").output == {"charged": 5, "by": "v2"}
        assert run.output == "told v2"

        with pytest.raises(EngineError, match="no step 'pay'"):
            await engine.replay(source.id, from_step="pay")
        with pytest.raises(EngineError, match="'charge' did not complete"):
            await engine.replay(source.id, from_step="notify")


async def test_edit_and_replay_records_the_edited_input(tmp_path: Path) -> None:
    async def charge(ctx: Any, amount: int) -> dict:
        return {"charged": amount}

    wf = flow("orders", Step("charge", charge, inputs={"amount": "$.body.amount"}))
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        source = await engine.wait_for_job(await engine.enqueue("orders", {"amount": 5}), 5)
        new_id = await engine.replay(source.id, input={"amount": 7})
        run = await engine.wait_for_job((await engine.get_run(new_id)).job_id, timeout=5)
        assert run.input == {"amount": 7}
        assert run.output == {"charged": 7}
        assert run.replay_of == source.id
        assert run.replay_from_step is None
        assert (await engine.get_run(source.id)).input == {"amount": 5}


# ---- retry now ------------------------------------------------------------------------------
async def test_retry_now_starts_a_job_in_backoff_at_once(database: Path | None) -> None:
    async def flaky(ctx: Any) -> int:
        if ctx.params["attempt"] == 1:
            raise ConnectionError("first delivery fails")
        return ctx.params["attempt"]

    wf = flow("orders", Step("work", flaky), retries=2, delay="30s")
    async with Engine(workflows=[wf], database=database) as engine:
        async with anyio.create_task_group() as tg:
            events = engine.events()
            job = await engine.enqueue("orders")
            with anyio.fail_after(5):
                queued = await first(events, RunQueued, status="delayed")
            tg.cancel_scope.cancel()
        failed_run = next(r for r in await engine.runs("failed") if r.job_id == job)
        started = time.monotonic()
        # Asked on the failed run, it starts the job's next attempt.
        assert await engine.retry_now(failed_run.id) == queued.run_id
        run = await engine.wait_for_job(job, timeout=10)
        assert time.monotonic() - started < 10  # the backoff was 30 s
        assert run.id == queued.run_id
        assert run.status is RunStatus.COMPLETED
        assert run.output == 2
        with pytest.raises(EngineError, match="retry now starts a run in retry backoff"):
            await engine.retry_now(run.id)


async def test_retry_now_cuts_a_step_backoff_short(tmp_path: Path) -> None:
    async def flaky(ctx: Any) -> int:
        if ctx.attempt == 1:
            raise ConnectionError("try again")
        return ctx.attempt

    wf = flow("orders", Step("work", flaky, retry=Retry(3, min_timeout="30s")))
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        events = engine.events()
        job = await engine.enqueue("orders")
        with anyio.fail_after(5):
            failed = await first(events, AttemptFailed)
        assert failed.backoff_ms == 30_000
        assert [r.id for r in await engine.runs(retrying=True)] == [failed.run_id]
        started = time.monotonic()
        assert await engine.retry_now(failed.run_id) == failed.run_id
        run = await engine.wait_for_job(job, timeout=10)
        assert time.monotonic() - started < 10
        assert run.status is RunStatus.COMPLETED
        assert [a.number for a in run.step("work").attempts] == [1, 2]
        assert await engine.runs(retrying=True) == []
        await events.aclose()


async def test_retry_now_reaches_a_step_backoff_in_another_process(tmp_path: Path) -> None:
    async def flaky(ctx: Any) -> int:
        if ctx.attempt == 1:
            raise ConnectionError("try again")
        return ctx.attempt

    db = tmp_path / "blok.db"
    wf = flow("orders", Step("work", flaky, retry=Retry(2, min_timeout="30s")))
    async with (
        Engine(workflows=[wf], database=db) as worker,
        Engine(workflows=[wf], database=db, consume=False) as console,
    ):
        events = worker.events()
        job = await console.enqueue("orders")
        with anyio.fail_after(5):
            failed = await first(events, AttemptFailed)
        await events.aclose()

        async def backoff_recorded() -> bool:  # the event comes before the commit
            run = await console.get_run(failed.run_id)
            return any(a.backoff_ms for s in run.steps for a in s.attempts)

        await until(backoff_recorded)
        await console.retry_now(failed.run_id)  # a signal the worker holding the run sees
        run = await console.wait_for_job(job, timeout=10)
        assert run.status is RunStatus.COMPLETED


async def test_retry_now_starts_a_delayed_run(database: Path | None) -> None:
    wf = flow("orders", Step("work", noop))
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("orders", delay="30s")
        run = await run_of(engine, job)
        assert run.status is RunStatus.DELAYED
        assert await engine.retry_now(run.id) == run.id
        assert (await engine.wait_for_job(job, timeout=10)).status is RunStatus.COMPLETED
        with pytest.raises(EngineError, match="is completed: retry now starts"):
            await engine.retry_now(run.id)


async def test_retry_now_from_a_console_process_starts_a_delayed_run(tmp_path: Path) -> None:
    db = tmp_path / "blok.db"
    wf = flow("orders", Step("work", noop))
    async with (
        Engine(workflows=[wf], database=db) as worker,
        Engine(workflows=[wf], database=db, consume=False) as console,
    ):
        await worker.pause("orders")  # retry now is explicit: it runs despite the pause
        job = await console.enqueue("orders", delay="30s")
        run = await run_of(console, job)
        assert await console.retry_now(run.id) == run.id
        done = await console.wait_for_job(job, timeout=10)
        assert done.status is RunStatus.COMPLETED
        assert done.worker == worker.worker.id


# ---- filters --------------------------------------------------------------------------------
async def test_stuck_runs_are_those_far_past_their_workflow_median(
    database: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past 3 × the median, but not past the floor (BLOK_STUCK_MIN): not stuck. With a median
    # of 50 ms a run of 2.5 s was, and the stuck filter's bulk cancel took it.
    monkeypatch.setenv("BLOK_STUCK_MIN", "0")
    gate, other_gate = Gate(), Gate()
    flows = [
        flow("slowpoke", Step("work", gate), concurrency=4),
        flow("fresh", Step("work", other_gate)),
    ]
    async with Engine(workflows=flows, database=database) as engine:
        gate.release.set()
        for job in await engine.enqueue_many("slowpoke", [{}] * 3):
            await engine.wait_for_job(job, timeout=5)
        gate.rearm()
        hung = await engine.enqueue("slowpoke")
        with anyio.fail_after(10):
            await gate.started.wait()
        await engine.enqueue("fresh")  # running too, but no completed run to compare with
        await other_gate.started.wait()
        hung_run = await run_of(engine, hung)
        with anyio.fail_after(5):
            # Time has to pass (3 × the median): there is nothing to await.
            while not await engine.stuck_runs(factor=3):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        monkeypatch.setenv("BLOK_STUCK_MIN", "1h")
        assert await engine.runs(stuck=3.0) == []
        monkeypatch.setenv("BLOK_STUCK_MIN", "0")
        assert [r.id for r in await engine.runs(stuck=3.0)] == [hung_run.id]
        assert await engine.count_runs(RunFilter.of(stuck=3.0)) == 1
        assert await engine.runs(stuck=1e9) == []
        with pytest.raises(EngineError, match="stuck must be a factor"):
            await engine.runs(stuck=0)

        result = await engine.cancel_many(RunFilter.of(stuck=3.0))
        assert result.ids == [hung_run.id]
        assert (await engine.get_run(hung_run.id)).status is RunStatus.CANCELLED
        other_gate.release.set()


async def test_a_workflow_that_never_completed_has_its_runs_stuck_after_the_no_baseline_time(
    database: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workflow that hangs every time has no median: its runs, hung for 11 minutes, were
    # never "stuck", and the operator's filter found nothing.
    monkeypatch.setattr(filters, "NO_BASELINE_S", 0.2)
    monkeypatch.setenv("BLOK_STUCK_MIN", "0")
    gate = Gate()
    async with Engine(workflows=[flow("hangs", Step("work", gate))], database=database) as engine:
        hung_run = await run_of(engine, await engine.enqueue("hangs"))
        with anyio.fail_after(10):
            await gate.started.wait()
        assert await engine.stuck_runs(factor=3) == []  # not yet 0.2 s
        with anyio.fail_after(5):
            # Time has to pass (the no-baseline time): there is nothing to await.
            while not await engine.stuck_runs(factor=3):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert [r.id for r in await engine.stuck_runs(factor=3)] == [hung_run.id]
        gate.release.set()


async def test_error_text_filter_finds_runs_by_their_error(database: Path | None) -> None:
    async def charge(ctx: Any) -> None:
        if ctx.body["card"] == "bad":
            raise ValueError("card declined by issuer")
        if ctx.body["card"] == "slow":
            raise TimeoutError("gateway timeout")

    wf = flow("orders", Step("charge", charge))
    async with Engine(workflows=[wf], database=database) as engine:
        jobs = await engine.enqueue_many("orders", [{"card": c} for c in ("bad", "slow", "ok")])
        runs = [await engine.wait_for_job(job, timeout=5) for job in jobs]
        assert [r.id for r in await engine.runs(text="declined")] == [runs[0].id]
        assert [r.id for r in await engine.runs("failed", text="gateway")] == [runs[1].id]
        assert await engine.count_runs(RunFilter.of(text="declined")) == 1
