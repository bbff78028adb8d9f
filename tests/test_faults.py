"""Faults in user code and in the process around it (issue 15): the engine records them and
keeps serving; a stop never leaves code running under a job another worker may take."""

from __future__ import annotations

import logging
import signal
import sqlite3
import sys
import textwrap
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_helpers import blok, cli_env, start_worker
from support import DURABLE, a_database, all_tasks_blocked, marked_line, polite_node, until

from engine import (
    AttemptStatus,
    Engine,
    JobState,
    Retry,
    RunStatus,
    Step,
    StepStatus,
    WorkerTrigger,
    Workflow,
)
from engine.backends import open_backend
from engine.gates import Gates
from engine.node_calls import NodeCalls
from engine.run_handle import RunHandle
from engine.watchdog import LoopWatchdog

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    return None if request.param == "memory" else tmp_path / "blok.db"


class Halt(BaseException):
    """A user's own BaseException subclass."""


RAISED: dict[str, BaseException] = {
    "SystemExit": SystemExit(3),
    "GeneratorExit": GeneratorExit("closed"),
    "KeyboardInterrupt": KeyboardInterrupt(),
    "Halt": Halt("stop everything"),
}


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_a_base_exception_from_a_node_fails_the_run_and_the_engine_serves_on(
    database: Path | None, sync: bool
) -> None:
    def raise_it(ctx) -> None:
        if ctx.body.get("raise"):
            raise RAISED[ctx.body["raise"]]

    async def raise_it_async(ctx) -> None:
        raise_it(ctx)

    def ok(ctx) -> str:
        return "served"

    wf = Workflow(
        name="fragile",
        trigger=WorkerTrigger(queue="fragile"),
        steps=[Step("risky", raise_it if sync else raise_it_async), Step("after", ok)],
    )
    async with Engine(workflows=[wf], database=database) as engine:
        for name, error in RAISED.items():
            run = await engine.wait_for_job(
                await engine.enqueue("fragile", {"raise": name}), timeout=10
            )
            assert run.status is RunStatus.FAILED, name
            assert run.error_step == "risky"
            step = run.step("risky")
            assert step.status is StepStatus.FAILED
            assert step.attempts[0].error_type == type(error).__name__
            assert run.step("after").status is StepStatus.PENDING
            # The engine is still serving: the next job runs to the end.
            fine = await engine.wait_for_job(await engine.enqueue("fragile", {}), timeout=10)
            assert fine.status is RunStatus.COMPLETED and fine.output == "served"


async def test_a_timed_out_sync_attempt_is_told_and_its_retry_waits_for_its_thread(
    database: Path | None,
) -> None:
    spans: list[tuple[int, float, float, bool]] = []

    def stubborn(ctx) -> str:
        began = time.monotonic()
        saw_cancelled = False
        while time.monotonic() - began < 0.4:  # does not return early: it only notes the flag
            saw_cancelled = saw_cancelled or ctx.cancelled
            time.sleep(0.02)
        spans.append((ctx.attempt, began, time.monotonic(), saw_cancelled))
        return "late"

    wf = Workflow(
        name="stubborn",
        trigger=WorkerTrigger(queue="stubborn"),
        steps=[Step("slow", stubborn, max_duration="100ms", retry=Retry(2, min_timeout=1))],
    )
    async with Engine(workflows=[wf], database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("stubborn", {}), timeout=10)
    assert run.status is RunStatus.TIMED_OUT
    assert [a.status for a in run.step("slow").attempts] == [AttemptStatus.TIMED_OUT] * 2
    assert [span[0] for span in spans] == [1, 2]
    assert all(saw for *_, saw in spans), "ctx.cancelled was not set on the timeout"
    (_, _, first_end, _), (_, second_start, _, _) = spans
    assert second_start >= first_end, "the retry started while the timed-out attempt ran"
    assert any("still runs in its thread" in line.message for line in run.logs)


@pytest.mark.parametrize("how", ["job timeout", "cancel"])
async def test_a_sync_node_sees_ctx_cancelled_on_a_job_timeout_and_a_cancel(
    database: Path | None, how: str
) -> None:
    started, returned = threading.Event(), threading.Event()

    def polls(ctx) -> str:
        started.set()
        deadline = time.monotonic() + 5
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        if ctx.cancelled:
            returned.set()
        return "stopped"

    timeout = {"timeout": "150ms"} if how == "job timeout" else {}
    wf = Workflow(
        name="polls",
        trigger=WorkerTrigger(queue="polls", **timeout),
        steps=[Step("poll", polls)],
    )
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("polls", {})
        await until(started.is_set)
        if how == "cancel":
            await engine.cancel((await engine.get_job(job)).run_id)
        run = await engine.wait_for_job(job, timeout=10)
        await until(returned.is_set, timeout=3)
    assert run.status is (RunStatus.TIMED_OUT if how == "job timeout" else RunStatus.CANCELLED)


# ---- an async node blocking the loop (item 9) ----------------------------------------------------
async def test_an_async_node_blocking_the_loop_is_named_and_timed_out(
    database: Path | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="blok.watchdog")

    async def blocker(ctx) -> str:
        time.sleep(1.2)  # noqa: ASYNC251 - blocks the whole event loop, as the bug does  # sleeps
        return "late"

    wf = Workflow(
        name="blocking",
        trigger=WorkerTrigger(queue="blocking"),
        steps=[Step("blocker", blocker, max_duration="300ms")],
    )
    async with Engine(workflows=[wf], database=database, watchdog=0.3) as engine:
        run = await engine.wait_for_job(await engine.enqueue("blocking", {}), timeout=10)
    assert run.status is RunStatus.TIMED_OUT  # 1.2 s against 300 ms: not completed
    [attempt] = run.step("blocker").attempts
    assert attempt.status is AttemptStatus.TIMED_OUT
    assert "blocked for" in caplog.text
    # With the line the loop is blocked at: the call to find (it named the step alone).
    at = marked_line(__file__, "# sleeps")
    assert f"by [step 1/1] blocker of run {run.id} (blocking) at {at}:" in caplog.text
    assert any("blocked the event loop for" in line.message for line in run.logs)


async def test_a_lease_run_out_while_a_node_blocked_the_loop_says_so_in_the_crashed_run(
    database: Path | None,
) -> None:
    # The worker's own claim took the job over once the loop ran again, and the crashed run
    # said "worker X stopped renewing its lease; the job was taken over by another worker":
    # there was no other worker, and nothing said what to change.
    async def blocker(ctx: Any) -> str:
        if ctx.params["attempt"] == 1:
            time.sleep(1.6)  # noqa: ASYNC251 - past the 1 s lease, the loop blocked  # blocks
        return "done"

    wf = Workflow(name="blocks", trigger=WorkerTrigger(queue="blocks"), steps=[Step("b", blocker)])
    async with Engine(workflows=[wf], database=database, lease=1, watchdog=0.2) as engine:
        job = await engine.enqueue("blocks", {})
        run = await engine.wait_for_job(job, timeout=15)
        first = (await engine.runs(queue="blocks", status=RunStatus.CRASHED))[0]
    assert run.status is RunStatus.COMPLETED and run.job_attempt == 2
    at = marked_line(__file__, "# blocks")
    assert first.error is not None and first.error.startswith(
        f"this worker ({engine.worker.id}) did not renew its lease in time (lease expired), its "
        "event loop was blocked for "
    ), first.error
    assert first.error.endswith(
        f"s by [step 1/1] b at {at} (an async node must not call blocking code: make it a plain "
        "def, or await anyio.to_thread.run_sync); it took the job over from itself"
    ), first.error


async def test_a_stall_that_a_node_takes_over_in_the_same_turn_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The loop blocked first by something else (a garbage collection, engine code), then, in
    the same turn of the loop, by a node: the stall is named after the node (seen in a full
    test run, where the suite's garbage collection ran just before the blocking node)."""
    caplog.set_level(logging.WARNING, logger="blok.watchdog")
    frames = NodeCalls(lambda run, message, level: None)
    dog = LoopWatchdog(frames, threshold_s=0.2)

    def node() -> None:
        me = id(sys._getframe())
        frames.async_frames[me] = ("run_x", "wf", "[step 1/1] n")
        time.sleep(0.6)
        del frames.async_frames[me]

    async with anyio.create_task_group() as tg:
        tg.start_soon(dog.beat)
        await all_tasks_blocked()
        time.sleep(0.4)  # noqa: ASYNC251 - not a node: the first report names nobody
        node()
        await until(lambda: "runs again" in caplog.text, timeout=5)
        tg.cancel_scope.cancel()
    assert "not by a step's node" in caplog.text
    assert "by [step 1/1] n of run run_x (wf)" in caplog.text


SUSPENDED = textwrap.dedent(
    """
    import logging, sys, anyio
    from engine.node_calls import NodeCalls
    from engine.watchdog import LoopWatchdog

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(LoopWatchdog(NodeCalls(lambda *a: None), threshold_s=0.2).beat)
            await anyio.sleep(0.1)
            print("ready", flush=True)
            await anyio.sleep(60)

    anyio.run(main)
    """
)


async def test_a_process_suspended_whole_is_said_so_not_a_blocked_loop(tmp_path: Path) -> None:
    """SIGSTOP (a paused machine, a suspended laptop) stops the watchdog's thread too: on
    waking it said the loop had been blocked, 'not by a step's node (engine code…)'."""
    script = tmp_path / "suspended.py"
    script.write_text(SUSPENDED)
    async with await anyio.open_process([sys.executable, str(script)], env=cli_env()) as process:
        assert process.stdout is not None and process.stderr is not None
        with anyio.fail_after(10):
            assert (await process.stdout.receive()).strip() == b"ready"
        said = b""
        try:
            process.send_signal(signal.SIGSTOP)
            await anyio.sleep(1.0)  # suspended this long: five times the watchdog's threshold
            process.send_signal(signal.SIGCONT)
            with anyio.fail_after(10):
                while b"again after" not in said and b"suspended" not in said:
                    said += await process.stderr.receive()
        finally:
            process.kill()
    text = said.decode()
    assert text.startswith("this process was suspended for "), text
    assert "blocked" not in text.replace("was not blocked", ""), text


# ---- an exception inside `async with Engine` (item 13) -------------------------------------------
async def test_an_exception_in_the_engines_body_reaches_the_caller_as_itself(
    database: Path | None,
) -> None:
    started = threading.Event()

    def busy(ctx) -> None:
        started.set()
        while not ctx.cancelled:
            time.sleep(0.01)

    async def sleepy(ctx) -> None:
        await anyio.sleep(30)

    wf = Workflow(
        name="busy",
        trigger=WorkerTrigger(queue="busy", concurrency=2),
        steps=[Step("busy", busy)],
    )
    other = Workflow(name="nap", trigger=WorkerTrigger(queue="nap"), steps=[Step("nap", sleepy)])
    with pytest.raises(LookupError) as raised:
        async with Engine(workflows=[wf, other], database=database, grace_period=0.1) as engine:
            await engine.enqueue("busy", {})
            await engine.enqueue("nap", {})
            await until(started.is_set)
            raise LookupError("the app's own error")
    assert type(raised.value) is LookupError  # not an ExceptionGroup around it
    assert str(raised.value) == "the app's own error"


# ---- a stop is not a crash (item 15) -------------------------------------------------------------
async def test_a_run_stopped_by_a_graceful_stop_goes_on_where_it_stopped(tmp_path: Path) -> None:
    db = tmp_path / "blok.db"
    calls: list[str] = []
    long_started = anyio.Event()
    resumed = [False]

    async def prepare(ctx) -> dict:
        calls.append("prepare")
        return {"token": 41}

    async def long(ctx, token: int) -> int:
        calls.append("long")
        if not resumed[0]:
            long_started.set()
            await anyio.sleep(30)
        return token + 1

    wf = Workflow(
        name="stoppable",
        trigger=WorkerTrigger(queue="stoppable", retries=0),
        steps=[
            Step("prepare", prepare),
            Step("long", long, inputs={"token": "$.state.prepare.token"}),
        ],
    )
    async with Engine(workflows=[wf], database=db, grace_period=0.2) as engine:
        job = await engine.enqueue("stoppable", {})
        with anyio.fail_after(10):
            await long_started.wait()
    resumed[0] = True
    async with Engine(workflows=[wf], database=db) as engine:
        run = await engine.wait_for_job(job, timeout=10)
        runs = await engine.runs(queue="stoppable")
        stats = await engine.queue_stats("stoppable")
    assert [r.id for r in runs] == [run.id]  # the same run, not a crashed one and a new one
    assert run.status is RunStatus.COMPLETED and run.output == 42
    assert calls == ["prepare", "long", "long"]  # prepare not again: its state came back
    long_attempts = run.step("long").attempts
    assert [a.status for a in long_attempts] == [AttemptStatus.CANCELLED, AttemptStatus.COMPLETED]
    assert "interrupted by a stop" in (long_attempts[0].error or "")
    assert (stats.failed, stats.dead, stats.completed) == (0, 0, 1)
    assert run.job_attempt == 1  # the retry budget untouched


async def test_an_attempt_a_stop_interrupted_is_not_counted_against_the_steps_budget(
    tmp_path: Path,
) -> None:
    """A step with no Retry (a budget of one attempt) that a stop interrupted runs again on
    resume as its attempt 1 (ctx.attempt), and its record says attempt 2 of the 2 it may make
    in all (never "2/1")."""
    db = tmp_path / "blok.db"
    started = anyio.Event()
    attempts_seen: list[int] = []
    resumed = [False]

    async def slow(ctx: Any) -> str:
        attempts_seen.append(ctx.attempt)
        if not resumed[0]:
            started.set()
            await anyio.sleep(30)
        return "done"

    wf = Workflow(
        name="slow", trigger=WorkerTrigger(queue="slow", retries=0), steps=[Step("slow", slow)]
    )
    async with Engine(workflows=[wf], database=db, grace_period=0.2) as engine:
        job = await engine.enqueue("slow", {})
        with anyio.fail_after(10):
            await started.wait()
    resumed[0] = True
    async with Engine(workflows=[wf], database=db) as engine:
        run = await engine.wait_for_job(job, timeout=10)
    step = run.step("slow")
    assert run.status is RunStatus.COMPLETED
    assert [(a.number, a.status) for a in step.attempts] == [
        (1, AttemptStatus.CANCELLED),
        (2, AttemptStatus.COMPLETED),
    ]
    assert step.max_attempts == 2
    assert attempts_seen == [1, 1]


async def test_a_resumed_step_keeps_its_failed_attempts_against_its_budget(
    tmp_path: Path,
) -> None:
    """Stopped in its retry backoff after a failed attempt 1 of 2, the step makes one more
    attempt on resume (its attempt 2, the last), not a fresh budget of two."""
    db = tmp_path / "blok.db"
    attempts_seen: list[int] = []

    async def flaky(ctx: Any) -> None:
        attempts_seen.append(ctx.attempt)
        raise ConnectionError(f"attempt {ctx.attempt} refused")

    retry = Retry(max_attempts=2, min_timeout="60s")  # the stop comes in the 60 s backoff
    wf = Workflow(
        name="flaky",
        trigger=WorkerTrigger(queue="flaky", retries=0),
        steps=[Step("flaky", flaky, retry=retry)],
    )
    async with Engine(workflows=[wf], database=db, grace_period=0.2) as engine:
        job = await engine.enqueue("flaky", {})

        async def backing_off() -> bool:
            run = await engine.get_run((await engine.get_job(job)).run_id)
            return any(s.attempts and s.attempts[0].backoff_ms is not None for s in run.steps)

        await until(backing_off)
    async with Engine(workflows=[wf], database=db) as engine:
        run = await engine.wait_for_job(job, timeout=10)
    step = run.step("flaky")
    assert run.status is RunStatus.FAILED
    assert attempts_seen == [1, 2]
    assert [(a.number, a.status) for a in step.attempts] == [
        (1, AttemptStatus.FAILED),
        (2, AttemptStatus.FAILED),
    ]
    assert step.max_attempts == 2


# ---- a stop, a cancel or a lost lease while a run's start is written ------------------------------
# A job claimed ahead (not handed straight to its slot) waits for its run's start to be written
# before its code runs, so that a crash there is never a silent double. What lands in that wait
# found no cancel scope yet: the code then ran after it.


def called(monkeypatch: pytest.MonkeyPatch, method: str) -> anyio.Event:
    """An event set once the RunHandle method `method` (which stops a run: `interrupt`,
    `cancel`, `lose`) has been called on a run; the method still does its work."""
    landed = anyio.Event()
    real = getattr(RunHandle, method)

    def and_tell(handle: RunHandle) -> None:
        real(handle)
        landed.set()

    monkeypatch.setattr(RunHandle, method, and_tell)
    return landed


class HeldStart:
    """Two jobs on a queue of one slot: job 0 runs for the slot, job 1 is claimed ahead. Job
    0 ends when `start_job_1` is called, and job 1's start is held in its flush (the real
    flush, late) until the RunHandle method `method` has been called on a run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
        self.monkeypatch = monkeypatch
        self.gates = [anyio.Event(), anyio.Event()]
        self.started: list[int] = []
        self.landed = called(monkeypatch, method)

    def workflow(self, provider: str) -> Workflow:
        async def gated(ctx) -> int:
            i: int = ctx.body["i"]
            self.started.append(i)
            await self.gates[i].wait()
            return i

        trigger = WorkerTrigger(queue="gated", concurrency=1, provider=provider, retries=0)
        return Workflow(name="gated", trigger=trigger, steps=[Step("gated", gated)])

    async def start_job_1(self, engine: Engine, answers: anyio.Event | None = None) -> str:
        """Job 1's id, once its start waits in the flush (until `answers` is set, if given:
        a database that does not answer)."""
        _, ahead = await engine.enqueue_many("gated", [{"i": 0}, {"i": 1}])
        await until(lambda: self.started == [0])
        runs = engine.backend.runs
        flush = runs.flush
        in_flush = anyio.Event()

        async def flush_once_landed() -> None:
            in_flush.set()
            await (self.landed if answers is None else answers).wait()
            await flush()

        self.monkeypatch.setattr(runs, "flush", flush_once_landed)
        self.gates[0].set()
        with anyio.fail_after(10):
            await in_flush.wait()
        self.monkeypatch.setattr(runs, "flush", flush)
        return ahead

    async def job_1_done_here(self, engine: Engine) -> None:
        """Until job 1 is done with here (or its code began, as it must not)."""
        with anyio.fail_after(10):
            await self.landed.wait()
        await until(lambda: engine.in_flight == 0 or 1 in self.started)
        self.gates[1].set()


@pytest.mark.parametrize("kind", DURABLE)
async def test_a_stop_that_lands_while_a_start_is_written_stops_the_run_as_it_opens(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code ran on after the stop, and the drain took it for code that would not stop:
    held, its job kept until the lease ran out (a worker process exits with status 3 over
    it). Now it does not begin, and its job goes back to the queue."""
    held = HeldStart(monkeypatch, "interrupt")
    async with a_database(kind, tmp_path) as database:
        async with Engine(
            workflows=[held.workflow(kind)], database=database, exit_when_stuck=False, lease=30
        ) as engine:
            ahead = await held.start_job_1(engine)
            with anyio.fail_after(10):
                await engine.shutdown(grace_period=0)
        async with Engine(database=database, create=False) as client:
            job = await client.get_job(ahead)
            run = await client.get_run(job.run_id)
    assert held.started == [0]  # job 1's code never ran
    assert job.state is JobState.WAITING  # back in its queue, not held
    assert run.status is not RunStatus.RUNNING


@pytest.mark.parametrize("kind", DURABLE)
async def test_a_stop_while_a_start_waits_on_a_database_that_does_not_answer_hands_it_back(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The start's write did not land (the database out of reach), and the run's wait for it
    outlasted the stop: the drain took it for code that would not stop, kept its job and
    exited the process (status 3) over it, though none of its code had run. The stop now
    cuts the wait, and the job goes back to the queue."""
    held = HeldStart(monkeypatch, "interrupt")
    answers = anyio.Event()
    async with a_database(kind, tmp_path) as database:
        async with Engine(
            workflows=[held.workflow(kind)], database=database, exit_when_stuck=False, lease=30
        ) as engine:
            ahead = await held.start_job_1(engine, answers)
            with anyio.fail_after(10):
                await engine.shutdown(grace_period=0)
        answers.set()
        async with Engine(database=database, create=False) as client:
            job = await client.get_job(ahead)
    assert held.started == [0]  # job 1's code never ran
    assert job.state is JobState.WAITING  # back in its queue, not kept
    assert not [r.getMessage() for r in caplog.records if "did not stop" in r.getMessage()]


async def test_a_cancel_that_lands_while_a_start_is_written_runs_no_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run was recorded cancelled, but its code ran to its first await first."""
    held = HeldStart(monkeypatch, "cancel")
    async with Engine(workflows=[held.workflow("sqlite")], database=tmp_path / "b.db") as engine:
        ahead = await held.start_job_1(engine)
        job = await engine.get_job(ahead)
        await engine.cancel(job.run_id)
        await held.job_1_done_here(engine)
        run = await engine.wait_for_job(ahead, timeout=10)
    assert held.started == [0]  # job 1's code never ran
    assert run.status is RunStatus.CANCELLED


async def test_a_lease_lost_while_a_start_is_written_runs_no_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker takes the job meanwhile (its claim written straight into the file): the
    renewal tells this worker it lost the lease, and the code ran here beside the other's."""
    held = HeldStart(monkeypatch, "lose")
    db = tmp_path / "blok.db"
    # A lease of 3 s, renewed every second: the lease itself has not run out when the
    # renewal finds the job gone, so only the renewal's word stops the code.
    async with Engine(workflows=[held.workflow("sqlite")], database=db, lease=3) as engine:
        ahead = await held.start_job_1(engine)
        with closing(sqlite3.connect(db, timeout=30)) as conn, conn:
            conn.execute(
                "UPDATE jobs SET worker = 'another', epoch = epoch + 1 WHERE id = ?", (ahead,)
            )
        await held.job_1_done_here(engine)
        job = await engine.get_job(ahead)
    assert held.started == [0]  # job 1's code never ran here
    assert job.worker == "another"


async def test_a_run_that_registers_after_a_drain_stopped_the_others_runs_no_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job still in the gates (a debounce, a concurrency key and a rate limit each ask the
    database) when a drain stops the runs in flight was not among them: its run registered
    after, and its code began after the stop. Now it stops as it registers: no code, its job
    back in the queue."""
    db = tmp_path / "blok.db"
    started: list[int] = []
    in_gates, through = anyio.Event(), anyio.Event()
    stopping = called(monkeypatch, "interrupt")  # past the drain's grace: runs are stopped
    admit = Gates.admit

    async def admit_late(self: Gates, claim: Any, *args: Any) -> bool:
        if claim.job.payload["i"] == 1:
            in_gates.set()
            await stopping.wait()
        admitted = await admit(self, claim, *args)
        through.set()
        return admitted

    async def slow_to_stop(ctx) -> int:
        i: int = ctx.body["i"]
        started.append(i)
        try:
            await anyio.sleep_forever()
        finally:
            if i == 0:  # job 0 unwinds once job 1 went through the gates and began or not
                with anyio.CancelScope(shield=True), anyio.fail_after(10):
                    await through.wait()
                    await until(lambda: engine.in_flight == 1 or 1 in started)
        return i

    monkeypatch.setattr(Gates, "admit", admit_late)
    trigger = WorkerTrigger(queue="slow", concurrency=2, retries=0)
    wf = Workflow(name="slow", trigger=trigger, steps=[Step("slow", slow_to_stop)])
    async with Engine(workflows=[wf], database=db, exit_when_stuck=False, lease=30) as engine:
        _, second = await engine.enqueue_many("slow", [{"i": 0}, {"i": 1}])
        with anyio.fail_after(10):
            await in_gates.wait()
        await until(lambda: started == [0])
        with anyio.fail_after(20):
            await engine.shutdown(grace_period=0)
    async with Engine(database=db, create=False) as client:
        job = await client.get_job(second)
    assert started == [0]  # job 1's code never began
    assert job.state is JobState.WAITING


async def test_a_plain_def_that_returns_when_told_to_stop_is_handed_back_not_held(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain def that watches ctx.cancelled and returns a few ms after a stop was taken for
    code that never stops (its thread was looked at the moment it was told): its job was
    kept, and a worker process exited for it."""
    db = tmp_path / "blok.db"
    started = threading.Event()
    trigger = WorkerTrigger(queue="polite", retries=0)
    wf = Workflow(name="polite", trigger=trigger, steps=[Step("polite", polite_node(started))])
    async with Engine(
        workflows=[wf], database=db, grace_period=0.1, exit_when_stuck=False
    ) as engine:
        job_id = await engine.enqueue("polite", {})
        await anyio.to_thread.run_sync(started.wait, 10)
    async with Engine(database=db, create=False) as client:
        job = await client.get_job(job_id)
        run = await client.get_run(job.run_id)
    assert not [r.getMessage() for r in caplog.records if "did not stop" in r.getMessage()]
    assert job.state is JobState.WAITING and job.worker is None  # handed back, to go on
    assert "interrupted by a stop" in (run.step("polite").attempts[0].error or "")


async def test_a_job_still_opening_when_a_drain_begins_has_its_grace_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job its slot held but had not opened yet (a scheduled tick reads its run first; a
    gate asks the database) when a drain began was not among the runs the drain waited for:
    the wait ended at once, and the run opened as everything was stopped. Its plain def then
    ran in its thread past the stop, and the process exited (a test process, in CI). It is
    waited for as the runs are, and completes within the grace."""
    db = tmp_path / "blok.db"
    in_gates, draining = anyio.Event(), anyio.Event()
    admit = Gates.admit

    async def admit_late(self: Gates, *args: Any) -> bool:
        in_gates.set()
        await draining.wait()
        return await admit(self, *args)

    def quick(ctx: Any) -> int:
        return int(ctx.body["i"])

    monkeypatch.setattr(Gates, "admit", admit_late)
    wf = Workflow(name="quick", trigger=WorkerTrigger(queue="quick"), steps=[Step("q", quick)])
    async with Engine(workflows=[wf], database=db, exit_when_stuck=False) as engine:
        job_id = await engine.enqueue("quick", {"i": 7})
        with anyio.fail_after(10):
            await in_gates.wait()
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.shutdown, 10.0)
            await until(lambda: engine.worker.stopping_since is not None)  # the drain began
            draining.set()
    async with Engine(database=db, create=False) as client:
        job = await client.get_job(job_id)
        run = await client.get_run(job.run_id)
    assert (job.state, run.status, run.output) == (JobState.COMPLETED, RunStatus.COMPLETED, 7)


@pytest.mark.parametrize("kind", DURABLE)
async def test_a_stopped_worker_is_not_registered_again_by_a_renewal_due_as_it_stops(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's lease renewals (each also a heartbeat) go on while it drains; once the
    drain unregistered it, one still due before its tasks end must not register it again,
    leaving a worker nobody runs in the registry."""
    from engine.backends.postgres.shared import PostgresShared
    from engine.backends.sqlite.shared import SqliteShared

    for shared in (SqliteShared, PostgresShared):

        def slow_to_forget(forget: Any) -> Any:
            async def forget_worker(self: Any, worker_id: str) -> list[tuple[str, str]]:
                freed: list[tuple[str, str]] = await forget(self, worker_id)
                await anyio.sleep(0.1)  # renewals of a 30 ms lease come due meanwhile
                return freed

            return forget_worker

        monkeypatch.setattr(shared, "forget_worker", slow_to_forget(shared.forget_worker))
    wf = Workflow(name="idle", trigger=WorkerTrigger(queue="idle"), steps=[Step("s", print)])
    async with a_database(kind, tmp_path) as database:
        async with Engine(workflows=[wf], database=database, lease=0.03) as engine:
            assert len(await engine.workers()) == 1
        async with open_backend(database) as backend:
            assert await backend.shared.workers() == []


# ---- stopping a worker process (items 8 and 14) --------------------------------------------------
STOPPABLE = textwrap.dedent(
    """
    import time
    from pathlib import Path
    import anyio
    from engine import Step, WorkerTrigger, Workflow

    HERE = Path(__file__).parent

    async def nap(ctx):
        (HERE / f"started-{ctx.run_id}").touch()
        await anyio.sleep(ctx.body.get("seconds", 60))
        return "rested"

    def grind(ctx):  # a sync node that does not look at ctx.cancelled
        (HERE / f"started-{ctx.run_id}").touch()
        while not (HERE / "release").exists():
            time.sleep(0.02)
        return "ground"

    workflows = [
        Workflow(name="nap", trigger=WorkerTrigger(queue="nap"), steps=[Step("nap", nap)]),
        Workflow(name="grind", trigger=WorkerTrigger(queue="grind"), steps=[Step("grind", grind)]),
    ]
    """
)


@pytest.fixture
def stoppable(tmp_path: Path) -> Path:
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "stoppable.py").write_text(STOPPABLE)
    return folder


def started(folder: Path) -> bool:
    return any(folder.glob("started-*"))


async def test_a_second_stop_signal_stops_at_once_and_hands_stopped_jobs_back(
    tmp_path: Path, stoppable: Path
) -> None:
    db = tmp_path / "blok.db"
    worker = start_worker(db, stoppable, "--grace", "60", "--no-watch")
    try:
        job = blok("enqueue", "nap", "{}", "--db", db).stdout.strip()
        await until(lambda: started(stoppable))
        worker.process.send_signal(signal.SIGTERM)
        await until(lambda: "draining" in worker.stderr())
        began = time.monotonic()
        worker.process.send_signal(signal.SIGTERM)  # do not wait the 60 s
        code = await anyio.to_thread.run_sync(worker.process.wait, 20)
        assert time.monotonic() - began < 10
        assert code == 0, worker.stderr()
    finally:
        worker.stop()
    async with Engine(database=db, create=False) as client:
        handed_back = await client.get_job(job)
        run = await client.get_run(handed_back.run_id)
    assert handed_back.state is JobState.WAITING and handed_back.resume  # its code stopped
    assert run.status is RunStatus.QUEUED
    assert any("interrupted by a stop" in line.message for line in run.logs)


async def test_a_sync_node_that_does_not_stop_ends_the_process_and_keeps_its_job(
    tmp_path: Path, stoppable: Path
) -> None:
    db = tmp_path / "blok.db"
    worker = start_worker(db, stoppable, "--grace", "0.3", "--no-watch")
    try:
        job = blok("enqueue", "grind", "{}", "--db", db).stdout.strip()
        await until(lambda: started(stoppable))
        worker.process.send_signal(signal.SIGTERM)
        # The thread cannot be stopped and does not keep the process alive: it exits.
        code = await anyio.to_thread.run_sync(worker.process.wait, 20)
        assert code == 3, worker.stderr()
    finally:
        worker.stop()
    assert "is not handed back while its code runs" in worker.stderr()
    async with Engine(database=db, create=False) as client:
        held = await client.get_job(job)
        run = await client.get_run(held.run_id)
    # Recorded, but not handed back while the code ran: still the dead worker's job.
    assert held.state is JobState.ACTIVE and held.worker == worker.id
    assert run.status is RunStatus.QUEUED
    assert any("still runs in its thread" in line.message for line in run.logs)
    (stoppable / "release").touch()
    # A worker starting on the database finds that process gone and the run goes on.
    async with Engine(workflows=stoppable, database=db) as engine:
        done = await engine.wait_for_job(job, timeout=20)
        runs = await engine.runs(queue="grind")
    assert done.id == run.id and done.status is RunStatus.COMPLETED and done.output == "ground"
    assert [r.id for r in runs] == [run.id]


async def test_an_embedding_app_may_keep_its_process_when_code_does_not_stop(
    tmp_path: Path, stoppable: Path
) -> None:
    """Engine(exit_when_stuck=False): the stop returns instead of exiting the process; the
    job stays this worker's (not handed back) until its lease runs out."""
    db = tmp_path / "blok.db"
    async with Engine(
        workflows=stoppable, database=db, grace_period=0.3, exit_when_stuck=False, lease=30
    ) as engine:
        job = await engine.enqueue("grind", {})
        await until(lambda: started(stoppable))
        await engine.shutdown()  # ends the `async with`, and this process lives on
    async with Engine(database=db, create=False) as client:
        held = await client.get_job(job)
    assert held.state is JobState.ACTIVE  # not handed back while its code runs
    (stoppable / "release").touch()
