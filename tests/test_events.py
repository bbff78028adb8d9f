"""wait.for_event and send_event on memory, SQLite and PostgreSQL: delivered, sent before the
wait, timeout, across a restart with no worker alive, from another process (the CLI), by key,
and the errors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_helpers import blok
from support import DURABLE, a_database, any_database, job_run, run_when

from engine import (
    Engine,
    EngineError,
    EventOutcome,
    EventSent,
    RunStatus,
    Step,
    UnknownRun,
    WorkerTrigger,
    Workflow,
    WorkflowDefinitionError,
    wait,
)

pytestmark = pytest.mark.anyio


database = any_database  # the fixture: each of DATABASES in turn (tests/support.py)


@pytest.fixture(params=DURABLE)
async def durable(
    request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str
) -> AsyncIterator[Path | str]:
    """A database that outlives an engine, which other processes can open."""
    async with a_database(request.param, tmp_path) as location:
        assert location is not None
        yield location


def approval_flow(
    timeout: str = "30s", before: Callable[..., Any] | None = None, **trigger: Any
) -> Workflow:
    async def prepare(ctx: Any) -> str:
        if before is not None:
            await before()
        return "prepared"

    def ship(ctx: Any) -> dict[str, Any]:
        return {"approval": ctx.state["approval"], "prepare": ctx.state["prepare"]}

    return Workflow(
        name="orders.ship",
        trigger=WorkerTrigger(queue="ship", **{"concurrency": 4, **trigger}),
        steps=[
            Step("prepare", prepare),
            wait.for_event("approved", timeout=timeout, name="approval"),
            Step("ship", ship),
        ],
    )


async def waiting(engine: Engine, job_id: str) -> Any:
    return await run_when(engine, job_id, RunStatus.WAITING)


async def test_the_event_is_the_output_of_the_wait(database: Path | str | None) -> None:
    async with Engine(workflows=[approval_flow()], database=database) as engine:
        job_id = await engine.enqueue("ship", {"order": 1})
        run = await waiting(engine, job_id)
        why = await engine.why_waiting(run.id)
        assert (why.gate, why.event) == ("event", "approved") and why.until is not None
        assert "waiting for event 'approved'" in why.summary
        assert await engine.send_event(run.id, "approved", {"by": "ann"}) == [run.id]
        done = await engine.wait_for_job(job_id, timeout=10)
        assert done.status is RunStatus.COMPLETED
        assert done.output == {"approval": {"by": "ann"}, "prepare": "prepared"}
        assert done.step("approval").output == {"by": "ann"}
        assert done.id == run.id  # the same run went on: no new delivery


async def test_an_event_sent_before_the_wait_is_kept(database: Path | str | None) -> None:
    go = anyio.Event()
    async with Engine(workflows=[approval_flow(before=go.wait)], database=database) as engine:
        job_id = await engine.enqueue("ship", {})
        run = await run_when(engine, job_id, RunStatus.RUNNING)  # held before its wait
        await engine.send_event(run.id, "approved", "early")
        assert [(m.event, m.taken_by) for m in await engine.events_of(run.id)] == [
            ("approved", None)
        ]
        go.set()
        with anyio.fail_after(5):  # far sooner than the wait's 30 s timeout
            done = await engine.wait_for_job(job_id)
        assert done.output["approval"] == "early"
        assert [m.taken_by for m in await engine.events_of(run.id)] == ["1:approval"]


async def test_the_timeout_gives_none_and_the_run_goes_on(database: Path | str | None) -> None:
    async with Engine(workflows=[approval_flow(timeout="300ms")], database=database) as engine:
        job_id = await engine.enqueue("ship", {})
        done = await engine.wait_for_job(job_id, timeout=10)
        assert done.status is RunStatus.COMPLETED
        assert done.output == {"approval": None, "prepare": "prepared"}
        # A late event is refused: the run has ended.
        with pytest.raises(EngineError, match="already ended"):
            await engine.send_event(done.id, "approved", 1)


async def test_waiting_runs_hold_no_worker_slot(database: Path | str | None) -> None:
    async with Engine(workflows=[approval_flow(concurrency=1)], database=database) as engine:
        jobs = [await engine.enqueue("ship", {"n": n}) for n in range(3)]
        runs = [await waiting(engine, job_id) for job_id in jobs]  # all three parked at once
        for run in runs:
            await engine.send_event(run.id, "approved", run.id)
        for job_id, run in zip(jobs, runs, strict=True):
            assert (await engine.wait_for_job(job_id, timeout=10)).output["approval"] == run.id


async def test_unknown_and_finished_runs_are_refused(database: Path | str | None) -> None:
    async with Engine(workflows=[approval_flow(timeout="10ms")], database=database) as engine:
        with pytest.raises(UnknownRun, match="unknown run 'run_nope'"):
            await engine.send_event("run_nope", "approved", 1)
        with pytest.raises(EngineError, match="event name"):
            await engine.send_event("run_nope", "", 1)
        # One line, matched exactly: no line break, escape or space at an end.
        for name, why in (
            ("evil\n\x1b[31mred", "holds a control character (U+000A)"),
            ("a\u200bb", "holds a control character (U+200B)"),
            (" approved", "starts or ends with whitespace"),
        ):
            with pytest.raises(EngineError) as raised:
                await engine.send_event("run_nope", name, 1)
            assert str(raised.value) == f"event name {name!r} {why}"
        done = await engine.wait_for_job(await engine.enqueue("ship", {}), timeout=10)
        with pytest.raises(EngineError, match=f"run {done.id} has already ended"):
            await engine.send_event(done.id, "approved", 1)


async def test_an_event_nobody_waits_for_stays_with_the_run(database: Path | str | None) -> None:
    async with Engine(workflows=[approval_flow()], database=database) as engine:
        job_id = await engine.enqueue("ship", {})
        run = await waiting(engine, job_id)
        await engine.send_event(run.id, "refunded", {"why": "typo"})
        assert (await job_run(engine, job_id)).status is RunStatus.WAITING
        box = await engine.events_of(run.id)
        assert [(m.event, m.payload, m.taken_by) for m in box] == [
            ("refunded", {"why": "typo"}, None)
        ]
        await engine.cancel(run.id)


def told(reached: EventSent) -> EventSent:
    """What `send_event` returned: a list of run ids, and what became of the event."""
    assert isinstance(reached, list)  # as it always was
    return reached


async def test_the_sender_is_told_whether_a_wait_took_the_event_or_it_was_kept(
    database: Path | str | None,
) -> None:
    go = anyio.Event()
    async with Engine(workflows=[approval_flow(before=go.wait)], database=database) as engine:
        job_id = await engine.enqueue("ship", {})
        run = await run_when(engine, job_id, RunStatus.RUNNING)  # held before its wait
        # Before the run reaches its wait: kept for it, and its workflow does wait for it.
        early = told(await engine.send_event(run.id, "approved", "early"))
        assert early == [run.id]
        assert (early.outcome, early.waits_for, early.run_status) == (
            EventOutcome.KEPT,
            (),
            RunStatus.RUNNING,
        )
        assert (early.workflow, early.workflow_events, early.awaited) == (
            "orders.ship",
            ("approved",),
            True,
        )
        go.set()
        assert (await engine.wait_for_job(job_id, timeout=10)).output["approval"] == "early"

        second = await engine.enqueue("ship", {})
        parked = await waiting(engine, second)
        # A name no wait of the workflow has: kept all the same (the contract), and said so.
        typo = told(await engine.send_event(parked.id, "aproved", {}))
        assert typo == [parked.id]
        assert (typo.outcome, typo.waits_for, typo.awaited) == (
            EventOutcome.KEPT,
            ("approved",),
            False,
        )
        # Paused, the queue resumes nothing: both events reach the run before it takes one.
        await engine.pause("ship")
        taken = told(await engine.send_event(parked.id, "approved", "late"))
        assert taken == [parked.id]
        assert (taken.outcome, taken.awaited) == (EventOutcome.DELIVERED, True)
        # The wait takes the first: a second is kept (it was said delivered, and never taken).
        again = told(await engine.send_event(parked.id, "approved", "later"))
        assert (again.outcome, again.waits_for) == (EventOutcome.KEPT, ("approved",))
        await engine.resume("ship")
        assert (await engine.wait_for_job(second, timeout=10)).output["approval"] == "late"


def keyed_flow() -> Workflow:
    return Workflow(
        name="orders.pay",
        trigger=WorkerTrigger(queue="pay", concurrency=4),
        steps=[wait.for_event("paid", timeout="30s", match="$.body.order_id", name="payment")],
    )


async def test_delivery_by_key_wakes_the_runs_waiting_on_it(database: Path | str | None) -> None:
    async with Engine(workflows=[keyed_flow()], database=database) as engine:
        a1 = await engine.enqueue("pay", {"order_id": "A1"})
        b2 = await engine.enqueue("pay", {"order_id": "B2"})
        run_a1, run_b2 = await waiting(engine, a1), await waiting(engine, b2)
        assert (await engine.why_waiting(run_a1.id)).key == "A1"
        reached = await engine.send_event(None, "paid", {"order_id": "A1", "amount": 5})
        assert reached == [run_a1.id]
        done = await engine.wait_for_job(a1, timeout=10)
        assert done.output == {"order_id": "A1", "amount": 5}
        assert (await engine.get_run(run_b2.id)).status is RunStatus.WAITING
        # Sent by key before anyone waits on it: kept for the first run that does.
        assert await engine.send_event(None, "paid", {"order_id": "C3"}) == []
        c3 = await engine.enqueue("pay", {"order_id": "C3"})
        with anyio.fail_after(5):
            assert (await engine.wait_for_job(c3)).output == {"order_id": "C3"}
        await engine.cancel(run_b2.id)


def test_a_match_must_be_a_body_path() -> None:
    with pytest.raises(WorkflowDefinitionError, match=r"match must be a \$\.body"):
        wait.for_event("paid", match="$.state.x")
    with pytest.raises(WorkflowDefinitionError, match="timeout"):
        wait.for_event("paid", timeout="soon")


FLOW_FILE = """
from engine import Step, WorkerTrigger, Workflow, wait


def ship(ctx):
    return ctx.state["approval"]


workflow = Workflow(
    name="orders.ship",
    trigger=WorkerTrigger(queue="ship"),
    steps=[wait.for_event("approved", timeout="1h", name="approval"), Step("ship", ship)],
)
"""


async def test_an_event_sent_with_no_worker_alive_is_delivered_when_one_comes_back(
    tmp_path: Path, durable: Path | str
) -> None:
    database = durable
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "ship.py").write_text(FLOW_FILE)
    async with Engine(workflows=flows, database=database) as engine:
        job_id = await engine.enqueue("ship", {})
        run = await waiting(engine, job_id)
    # No worker runs now: a client engine (no workflows, another connection) sends it.
    async with Engine(database=database, create=False) as client:
        assert await client.send_event(run.id, "approved", {"ok": True}) == [run.id]
        assert (await client.get_run(run.id)).status is RunStatus.WAITING
    async with Engine(workflows=flows, database=database) as engine:
        with anyio.fail_after(10):  # not the wait's hour
            done = await engine.wait_for_job(job_id)
        assert done.output == {"ok": True}


async def test_an_event_from_the_command_line_reaches_the_worker(durable: Path | str) -> None:
    database = durable
    async with Engine(workflows=[approval_flow(timeout="1h")], database=database) as engine:
        job_id = await engine.enqueue("ship", {})
        run = await waiting(engine, job_id)
        sent = await anyio.to_thread.run_sync(
            lambda: blok("send", run.id, "approved", '{"by": "cli"}', "--db", database)
        )
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout.strip() == f"{run.id} approved sent"
        with anyio.fail_after(10):
            done = await engine.wait_for_job(job_id)
        assert done.output["approval"] == {"by": "cli"}
        refused = await anyio.to_thread.run_sync(
            lambda: blok("send", run.id, "approved", "1", "--db", database)
        )
        assert refused.returncode == 1
        assert "has already ended" in refused.stderr and "Traceback" not in refused.stderr
        usage = await anyio.to_thread.run_sync(lambda: blok("send", run.id, "--db", database))
        assert usage.returncode == 2 and "RUN_ID EVENT JSON" in usage.stderr


async def test_the_command_line_says_an_event_no_wait_took_was_kept(durable: Path | str) -> None:
    database = durable
    async with Engine(workflows=[approval_flow(timeout="1h")], database=database) as engine:
        run = await waiting(engine, await engine.enqueue("ship", {}))
        await engine.flush()  # what the worker serves is in the database for the command
        sent = await anyio.to_thread.run_sync(
            lambda: blok("send", run.id, "wrongevent", "{}", "--db", database)
        )
        assert sent.returncode == 0, sent.stderr
        assert sent.stdout.strip() == (
            f"{run.id} wrongevent kept: the run waits for 'approved' now; it will get "
            "'wrongevent' if it waits for it later"
        )
        assert sent.stderr.strip() == (
            "blok-tui: warning: workflow 'orders.ship' has no wait.for_event('wrongevent'): "
            "no step of it takes this event (the events it waits for: 'approved')"
        )
        await engine.cancel(run.id)


async def test_an_event_sent_by_key_that_no_wait_matches_on_a_key_is_said_to_reach_none(
    database: Path | str | None,
) -> None:
    # `send --by-key approved {...}` where the waits for 'approved' take it sent to their run:
    # "no run waits on that key: kept", and it was kept for a run that never comes.
    from blok_tui.run_text import keyless

    async with Engine(workflows=[approval_flow(), keyed_flow()], database=database) as engine:
        await engine.flush()  # the catalog the engine reads its waits from
        unkeyed = await engine.send_event(None, "approved", {"order_id": "A1"})
        assert (list(unkeyed), unkeyed.unkeyed) == ([], True)
        assert keyless(unkeyed) == (
            "no wait.for_event('approved') here matches on a key (match=): kept, it reaches no "
            "run; send it to the run instead (blok-tui send RUN_ID approved JSON)"
        )
        keyed = await engine.send_event(None, "paid", {"order_id": "A1"})
        assert (keyed.unkeyed, keyless(keyed)) == (False, None)
        nobody = await engine.send_event(None, "refunded", {})  # never_awaited says that one
        assert (nobody.unkeyed, keyless(nobody)) == (False, None)


def test_the_cli_sends_by_key(tmp_path: Path) -> None:
    database = tmp_path / "key.db"
    code = f"""
import anyio
from engine import Engine
from test_events import keyed_flow

async def main():
    async with Engine(workflows=[keyed_flow()], database={str(database)!r}):
        pass

anyio.run(main)
"""
    made = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    kept = blok("send", "--by-key", "paid", '{"order_id": "Z9"}', "--db", database)
    assert kept.returncode == 0, kept.stderr
    assert "no run waits on that key" in kept.stdout
    assert kept.stderr == ""
    # A typo in its name was kept for good, without a word (a run-directed send warned).
    typo = blok("send", "--by-key", "piad", '{"order_id": "Z9"}', "--db", database)
    assert typo.returncode == 0 and "no run waits on that key" in typo.stdout
    assert typo.stderr == (
        "blok-tui: warning: no workflow on this database has a wait.for_event('piad'): it is "
        "kept for a run that never comes (the events they wait for: 'paid')\n"
    )
    # A payload without the key the waits match on: kept for ever too, and nothing said.
    unkeyed = blok("send", "--by-key", "paid", '{"orderId": "Z9"}', "--db", database)
    assert unkeyed.returncode == 0 and "no run waits on that key" in unkeyed.stdout
    assert unkeyed.stderr == (
        "blok-tui: warning: the payload has no 'order_id', which the waits for 'paid' match "
        "on: it is kept for a run that never comes\n"
    )
    # null: the wait's output, None, reads as its timeout.
    null = blok("send", "--by-key", "paid", "null", "--db", database)
    assert null.returncode == 0 and null.stderr.endswith(
        "blok-tui: warning: a null payload reads as a timeout to the wait (its output is None "
        "both ways)\n"
    ), null.stderr


async def test_a_producer_engine_reaches_a_worker_process(tmp_path: Path) -> None:
    from cli_helpers import start_worker

    database = tmp_path / "worker.db"
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "ship.py").write_text(FLOW_FILE)
    worker = await anyio.to_thread.run_sync(lambda: start_worker(database, flows))
    try:
        async with Engine(database=database, create=False) as producer:
            job_id = await producer.enqueue("ship", {})
            run = await waiting(producer, job_id)
            assert run.worker == worker.id
            assert await producer.send_event(run.id, "approved", {"from": "producer"}) == [run.id]
            with anyio.fail_after(10):  # not the wait's hour
                done = await producer.wait_for_job(job_id)
            assert done.output == {"from": "producer"}
            assert done.worker == worker.id
    finally:
        assert await anyio.to_thread.run_sync(worker.stop) == 0


def test_a_missing_key_is_read_as_a_delivery_reads_it() -> None:
    # The by-key warning walked the payload on its own and knew no list index: a key the
    # payload carried at "items.0.id" was said missing.
    from engine.mailbox import _missing_keys
    from engine.models import WorkflowInfo

    declared = [
        WorkflowInfo(
            name="w",
            version="1",
            queue="q",
            path=None,
            steps=[],
            event_keys={"paid": ["items.0.id"]},
        )
    ]
    assert _missing_keys("paid", {"items": [{"id": "A1"}]}, declared) == ()
    assert _missing_keys("paid", {"items": []}, declared) == ("items.0.id",)
    assert _missing_keys("paid", {"items": [{"id": None}]}, declared) == ("items.0.id",)
    assert _missing_keys("other", {}, declared) == ()  # nothing known of its keys
