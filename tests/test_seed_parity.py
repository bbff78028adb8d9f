"""The seed's semantics (issue 16), each on memory and SQLite: dead letters and their requeue,
the job's retry budget and timeout, step options, snapshots, switches, helper workflows, waits."""

from __future__ import annotations

import itertools
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import run_when, until
from test_crash import WORKER, WORKFLOW, start_worker, wait_running

from engine import (
    AttemptStatus,
    Engine,
    EngineError,
    JobState,
    Retry,
    RunFilter,
    RunStatus,
    Step,
    StepStatus,
    WorkerTrigger,
    Workflow,
    WorkflowDefinitionError,
    for_each,
    subworkflow,
    switch,
    wait,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    return None if request.param == "memory" else tmp_path / "blok.db"


def flow(name: str, *steps: Any, **trigger: Any) -> Workflow:
    return Workflow(name=name, trigger=WorkerTrigger(queue=name, **trigger), steps=list(steps))


async def broken(ctx) -> None:
    raise RuntimeError("downstream is down")


async def runs_of(engine: Engine, job: str) -> list[Any]:
    return sorted(
        await engine.runs(queue=(await engine.get_job(job)).queue, limit=1000),
        key=lambda run: run.created_at,
    )


# ---- dead letters ------------------------------------------------------------------------------
async def test_dead_letters_carry_job_id_and_a_requeue_gives_a_fresh_budget(
    database: Path | None,
) -> None:
    wf = flow("fragile", Step("call", broken), retries=2, delay=1)
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("fragile", {})
        await engine.wait_for_job(job, timeout=10)
        dead = await engine.dead_letters("fragile")
        assert [d.job_id for d in dead] == [job]
        assert len(await runs_of(engine, job)) == 3
        assert await engine.requeue(dead[0].job_id) == job
        await engine.wait_for_job(job, timeout=10)
        # Three more runs (the first try and two retries), not one.
        assert [r.job_attempt for r in await runs_of(engine, job)] == [1, 2, 3, 1, 2, 3]
        assert (await engine.get_job(job)).state is JobState.DEAD


async def test_a_failed_job_without_retries_goes_to_the_dead_letter_queue(
    database: Path | None,
) -> None:
    wf = flow("once", Step("call", broken))  # retries=0
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("once", {})
        assert (await engine.wait_for_job(job, timeout=10)).status is RunStatus.FAILED
        assert (await engine.get_job(job)).state is JobState.DEAD
        assert [d.job_id for d in await engine.dead_letters("once")] == [job]
        stats = await engine.queue_stats("once")
        assert (stats.dead, stats.failed) == (1, 0)


async def test_a_step_timing_out_goes_through_the_job_retries_then_the_dead_letter_queue(
    database: Path | None,
) -> None:
    async def slow(ctx) -> None:
        await anyio.sleep(10)

    wf = flow("slow", Step("crawl", slow, max_duration="50ms"), retries=1, delay=1)
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("slow", {})
        last = await engine.wait_for_job(job, timeout=10)
        runs = await runs_of(engine, job)
        assert [(r.job_attempt, r.status) for r in runs] == [
            (1, RunStatus.TIMED_OUT),
            (2, RunStatus.TIMED_OUT),
        ]
        assert last.id == runs[-1].id
        assert last.step("crawl").attempts[-1].status is AttemptStatus.TIMED_OUT
        assert (await engine.get_job(job)).state is JobState.DEAD


async def test_the_jobs_own_timeout_is_final(database: Path | None) -> None:
    async def slow(ctx) -> None:
        await anyio.sleep(10)

    wf = flow("bounded", Step("crawl", slow), retries=3, timeout="100ms")
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("bounded", {})
        run = await engine.wait_for_job(job, timeout=10)
        assert run.status is RunStatus.TIMED_OUT
        assert len(await runs_of(engine, job)) == 1
        assert (await engine.get_job(job)).state is JobState.FAILED


# ---- per-job settings --------------------------------------------------------------------------
async def test_enqueue_overrides_retries_and_timeout_and_ctx_job_shows_them(
    database: Path | None,
) -> None:
    seen: list[Any] = []

    async def look(ctx) -> None:
        seen.append(ctx.job)
        if ctx.body.get("sleep"):
            await anyio.sleep(10)
        if not ctx.job.last_attempt:
            raise RuntimeError("not yet")

    wf = flow("jobs", Step("look", look), delay=1)  # the trigger: no retries, no timeout
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("jobs", {}, retries=2, delay="20ms")
        run = await engine.wait_for_job(job, timeout=10)
        assert run.status is RunStatus.COMPLETED  # the third attempt is the last: it passes
        assert [(j.attempt, j.max_retries, j.last_attempt) for j in seen] == [
            (1, 2, False),
            (2, 2, False),
            (3, 2, True),
        ]
        first = seen[0]
        assert (first.id, first.queue, first.delay_ms, first.timeout_ms) == (job, "jobs", 20, None)
        assert [j.delivery for j in seen] == [1, 2, 3]
        assert first.created_at == (await engine.get_job(job)).created_at

        seen.clear()
        timed = await engine.enqueue("jobs", {"sleep": True}, retries=3, timeout="100ms")
        run = await engine.wait_for_job(timed, timeout=10)
        assert run.status is RunStatus.TIMED_OUT
        assert "the job's timeout" in (run.error or "")
        assert [j.timeout_ms for j in seen] == [100]  # final: no retry despite retries=3
        assert (await engine.get_job(timed)).state is JobState.FAILED

        for bad in ({"retries": -1}, {"retries": 10**6}, {"timeout": "0ms"}, {"timeout": "x"}):
            with pytest.raises(EngineError):
                await engine.enqueue("jobs", {}, **bad)
        assert await engine.count_runs(RunFilter.of(queue="jobs")) == 4


async def test_a_requeue_keeps_the_jobs_own_budget(database: Path | None) -> None:
    wf = flow("own", Step("call", broken), delay=1)
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("own", {}, retries=1)
        await engine.wait_for_job(job, timeout=10)
        await engine.requeue(job)
        await engine.wait_for_job(job, timeout=10)
        assert [r.job_attempt for r in await runs_of(engine, job)] == [1, 2, 1, 2]


# ---- the idempotency key -----------------------------------------------------------------------
async def test_a_none_idempotency_key_caches_nothing(database: Path | None) -> None:
    calls: list[Any] = []

    async def charge(ctx) -> str:
        calls.append(ctx.body.get("order"))
        return f"charged {ctx.body.get('order')}"

    step = Step("charge", charge, idempotency_key=lambda ctx: ctx.body.get("order"))
    wf = flow("pay", step)
    async with Engine(workflows=[wf], database=database) as engine:
        outputs = []
        for body in ({"order": None, "n": 1}, {"n": 2}, {"order": "A"}, {"order": "A"}):
            run = await engine.wait_for_job(await engine.enqueue("pay", body), timeout=10)
            outputs.append((run.step("charge").status, run.output))
    # Job 2 did not get job 1's output: a None key is no key ("None" is not a key either).
    assert calls == [None, None, "A"]
    assert outputs == [
        (StepStatus.COMPLETED, "charged None"),
        (StepStatus.COMPLETED, "charged None"),
        (StepStatus.COMPLETED, "charged A"),
        (StepStatus.CACHED, "charged A"),
    ]


# ---- step options --------------------------------------------------------------------------
async def test_step_options_active_ephemeral_as_and_spread(database: Path | None) -> None:
    called: list[str] = []

    async def off(ctx) -> str:
        called.append("off")
        return "never"

    async def token(ctx) -> dict:
        return {"secret": "s3cr3t"}

    async def fetch(ctx) -> dict:
        return {"id": 7}

    async def profile(ctx) -> dict:
        return {"name": "ann", "plan": "pro"}

    async def use(ctx, secret: str, user: dict, name: str, plan: str) -> dict:
        return {
            "secret_seen": secret == "s3cr3t",
            "user": user,
            "name": name,
            "plan": plan,
            "keys": sorted(ctx.state),
        }

    wf = flow(
        "opts",
        Step("off", off, active=False),
        Step("token", token, ephemeral=True),
        Step("peek", lambda ctx: ctx.state.get("token"), inputs={}),
        Step("fetch", fetch, as_="user"),
        Step("profile", profile, spread=True),
        Step(
            "use",
            use,
            inputs={
                "secret": lambda ctx: "s3cr3t" if "token" not in ctx.state else "leaked",
                "user": "$.state.user",
                "name": "$.state.name",
                "plan": "$.state.plan",
            },
        ),
    )
    async with Engine(workflows=[wf], database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("opts", {}), timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    assert called == []
    off_record = run.step("off")
    assert (off_record.status, off_record.attempts, off_record.output) == (
        StepStatus.SKIPPED,
        [],
        None,
    )
    assert run.step("token").status is StepStatus.COMPLETED
    assert run.step("token").output is None  # not in the stored record
    assert run.step("peek").output is None  # nor in ctx.state
    assert run.step("fetch").output == {"id": 7}  # recorded under its name, kept as "user"
    assert run.output == {
        "secret_seen": True,
        "user": {"id": 7},
        "name": "ann",
        "plan": "pro",
        "keys": ["name", "peek", "plan", "user"],
    }


async def test_spread_of_a_non_dict_fails_the_step(database: Path | None) -> None:
    wf = flow("spread", Step("listy", lambda ctx: [1, 2], spread=True))
    async with Engine(workflows=[wf], database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("spread", {}), timeout=10)
    assert run.status is RunStatus.FAILED
    assert "spread=True but returned list" in (run.error or "")


def test_step_options_are_checked_when_defined() -> None:
    def node(ctx, **inputs) -> dict:
        return {}

    with pytest.raises(WorkflowDefinitionError, match="ephemeral and as_"):
        Step("a", node, ephemeral=True, as_="x")
    with pytest.raises(WorkflowDefinitionError, match=r"not kept in ctx.state \(ephemeral"):
        flow("e", Step("a", node, ephemeral=True), Step("b", node, inputs={"v": "$.state.a"}))
    with pytest.raises(WorkflowDefinitionError, match="as_='x'"):
        flow("f", Step("a", node, as_="x"), Step("b", node, inputs={"v": "$.state.a"}))
    flow("g", Step("a", node, as_="x"), Step("b", node, inputs={"v": "$.state.x"}))
    # After a spread, any key may exist: references are checked when the run reads them.
    flow("h", Step("a", node, spread=True), Step("b", node, inputs={"v": "$.state.anything"}))


# ---- state snapshots at a wait -------------------------------------------------------------
async def big(ctx) -> str:
    return "x" * 500


async def measure(ctx) -> int | None:
    value = ctx.state.get("big")
    return None if value is None else len(value)


def waiting_flow(**trigger: Any) -> Workflow:
    return flow("snap", Step("big", big), wait.for_("300ms"), Step("measure", measure), **trigger)


async def waiting_run(engine: Engine, job: str) -> Any:
    return await run_when(engine, job, RunStatus.WAITING)


async def test_above_the_cap_a_run_resuming_in_the_same_process_keeps_its_state(
    database: Path | None,
) -> None:
    async with Engine(workflows=[waiting_flow()], database=database, snapshot_cap=100) as engine:
        job = await engine.enqueue("snap", {})
        paused = await waiting_run(engine, job)
        assert "big" not in paused.state  # not saved...
        run = await engine.wait_for_job(job, timeout=10)
    assert run.status is RunStatus.COMPLETED
    assert run.output == 500  # ...but kept here
    assert any("above the 100-byte snapshot cap" in line.message for line in run.logs)


async def test_above_the_cap_a_run_resuming_after_a_restart_fails_naming_the_cap(
    tmp_path: Path,
) -> None:
    db = tmp_path / "blok.db"
    wf = waiting_flow(retries=1, delay=1)
    async with Engine(workflows=[wf], database=db, snapshot_cap=100) as engine:
        job = await engine.enqueue("snap", {})
        first = await waiting_run(engine, job)
    async with Engine(workflows=[wf], database=db, snapshot_cap=100) as engine:
        last = await engine.wait_for_job(job, timeout=10)
        failed = await engine.get_run(first.id)
    assert failed.status is RunStatus.FAILED
    assert "above the 100-byte snapshot cap (BLOK_STATE_SNAPSHOT_MAX_BYTES)" in (failed.error or "")
    # The job's retry runs from the start, in one process: it completes.
    assert (last.job_attempt, last.status, last.output) == (2, RunStatus.COMPLETED, 500)


async def test_with_snapshots_disabled_nothing_is_saved_and_a_restart_resumes_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLOK_STATE_SNAPSHOT_DISABLED", "1")
    db = tmp_path / "blok.db"
    async with Engine(workflows=[waiting_flow()], database=db) as engine:
        job = await engine.enqueue("snap", {})
        paused = await waiting_run(engine, job)
        assert "big" not in paused.state
        assert (await engine.wait_for_job(job, timeout=10)).output == 500  # same process
        job = await engine.enqueue("snap", {})
        paused = await waiting_run(engine, job)
    async with Engine(workflows=[waiting_flow()], database=db) as engine:
        run = await engine.wait_for_job(job, timeout=10)
    assert run.id == paused.id and run.status is RunStatus.COMPLETED
    assert run.output is None  # the seed's kill switch: resumed with an empty ctx.state
    assert any("BLOK_STATE_SNAPSHOT_DISABLED" in line.message for line in run.logs)
    # The Engine argument wins over the environment.
    async with Engine(workflows=[waiting_flow()], database=db, state_snapshots=True) as engine:
        job = await engine.enqueue("snap", {})
        assert (await waiting_run(engine, job)).state["big"] == "x" * 500


# ---- the operator switches ---------------------------------------------------------------------
def switch_env(monkeypatch: pytest.MonkeyPatch, name: str, how: str) -> dict[str, bool]:
    """`how`: "env" sets the seed's variable; "arg" sets it too, and the Engine argument turns
    the feature back on (the argument wins)."""
    monkeypatch.setenv(name, "1")
    return {} if how == "env" else {"on": True}


@pytest.mark.parametrize("how", ["env", "arg"])
async def test_blok_concurrency_disabled(
    database: Path | None, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    on = switch_env(monkeypatch, "BLOK_CONCURRENCY_DISABLED", how)
    running, release = [0], anyio.Event()
    peak = [0]

    async def hold(ctx) -> None:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await release.wait()
        running[0] -= 1

    wf = flow(
        "keyed",
        Step("hold", hold),
        concurrency=2,
        concurrency_key="$.body.k",
        concurrency_limit=1,
        on_limit="queue",
        limit_backoff="10ms",
    )
    args = {"concurrency_keys": True} if on else {}
    async with Engine(workflows=[wf], database=database, **args) as engine:
        jobs = [await engine.enqueue("keyed", {"k": "same"}) for _ in range(2)]
        if on:  # the key holds the second back, queued
            await until(lambda: running[0] == 1)

            async def held() -> bool:
                second = await engine.get_run((await engine.get_job(jobs[1])).run_id)
                return second.status is RunStatus.QUEUED and bool(second.logs)

            await until(held)
        else:
            await until(lambda: running[0] == 2)
        release.set()
        for job in jobs:
            assert (await engine.wait_for_job(job, timeout=10)).status is RunStatus.COMPLETED
    assert peak[0] == (1 if on else 2)


@pytest.mark.parametrize("how", ["env", "arg"])
async def test_blok_scheduling_disabled(
    database: Path | None, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    on = switch_env(monkeypatch, "BLOK_SCHEDULING_DISABLED", how)

    async def echo(ctx) -> Any:
        return ctx.body

    from engine import Debounce

    later = flow("later", Step("echo", echo), start_delay="1h")
    bursty = flow("bursty", Step("echo", echo), debounce=Debounce("$.body.k", delay="1h"))
    args = {"scheduling": True} if on else {}
    async with Engine(workflows=[later, bursty], database=database, **args) as engine:
        jobs = [await engine.enqueue("later", {"n": 1}), await engine.enqueue("bursty", {"k": 1})]
        if on:
            runs = [await engine.get_run((await engine.get_job(j)).run_id) for j in jobs]
            assert runs[0].status is RunStatus.DELAYED  # start_delay holds it an hour
            await until(
                lambda: engine.runs(queue="bursty", status="delayed"), timeout=10
            )  # the debounce window holds it
        else:
            for job in jobs:  # no start delay, no debounce window: both run at once
                run = await engine.wait_for_job(job, timeout=10)
                assert run.status is RunStatus.COMPLETED


@pytest.mark.parametrize("how", ["env", "arg"])
async def test_blok_janitor_disabled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    on = switch_env(monkeypatch, "BLOK_JANITOR_DISABLED", how)
    wf = flow("tidy", Step("n", lambda ctx: 1))
    args = {"janitor": True} if on else {}
    async with Engine(
        workflows=[wf],
        database=tmp_path / "blok.db",
        retention="1ms",
        janitor_interval=0.05,
        **args,
    ) as engine:
        run = await engine.wait_for_job(await engine.enqueue("tidy", {}), timeout=10)

        async def purged() -> bool:
            return not await engine.runs(queue="tidy")

        if on:
            await until(purged, timeout=5)
        else:
            # Ten janitor intervals: the run is still there.
            with anyio.move_on_after(0.5):
                await until(purged, timeout=5)
            assert [r.id for r in await engine.runs(queue="tidy")] == [run.id]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "crashy.py").write_text(WORKFLOW)
    (tmp_path / "worker.py").write_text(WORKER)
    return tmp_path


@pytest.mark.parametrize("how", ["env", "arg"])
async def test_blok_crash_autoflip_disabled(
    project: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    db = project / "blok.db"
    worker = start_worker(project)
    try:
        async with Engine(database=db, create=False) as client:
            await client.enqueue("crashy", {"n": 1, "seconds": 30})
            await wait_running(client, 1)
            [victim] = await client.runs(status="running")
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
    on = switch_env(monkeypatch, "BLOK_CRASH_AUTOFLIP_DISABLED", how)
    args = {"crash_recovery": True} if on else {}
    async with Engine(workflows=project / "workflows", database=db, **args) as engine:
        # Boot recovery ran (or not) before the engine was ready.
        found = await engine.get_run(victim.id)
        assert found.status is (RunStatus.CRASHED if on else RunStatus.RUNNING)
        await engine.shutdown(0)


# ---- sub-workflows without a trigger ---------------------------------------------------------
async def test_a_helper_workflow_without_a_trigger_runs_on_the_parents_queue(
    database: Path | None,
) -> None:
    async def double(ctx, n: int) -> int:
        return 2 * n

    helper = Workflow(
        name="helper.double", steps=[Step("double", double, inputs={"n": "$.body.n"})]
    )
    parent = flow(
        "parent",
        subworkflow("child", workflow="helper.double", input="$.body"),
        Step("add", lambda ctx: ctx.state["child"] + 1),
        concurrency=1,  # the parent waits without holding the slot the child needs
    )
    async with Engine(workflows=[parent, helper], database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("parent", {"n": 20}), timeout=10)
        assert run.status is RunStatus.COMPLETED, run.error
        assert run.output == 41
        child = await engine.get_run(run.step("child").child_run_id or "")
        assert (child.workflow_name, child.queue, child.output) == ("helper.double", "parent", 40)
        # A replay of the helper's run runs the helper again, not the queue's workflow.
        again = await engine.wait_for_job(
            (await engine.get_run(await engine.replay(child.id))).job_id, 10
        )
        assert (again.workflow_name, again.output) == ("helper.double", 40)


# ---- a wait at the end of a branch -------------------------------------------------------------
def ends_with_waits(name: str, pause: str) -> Workflow:
    async def square(ctx, n: int) -> int:
        return n * n

    return flow(
        name,
        for_each(
            "each",
            "$.body.items",
            steps=[Step("sq", square, inputs={"n": "$.state.each.item"}), wait.for_(pause)],
        ),
        switch(
            "route",
            on="$.body.kind",
            cases={"a": [Step("pick", lambda ctx: "A"), wait.for_(pause)]},
        ),
        wait.for_(pause),
    )


async def test_a_wait_at_the_end_of_a_branch_gives_the_same_output_paused_or_not(
    database: Path | None,
) -> None:
    flows = [ends_with_waits("quick", "0ms"), ends_with_waits("paused", "100ms")]
    async with Engine(workflows=flows, database=database) as engine:
        body = {"items": [1, 2, 3], "kind": "a"}
        quick = await engine.wait_for_job(await engine.enqueue("quick", body), timeout=10)
        paused = await engine.wait_for_job(await engine.enqueue("paused", body), timeout=10)
    assert any(
        s.wait_until and s.finished_at and s.finished_at > s.started_at for s in paused.steps
    )
    assert quick.status is paused.status is RunStatus.COMPLETED
    assert quick.step("each").output == paused.step("each").output == [1, 4, 9]
    assert quick.step("route").output == paused.step("route").output == "A"
    assert quick.output == paused.output == "A"


# ---- what the suite could not see ----------------------------------------------------------------
async def test_step_backoff_is_capped_by_max_timeout(database: Path | None) -> None:
    wf = flow(
        "capped",
        Step("call", broken, retry=Retry(4, min_timeout=20, factor=10, max_timeout=60)),
    )
    async with Engine(workflows=[wf], database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("capped", {}), timeout=10)
    attempts = run.step("call").attempts
    assert [a.backoff_ms for a in attempts] == [20, 60, 60, None]  # not 200, 2000
    for before, after in itertools.pairwise(attempts):
        gap = (after.started_at - before.finished_at).total_seconds() * 1000
        assert before.backoff_ms is not None
        assert before.backoff_ms * 0.9 <= gap < before.backoff_ms + 500
    assert (attempts[-1].started_at - attempts[0].started_at).total_seconds() < 1.5


def test_job_backoff_is_capped_at_30_seconds_with_up_to_10_percent_jitter() -> None:
    trigger = WorkerTrigger(queue="q", delay="20s")
    assert [trigger.backoff_ms(n, 0.0) for n in range(4)] == [20_000, 30_000, 30_000, 30_000]
    assert trigger.backoff_ms(5, 1.0) == 33_000
    assert WorkerTrigger(queue="q", delay="100ms").backoff_ms(2, 0.5) == 420


async def test_a_jobs_second_retry_waits_30_seconds_not_40(database: Path | None) -> None:
    wf = flow("slowly", Step("call", broken), retries=3, delay="20s")
    async with Engine(workflows=[wf], database=database) as engine:
        job = await engine.enqueue("slowly", {})

        async def next_run(after: str) -> Any:
            async def moved() -> bool:
                return (await engine.get_job(job)).run_id != after

            await until(moved)
            return await engine.get_run((await engine.get_job(job)).run_id)

        first = await engine.get_run((await engine.get_job(job)).run_id)
        second = await next_run(first.id)  # delayed about 20 s: started now by the operator
        failed = await engine.get_run(first.id)
        assert failed.finished_at and second.run_at
        assert 20 <= (second.run_at - failed.finished_at).total_seconds() <= 22.5
        await engine.retry_now(second.id)
        third = await next_run(second.id)
        failed = await engine.get_run(second.id)
        assert failed.finished_at and third.run_at
        assert 30 <= (third.run_at - failed.finished_at).total_seconds() <= 33.5  # not 40


async def test_idempotency_entries_expire_after_their_ttl(database: Path | None) -> None:
    calls: list[str] = []

    async def charge(ctx) -> str:
        calls.append(ctx.body["order"])
        return "charged"

    key = "$.body.order"
    short = flow("short", Step("charge", charge, idempotency_key=key, idempotency_ttl="300ms"))
    long = flow("long", Step("charge", charge, idempotency_key=key, idempotency_ttl="1h"))
    async with Engine(workflows=[short, long], database=database) as engine:
        first = await engine.wait_for_job(await engine.enqueue("short", {"order": "A"}), 10)
        cached_at = first.step("charge").finished_at
        assert cached_at is not None
        hits: list[Any] = []

        async def ran_again() -> bool:
            run = await engine.wait_for_job(await engine.enqueue("short", {"order": "A"}), 10)
            step = run.step("charge")
            if step.status is StepStatus.CACHED:
                hits.append(step.started_at)
                return False
            assert step.started_at is not None
            assert step.started_at >= cached_at + timedelta(milliseconds=300)  # not before
            return True

        await until(ran_again, timeout=10, every=0.05)  # ...but once the 300 ms are over
        assert hits and all(hit < cached_at + timedelta(milliseconds=300) for hit in hits)
        for _ in range(2):
            await engine.wait_for_job(await engine.enqueue("long", {"order": "B"}), 10)
    assert calls == ["A", "A", "B"]


async def test_the_step_after_a_wait_starts_no_earlier_than_its_deadline(
    database: Path | None,
) -> None:
    wf = flow(
        "patient", Step("before", lambda ctx: 1), wait.for_("250ms"), Step("after", lambda ctx: 2)
    )
    async with Engine(workflows=[wf], database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("patient", {}), timeout=10)
    waited = run.step("wait_2")
    after = run.step("after")
    assert waited.wait_until is not None and after.started_at is not None
    assert before_finished(run) + timedelta(milliseconds=250) <= waited.wait_until
    assert after.started_at >= waited.wait_until
    assert after.attempts[0].started_at >= waited.wait_until


def before_finished(run: Any) -> Any:
    finished = run.step("before").finished_at
    assert finished is not None
    return finished
