"""Schedules on memory, SQLite and PostgreSQL: one job per tick however many engines serve the
database, catch-up policies after a restart, hot reload, pause/resume/run now (API and CLI),
definition errors, BLOK_SCHEDULING_DISABLED."""

from __future__ import annotations

import itertools
import logging
import math
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, closing
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_helpers import blok, blok_json
from support import DURABLE, a_database, until

from engine import (
    Engine,
    RunStatus,
    Schedule,
    Step,
    WorkerTrigger,
    Workflow,
    WorkflowDefinitionError,
    scheduler,
)
from engine.reload import wait_until_watching

pytestmark = pytest.mark.anyio

DAY_S = 86_400.0


@pytest.fixture(params=DURABLE)
async def database(
    request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str
) -> AsyncIterator[Path | str]:
    """A database that outlives an engine, which several engines (processes) share."""
    async with a_database(request.param, tmp_path) as location:
        assert location is not None
        yield location


def ticking(*schedules: Schedule, name: str = "reports.daily") -> Workflow:
    def report(ctx: Any) -> Any:
        return ctx.body

    return Workflow(
        name=name,
        trigger=WorkerTrigger(queue=name, concurrency=8),
        schedules=list(schedules),
        steps=[Step("report", report)],
    )


async def ticks_of(engine: Engine, workflow: str) -> list[float]:
    runs = await engine.runs(workflow=workflow, limit=10_000)
    return sorted([float((await engine.get_job(r.job_id)).meta["tick"]) for r in runs])


async def test_every_second_on_two_engines_fires_once_per_tick(database: Path | str) -> None:
    wf = ticking(Schedule(every="1s", payload={"kind": "tick"}))
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(Engine(workflows=[wf], database=database))
        await stack.enter_async_context(Engine(workflows=[wf], database=database))
        [info] = await first.schedules()
        assert info.overruled == ()  # the same file on both: nothing to say

        async def five_ticks() -> bool:
            return len(await first.runs(workflow=wf.name, limit=100)) >= 5

        await until(five_ticks, timeout=15)
        ticks = await ticks_of(first, wf.name)
    assert len(ticks) == len(set(ticks)), f"a tick fired twice: {ticks}"
    # On the schedule's one-second grid. A tick the engines came to late (a machine busy for
    # seconds) fires once for the span it missed, as catch_up="latest" says: a wider step,
    # still whole seconds.
    steps = [b - a for a, b in itertools.pairwise(ticks)]
    assert steps and all(step >= 1.0 and step == int(step) for step in steps), ticks
    async with Engine(database=database, create=False) as client:
        runs = await client.runs(workflow=wf.name, limit=100)
        assert runs and all(run.input == {"kind": "tick"} for run in runs)
        [info] = await client.schedules()
        assert info.schedule == "every 1s" and info.last_run_id in {run.id for run in runs}


async def test_a_worker_whose_schedules_another_version_replaced_says_so_and_fires_those(
    database: Path | str, caplog: pytest.LogCaptureFixture
) -> None:
    """A mixed fleet: two workers with two versions of one workflow's file, declaring its
    schedule differently. The one declared last is what fires, and the other worker says so
    in its log, once; once the worker that declared it is gone, the other fires it."""
    caplog.set_level(logging.WARNING, logger="blok.scheduler")
    old, new = ticking(Schedule(every="1h")), ticking(Schedule(every="1s"))

    def overruled() -> list[str]:
        return [r.getMessage() for r in caplog.records if "another worker declared" in r.message]

    async with Engine(workflows=[old], database=database) as first:
        async with Engine(workflows=[new], database=database) as second:
            await until(lambda: overruled(), timeout=15)
            [info] = await first.schedules()
            assert info.schedule == "every 1s"
            # What an operator reads: which live workers' own schedules are not those firing.
            assert info.overruled == (first.worker.id,)
            listed = await anyio.to_thread.run_sync(
                lambda: blok("schedules", "--db", str(database))
            )
            assert listed.returncode == 0, listed.stderr
            said = (
                f"worker {first.worker.id} declares other schedules for {old.name} (another"
                " version of its file): those declared last fire"
            )
            assert f"blok-tui: note: {said}; deploy the same file to every worker" in (
                listed.stderr
            )
            assert second.worker.id not in listed.stderr
            # What a monitor reads: healthy, the mixed fleet named.
            health = await first.health()
            assert health.ok and health.schedules_overruled == {old.name: (first.worker.id,)}
            assert f"; {said} (blok-tui schedules)" in health.reason
        gone_at = time.time()

        async def fired_since() -> bool:
            runs = await first.runs(workflow=old.name, limit=100)
            return any(r.created_at.timestamp() > gone_at + 1 for r in runs)

        await until(fired_since, timeout=15)
    assert overruled() == [
        f"schedules of {old.name}: this worker declares 'every 1h', but another worker declared"
        " 'every 1s' since (another version of the workflow's file), and those fire; deploy"
        " the same file to every worker (blok-tui schedules lists what fires)"
    ]


async def test_a_version_with_no_schedules_declared_last_is_said_to_leave_none_firing(
    database: Path | str, caplog: pytest.LogCaptureFixture
) -> None:
    """A mixed fleet where the version of the file declared last has no schedules for the
    workflow: none fire, so `schedules` lists nothing of it; the worker whose file declares
    some is named there all the same, by `health`, and in its own log."""
    caplog.set_level(logging.WARNING, logger="blok.scheduler")
    old, new = ticking(Schedule(every="1h")), ticking()
    async with (
        Engine(workflows=[old], database=database) as first,
        Engine(workflows=[new], database=database) as second,
    ):
        assert await first.schedules() == []
        assert await second.overruled_schedules() == {old.name: (first.worker.id,)}
        said = (
            f"worker {first.worker.id} declares schedules for {old.name}, which another version"
            " of its file, declared last, has none of: none fire"
        )
        health = await second.health()
        assert health.ok and f"; {said} (blok-tui schedules)" in health.reason
        listed = await anyio.to_thread.run_sync(lambda: blok("schedules", "--db", str(database)))
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.strip() == "no schedules"
        assert f"blok-tui: note: {said}; deploy the same file to every worker" in listed.stderr
        logged = (
            f"schedules of {old.name}: this worker declares 'every 1h', but another worker"
            " declared none since (another version of the workflow's file), so none fire;"
        )
        await until(lambda: any(logged in r.getMessage() for r in caplog.records), timeout=15)
    async with Engine(workflows=[old], database=database) as alone:
        assert await alone.overruled_schedules() == {}  # one file: nothing to say
        [info] = await alone.schedules()
        assert info.schedule == "every 1h"


async def test_every_second_on_memory_fires_each_tick(tmp_path: Path) -> None:
    wf = ticking(Schedule(every="1s"))
    async with Engine(workflows=[wf]) as engine:

        async def three() -> bool:
            return len(await engine.runs(workflow=wf.name)) >= 3

        await until(three, timeout=10)
        ticks = await ticks_of(engine, wf.name)
        assert [b - a for a, b in itertools.pairwise(ticks)] == [1.0] * (len(ticks) - 1)
        [info] = await engine.schedules()
        assert info.next_at is not None and info.next_at.timestamp() > ticks[-1]
        assert info.last_status in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.COMPLETED)


async def rewind(database: Path | str, days: int) -> None:
    """Downtime, as the database sees it: the schedule's last tick `days` ticks ago."""
    if isinstance(database, Path):
        with closing(sqlite3.connect(database)) as conn, conn:
            conn.execute("UPDATE schedules SET last_tick = last_tick - ?", (days * DAY_S,))
        return
    import asyncpg

    conn = await asyncpg.connect(database)
    try:
        await conn.execute("UPDATE blok.schedules SET last_tick = last_tick - $1", days * DAY_S)
    finally:
        await conn.close()


@pytest.mark.parametrize(("catch_up", "expected"), [("latest", 1), ("all", 5), ("none", 0)])
async def test_catch_up_after_a_restart(database: Path | str, catch_up: str, expected: int) -> None:
    wf = ticking(Schedule(every="1d", catch_up=catch_up))
    async with Engine(workflows=[wf], database=database) as engine:
        await until(lambda: engine.schedules())  # declared
        assert await engine.runs(workflow=wf.name) == []  # no tick before it existed
    await rewind(database, 5)
    newest = math.floor(time.time() / DAY_S) * DAY_S
    async with Engine(workflows=[wf], database=database) as engine:

        async def caught_up() -> bool:
            [info] = await engine.schedules()
            return info.last_tick_at is not None and info.last_tick_at.timestamp() == newest

        await until(caught_up)
        ticks = await ticks_of(engine, wf.name)
    assert len(ticks) == expected
    if catch_up == "all":
        assert ticks == [newest - n * DAY_S for n in range(4, -1, -1)]
    if catch_up == "latest":
        assert ticks == [newest]


async def test_a_cron_schedule_in_its_time_zone(database: Path | str) -> None:
    wf = ticking(Schedule(cron="30 2 * * *", timezone="Asia/Kolkata"))
    async with Engine(workflows=[wf], database=database) as engine:
        await until(lambda: engine.schedules())
        [info] = await engine.schedules()
        assert info.schedule == "cron 30 2 * * * Asia/Kolkata"
        assert info.next_at is not None
        local = info.next_at.astimezone(__import__("zoneinfo").ZoneInfo("Asia/Kolkata"))
        assert (local.hour, local.minute, local.second) == (2, 30, 0)
        assert 0 < info.next_at.timestamp() - time.time() <= DAY_S


async def test_pause_resume_and_run_now(database: Path | str) -> None:
    wf = ticking(Schedule(every="1d", payload={"now": True}))
    async with Engine(workflows=[wf], database=database) as engine:
        await until(lambda: engine.schedules())
        assert await engine.pause_schedule(wf.name) == "every 1d"
        [info] = await engine.schedules()
        assert info.paused and info.next_at is None
        run_id = await engine.run_schedule(wf.name, "every 1d")  # a pause does not stop it
        done = await engine.wait_for_job((await engine.get_run(run_id)).job_id, timeout=10)
        assert done.output == {"now": True}
        [info] = await engine.schedules()
        assert info.last_run_id == run_id and info.last_status is RunStatus.COMPLETED
        await engine.resume_schedule(wf.name)
        [info] = await engine.schedules()
        assert not info.paused and info.next_at is not None
        with pytest.raises(Exception, match="has no schedule 'every 2d'"):
            await engine.pause_schedule(wf.name, "every 2d")
        with pytest.raises(Exception, match="has no schedules"):
            await engine.pause_schedule("nope")


async def test_the_cli_lists_pauses_and_runs_schedules(database: Path | str) -> None:
    wf = ticking(Schedule(every="1d"), Schedule(every="2d"))
    async with Engine(workflows=[wf], database=database) as engine:
        await until(lambda: engine.schedules())
        await engine.flush()

        def cli(*args: str) -> Any:
            return anyio.to_thread.run_sync(lambda: blok(*args, "--db", str(database)))

        listed = await anyio.to_thread.run_sync(
            lambda: blok_json("schedules", "--json", "--db", database)
        )
        assert [s["schedule"] for s in listed] == ["every 1d", "every 2d"]
        table = await cli("schedules")
        assert table.returncode == 0 and "every 2d" in table.stdout and "active" in table.stdout
        assert table.stderr == ""  # a worker is alive: this engine
        # NEXT in this machine's time, its zone named (a cron's own is in SCHEDULE).
        next_at = datetime.fromisoformat(listed[0]["next_at"]).astimezone()
        assert next_at.strftime("%Y-%m-%d %H:%M:%S %Z") in table.stdout, table.stdout
        ambiguous = await cli("schedules", "pause", wf.name)
        # The command again with one named, quoted: "name one" did not say where, or how.
        assert ambiguous.returncode == 1 and ambiguous.stderr == (
            f"blok-tui: error: workflow {wf.name!r} has 2 schedules; name one after it: "
            f"blok-tui schedules pause {wf.name} 'every 2d' (its schedules: 'every 1d', "
            "'every 2d')\n"
        )
        paused = await cli("schedules", "pause", wf.name, "every 2d")
        assert paused.returncode == 0, paused.stderr
        assert [s.paused for s in await engine.schedules()] == [False, True]
        ran = await cli("schedules", "run", wf.name, "every 1d")
        assert ran.returncode == 0, ran.stderr
        run_id = ran.stdout.strip()
        assert (await engine.wait_for_job((await engine.get_run(run_id)).job_id, 10)).status is (
            RunStatus.COMPLETED
        )
    # No worker alive now: the list says nothing fires, as NEXT comes and goes.
    idle = await anyio.to_thread.run_sync(lambda: blok("schedules", "--db", str(database)))
    assert idle.returncode == 0 and "every 2d" in idle.stdout
    assert idle.stderr == (
        "blok-tui: note: no schedule fires until a worker starts (blok-tui worker)\n"
    )
    # A worker alive that does not serve the workflow (its file failed to load there): the
    # list said "active" with a NEXT that came and went, and nothing fired.
    async with Engine(workflows=[ticking(name="other")], database=database) as other:
        await until(lambda: other.schedules())
        await other.flush()
        unserved = {i.workflow: i.served for i in await other.schedules()}
        assert unserved == {wf.name: False}
        listed = await anyio.to_thread.run_sync(lambda: blok("schedules", "--db", str(database)))
    row = next(line for line in listed.stdout.splitlines() if "every 1d" in line)
    assert row.split()[3:6] == ["reports.daily", "not", "served"], row
    assert listed.stderr == (
        "blok-tui: note: no live worker serves reports.daily: its ticks are not fired "
        "(blok-tui health names the workflow files that fail to load)\n"
    )


FILE = """
from engine import Schedule, Step, WorkerTrigger, Workflow


def report(ctx):
    return 1


workflow = Workflow(
    name="reports.hourly",
    trigger=WorkerTrigger(queue="hourly"),
    schedules=[{schedules}],
    steps=[Step("report", report)],
)
"""


async def test_hot_reload_adds_changes_and_removes_schedules(
    tmp_path: Path, database: Path | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each change of the file wakes the scheduler, not its next turn (the second change once
    # woke nothing: the scheduler listened to the event it had replaced after the first).
    monkeypatch.setattr(scheduler, "POLL_S", DAY_S)
    flows = tmp_path / "flows"
    flows.mkdir()
    file = flows / "hourly.py"
    file.write_text(FILE.format(schedules='Schedule(cron="0 * * * *")'))

    async def ids(engine: Engine) -> list[tuple[str, Any]]:
        return [(s.schedule, s.paused) for s in await engine.schedules()]

    async with Engine(workflows=flows, database=database, watch=True) as engine:
        await wait_until_watching(engine)
        await until(lambda: engine.schedules())
        assert await ids(engine) == [("cron 0 * * * * UTC", False)]
        file.write_text(FILE.format(schedules='Schedule(cron="0 * * * *"), Schedule(every="10m")'))

        async def two() -> bool:
            return len(await engine.schedules()) == 2

        await until(two)
        file.write_text(FILE.format(schedules='Schedule(every="10m")'))

        async def changed() -> bool:
            return await ids(engine) == [("every 10m", False)]

        await until(changed)
        file.write_text(FILE.format(schedules=""))

        async def removed() -> bool:
            return await engine.schedules() == []

        await until(removed)


async def test_a_paused_schedule_changed_in_its_file_stays_paused(
    tmp_path: Path, database: Path | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A schedule's id is its expression: an operator paused `every 10m`, a developer made it
    `every 20m`, and the new schedule fired, active, with nobody resuming it."""
    monkeypatch.setattr(scheduler, "POLL_S", DAY_S)
    flows = tmp_path / "flows"
    flows.mkdir()
    file = flows / "hourly.py"
    file.write_text(FILE.format(schedules='Schedule(every="10m")'))

    async def states(engine: Engine) -> list[tuple[str, Any]]:
        return [(s.schedule, s.paused) for s in await engine.schedules()]

    async with Engine(workflows=flows, database=database, watch=True) as engine:
        await wait_until_watching(engine)
        await engine.pause_schedule("reports.hourly")
        file.write_text(FILE.format(schedules='Schedule(every="20m")'))

        async def replaced() -> bool:
            return [s for s, _ in await states(engine)] == ["every 20m"]

        await until(replaced)
        assert await states(engine) == [("every 20m", True)]
        # Two schedules from one: which one the pause was for is not known, nothing is kept.
        file.write_text(FILE.format(schedules='Schedule(every="30m"), Schedule(every="1h")'))

        async def two() -> bool:
            return len(await engine.schedules()) == 2

        await until(two)
        assert await states(engine) == [("every 1h", False), ("every 30m", False)]
        # One of two paused, then changed: the pause goes with it, the other stays active
        # (it was lost where the workflow had more than one schedule).
        await engine.pause_schedule("reports.hourly", "every 30m")
        file.write_text(FILE.format(schedules='Schedule(every="45m"), Schedule(every="1h")'))

        async def edited() -> bool:
            return "every 45m" in [s for s, _ in await states(engine)]

        await until(edited)
        assert await states(engine) == [("every 1h", False), ("every 45m", True)]


async def test_an_idle_scheduler_writes_nothing(
    database: Path | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workflows served without schedules are declared once (no schedules: any left by an
    # earlier version go), not again at every turn: with 200 of them, 200 writes a second.
    monkeypatch.setattr(scheduler, "POLL_S", 0.01)  # turns, quickly
    plain = [ticking(name=f"plain.{i}") for i in range(3)]  # no schedules
    workflows = [*plain, ticking(Schedule(cron="0 0 1 1 *"))]
    async with Engine(workflows=workflows, database=database) as engine:
        shared = engine.backend.shared
        declare, schedules = shared.declare_schedules, shared.schedules
        declared: list[str] = []
        turns: list[int] = []

        async def counted_declare(workflow: str, specs: Any) -> None:
            declared.append(workflow)
            await declare(workflow, specs)

        async def counted_schedules() -> Any:
            turns.append(1)
            return await schedules()

        monkeypatch.setattr(shared, "declare_schedules", counted_declare)
        monkeypatch.setattr(shared, "schedules", counted_schedules)
        await until(lambda: len(turns) >= 2)  # a whole turn since: everything is declared
        declared.clear()
        turns.clear()
        await until(lambda: len(turns) >= 5)
        assert declared == []
        assert [s.workflow for s in await engine.schedules()] == ["reports.daily"]


def test_definition_errors_are_refused_where_they_are_written() -> None:
    # By the Schedule itself: one built apart from its workflow (in a test, a helper) was
    # taken, and refused only once a Workflow held it.
    with pytest.raises(WorkflowDefinitionError) as raised:
        Schedule(cron="61 * * * *")
    assert str(raised.value) == "Schedule: invalid cron expression '61 * * * *': Bad minute"
    # One `*` too many: read as a seconds field first, "every 2 minutes" fired every 2 seconds.
    with pytest.raises(WorkflowDefinitionError) as raised:
        Schedule(cron="*/2 * * * * *")
    assert str(raised.value) == (
        "Schedule: cron expression '*/2 * * * * *' has 6 fields; a cron has 5 (minute hour day "
        "month weekday); for seconds, use Schedule(every='2s')"
    )
    with pytest.raises(WorkflowDefinitionError, match="unknown time zone 'Mars/Base'"):
        ticking(Schedule(cron="0 * * * *", timezone="Mars/Base"), name="w")
    # cron's own macros, as cron and Temporal take them; and what they are not.
    assert Schedule(cron="@hourly").id == "cron 0 * * * * UTC"
    with pytest.raises(WorkflowDefinitionError, match="unknown cron macro '@often': one of"):
        Schedule(cron="@often")
    with pytest.raises(WorkflowDefinitionError, match="timezone is for cron="):
        Schedule(every="2s", timezone="Europe/Paris")
    with pytest.raises(WorkflowDefinitionError) as raised:
        Workflow(
            name="w",
            trigger=WorkerTrigger(queue="w"),
            schedules=Schedule(every="2s"),  # type: ignore[arg-type]
            steps=[Step("s", print)],
        )
    assert str(raised.value) == (
        "workflow 'w': schedules must be a list of Schedule, not Schedule (schedules=[...])"
    )
    with pytest.raises(WorkflowDefinitionError, match=r"either cron= .* or every="):
        Schedule()
    with pytest.raises(WorkflowDefinitionError, match=r"either cron= .*not both"):
        Schedule(cron="* * * * *", every="1s")
    with pytest.raises(WorkflowDefinitionError, match="every"):
        Schedule(every="10ms")
    with pytest.raises(WorkflowDefinitionError, match="catch_up"):
        Schedule(every="1s", catch_up="some")
    with pytest.raises(WorkflowDefinitionError, match="twice"):
        ticking(Schedule(every="1s"), Schedule(every="1000ms"), name="w")
    with pytest.raises(WorkflowDefinitionError, match="give the workflow a WorkerTrigger"):
        Workflow(name="w", schedules=[Schedule(every="1s")], steps=[Step("s", print)])


def test_a_too_short_every_is_refused_in_the_units_it_was_written_in() -> None:
    with pytest.raises(WorkflowDefinitionError) as raised:
        Schedule(every="0s")
    assert str(raised.value) == "Schedule: every must be at least 1s, not '0s'"
    with pytest.raises(WorkflowDefinitionError) as raised:
        Schedule(every=500)
    assert str(raised.value) == "Schedule: every must be at least 1s, not 500 (milliseconds)"
    assert Schedule(every="1s").every == 1000


def test_a_payload_enqueue_would_refuse_is_refused_where_the_schedule_is_written() -> None:
    """It was taken as it was: NaN stored as JSON no other reader parses, an object failing
    every tick's job (into the dead-letter queue, with an error about a return value)."""
    for payload, why in (
        ({"x": float("nan")}, "payload holds NaN at $.x: not standard JSON"),
        ({"x": object()}, "payload is not JSON-serialisable: $.x is a"),
        ({1: "a"}, "payload has a key 1 (int) at $: JSON object keys are strings"),
    ):
        with pytest.raises(WorkflowDefinitionError) as raised:
            Schedule(every="1s", payload=payload)
        assert str(raised.value).startswith(f"Schedule: {why}"), raised.value
    assert Schedule(every="1s", payload={"x": [1, "a", None]}).payload == {"x": [1, "a", None]}


async def test_a_schedule_whose_payload_lacks_a_field_the_workflow_reads_is_warned_of_at_load(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every tick's run failed with "$.body has no key 'at'", said only by the runs, one a
    tick: enqueue warns of such a payload, a schedule's was never looked at."""

    def remind(ctx: Any, who: str, at: int) -> str:
        return who

    def reminding(name: str, *schedules: Schedule) -> Workflow:
        return Workflow(
            name=name,
            trigger=WorkerTrigger(queue=name),
            schedules=list(schedules),
            steps=[Step("remind", remind, inputs={"who": "$.body.who", "at": "$.body.when.at"})],
        )

    caplog.set_level("WARNING", logger="blok.catalog")
    lacking = reminding(
        "reminders", Schedule(every="1h", payload={"who": "ops"}), Schedule(cron="0 9 * * *")
    )
    whole = reminding("whole", Schedule(every="1h", payload={"who": "ops", "when": {"at": 1}}))
    async with Engine(workflows=[lacking, whole], database=None):
        pass
    warned = [r.getMessage().split(": ", 1)[1] for r in caplog.records if r.name == "blok.catalog"]
    assert warned == [
        "workflow 'reminders', schedule 'every 1h': its payload has no $.body.when, which the "
        "workflow reads: each tick's run fails at the step that reads it (unless in a branch "
        "the run does not take)",
        "workflow 'reminders', schedule 'cron 0 9 * * * UTC': its payload has no $.body.who, "
        "$.body.when, which the workflow reads: each tick's run fails at the steps that read "
        "them (unless in a branch the run does not take)",
    ], warned


@pytest.mark.parametrize("durable", [False, True])
async def test_an_engine_lists_and_pauses_its_schedules_once_started(
    database: Path | str, durable: bool
) -> None:
    """Its scheduler declared them in a task of its own, some moments after `async with`
    entered: until then `schedules()` was empty and a pause said the workflow had none."""
    daily = Schedule(cron="0 9 * * *", timezone="America/New_York")
    async with Engine(workflows=[ticking(daily)], database=database if durable else None) as engine:
        [listed] = await engine.schedules()
        assert (listed.schedule, listed.paused) == (daily.id, False)
        await engine.pause_schedule("reports.daily")
        assert [info.paused for info in await engine.schedules()] == [True]


async def test_scheduling_can_be_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLOK_SCHEDULING_DISABLED", "1")
    async with Engine(workflows=[ticking(Schedule(every="1s"))]) as engine:
        await engine.flush()
        assert await engine.schedules() == []


@pytest.mark.parametrize(
    ("catch_up", "expected"),
    [
        ("latest", ([50.0], [])),
        ("all", ([10.0, 20.0, 30.0, 40.0, 50.0], [])),
        ("none", ([], [50.0])),
    ],
)
def test_missed_ticks_by_policy(catch_up: str, expected: tuple[list[float], list[float]]) -> None:
    from engine.backends.base import ScheduleSpec
    from engine.scheduler import due_ticks

    spec = ScheduleSpec("wf", "every 10s", "q", None, 10_000, "UTC", catch_up)
    # Last tick at 0, looked at 53: five ticks missed, the newest 3 s ago.
    assert due_ticks(spec, 0.0, 53.0) == expected
    # On time (the tick fell due a moment ago): every policy fires it, once.
    assert due_ticks(spec, 40.0, 50.5) == ([50.0], [])
    assert due_ticks(spec, 50.0, 59.9) == ([], [])


async def test_a_tick_claimed_by_a_worker_that_died_is_enqueued_by_another(
    database: Path | str,
) -> None:
    from engine.backends import open_backend
    from engine.scheduler import tick_job_id, tick_run_id

    wf = ticking(Schedule(every="1d"))
    async with Engine(workflows=[wf], database=database) as engine:
        await until(lambda: engine.schedules())
    await rewind(database, 1)
    newest = math.floor(time.time() / DAY_S) * DAY_S
    job_id = tick_job_id(wf.name, "every 1d", newest)
    # A scheduler that claimed today's tick and died before it enqueued the job.
    async with open_backend(database) as backend:
        assert await backend.shared.claim_tick(
            wf.name, "every 1d", newest, job_id, tick_run_id(job_id)
        )
    async with Engine(workflows=[wf], database=database) as engine:

        async def enqueued() -> bool:
            return any(r.job_id == job_id for r in await engine.runs(workflow=wf.name))

        await until(enqueued, timeout=15)
        done = await engine.wait_for_job(job_id, timeout=10)
        assert done.id == tick_run_id(job_id)
        assert await ticks_of(engine, wf.name) == [newest]
