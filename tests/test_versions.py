"""Two workers on one database serving one workflow at different versions (a rolling deploy,
or a worker left with old files): its runs split between the versions. Each worker says so
in its log; nothing did."""

from __future__ import annotations

import logging
import signal
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_helpers import blok, start_worker
from pg import fresh_database
from support import durable_database, run_when, until

from engine import (
    Engine,
    JobState,
    RunStatus,
    Step,
    StepStatus,
    WorkerTrigger,
    Workflow,
    wait,
)

pytestmark = pytest.mark.anyio
database = durable_database


def charge(version: str) -> Workflow:
    def node(ctx: Any) -> str:
        return version

    return Workflow(
        name="orders.charge",
        trigger=WorkerTrigger(queue="orders"),
        steps=[Step(f"charge_{version}", node)],  # another step: another version
    )


async def test_a_workflow_served_at_two_versions_is_said_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="blok.versions")
    database = tmp_path / "blok.db"
    old, new = charge("v1"), charge("v2")
    assert old.version != new.version
    async with Engine(workflows=[old], database=database) as first:
        assert not caplog.records  # one version so far
        async with Engine(workflows=[new], database=database) as second:
            await until(lambda: caplog.records)  # said as its chores begin
            [said] = [r.getMessage() for r in caplog.records]
            workers = {old.version: first.worker.id, new.version: second.worker.id}
            by = "; ".join(f"{v} by {workers[v]}" for v in sorted(workers))
            assert said == (
                f"workflow 'orders.charge' is served at 2 versions ({by}): its jobs run on "
                "whichever worker claims them"
            )
            # Once: the next look finds the same split and says nothing more.
            assert await second._chores.versions.check(second.backend) == [said]  # type: ignore[union-attr]
            assert len(caplog.records) == 1


async def test_health_names_a_workflow_served_at_two_versions(tmp_path: Path) -> None:
    """`blok-tui health` (and `engine.health()`) said a split in no word: only the logs did."""
    database = tmp_path / "blok.db"
    old, new = charge("v1"), charge("v2")
    async with Engine(workflows=[old], database=database) as first:
        health = await first.health()
        assert health.ok and not health.version_splits and "versions" not in health.reason
        async with Engine(workflows=[new], database=database) as second:
            health = await first.health()
            assert health.ok
            assert health.version_splits == {
                "orders.charge": {old.version: [first.worker.id], new.version: [second.worker.id]}
            }
            assert "workflow 'orders.charge' is served at 2 versions" in health.reason


# ---- a run resuming where its version is not --------------------------------------------------
def pay(order: list[str], charged: list[str]) -> Workflow:
    """orders.pay with its steps in `order`: a charge, a wait for "go", a notice."""

    def charge_card(ctx: Any) -> str:
        charged.append(ctx.run_id)
        return "charged"

    steps = {
        "charge": Step("charge", charge_card),
        "gate": wait.for_event("go", name="gate"),
        "notify": Step("notify", lambda ctx: "sent"),
        "audit": Step("audit", lambda ctx: "audited"),
    }
    return Workflow(
        name="orders.pay",
        trigger=WorkerTrigger(queue="pay", retries=2),
        steps=[steps[name] for name in order],
    )


async def parked(database: str, charged: list[str]) -> tuple[str, Any]:
    """A job of orders.pay at its first version, once its run waits for "go" after its charge
    (and the engine that ran it has stopped): (its job id, its run)."""
    async with Engine(
        workflows=[pay(["charge", "gate", "notify"], charged)], database=database
    ) as first:
        job_id = await first.enqueue("pay", {"order": "A1"})
        return job_id, await run_when(first, job_id, RunStatus.WAITING)


async def test_a_run_whose_version_is_gone_and_whose_steps_changed_is_not_resumed_by_position(
    database: str,
) -> None:
    """A run waited on its first version; the worker restarted with the steps reordered. It
    resumed by position: the charge ran again under the wait's record and the notice never
    ran, in a run recorded completed (or, with a step added, an engine IndexError). Now it
    runs nothing, fails saying how to go on, and its job is a dead letter (a retry would run
    the charge again)."""
    charged: list[str] = []
    job_id, run = await parked(database, charged)
    assert charged == [run.id]
    changed = pay(["gate", "charge", "notify"], charged)
    async with Engine(workflows=[changed], database=database) as second:
        await second.send_event(run.id, "go", {})
        ended = await second.wait_for_job(job_id, timeout=20)
        job = await second.get_job(job_id)
        dead = [j.job_id for j in await second.dead_letters("pay")]
    assert charged == [run.id]  # not again
    assert (ended.id, ended.status, job.state, dead) == (
        run.id,
        RunStatus.FAILED,
        JobState.DEAD,
        [job_id],
    )
    assert ended.error == (
        f"[step 2/3] gate: version {run.workflow_version} it started on is served by no live "
        "worker, and the steps of the version served now differ from its own: not resumed, as "
        "going on by position would run other steps than its record says; replay it from step "
        f"'gate' (blok-tui replay {run.id} --from-step gate), or requeue it to run it from its "
        "first step"
    )
    assert [(s.name, s.status) for s in ended.steps] == [
        ("charge", StepStatus.COMPLETED),
        ("gate", StepStatus.FAILED),
        ("notify", StepStatus.PENDING),
    ]
    assert ended.error_step == "gate" and ended.workflow_version == run.workflow_version


async def test_a_run_whose_version_is_gone_goes_on_where_only_later_steps_changed(
    database: str,
) -> None:
    """A deploy that added a step after a wait, and restarted the workers: each run parked in
    the wait failed when its event came, and went to the dead-letter queue with the event it
    had been sent (a replay from the wait waited for it again). The steps it ran and the
    wait are unchanged: it goes on with the new version's steps from there."""
    charged: list[str] = []
    job_id, run = await parked(database, charged)
    grown = pay(["charge", "gate", "audit", "notify"], charged)
    async with Engine(workflows=[grown], database=database) as second:
        assert grown.version != run.workflow_version
        await second.send_event(run.id, "go", {"by": "ann"})
        ended = await second.wait_for_job(job_id, timeout=20)
    assert ended.status is RunStatus.COMPLETED, ended.error
    assert charged == [run.id]  # not again
    assert [(s.name, s.status, s.output) for s in ended.steps] == [
        ("charge", StepStatus.COMPLETED, "charged"),
        ("gate", StepStatus.COMPLETED, {"by": "ann"}),  # the event it was sent
        ("audit", StepStatus.COMPLETED, "audited"),
        ("notify", StepStatus.COMPLETED, "sent"),
    ]
    assert [s.index for s in ended.steps] == [0, 1, 2, 3]
    assert ended.workflow_version == grown.version
    assert (
        f"resumed on version {grown.version} (started on {run.workflow_version}, which no live "
        "worker serves): the steps up to 'gate', where it goes on, are unchanged; the steps "
        "after it are the new version's"
    ) in [line.message for line in ended.logs]


PAY_FILE = textwrap.dedent(
    """
    from pathlib import Path
    from engine import Step, WorkerTrigger, Workflow, wait

    def charge(ctx):
        with Path(ctx.body["ledger"]).open("a") as ledger:
            ledger.write("charged by the first version\\n")
        return "charged"

    workflow = Workflow(
        name="orders.pay",
        trigger=WorkerTrigger(queue="pay", retries=2),
        steps=[Step("charge", charge), wait.for_event("go", name="gate"), Step("notify", lambda ctx: "sent")],
    )
    """
)


async def test_a_run_is_left_to_the_live_worker_that_serves_its_version(tmp_path: Path) -> None:
    """A rolling deploy on PostgreSQL: the run began on a worker of the first version, and a
    worker of a version with the steps reordered took it up when its event came. It ran it
    by position (a second wait, the notice lost, or an IndexError). Now it leaves it to the
    worker that has its version, which finishes it."""
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "pay.py").write_text(PAY_FILE)
    ledger = tmp_path / "ledger.txt"
    charged: list[str] = []
    async with fresh_database() as url:
        first = start_worker(url, tmp_path / "workflows", logs=tmp_path).process
        try:
            async with Engine(database=url) as producer:
                job_id = await producer.enqueue("pay", {"ledger": str(ledger)})
                run = await run_when(producer, job_id, RunStatus.WAITING, timeout=20)
            first.send_signal(signal.SIGSTOP)  # alive, claiming nothing: the other takes it
            try:
                changed = pay(["gate", "charge", "notify"], charged)
                async with Engine(workflows=[changed], database=url) as second:
                    await second.send_event(run.id, "go", {})
                    await until(lambda: left_to_it(second, run.id), timeout=20)
                    assert (await second.get_run(run.id)).status is RunStatus.WAITING
            finally:
                first.send_signal(signal.SIGCONT)
            async with Engine(database=url) as producer:
                ended = await producer.wait_for_job(job_id, timeout=30)
        finally:
            first.terminate()
            first.wait(timeout=20)
    assert ended.status is RunStatus.COMPLETED, ended.error
    assert [(s.name, s.status) for s in ended.steps] == [
        ("charge", StepStatus.COMPLETED),
        ("gate", StepStatus.COMPLETED),
        ("notify", StepStatus.COMPLETED),
    ]
    assert charged == [] and ledger.read_text() == "charged by the first version\n"
    said = [line.message for line in ended.logs if "left to it" in line.message]
    assert len(said) == 1 and said[0].startswith(
        f"version {run.workflow_version} it started on is served by worker "
    )


async def left_to_it(engine: Engine, run_id: str) -> bool:
    run = await engine.get_run(run_id)
    return any("left to it" in line.message for line in run.logs)


async def test_a_replay_says_which_version_it_runs_when_not_its_runs(tmp_path: Path) -> None:
    """A run failed on one version; the fix was deployed; `blok-tui replay` printed the new
    run's id, and nothing said it runs the fixed code rather than what the run ran."""
    database = tmp_path / "blok.db"

    def broken(ctx: Any) -> None:
        raise ValueError("bad deploy")

    old = Workflow(
        name="orders.charge", trigger=WorkerTrigger(queue="orders"), steps=[Step("go", broken)]
    )
    async with Engine(workflows=[old], database=database) as first:
        failed = await first.wait_for_job(await first.enqueue("orders", {}), timeout=10)
    assert failed.status is RunStatus.FAILED
    fixed = charge("v2")
    async with Engine(workflows=[fixed], database=database) as second:
        done = await anyio.to_thread.run_sync(blok, "replay", failed.id, "--db", database)
        assert done.returncode == 0, done.stderr
        replay = await second.wait_for_job(
            (await second.get_run(done.stdout.strip())).job_id, timeout=10
        )
    assert replay.status is RunStatus.COMPLETED and replay.workflow_version == fixed.version
    assert done.stderr == (
        f"blok-tui: note: the replay runs version {fixed.version} of orders.charge "
        f"(run {failed.id} ran {old.version})\n"
    )


async def test_two_deployments_serving_one_queue_each_run_only_the_jobs_enqueued_for_their_own(
    database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Two services that chose one queue name (or a deploy that renamed the workflow while the
    # old one still ran): a worker ran the other's jobs with its own code, recorded under the
    # other's workflow ("one" completed with "from B"), and no one was told of the clash.
    async def from_a(ctx: Any) -> str:
        return "from A"

    async def from_b(ctx: Any) -> str:
        return "from B"

    one = Workflow(name="one", trigger=WorkerTrigger(queue="x"), steps=[Step("hi", from_a)])
    two = Workflow(name="two", trigger=WorkerTrigger(queue="x"), steps=[Step("hi", from_b)])
    async with Engine(workflows=[one], database=database) as a:
        await a.pause("x")
        for_a = [await a.enqueue("x", {}) for _ in range(3)]
        with caplog.at_level(logging.WARNING, logger="blok.versions"):
            async with Engine(workflows=[two], database=database) as b:
                # The latest declaration names the queue's jobs now.
                for_b = [await b.enqueue("x", {}) for _ in range(3)]
                await b.resume("x")
                # Each job left to A is held a second by B, which then passes it over while A
                # takes it (B claimed it again as it fell due, a second at a time, and A won it
                # only when it looked at that moment: one job took 37 claims, 36 s).
                with anyio.fail_after(60):
                    ran = {job: await b.wait_for_job(job) for job in for_a + for_b}
                held = {job: (await b.get_job(job)).meta.get("held", 0) for job in for_a}
                # Said by health too: the warning was only in the workers' logs.
                report = await b.health()
                # And by the queues' list: it named one of them ("two"), the console's too.
                (listed,) = await b.queues()
                table = await anyio.to_thread.run_sync(blok, "queues", "--db", database)
    assert report.ok and f"queue 'x' is served with 2 workflows ('one' by {a.worker.id}; " in (
        report.reason
    ), report.reason
    assert (listed.workflow_name, listed.workflow_names) == ("two", ["one", "two"]), listed
    assert table.returncode == 0 and table.stdout.splitlines()[1].split()[:4] == [
        "x",
        "one",
        "+",
        "two",
    ], table.stdout
    assert all(times <= 1 for times in held.values()), held
    assert {job: (run.workflow_name, run.output) for job, run in ran.items()} == {
        **{job: ("one", "from A") for job in for_a},
        **{job: ("two", "from B") for job in for_b},
    }
    said = [r.getMessage() for r in caplog.records if "is served here with" in r.getMessage()]
    assert said and said[0].startswith(
        "queue 'x' is served here with workflow 'two', and by worker "
    ), said
    assert "with workflow 'one': jobs enqueued to it now run 'two'" in said[0], said


async def test_a_database_dropped_as_a_worker_starts_is_said_by_its_clash_check_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The check for another deployment on the worker's queues reads the live workers as the
    worker starts: a PostgreSQL database dropped at that moment put the driver's traceback in
    the worker's log before the worker's own one-line error (seen by
    tests/postgres/test_pg_outage_stop.py, now and then)."""
    from pg import drop_under_its_users

    from engine.backends import open_backend
    from engine.versions import say_other_declarations

    caplog.set_level("WARNING", logger="blok.versions")
    async with fresh_database() as url, open_backend(url) as backend:
        await drop_under_its_users(url)
        await say_other_declarations(backend, "vm:1:me", {})
    [said] = [r for r in caplog.records if r.name == "blok.versions"]
    assert said.exc_info is None, said.exc_info
    assert said.getMessage().startswith("could not read the other workers' queues: "), said
    assert "does not exist" in said.getMessage(), said.getMessage()
