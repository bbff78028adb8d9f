"""`Engine.where` / `blok-tui where`: the worker that runs a run says where its code is now,
on this process or another one, and the answer lands on the run's log."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from backends.builders import a_run
from cli_helpers import blok, cli_env, eventually, serve
from support import (
    add_unserved,
    durable_database,
    expect_events,
    marked_line,
    provider_of,
    until,
)

from engine import (
    AttemptFailed,
    Engine,
    EngineError,
    JobState,
    Retry,
    RunStatus,
    Step,
    StepStarted,
    UnknownRun,
    WorkerTrigger,
    Workflow,
    threads,
)
from engine.models import WorkerInfo, utcnow
from engine.node_calls import NodeCalls
from engine.whereabouts import NOTHING_RUNS, STARTING

pytestmark = pytest.mark.anyio

line_of = partial(marked_line, __file__)
database = durable_database  # the fixture: each DURABLE database in turn (tests/support.py)


async def _hold(ctx: Any, release: anyio.Event) -> None:
    await _waits_for(release)  # the node own line


async def _waits_for(release: anyio.Event) -> None:
    await release.wait()  # where the async node waits


def _spins(ctx: Any, release: threading.Event, entered: threading.Event) -> None:
    entered.set()
    release.wait(30)  # where the sync node thread waits


def _fails(ctx: Any) -> None:
    raise ConnectionError("upstream down")


async def test_a_running_nodes_answer_names_its_step_its_line_and_its_frames() -> None:
    release, released, entered = anyio.Event(), threading.Event(), threading.Event()
    flows = [
        Workflow(
            name="held",
            trigger=WorkerTrigger(queue="held"),
            steps=[Step("hold", _hold, inputs={"release": lambda ctx: release})],
        ),
        Workflow(
            name="spun",
            trigger=WorkerTrigger(queue="spun"),
            steps=[
                Step(
                    "spin",
                    _spins,
                    inputs={"release": lambda ctx: released, "entered": lambda ctx: entered},
                )
            ],
        ),
    ]
    async with Engine(workflows=flows, database=None) as engine:
        # Both steps started: the async node is called in the same turn.
        async with expect_events(engine, StepStarted, count=2):
            held = await engine.enqueue("held", {})
            spun = await engine.enqueue("spun", {})
        held_run = (await engine.get_job(held)).run_id
        spun_run = (await engine.get_job(spun)).run_id
        answer = await engine.where(held_run)
        assert answer == "\n".join(
            [
                f"where: [step 1/1] hold is at {line_of('where the async node waits')}",
                f"  {line_of('the node own line')} in _hold: await _waits_for(release)"
                "  # the node own line",
                f"  {line_of('where the async node waits')} in _waits_for: await "
                "release.wait()  # where the async node waits",
            ]
        )
        # In its thread (handed to one but not yet in it, it is said to be starting there).
        assert await anyio.to_thread.run_sync(entered.wait, 10)
        spun_answer = await engine.where(spun_run)
        assert spun_answer.splitlines()[0] == (
            f"where: [step 1/1] spin is at {line_of('sync node thread waits')}"
        ), spun_answer
        release.set()
        released.set()
        done = await engine.wait_for_job(held, timeout=10)
    assert done.status is RunStatus.COMPLETED
    # The answer is on the run's log too.
    assert [line.message for line in done.logs] == [answer]


async def test_a_run_between_attempts_says_no_code_runs_and_an_ended_one_is_refused() -> None:
    flows = [
        Workflow(
            name="backs",
            trigger=WorkerTrigger(queue="backs"),
            steps=[Step("call", _fails, retry=Retry(max_attempts=2, min_timeout="1h"))],
        )
    ]
    async with Engine(workflows=flows, database=None) as engine:
        async with expect_events(engine, AttemptFailed):
            job_id = await engine.enqueue("backs", {})
        run_id = (await engine.get_job(job_id)).run_id
        assert await engine.where(run_id) == NOTHING_RUNS
        await engine.cancel(run_id)
        await engine.wait_for_job(job_id, timeout=10)
        with pytest.raises(EngineError, match=f"run {run_id} is cancelled: none of its code runs"):
            await engine.where(run_id)
        with pytest.raises(UnknownRun):
            await engine.where("run_nope")


NAPS = """
import time
from pathlib import Path

import anyio
from engine import Step, Workflow, WorkerTrigger


async def nap(ctx):
    await anyio.sleep(3600)  # the nap


async def block(ctx):
    Path(ctx.body["marker"]).touch()
    time.sleep(2)  # an async node that blocks the event loop


workflows = [
    Workflow(name="naps", trigger=WorkerTrigger(queue="naps"), steps=[Step("nap", nap)]),
    Workflow(name="blocks", trigger=WorkerTrigger(queue="blocks"), steps=[Step("b", block)]),
]
"""


def test_another_process_answers_and_one_that_died_is_said_not_to(tmp_path: Path) -> None:
    """`blok-tui where` on SQLite: the worker process holding the run answers; while a node
    blocks its event loop, or after a kill -9 (its lease not yet run out), nobody does, and the
    command says so in one line."""
    database, worker = serve(tmp_path, {"naps.py": NAPS})
    folder = tmp_path / "workflows"
    try:
        job = blok("enqueue", "naps", "{}", "--db", database)
        job_id = job.stdout.strip()
        eventually(lambda: "running" in blok("runs", "--db", database).stdout or None)
        where = eventually(lambda: _answered(blok("where", job_id, "--db", database)))
        assert where.stdout.splitlines() == [
            f"where: [step 1/1] nap is at {folder / 'naps.py'}:10",
            f"  {folder / 'naps.py'}:10 in nap: await anyio.sleep(3600)  # the nap",
        ], where.stdout
        marker = tmp_path / "blocking"
        blocked = blok("enqueue", "blocks", json.dumps({"marker": str(marker)}), "--db", database)
        eventually(marker.exists)
        # Its start may not even be written: the loop that would write it is held.
        held = blok("where", blocked.stdout.strip(), "--db", database, "--timeout", "500ms")
        assert held.returncode == 1 and "did not answer within 0.5s" in held.stderr, held
        assert held.stderr.startswith("blok-tui: error: run run_") and held.stderr.endswith(
            "did not answer within 0.5s: it is gone, a node blocks its event loop (its log names "
            "which), or it has not started the run yet; blok-tui workers lists the live ones\n"
        ), held.stderr
        worker.process.kill()
        worker.process.wait()
        # A dead holder is named at once, not after the wait for an answer that cannot come.
        gone = blok("where", job_id, "--db", database, "--timeout", "30s")
        assert gone.returncode == 1 and gone.stdout == "", gone
        assert gone.stderr.startswith("blok-tui: error: run run_") and gone.stderr.endswith(
            f": none of its code runs now: its worker {worker.id} is gone (its process "
            f"{worker.process.pid} no longer runs); a live worker takes its job over: the run is "
            "recorded crashed and its job gets a new run (no worker is alive now: start one)\n"
        ), gone.stderr
        # `show` says it too: the record still says running, and nothing will move it on.
        shown = blok("show", job_id, "--db", database).stdout
        assert (
            f"; nobody runs it now: its worker {worker.id} is gone (its process "
            f"{worker.process.pid} no longer runs); a live worker takes its job over"
        ) in " ".join(shown.split()), shown
        # And `runs` lists it so (its ERROR column; `orphaned` and `orphaned_then` in JSON), as
        # the console does.
        why = f"its worker {worker.id} is gone (its process {worker.process.pid} no longer runs)"
        then = (
            "a live worker takes its job over: the run is recorded crashed and its job gets a new "
            "run (no worker is alive now: start one)"
        )
        listed = blok("runs", "--db", database, "--queue", "naps").stdout.splitlines()
        [row] = [line for line in listed if " running " in line]
        assert row.endswith(f"orphaned: {why}; {then}"), listed
        records = json.loads(blok("runs", "--db", database, "--queue", "naps", "--json").stdout)
        orphans = [
            (r.get("orphaned"), r.get("orphaned_then")) for r in records if r["status"] == "running"
        ]
        assert orphans == [(why, then)]
    finally:
        worker.process.kill()
        worker.process.wait()


def test_a_frozen_worker_past_its_lease_is_said_to_have_let_it_run_out(tmp_path: Path) -> None:
    """A worker frozen (SIGSTOP) holds its run and cannot answer. Once its lease has run out,
    `where` says so at once instead of waiting for an answer."""
    database, worker = serve(tmp_path, {"naps.py": NAPS}, "--lease", "1s")
    try:
        job_id = blok("enqueue", "naps", "{}", "--db", database).stdout.strip()
        eventually(lambda: _answered(blok("where", job_id, "--db", database)))
        os.kill(worker.process.pid, signal.SIGSTOP)
        frozen = eventually(
            lambda: _refused(blok("where", job_id, "--db", database, "--timeout", "300ms"))
        )
        assert frozen.stdout == "" and frozen.stderr.startswith("blok-tui: error: run run_")
        assert (
            f": none of its code runs now: its worker {worker.id} let the lease on its job run "
            "out at "
        ) in frozen.stderr, frozen.stderr
        assert frozen.stderr.endswith(
            "(the worker is frozen, or gone); a live worker takes its job over: the run is "
            "recorded crashed and its job gets a new run\n"
        ), frozen.stderr
        shown = " ".join(blok("show", job_id, "--db", database).stdout.split())
        assert re.search(
            rf"; nobody runs it now: its worker {re.escape(worker.id)} let the lease on its job "
            r"run out at \d\d:\d\d:\d\d \(the worker is frozen, or gone\); a live worker takes",
            shown,
        ), shown
    finally:
        os.kill(worker.process.pid, signal.SIGCONT)
        worker.process.kill()
        worker.process.wait()


def _refused(done: Any) -> Any:
    """`where`'s refusal that names what became of the holder (not a wait that timed out)."""
    return done if done.returncode == 1 and "none of its code runs now" in done.stderr else None


async def test_a_holder_on_another_machine_with_no_heartbeat_is_named(tmp_path: Path) -> None:
    """A job held by a worker of another machine whose heartbeat stopped (a pid means nothing
    here, so its heartbeat tells): nobody will answer, and `where` says who is gone since
    when. On SQLite, whose rows keep the heartbeat's moment as written (PostgreSQL stamps it
    with its own clock, so an old one would take the test STALE_HEARTBEAT_S to make)."""
    database = str(tmp_path / "blok.db")
    last = utcnow() - timedelta(minutes=5)
    holder = "elsewhere:4242:0a0b0c"
    async with Engine(database=database) as engine:
        engine.backend.shared.heartbeat(
            WorkerInfo(
                id=holder,
                host="elsewhere",
                pid=4242,
                process="0b1d4c3e-another-boot/4026531836#812",
                started_at=last,
                heartbeat_at=last,
            )
        )
        await engine.backend.runs.flush()  # the heartbeat goes with the writer's next commit
        queue = engine.backend.queue(provider_of(database))
        [job] = await add_unserved(queue, "far", [{}])
        [claim] = await queue.claim("far", 1, holder, 0.05)
        assert claim.job.id == job.id and claim.job.lease_until is not None
        lapsed = claim.job.lease_until
        await until(lambda: engine.now() > lapsed)
        # Its lease ran out too, but that the worker is gone is what tells the most.
        with pytest.raises(EngineError) as refused:
            await engine.where(job.run_id, timeout=30)
    assert str(refused.value) == (
        f"run {job.run_id}: none of its code runs now: its worker {holder} is gone (no heartbeat "
        f"since {last.isoformat(timespec='seconds')}); a live worker takes its job over: the run "
        "is recorded crashed and its job gets a new run (no worker is alive now: start one)"
    )


async def test_a_question_for_a_job_held_ahead_is_answered_as_it_starts(database: str) -> None:
    """With one slot busy, the worker holds the queue's next job ahead of it (claimed, not
    started). A question for that job reaches the worker before the run begins, and is
    answered with the run's start."""
    release = anyio.Event()
    flow = Workflow(
        name="one",
        trigger=WorkerTrigger(queue="one", concurrency=1, provider=provider_of(database)),
        steps=[Step("hold", _hold, inputs={"release": lambda ctx: release})],
    )
    async with Engine(workflows=[flow], database=database) as engine:
        await engine.pause("one")
        first = await engine.enqueue("one", {})
        second = await engine.enqueue("one", {})
        async with expect_events(engine, StepStarted):
            await engine.resume("one")  # one claim takes both: the second is held ahead
        held = await engine.get_job(second)
        assert held.state is JobState.ACTIVE and held.run_id not in engine.operator.worker.handles
        answer: list[str] = []

        async def ask() -> None:
            answer.append(await engine.where(held.run_id, timeout=30))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(ask)
            # The signal comes through the store, read at the worker's next look (a second
            # apart); 10 s ran out once in CI with a chaos test's workers taking both cores.
            await until(lambda: second in engine.operator.worker._early, timeout=30)
            release.set()  # the first run ends, the second starts (and holds: set already)
        assert answer == [STARTING]
        done = await engine.wait_for_job(second, timeout=10)
        assert STARTING in [line.message for line in done.logs]
        await engine.wait_for_job(first, timeout=10)


def _answered(done: Any) -> Any:
    """An answer from inside the node (not one from between the run's start and its call)."""
    return done if done.returncode == 0 and " is at " in done.stdout else None


async def _naps(ctx: Any, seconds: float, release: anyio.Event) -> None:
    with anyio.move_on_after(seconds):
        await release.wait()  # where a long nap waits


async def test_a_stuck_run_is_listed_by_runs_stuck_and_placed_by_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a headless operator types: `blok-tui runs --stuck`, then `blok-tui where`; the
    engine here is the other process's worker."""
    monkeypatch.setenv("BLOK_STUCK_MIN", "0")  # the commands' environment too: no 30 s floor
    release = anyio.Event()
    flows = [
        Workflow(
            name="naps",
            trigger=WorkerTrigger(queue="naps", concurrency=2),
            steps=[
                Step(
                    "nap",
                    _naps,
                    inputs={"seconds": "$.body.seconds", "release": lambda ctx: release},
                )
            ],
        )
    ]
    database = tmp_path / "blok.db"
    async with Engine(workflows=flows, database=database) as engine:
        for _ in range(3):  # a median of a few ms
            await engine.wait_for_job(await engine.enqueue("naps", {"seconds": 0}), timeout=10)
        async with expect_events(engine, StepStarted):  # the quick ones have ended
            long_job = await engine.enqueue("naps", {"seconds": 60})
        long = (await engine.get_job(long_job)).run_id
        # The command's own start takes far longer than 3 × the median.
        stuck = await _blok("runs", "--stuck", "--json", "--db", database)
        assert [run["id"] for run in json.loads(stuck)] == [long]
        shown = await _blok("show", long, "--db", database)
        assert f"stuck? (blok-tui where {long} says where it is)" in shown, shown
        where = await _blok("where", long, "--db", database)
        assert where.splitlines()[0] == (
            f"where: [step 1/1] nap is at {line_of('where a long nap waits')}"
        )
        release.set()
        await engine.wait_for_job(long_job, timeout=10)
        none = await _blok("runs", "--stuck", "5", "--db", database)
        assert none == (
            "no runs running longer than 5× their workflow's median time (10m where none"
            " completed)\n"
        )


async def _blok(*args: str | Path) -> str:
    done = await anyio.run_process(
        [sys.executable, "-m", "blok_tui", *map(str, args)], check=False, env=cli_env()
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def test_a_sync_node_handed_to_a_thread_not_yet_in_it_is_said_to_be_starting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed: list[Any] = []
    monkeypatch.setattr(threads._POOL, "submit", handed.append)  # no thread takes it yet
    calls = NodeCalls(lambda run, message, level: None)
    run = a_run()
    calls.start_sync(run, Step("spin", _spins), "[step 1/1] spin", None, {})  # type: ignore[arg-type]
    assert len(handed) == 1
    assert calls.where_now(run.id) == ["where: [step 1/1] spin is starting in its thread"]
