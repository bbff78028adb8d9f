"""The engine core on both stores: retries, timeouts, cancellation, the cache, waits, replay."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from support import expect_events, polite_node, raised_at, until

from engine import (
    Engine,
    EngineError,
    JobState,
    Retry,
    RunFinished,
    RunStatus,
    RunStatusChanged,
    Step,
    StepStarted,
    StepStatus,
    UnknownJob,
    UnknownQueue,
    UnknownRun,
    WorkerTrigger,
    Workflow,
    WorkflowDefinitionError,
    memory_runs,
    wait,
)
from engine.backends.sqlite.store import SqliteRunStore
from engine.models import AttemptStatus

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    return None if request.param == "memory" else tmp_path / "blok.db"


def flow(name: str, *steps: Step, queue: str | None = None, **trigger: object) -> Workflow:
    return Workflow(
        name=name, trigger=WorkerTrigger(queue=queue or name, **trigger), steps=list(steps)
    )


async def run_of(engine: Engine, job_id: str):
    return await engine.get_run((await engine.get_job(job_id)).run_id)


async def test_retry_records_every_attempt(database: Path | None) -> None:
    calls: list[int] = []

    async def flaky(ctx, order_id: str) -> dict:
        calls.append(ctx.attempt)
        ctx.logger.info("attempt %d for %s", ctx.attempt, order_id)
        if ctx.attempt < 3:
            raise ConnectionError(f"gateway refused attempt {ctx.attempt}")
        return {"charged": order_id}

    wf = flow(
        "orders",
        Step(
            "charge",
            flaky,
            inputs={"order_id": "$.body.order_id"},
            retry=Retry(3, min_timeout="10ms", factor=2),
        ),
    )
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("orders", {"order_id": "A1"})
        run = await engine.wait_for_job(job, timeout=10)
        assert run.status is RunStatus.COMPLETED
        assert calls == [1, 2, 3]
        step = run.step("charge")
        assert step.status is StepStatus.COMPLETED
        assert step.output == {"charged": "A1"}
        assert [a.number for a in step.attempts] == [1, 2, 3]
        assert [a.status for a in step.attempts] == [
            AttemptStatus.FAILED,
            AttemptStatus.FAILED,
            AttemptStatus.COMPLETED,
        ]
        assert step.attempts[0].error == "gateway refused attempt 1"
        assert step.attempts[0].error_type == "ConnectionError"
        assert "ConnectionError" in (step.attempts[1].traceback or "")
        # The seed's backoff: min(max, min * factor ** (attempt - 1)).
        assert [a.backoff_ms for a in step.attempts] == [10, 20, None]
        assert [line.message for line in step.logs] == [
            "attempt 1 for A1",
            "attempt 2 for A1",
            "attempt 3 for A1",
        ]
        assert run.attempts == 3 and run.failed_attempts == 2


@pytest.mark.parametrize(
    ("retries", "said"), [(1, "used up its retry"), (2, "used up its 2 retries")]
)
async def test_a_dead_letters_last_run_says_how_many_retries_it_used(
    database: Path | None, retries: int, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(ctx) -> None:
        raise ValueError("card declined")

    wf = flow("pay", Step("charge", broken), retries=retries, delay=1)
    async with Engine(workflows=[wf], database=database) as engine:
        job_id = await engine.enqueue("pay", {})
        run = await engine.wait_for_job(job_id, 10)
        assert (await engine.get_job(job_id)).state is JobState.DEAD
        lines = [line.message for line in run.logs]
        assert f"job {job_id} {said}: moved to the dead-letter queue" in lines
    # And the worker's log, on the run's last line: it read the same, retried or dead; and
    # named no job, where `requeue` and `discard` take the job's id.
    lines = [r.getMessage() for r in caplog.records if r.name == "blok.runs"]
    assert len(lines) == retries + 1
    dead = f"pay failed ({said}: {job_id} moved to the dead-letter queue): [step 1/1] charge"
    assert lines[-1].startswith(dead), lines
    assert "dead-letter" not in " ".join(lines[:-1])
    retried = re.compile(r"pay failed \(retrying in \d+\.\ds as run run_\w+\): \[step 1/1\]")
    assert all(retried.match(line) for line in lines[:-1]), lines


async def test_a_wake_from_a_wait_is_not_a_delivery(database: Path | None) -> None:
    # A job with one retry whose runs wait before they fail: the dead-letter view said "4
    # deliveries" where `show` said "delivery 2 of 2", and `ctx.job.delivery` said 2 after
    # the first run's wait (its retry unspent): each claim that woke a run counted.
    seen: list[tuple[int, int]] = []

    async def charge(ctx) -> None:
        seen.append((ctx.job.attempt, ctx.job.delivery))
        raise ValueError("declined")

    wf = flow("pay", Step("prepare", lambda ctx: 1), wait.for_("20ms"), Step("charge", charge))
    wf = Workflow(
        name="pay",
        trigger=WorkerTrigger(queue="pay", retries=1, delay=1),
        steps=wf.steps,
    )
    async with Engine(workflows=[wf], database=database) as engine:
        job_id = await engine.enqueue("pay", {})
        last = await engine.wait_for_job(job_id, 10)
        job = await engine.get_job(job_id)
        [dead] = await engine.dead_letters("pay")
    assert seen == [(1, 1), (2, 2)]
    assert (job.state, job.deliveries, dead.deliveries, last.job_attempt) == (
        JobState.DEAD,
        2,
        2,
        2,
    )
    assert job.attempts == 4  # its claims: two deliveries, each woken once


async def test_failure_message_names_the_step_and_keeps_the_cause(database: Path | None) -> None:
    async def ok(ctx) -> int:
        return 1

    async def broken(ctx) -> None:
        raise ValueError("card declined")

    wf = flow("pay", Step("a", ok), Step("charge", broken), Step("c", ok), Step("d", ok))
    async with Engine(workflows=[wf], database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("pay", {}), timeout=10)
        assert run.status is RunStatus.FAILED
        assert run.error == f"[step 2/4] charge failed: card declined (at {raised_at(broken)})"
        assert run.error_step == "charge"
        assert [s.status for s in run.steps] == [
            StepStatus.COMPLETED,
            StepStatus.FAILED,
            StepStatus.PENDING,
            StepStatus.PENDING,
        ]
        assert run.step("charge").attempts[0].error_type == "ValueError"


async def test_an_input_the_payload_lacks_fails_the_step_naming_the_near_miss(
    database: Path | None,
) -> None:
    async def charge(ctx, amount: int) -> int:
        return amount

    step = Step("charge", charge, inputs={"amount": "$.body.amount"})
    wf = flow("pay", step)
    async with Engine(workflows=[wf], database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("pay", {"amout": 5}), timeout=10)
        assert run.status is RunStatus.FAILED
        # Where: the line the step was written on (its expression is the bad input).
        written = raised_at(test_an_input_the_payload_lacks_fails_the_step_naming_the_near_miss, 6)
        assert run.error == (
            "[step 1/1] charge failed: bad input: $.body.amount: $.body has no key 'amount' "
            f"(it has amout); did you mean 'amout'? (at {written})"
        )
        # A body of another JSON shape is said in JSON's words (it said "NoneType", "list").
        for body, kind in (
            (None, "null"),
            ([1, 2], "an array"),
            ("5", "a string"),
            (5, "a number (5)"),
        ):
            run = await engine.wait_for_job(await engine.enqueue("pay", body), timeout=10)
            assert run.error == (
                f"[step 1/1] charge failed: bad input: $.body.amount: $.body is {kind}, it has no "
                f"field 'amount' (at {written})"
            )


async def test_last_attempt_timeout_ends_timed_out(database: Path | None) -> None:
    finished: list[int] = []

    async def slow(ctx) -> None:
        try:
            await anyio.sleep(10)
        finally:
            finished.append(ctx.attempt)

    wf = flow(
        "slow",
        Step("crawl", slow, retry=Retry(2, min_timeout=5), max_duration="100ms"),
    )
    async with Engine(workflows=[wf], database=database) as engine:
        started = time.monotonic()
        run = await engine.wait_for_job(await engine.enqueue("slow", {}), timeout=10)
        assert time.monotonic() - started < 3
        assert run.status is RunStatus.TIMED_OUT
        step = run.step("crawl")
        assert step.timed_out
        assert [a.status for a in step.attempts] == [AttemptStatus.TIMED_OUT] * 2
        assert "timed out after 100ms" in (step.attempts[-1].error or "")
        assert finished == [1, 2]  # each attempt really was cancelled, not left running


async def test_cancel_stops_a_sleeping_step_at_once(database: Path | None) -> None:
    cleaned = anyio.Event()
    started = anyio.Event()

    async def sleepy(ctx) -> None:
        started.set()
        try:
            await anyio.sleep(30)
        finally:
            cleaned.set()

    wf = flow("sleepy", Step("nap", sleepy), retries=3)
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("sleepy", {})
        with anyio.fail_after(5):
            await started.wait()
        [run] = await engine.runs(queue="sleepy")
        began = time.monotonic()
        cancelled = await engine.cancel(run.id)
        # The cancel hears the run end; were it deaf to that, it would find out at its next
        # look, 0.5 s on (CANCEL_WAIT_S is spent in looks of 0.5 s each).
        assert time.monotonic() - began < 0.4
        assert cleaned.is_set()
        assert cancelled.status is RunStatus.CANCELLED
        assert cancelled.step("nap").status is StepStatus.CANCELLED
        assert cancelled.step("nap").attempts[0].status is AttemptStatus.CANCELLED
        stored = await engine.get_run(run.id)
        assert stored.status is RunStatus.CANCELLED
        # Never retried, despite retries=3.
        assert (await engine.get_job(job)).state == "cancelled"
        assert len(await engine.runs(queue="sleepy")) == 1
        with pytest.raises(EngineError, match="already ended"):
            await engine.cancel(run.id)


async def test_a_cancelled_sync_node_that_runs_on_keeps_its_slot_and_says_so(
    database: Path | None,
) -> None:
    """A plain def node cannot be stopped, only told (ctx.cancelled). One that does not read
    it ran on after its run was recorded cancelled, without a word, and the worker gave its
    slot to the next job: two jobs ran at once on a queue of concurrency 1."""
    release = threading.Event()
    began: list[str] = []

    def deaf(ctx: Any) -> str:
        began.append(ctx.body["n"])
        if ctx.body["n"] == "first":
            release.wait(30)
        return ctx.body["n"]

    wf = flow("deaf", Step("work", deaf), concurrency=1)
    async with Engine(workflows=[wf], database=database) as engine:
        first = await engine.enqueue("deaf", {"n": "first"})
        await until(lambda: began == ["first"])
        second = await engine.enqueue("deaf", {"n": "second"})
        [run] = await engine.runs(queue="deaf", status="running")
        cancelled = await engine.cancel(run.id)
        assert cancelled.status is RunStatus.CANCELLED
        assert any(
            line.message.startswith("cancelled, but step work still runs in its thread")
            for line in cancelled.logs
        ), cancelled.logs
        assert began == ["first"]  # its slot is still taken
        release.set()
        assert (await engine.wait_for_job(second, timeout=10)).output == "second"
        assert (await engine.get_job(first)).state is JobState.CANCELLED
    assert began == ["first", "second"]


async def test_a_cancelled_sync_node_that_returns_when_told_is_not_said_to_run_on(
    database: Path | None,
) -> None:
    """Its thread was looked at the moment the node was told: one that returned a few ms
    later had its run say it "still runs in its thread" and kept its slot, for ever after in
    the record."""
    began = threading.Event()
    polite = polite_node(began)
    async with Engine(workflows=[flow("polite", Step("work", polite))], database=database) as e:
        await e.enqueue("polite", {})
        await anyio.to_thread.run_sync(began.wait, 10)
        [run] = await e.runs(queue="polite", status="running")
        cancelled = await e.cancel(run.id)
    assert cancelled.status is RunStatus.CANCELLED
    assert not [line.message for line in cancelled.logs if "its thread" in line.message]


async def test_what_a_cancelled_sync_node_logs_as_it_returns_is_kept_with_its_run(
    database: Path | None,
) -> None:
    """A plain def that sees ctx.cancelled and says what it undid ("rolled back") before it
    returns: the line reached the worker's stderr, never the run's log, where the operator
    who cancelled it looks (an async node's, logged as it unwinds, was kept)."""
    began = threading.Event()

    def tidy(ctx: Any) -> str:
        began.set()
        while not ctx.cancelled:
            time.sleep(0.01)
        ctx.logger.warning("rolled back the reservation")
        return "stopped"

    async with Engine(workflows=[flow("tidy", Step("work", tidy))], database=database) as e:
        await e.enqueue("tidy", {})
        await anyio.to_thread.run_sync(began.wait, 10)
        [run] = await e.runs(queue="tidy", status="running")
        cancelled = await e.cancel(run.id)
        stored = await e.get_run(run.id)
    assert cancelled.status is RunStatus.CANCELLED
    assert [line.message for line in stored.step("work").logs] == ["rolled back the reservation"]


async def test_cancel_queued_and_delayed_runs(database: Path | None) -> None:
    async def noop(ctx) -> None:
        return None

    wf = flow("later", Step("noop", noop))
    waits = flow("waits", Step("noop", noop), wait.for_("1h"))
    async with Engine(workflows=[wf, waits], database=database) as engine:
        await engine.pause("later")
        queued = await run_of(engine, await engine.enqueue("later", {}))
        delayed = await run_of(engine, await engine.enqueue("later", {}, delay="1h"))
        assert queued.status is RunStatus.QUEUED and delayed.status is RunStatus.DELAYED
        for run in (queued, delayed):
            cancelled = await engine.cancel(run.id)
            assert cancelled.status is RunStatus.CANCELLED
            assert cancelled.error == "cancelled by operator before it ran"
        async with expect_events(engine, RunStatusChanged, where=lambda e: e.status == "waiting"):
            waiting = await engine.enqueue("waits", {})
        # It began (its first step ran): not "before it ran".
        cancelled = await engine.cancel((await run_of(engine, waiting)).id)
        assert (cancelled.status, cancelled.error) == (RunStatus.CANCELLED, "cancelled by operator")
        await engine.resume("later")
        stats = await engine.queue_stats("later")
        assert stats.cancelled == 2 and stats.waiting == 0 and stats.delayed == 0
        with pytest.raises(UnknownRun):
            await engine.cancel("run_nope")


async def test_idempotency_hit_skips_the_node(database: Path | None) -> None:
    calls: list[str] = []

    async def charge(ctx, order_id: str) -> dict:
        calls.append(order_id)
        return {"receipt": f"r-{order_id}"}

    wf = flow(
        "idem",
        Step(
            "charge",
            charge,
            inputs={"order_id": "$.body.order_id"},
            idempotency_key="$.body.order_id",
        ),
    )
    async with Engine(workflows=[wf], database=database) as engine:
        first = await engine.wait_for_job(await engine.enqueue("idem", {"order_id": "X"}), 10)
        second = await engine.wait_for_job(await engine.enqueue("idem", {"order_id": "X"}), 10)
        other = await engine.wait_for_job(await engine.enqueue("idem", {"order_id": "Y"}), 10)
        assert calls == ["X", "Y"]
        cached = second.step("charge")
        assert cached.status is StepStatus.CACHED
        assert cached.cached_from == first.id
        assert cached.output == {"receipt": "r-X"}
        assert second.status is RunStatus.COMPLETED
        assert other.step("charge").status is StepStatus.COMPLETED


async def test_wait_releases_and_resumes_with_state(database: Path | None) -> None:
    async def before(ctx) -> dict:
        return {"token": ctx.body["n"] * 2}

    async def after(ctx, token: int) -> int:
        return token + 1

    wf = flow(
        "waits",
        Step("before", before),
        wait.for_("300ms"),
        Step("after", after, inputs={"token": "$.state.before.token"}),
    )
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("waits", {"n": 20})
        events = engine.events()
        run = None
        with anyio.fail_after(5):
            async for event in events:
                if getattr(event, "status", None) == "waiting":
                    run = await engine.get_run(event.run_id)
                    break
        assert run is not None and run.status is RunStatus.WAITING
        assert run.wait_until is not None
        assert run.step("wait_2").status is StepStatus.WAITING
        done = await engine.wait_for_job(job, timeout=10)
        assert done.status is RunStatus.COMPLETED
        assert done.id == run.id
        assert done.output == 41
        assert done.step("wait_2").status is StepStatus.COMPLETED
        # The step before the wait ran once.
        assert len(done.step("before").attempts) == 1


def _waits_between_two_steps(name: str, ran: list[str], **trigger: object) -> Workflow:
    """A step, a 1 s wait, a step that reads the first's output; each step notes it ran."""

    async def first(ctx) -> str:
        ran.append("first")
        return "kept"

    async def second(ctx, value: str) -> str:
        ran.append("second")
        return value.upper()

    return flow(
        name,
        Step("first", first),
        wait.for_("1s"),
        Step("second", second, inputs={"value": "$.state.first"}),
        **trigger,
    )


async def test_wait_survives_a_restart(tmp_path: Path) -> None:
    ran: list[str] = []
    wf = _waits_between_two_steps("resume", ran)
    db = tmp_path / "blok.db"
    async with (
        Engine(workflows=[wf], database=db) as engine,
        expect_events(engine, RunStatusChanged, where=lambda event: event.status == "waiting"),
    ):
        job = await engine.enqueue("resume", {})
    assert ran == ["first"]
    async with Engine(workflows=[wf], database=db) as engine:
        run = await engine.wait_for_job(job, timeout=10)
        assert run.status is RunStatus.COMPLETED
        assert run.output == "KEPT"
        assert ran == ["first", "second"]


async def test_a_memory_queues_runs_are_queued_again_after_a_restart(tmp_path: Path) -> None:
    """A memory queue's jobs end with its process, but on a durable store its runs do not: the
    next engine queues them again, a queued run from its start and a waiting one from its
    wait (its first step not run again)."""
    ran: list[str] = []

    async def echo(ctx) -> str:
        ran.append("echo")
        return "echoed"

    flows = [
        _waits_between_two_steps("waits", ran, provider="memory"),
        flow("later", Step("echo", echo), provider="memory"),
    ]
    db = tmp_path / "blok.db"
    async with (
        Engine(workflows=flows, database=db) as engine,
        expect_events(engine, RunStatusChanged, where=lambda event: event.status == "waiting"),
    ):
        await engine.pause("later")
        queued = await engine.enqueue("later", {})
        waiting = await engine.enqueue("waits", {})
    assert ran == ["first"]
    async with Engine(workflows=flows, database=db) as engine:
        await engine.resume("later")
        assert (await engine.wait_for_job(queued, timeout=10)).output == "echoed"
        run = await engine.wait_for_job(waiting, timeout=10)
        assert run.status is RunStatus.COMPLETED and run.output == "KEPT"
    assert sorted(ran) == ["echo", "first", "second"]


async def test_a_memory_queues_runs_a_live_process_holds_are_left_to_it(tmp_path: Path) -> None:
    """Two engines on one database serve the same memory queues: the one that starts later
    leaves the other's runs (a queued one, a waiting one) to it, whose memory holds their jobs
    (taking them would run them twice). An engine that starts once that one is gone takes them
    all, oldest first."""
    ran: list[str] = []
    echoed: list[int] = []

    async def echo(ctx) -> int:
        echoed.append(ctx.body["n"])
        return int(ctx.body["n"])

    flows = [
        _waits_between_two_steps("waits", ran, provider="memory"),
        flow("later", Step("echo", echo), provider="memory", concurrency=1),
    ]
    db = tmp_path / "blok.db"
    async with Engine(workflows=flows, database=db) as first:
        async with expect_events(
            first, RunStatusChanged, where=lambda event: event.status == "waiting"
        ):
            await first.pause("later")
            queued = [await first.enqueue("later", {"n": n}) for n in (1, 2)]
            waiting = await first.enqueue("waits", {})
        async with Engine(workflows=flows, database=db) as second:
            later, waits = await second.queue_stats("later"), await second.queue_stats("waits")
            assert (later.waiting, later.delayed, waits.waiting, waits.delayed) == (0, 0, 0, 0)
        assert (await first.queue_stats("later")).waiting == 2
    assert ran == ["first"] and echoed == []
    async with Engine(workflows=flows, database=db) as third:
        await third.resume("later")
        for job_id, n in zip(queued, (1, 2), strict=True):
            assert (await third.wait_for_job(job_id, timeout=10)).output == n
        run = await third.wait_for_job(waiting, timeout=10)
        assert run.status is RunStatus.COMPLETED and run.output == "KEPT"
    assert ran == ["first", "second"] and echoed == [1, 2]


async def test_a_restart_takes_back_many_memory_runs_a_write_a_chunk_oldest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart after many pending runs of a memory queue takes them back a chunk of runs a
    write (`memory_runs.CHUNK`, 3 here), not a write a run, and queues them oldest first."""
    echoed: list[int] = []

    async def echo(ctx) -> int:
        echoed.append(ctx.body["n"])
        return int(ctx.body["n"])

    flows = [flow("later", Step("echo", echo), provider="memory", concurrency=1)]
    db = tmp_path / "blok.db"
    async with Engine(workflows=flows, database=db) as engine:
        await engine.pause("later")
        queued = [await engine.enqueue("later", {"n": n}) for n in range(7)]
    writes: list[int] = []
    adopt_runs = SqliteRunStore.adopt_runs

    async def counted(self: SqliteRunStore, runs: Any, worker: str) -> set[str]:
        writes.append(len(runs))
        return await adopt_runs(self, runs, worker)

    monkeypatch.setattr(memory_runs, "CHUNK", 3)
    monkeypatch.setattr(SqliteRunStore, "adopt_runs", counted)
    async with Engine(workflows=flows, database=db) as engine:
        await engine.resume("later")
        for job_id in queued:
            assert (await engine.wait_for_job(job_id, timeout=10)).status is RunStatus.COMPLETED
    assert writes == [3, 3, 1]
    assert echoed == list(range(7))


async def test_a_memory_queues_pending_run_is_cancelled_from_elsewhere_once_nobody_holds_it(
    tmp_path: Path,
) -> None:
    """From a process that does not hold it, a memory queue's pending run is cancelled only if
    no live process may hold its job: a waiting run and a queued one whose worker is gone are
    (another worker serving its queue has not taken them back yet: it does so every janitor
    interval); a queued one a live worker holds is not."""
    ran: list[str] = []

    async def noop(ctx) -> None:
        return None

    flows = [
        _waits_between_two_steps("waits", ran, provider="memory"),
        flow("later", Step("noop", noop), provider="memory"),
    ]
    db = tmp_path / "blok.db"
    async with Engine(workflows=flows, database=db) as second:
        await second.pause("later")
        held = await run_of(second, await second.enqueue("later", {}))
        async with (
            Engine(workflows=flows, database=db) as first,
            expect_events(first, RunStatusChanged, where=lambda event: event.status == "waiting"),
        ):
            queued = await run_of(first, await first.enqueue("later", {}))
            waiting = await run_of(first, await first.enqueue("waits", {}))
        async with Engine(database=db, consume=False) as client:
            for run, error in (
                (waiting, "cancelled by operator"),  # it began
                (queued, "cancelled by operator before it ran"),
            ):
                cancelled = await client.cancel(run.id)
                assert (cancelled.status, cancelled.error) == (RunStatus.CANCELLED, error)
            for act in (client.cancel, client.retry_now):
                with pytest.raises(EngineError, match="only that process can act on it"):
                    await act(held.id)
        assert (await second.get_run(held.id)).status is RunStatus.QUEUED


async def test_a_live_worker_takes_back_the_memory_runs_of_a_process_that_is_gone(
    tmp_path: Path,
) -> None:
    """Not only at a start: a worker serving a memory queue takes back, within a janitor
    interval, the waiting run of another that stopped while it ran, and finishes it from its
    wait (its first step not run again)."""
    ran: list[str] = []
    flows = [_waits_between_two_steps("waits", ran, provider="memory")]
    db = tmp_path / "blok.db"
    async with Engine(workflows=flows, database=db, janitor_interval=0.2) as second:
        async with (
            Engine(workflows=flows, database=db) as first,
            expect_events(first, RunStatusChanged, where=lambda event: event.status == "waiting"),
        ):
            waiting = await run_of(first, await first.enqueue("waits", {}))
        async with expect_events(second, RunFinished, where=lambda e: e.run_id == waiting.id):
            pass  # first is gone: its waiting run is second's to take back
        run = await second.get_run(waiting.id)
        assert (run.status, run.output, ran) == (RunStatus.COMPLETED, "KEPT", ["first", "second"])


async def test_a_queued_memory_run_names_its_process_and_is_taken_back_when_that_one_is_gone(
    tmp_path: Path,
) -> None:
    """A memory queue's run that never started names the worker whose memory holds its job, so
    that when that worker is gone a live one takes it back, although yet another live worker
    serves the queue (a run naming none might be in that one's memory, and would be left)."""
    echoed: list[int] = []

    async def echo(ctx) -> int:
        echoed.append(ctx.body["n"])
        return int(ctx.body["n"])

    flows = [flow("later", Step("echo", echo), provider="memory")]
    db = tmp_path / "blok.db"
    async with (
        Engine(workflows=flows, database=db, janitor_interval=0.2) as second,
        Engine(workflows=flows, database=db, janitor_interval=3600) as third,
    ):
        async with Engine(workflows=flows, database=db) as first:
            await first.pause("later")
            queued = [await run_of(first, await first.enqueue("later", {"n": n})) for n in (1, 2)]
            assert {run.worker for run in queued} == {first.worker.id}
        async with expect_events(second, RunFinished, count=2):
            await second.resume("later")  # first is gone: second takes its runs back
        assert sorted(echoed) == [1, 2]
        assert (await third.queue_stats("later")).completed == 0


async def test_of_two_workers_one_takes_back_a_memory_run(tmp_path: Path) -> None:
    """The run a gone process left is taken back by one worker serving its queue, not by each
    (each would run it): the first to take the queue's lease."""
    ran: list[str] = []
    flows = [_waits_between_two_steps("waits", ran, provider="memory")]
    db = tmp_path / "blok.db"
    async with (
        Engine(workflows=flows, database=db) as first,
        expect_events(first, RunStatusChanged, where=lambda event: event.status == "waiting"),
    ):
        await first.enqueue("waits", {})
    async with (
        Engine(workflows=flows, database=db) as second,
        Engine(workflows=flows, database=db) as third,
    ):
        taken = [(await engine.queue_stats("waits")).delayed for engine in (second, third)]
        assert taken == [1, 0]


async def test_unparseable_until_fails_the_step(database: Path | None) -> None:
    async def noop(ctx) -> None:
        return None

    wf = flow("until", Step("noop", noop), wait.until("$.body.when"))
    async with Engine(workflows=[wf], database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("until", {"when": "tomorrow-ish"}), 10)
        assert run.status is RunStatus.FAILED
        assert "cannot parse 'tomorrow-ish'" in (run.error or "")
        assert run.error.startswith("[step 2/2] wait_2 failed")


async def test_replay_records_lineage(database: Path | None) -> None:
    seen: list[dict] = []

    async def record(ctx) -> int:
        seen.append(ctx.body)
        return len(seen)

    wf = flow("again", Step("record", record))
    async with Engine(workflows=[wf], database=database) as engine:
        original = await engine.wait_for_job(await engine.enqueue("again", {"v": 1}), 10)
        new_id = await engine.replay(original.id)
        assert new_id != original.id
        replayed = await engine.wait_for_job((await engine.get_run(new_id)).job_id, 10)
        assert replayed.id == new_id
        assert replayed.replay_of == original.id
        assert replayed.input == {"v": 1}
        assert seen == [{"v": 1}, {"v": 1}]
        with pytest.raises(UnknownRun):
            await engine.replay("run_missing")


async def test_enqueue_validates_before_writing(database: Path | None) -> None:
    async def noop(ctx) -> None:
        return None

    async with Engine(workflows=[flow("v", Step("noop", noop))], database=database) as engine:
        with pytest.raises(UnknownQueue, match="unknown queue 'nope'"):
            await engine.enqueue("nope", {})
        with pytest.raises(EngineError, match="not JSON-serialisable"):
            await engine.enqueue("v", {"when": object()})
        with pytest.raises(EngineError, match="negative"):
            await engine.enqueue("v", {}, delay=-5)
        assert await engine.runs() == []
        stats = await engine.queue_stats("v")
        assert stats.waiting == stats.delayed == stats.completed == 0


async def test_event_stream_tells_a_run_story(database: Path | None) -> None:
    async def ok(ctx) -> int:
        return 1

    wf = flow("story", Step("one", ok), Step("two", ok))
    async with Engine(workflows=[wf], database=database) as engine:
        seen: list[str] = []

        async def listen(ready: anyio.Event) -> None:
            events = engine.events()
            ready.set()
            async for event in events:
                seen.append(type(event).__name__)
                if isinstance(event, RunFinished):
                    return

        async with anyio.create_task_group() as tg:
            ready = anyio.Event()
            tg.start_soon(listen, ready)
            await ready.wait()
            await anyio.lowlevel.checkpoint()
            await engine.enqueue("story", {})
        assert seen[0] == "RunQueued"
        assert "RunStarted" in seen
        assert seen.count("StepStarted") == 2 and seen.count("StepFinished") == 2
        assert seen[-1] == "RunFinished"
        assert StepStarted.__name__ in seen


async def test_janitor_purges_old_terminal_runs(database: Path | None) -> None:
    async def ok(ctx) -> int:
        return 1

    wf = flow("old", Step("ok", ok))
    async with Engine(workflows=[wf], database=database, retention="200ms") as engine:
        done = await engine.wait_for_job(await engine.enqueue("old", {}), 10)
        await engine.pause("old")
        pending = await engine.enqueue("old", {})
        await anyio.sleep(0.3)  # the retention is a wall-clock age: let it pass
        assert await engine.purge() == 1
        with pytest.raises(UnknownRun):
            await engine.get_run(done.id)
        # Runs that have not ended are never purged.
        assert (await engine.get_job(pending)).state == "waiting"
        assert len(await engine.runs()) == 1


async def test_janitor_keeps_a_dead_letters_last_run(database: Path | None) -> None:
    # The dead letter stayed, its runs went: `show` of the run it names said "unknown run",
    # and why it died was gone with it.
    async def broken(ctx) -> int:
        raise ValueError("no such customer")

    wf = Workflow(
        name="dies",
        trigger=WorkerTrigger(queue="dies", retries=1, delay=1),
        steps=[Step("broken", broken)],
    )
    async with Engine(workflows=[wf], database=database, retention="200ms") as engine:
        job_id = await engine.enqueue("dies", {})
        last = await engine.wait_for_job(job_id, 10)
        assert (await engine.get_job(job_id)).state is JobState.DEAD
        first = [run.id for run in await engine.runs(queue="dies") if run.id != last.id]
        assert len(first) == 1  # the retried one
        await anyio.sleep(0.3)  # the retention is a wall-clock age: let it pass
        assert await engine.purge() == 1
        with pytest.raises(UnknownRun):
            await engine.get_run(first[0])
        kept = await engine.get_run(last.id)
        assert "no such customer" in (kept.error or "")
        assert (await engine.get_job(job_id)).run_id == last.id
        # Discarded, it goes with the retention as any finished job does, its last run too.
        await engine.discard(job_id)
        await anyio.sleep(0.3)
        assert await engine.purge() == 1
        with pytest.raises(UnknownRun):
            await engine.get_run(last.id)
        with pytest.raises(UnknownJob):
            await engine.get_job(job_id)


def test_definitions_are_checked_with_names() -> None:
    async def node(ctx) -> None:
        return None

    with pytest.raises(WorkflowDefinitionError, match=r"step 'charge': max_duration: cannot parse"):
        Step("charge", node, max_duration="10 parsecs")
    with pytest.raises(WorkflowDefinitionError, match=r"'orders'.*'a' is used twice"):
        Workflow(name="orders", steps=[Step("a", node), Step("a", node)])
    with pytest.raises(
        WorkflowDefinitionError,
        match=r"'orders', step 'b': \$\.state\.zzz\.id refers to step 'zzz'",
    ):
        Workflow(
            name="orders",
            steps=[Step("a", node), Step("b", node, inputs={"x": "$.state.zzz.id"})],
        )
    with pytest.raises(WorkflowDefinitionError, match="must start with one of"):
        Step("c", node, inputs={"x": "$.bogus.x"})
    # A near miss names what was meant; a word like none of them suggests nothing.
    with pytest.raises(
        WorkflowDefinitionError, match=r"must start with one of .*; did you mean '\$\.body'\?$"
    ):
        Step("c", node, inputs={"x": "$.bdy.x"})
    # Inside a for_each, `$.item` is the natural guess: where the item is, said.
    with pytest.raises(
        WorkflowDefinitionError, match=r"\(a for_each's item is \$\.state\.<its name>\.item\)$"
    ):
        Step("c", node, inputs={"x": "$.item"})
    # The earlier steps in their order, not the alphabet's.
    with pytest.raises(
        WorkflowDefinitionError, match=r"earlier steps: check, charge\); did you mean 'charge'\?$"
    ):
        Workflow(
            name="orders",
            steps=[
                Step("check", node),
                Step("charge", node),
                Step("ship", node, inputs={"x": "$.state.chrage.id"}),
            ],
        )
    with pytest.raises(WorkflowDefinitionError) as far:
        Step("c", node, inputs={"x": "$.quux.x"})
    assert "did you mean" not in str(far.value)
    with pytest.raises(WorkflowDefinitionError, match=r"wait\.for_: cannot parse duration"):
        wait.for_("soon")
