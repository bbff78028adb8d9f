"""RateLimit on memory, SQLite and PostgreSQL: no more than `limit` starts in any sliding window,
across two engines on one database; the rest wait `throttled` without using retries; per key."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from support import DURABLE, a_database, any_database, until

from engine import (
    Engine,
    RateLimit,
    Run,
    RunStatus,
    Step,
    WorkerTrigger,
    Workflow,
    WorkflowDefinitionError,
)

pytestmark = pytest.mark.anyio

# A start counts from the moment the gate lets it through (the window's lock held); the run's
# record says it started a moment later, once that answer is back. Windows are checked on the
# records' start times, so two starts a window apart at the gate may look this much closer:
# the check uses windows this much shorter than the period. (Not the nodes' start times: on a
# database the start's commit comes between, and on a loaded machine that is no moment.)
SKEW_S = 0.15


def limited(starts: list[tuple[float, Any]], **rate: Any) -> Workflow:
    def work(ctx: Any) -> Any:
        starts.append((time.time(), ctx.body.get("tenant")))
        return ctx.body

    return Workflow(
        name="api.calls",
        trigger=WorkerTrigger(
            queue="calls", concurrency=10, retries=0, rate_limit=RateLimit(**rate)
        ),
        steps=[Step("work", work)],
    )


database = any_database  # the fixture: each of DATABASES in turn (tests/support.py)


@pytest.fixture(params=DURABLE)
async def durable(
    request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str
) -> AsyncIterator[Path | str]:
    """A database that several engines (processes) share."""
    async with a_database(request.param, tmp_path) as location:
        assert location is not None
        yield location


def started(runs: list[Run], tenant: str | None = None) -> list[float]:
    """When the runs started, by their records (of one tenant's jobs, if given)."""
    times = []
    for run in runs:
        assert run.started_at is not None
        if tenant is None or run.input["tenant"] == tenant:
            times.append(run.started_at.timestamp())
    return times


def most_in_a_window(times: list[float], period: float) -> int:
    times = sorted(times)
    return max(sum(1 for t in times if start <= t < start + period - SKEW_S) for start in times)


async def test_no_more_than_limit_starts_in_any_window_across_two_engines(
    durable: Path | str,
) -> None:
    database = durable
    starts: list[tuple[float, Any]] = []
    wf = limited(starts, limit=3, period="1s")
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(Engine(workflows=[wf], database=database))
        await stack.enter_async_context(Engine(workflows=[wf], database=database))
        jobs = [await first.enqueue("calls", {"n": n}) for n in range(10)]

        async def throttled_one() -> bool:
            return bool(await first.runs(status="throttled", queue="calls"))

        await until(throttled_one)
        [held] = await first.runs(status="throttled", queue="calls", limit=1)
        why = await first.why_waiting(held.id)
        assert why.gate == "rate_limit" and why.until is not None
        assert len(why.holders) == 3 and "3/3 runs started in the window" in why.summary
        assert held.error is not None and held.error.startswith("throttled: rate limit")
        runs = [await first.wait_for_job(job_id, timeout=20) for job_id in jobs]
    assert [run.status for run in runs] == [RunStatus.COMPLETED] * 10
    assert {run.job_attempt for run in runs} == {1}  # held, never retried
    assert len(starts) == 10  # each node ran once
    assert most_in_a_window(started(runs), 1.0) <= 3
    # Sliding, not fixed windows: 10 starts at 3 per second take three seconds at least.
    span = max(started(runs)) - min(started(runs))
    assert span >= 3 - SKEW_S


async def test_the_limit_holds_per_key(database: Path | str | None) -> None:
    starts: list[tuple[float, Any]] = []
    wf = limited(starts, limit=1, period="1s", key="$.body.tenant")
    async with Engine(workflows=[wf], database=database) as engine:
        jobs = [
            await engine.enqueue("calls", {"tenant": tenant, "n": n})
            for n in range(3)
            for tenant in ("a", "b")
        ]
        runs = [await engine.wait_for_job(job_id, timeout=20) for job_id in jobs]
    assert [run.status for run in runs] == [RunStatus.COMPLETED] * 6
    assert len(starts) == 6
    for tenant in ("a", "b"):
        assert most_in_a_window(started(runs, tenant), 1.0) == 1
    # The keys do not share a window: both tenants' first runs started together.
    assert abs(min(started(runs, "a")) - min(started(runs, "b"))) < 0.5


def test_a_rate_limit_is_checked_when_defined() -> None:
    with pytest.raises(WorkflowDefinitionError, match="RateLimit: limit"):
        RateLimit(limit=0, period="1s")
    with pytest.raises(WorkflowDefinitionError, match="RateLimit: period"):
        RateLimit(limit=1, period="soon")
    with pytest.raises(WorkflowDefinitionError, match=r"reads \$\.state"):
        RateLimit(limit=1, period="1s", key="$.state.x")
    # In the words of a rate limit, not pydantic's; and True is no limit of 1.
    for given, said in (
        ({"limit": 2, "period": "0s"}, "period: a window of at least 1ms, not '0s'"),
        (
            {"limit": True, "period": "1s"},
            "limit: a whole number of starts, 1 to 1,000,000, not True",
        ),
    ):
        with pytest.raises(WorkflowDefinitionError) as raised:
            RateLimit(**given)
        assert str(raised.value) == f"RateLimit: {said}"
    # A string that is not an expression would put every run in one window.
    with pytest.raises(WorkflowDefinitionError) as raised:
        RateLimit(limit=1, period="1s", key="body.tenant")
    assert str(raised.value) == (
        "RateLimit.key: 'body.tenant' is not an expression: write one such as "
        "'$.body.user_id', a callable taking the context, or None (one window for all runs)"
    )


async def test_runs_whose_key_cannot_be_read_share_a_window_and_say_why(
    database: Path | str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """They went past the limit: the gate was skipped for them, with a line in each run's log
    and nothing in the worker's, a callable key named as `<function <lambda> at 0x…>`."""
    starts: list[tuple[float, Any]] = []
    wf = limited(starts, limit=1, period="1s", key=lambda ctx: ctx.body["tenant"]["id"])
    async with Engine(workflows=[wf], database=database) as engine:
        jobs = [await engine.enqueue("calls", {"tenant": "a", "n": n}) for n in range(3)]
        runs = [await engine.wait_for_job(job_id, timeout=20) for job_id in jobs]
    assert [run.status for run in runs] == [RunStatus.COMPLETED] * 3
    assert most_in_a_window(started(runs, "a"), 1.0) == 1
    said = [line.message for line in runs[0].logs if "could not be resolved" in line.message]
    assert said == [
        "rate limit key test_runs_whose_key_cannot_be_read_share_a_window_and_say_why.<locals>."
        f"<lambda> (at tests/test_rate_limits.py:{_line_of('key=lambda ctx')}) could not be "
        "resolved (string indices must be integers, not 'str'); the run counts in the window "
        "of key '(key unresolved)', shared by all such runs"
    ]
    assert any(said[0] in record.getMessage() for record in caplog.records)


def _line_of(text: str) -> int:
    """The line of this file that holds `text` (after this function's own)."""
    lines = Path(__file__).read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line and "_line_of" not in line)


async def test_a_run_held_back_by_the_limit_is_still_on_its_first_delivery(
    database: Path | str | None,
) -> None:
    """Each hold was a claim, and counted as a delivery: the third run of a burst was told it
    ran on delivery 3 of a job allowed 1."""

    def delivery(ctx: Any) -> Any:
        return [ctx.job.delivery, ctx.job.max_retries]

    wf = Workflow(
        name="api.calls",
        trigger=WorkerTrigger(
            queue="calls", concurrency=3, retries=0, rate_limit=RateLimit(limit=1, period="300ms")
        ),
        steps=[Step("work", delivery)],
    )
    async with Engine(workflows=[wf], database=database) as engine:
        jobs = [await engine.enqueue("calls", {}) for _ in range(3)]
        runs = [await engine.wait_for_job(job_id, timeout=20) for job_id in jobs]
        held = [await engine.get_job(job_id) for job_id in jobs]
    assert [run.output for run in runs] == [[1, 0]] * 3
    assert sum(job.attempts for job in held) > 3  # the gate held some back
    assert [job.deliveries for job in held] == [1, 1, 1]
