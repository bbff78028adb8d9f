"""What the console asks of the engine: text search (job id, input), replays of a run, the
`$.body` fields a workflow reads, and exception names as the user wrote them."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pg import NO_DRIVER, fresh_database

from engine import (
    Engine,
    RunFilter,
    Step,
    WorkerTrigger,
    Workflow,
    for_each,
    subworkflow,
    wait,
)
from engine.workflow import Debounce

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    return None if request.param == "memory" else tmp_path / "blok.db"


async def echo(ctx, **inputs) -> object:
    return ctx.body


ECHO = Workflow(name="echo", trigger=WorkerTrigger(queue="echo"), steps=[Step("echo", echo)])


async def test_text_matches_the_job_id_and_the_input_alike_in_every_store(
    database: Path | None,
) -> None:
    async with Engine(workflows=[ECHO], database=database) as engine:
        ann = await engine.enqueue("echo", {"customer": "Ann Lee", "note": "100%_sure"})
        bob = await engine.enqueue("echo", {"customer": "bob"}, job_id="order-7731")
        for job in (ann, bob):
            await engine.wait_for_job(job, timeout=10)

        async def found(text: str) -> list[str]:
            runs = await engine.runs(text=text)
            counted = await engine.count_runs(RunFilter.of(text=text))
            assert counted == len(runs)
            return sorted(run.job_id for run in runs)

        assert await found("order-77") == [bob]  # the job id
        assert await found("ann lee") == [ann]  # the input, case-blind
        assert await found("100%_") == [ann]  # % and _ are themselves, not wildcards
        assert await found("1%0") == []
        assert await found("b_b") == []
        assert await found("echo") == sorted([ann, bob])
        # Text the input holds beyond ASCII: stored as JSON, escaped ("\\u6ce8"), it was not
        # found once the console searched through the engine rather than by itself.
        kana = await engine.enqueue("echo", {"customer": "注文太郎", "quote": 'say "hi"'})
        await engine.wait_for_job(kana, timeout=10)
        assert await found("注文") == [kana]
        assert await found('say "hi"') == [kana]


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    pytest.importorskip("asyncpg", reason=NO_DRIVER)
    async with fresh_database() as url:
        yield url


async def test_text_beyond_ascii_is_found_in_the_input_on_postgresql(postgres_url: str) -> None:
    async with Engine(workflows=[ECHO], database=postgres_url) as engine:
        kana = await engine.enqueue("echo", {"customer": "注文太郎"})
        await engine.wait_for_job(kana, timeout=10)
        assert [run.job_id for run in await engine.runs(text="注文")] == [kana]
        assert await engine.count_runs(RunFilter.of(text="注文")) == 1


async def test_runs_filter_replays_of_a_run(database: Path | None) -> None:
    async with Engine(workflows=[ECHO], database=database) as engine:
        source = await engine.wait_for_job(await engine.enqueue("echo", {"n": 1}), 10)
        other = await engine.wait_for_job(await engine.enqueue("echo", {"n": 2}), 10)
        replays = {await engine.replay(source.id) for _ in range(2)}
        await engine.replay(other.id)
        assert {run.id for run in await engine.runs(replay_of=source.id)} == replays
        assert await engine.count_runs(RunFilter.of(replay_of=source.id)) == 2
        assert await engine.runs(replay_of="run_none") == []


async def test_workflow_info_lists_the_body_fields_its_steps_read(
    database: Path | None,
) -> None:
    async def node(ctx, **inputs: object) -> None:
        return None

    wf = Workflow(
        name="orders",
        trigger=WorkerTrigger(queue="orders", debounce=Debounce("$.body.customer.id")),
        steps=[
            Step("charge", node, inputs={"id": "$.body.order_id", "n": "$.body.amount"}),
            for_each(
                "lines",
                "$.body.lines",
                steps=[Step("line", node, inputs={"x": "$.state.lines.item"})],
            ),
            wait.until("$.body.ship_at"),
            Step("again", node, inputs={"id": "$.body.order_id"}, idempotency_key="$.body.key"),
            subworkflow("child", workflow="orders", input="$.body.child"),
        ],
    )
    async with Engine(workflows=[wf], database=database) as engine:
        [info] = await engine.workflows()
    assert info.body_fields == [
        "order_id",
        "amount",
        "lines",
        "ship_at",
        "key",
        "child",
        "customer.id",
    ]


async def test_a_client_sees_the_body_fields_workers_declared(tmp_path: Path) -> None:
    db = tmp_path / "blok.db"
    wf = Workflow(
        name="greet",
        trigger=WorkerTrigger(queue="greet"),
        steps=[Step("hi", echo, inputs={"who": "$.body.name"})],
    )
    async with Engine(workflows=[wf], database=db) as worker:
        await worker.flush()
        async with Engine(database=db, create=False) as client:
            [info] = await client.workflows()
    assert info.body_fields == ["name"]


async def test_exception_names_are_recorded_without_the_loaders_module_prefix(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "cards.py").write_text(
        textwrap.dedent(
            """
            from engine import Step, WorkerTrigger, Workflow

            class CardDeclined(Exception):
                pass

            async def charge(ctx):
                try:
                    raise CardDeclined("insufficient funds")
                except CardDeclined:
                    ctx.logger.exception("charging failed")
                    raise

            workflow = Workflow(
                name="cards", trigger=WorkerTrigger(queue="cards"), steps=[Step("charge", charge)]
            )
            """
        )
    )
    async with Engine(workflows=folder, database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("cards", {}), timeout=10)
    attempt = run.step("charge").attempts[0]
    assert attempt.error_type == "CardDeclined"
    assert attempt.traceback is not None
    assert "\nCardDeclined: insufficient funds" in attempt.traceback
    assert "blok_workflows" not in attempt.traceback
    [logged] = [line.message for line in run.step("charge").logs]
    assert "\nCardDeclined: insufficient funds" in logged and "blok_workflows" not in logged
