"""Faults in user code and in the process around it (issue 15): the engine records them and
keeps serving; a stop never leaves code running under a job another worker may take."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from support import until

from engine import (
    AttemptStatus,
    Engine,
    Retry,
    RunStatus,
    Step,
    StepStatus,
    WorkerTrigger,
    Workflow,
)

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
