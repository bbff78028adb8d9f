"""`blok-tui show RUN_ID --follow`: the run as `show` prints it, then one line a moment until it
ends, through the job's next delivery when a failed one is retried; against a real worker
process, and the follower's lines from hand-made records."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
from backends.builders import a_run
from cli_helpers import Follower, blok, cli_env, eventually, start_worker

from blok_tui.run_follow import RunFollower, follow
from engine import (
    Attempt,
    Engine,
    LogLine,
    Run,
    RunStatus,
    Step,
    StepRun,
    StepStatus,
    WorkerTrigger,
    Workflow,
)

FOLLOWED = """
from pathlib import Path

import anyio
from engine import Retry, Step, Workflow, WorkerTrigger


async def hold(ctx):
    ctx.logger.info("holding until %s exists", Path(ctx.body["release"]).name)
    while not await anyio.Path(ctx.body["release"]).exists():
        await anyio.sleep(0.02)
    return {"held": True}


def flaky(ctx):
    if ctx.attempt == 1:
        raise ValueError("not yet")
    return 2


def boom(ctx):
    marker = Path(ctx.body["marker"])
    if not marker.exists():
        marker.touch()
        raise RuntimeError("the first delivery fails")
    return {"done": True}


workflow = Workflow(
    name="follow.me",
    trigger=WorkerTrigger(queue="follow", concurrency=2),
    steps=[
        Step("hold", hold),
        Step("flaky", flaky, retry=Retry(max_attempts=2, min_timeout="1ms")),
        Step("boom", boom),
    ],
)
"""


@pytest.fixture
def shop(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "follow.py").write_text(FOLLOWED)
    return tmp_path / "blok.db", tmp_path / "workflows"


def _after(lines: list[str], *texts: str) -> None:
    """Each of `texts` is in a line after the line of the one before."""
    at = -1
    for text in texts:
        found = [i for i, line in enumerate(lines) if text in line and i > at]
        assert found, f"{text!r} not after line {at} in:\n" + "\n".join(lines)
        at = found[0]


def test_follow_tells_each_moment_through_the_jobs_next_delivery_and_exits_0(
    shop: tuple[Path, Path],
) -> None:
    database, workflows = shop
    release, marker = database.parent / "release", database.parent / "marker"
    worker = start_worker(database, workflows)
    try:
        job = blok(
            "enqueue",
            "follow",
            f'{{"release": "{release}", "marker": "{marker}"}}',
            "--retries",
            "1",
            "--db",
            database,
        )
        assert job.returncode == 0, job.stderr
        job_id = job.stdout.strip()
        # Followed by its job's id, while its first step holds: `show`'s text, then the news.
        eventually(lambda: "holding until" in blok("show", job_id, "--db", database).stdout)
        follower = Follower(job_id, "--db", database)
        before = follower.read_until("FOLLOWING")
        assert "status     running" in "\n".join(before), before
        release.touch()
        code, lines, stderr = follower.finish()
    finally:
        assert worker.stop() == 0, worker.stderr()
    assert code == 0, stderr
    news = follower.news()
    _after(
        news,
        "hold completed in",
        "flaky attempt 1 of 2 started",
        "flaky attempt 1 of 2 failed after",
        "flaky completed in",
        "boom started",
        "boom failed in",
        "run failed",
        f"job {job_id} goes on: delivery 2 of 2 is run ",
        "run delayed until",
        "why: job attempt 1 failed: the next one starts at ",
        "run completed in",
    )
    # Every moment once, stamped HH:MM:SS.mmm, the log's lines with their level and step.
    assert all(line[2] == ":" and line[8] == "." for line in news if line), news
    assert sum("hold completed" in line for line in news) == 2  # once a delivery
    assert any("info     hold  holding until release exists" in line for line in news), "\n".join(
        lines
    )
    assert "ValueError: not yet" in "\n".join(news)
    # A step of one attempt: its end says how it failed, no line for the attempt too.
    assert not any("boom attempt" in line for line in news), news


def test_follow_tells_a_crash_and_the_delivery_that_recovered_it(shop: tuple[Path, Path]) -> None:
    """kill -9 the worker under a followed run: the follower tells the crash a second worker
    finds, and follows the job's next delivery to its end."""
    database, workflows = shop
    release, marker = database.parent / "release", database.parent / "marker"
    marker.touch()  # no failure of its own: only the crash
    first = start_worker(database, workflows, "--lease", "1s", name="first")
    payload = f'{{"release": "{release}", "marker": "{marker}"}}'
    job_id = blok("enqueue", "follow", payload, "--retries", "1", "--db", database).stdout.strip()
    eventually(lambda: "holding until" in blok("show", job_id, "--db", database).stdout)
    follower = Follower(job_id, "--db", database)
    follower.read_until("FOLLOWING")
    first.process.kill()
    first.process.wait()
    release.touch()
    second = start_worker(database, workflows, "--lease", "1s", name="second")
    try:
        code, _, stderr = follower.finish()
    finally:
        assert second.stop() == 0, second.stderr()
    assert code == 0, stderr
    news = follower.news()
    _after(
        news,
        "run crashed in",
        # A crash uses no retry: the job may take one delivery more than it was allowed.
        f"job {job_id} goes on: delivery 2 of 3 is run ",
        "hold completed in",
        "run completed in",
    )
    # Told in time order, the crash after the step it cut short.
    assert [line[:12] for line in news] == sorted(line[:12] for line in news), news


def test_follow_exits_1_when_the_run_ends_otherwise(shop: tuple[Path, Path]) -> None:
    database, workflows = shop
    release = database.parent / "release"
    worker = start_worker(database, workflows)
    try:
        job = blok(
            "enqueue",
            "follow",
            f'{{"release": "{release}", "marker": "{release}.marker"}}',
            "--db",
            database,
        )
        follower = Follower(job.stdout.strip(), "--db", database)
        follower.read_until("FOLLOWING")
        run_id = next(line.split()[1] for line in follower.lines if line.startswith("run "))
        cancelled = blok("cancel", run_id, "--db", database)
        assert cancelled.returncode == 0, cancelled.stderr
        code, lines, stderr = follower.finish()
    finally:
        assert worker.stop() == 0, worker.stderr()
    assert code == 1
    assert any("run cancelled" in line for line in lines), lines
    assert stderr.strip() == f"blok-tui: error: run {run_id} cancelled (blok-tui show {run_id})"


def test_follow_of_a_run_that_ended_prints_it_and_stops(shop: tuple[Path, Path]) -> None:
    database, workflows = shop
    release = database.parent / "release"
    release.touch()
    worker = start_worker(database, workflows)
    try:
        done = blok(
            "enqueue",
            "follow",
            f'{{"release": "{release}", "marker": "{release}.marker"}}',
            "--wait",
            "--db",
            database,
        )
        assert done.returncode == 1, done.stdout  # the first delivery fails, with no retries
    finally:
        assert worker.stop() == 0, worker.stderr()
    run_id = done.stderr.split()[3]  # "blok-tui: error: run RUN_ID failed: ..."
    shown = subprocess.run(
        [sys.executable, "-m", "blok_tui", "show", run_id, "-f", "--db", str(database)],
        capture_output=True,
        text=True,
        timeout=30,
        env=cli_env(),
    )
    assert shown.returncode == 1, shown.stderr
    # `show`'s text, with nothing to follow after it.
    assert shown.stdout.startswith(f"run        {run_id}\n"), shown.stdout
    assert "FOLLOWING" not in shown.stdout
    assert f"run {run_id} failed" in shown.stderr


def test_enqueue_follow_tells_the_new_run_from_its_start(shop: tuple[Path, Path]) -> None:
    database, workflows = shop
    release, marker = database.parent / "release", database.parent / "marker"
    release.touch()
    marker.touch()
    worker = start_worker(database, workflows)
    try:
        payload = f'{{"release": "{release}", "marker": "{marker}"}}'
        done = blok("enqueue", "follow", payload, "--follow", "--db", database)
    finally:
        assert worker.stop() == 0, worker.stderr()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    first = lines[0][14:].split()
    assert (first[0], first[2], first[3]) == ("job", "is", "run"), lines
    job_id, run_id = first[1], first[4]
    assert run_id.startswith("run_") and run_id in blok("show", job_id, "--db", database).stdout
    _after(lines, "hold started", "holding until", "hold completed", "run completed in")
    both = blok("enqueue", "follow", "{}", "--follow", "--wait", "--db", database)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr, both.stderr


def test_follow_and_json_together_are_refused(tmp_path: Path) -> None:
    done = blok("show", "run_x", "--follow", "--json", "--db", tmp_path / "none.db")
    assert done.returncode == 2
    assert "--follow prints lines, not JSON" in done.stderr


# ---- the follower's lines, from hand-made records --------------------------------------------
T0 = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)


def _run() -> Run:
    run = a_run(status=RunStatus.RUNNING, created_at=T0)
    run.started_at = T0
    run.steps = [
        StepRun(index=0, name="fetch", status=StepStatus.RUNNING, started_at=T0, max_attempts=3),
        StepRun(index=1, name="each", kind="for_each", status=StepStatus.PENDING),
    ]
    run.steps[0].attempts = [Attempt(number=1, started_at=T0)]
    return run


def test_news_tells_only_what_is_new_oldest_first() -> None:
    run = _run()
    follower = RunFollower(tz=UTC)
    follower.know(run)
    assert follower.news(run, T0) == []
    fetch = run.steps[0]
    first = fetch.attempts[0]
    first.status, first.finished_at = "failed", T0 + timedelta(seconds=1)  # type: ignore[assignment]
    first.error, first.error_type, first.backoff_ms = "timeout", "TimeoutError", 500
    fetch.attempts.append(Attempt(number=2, started_at=T0 + timedelta(seconds=1.5)))
    fetch.logs.append(
        LogLine(ts=T0 + timedelta(seconds=1.2), level="WARNING", message="slow\nvery slow", step=0)
    )
    assert follower.news(run, T0) == [
        "12:00:01.000  fetch attempt 1 of 3 failed after 1.0s: TimeoutError: timeout; next in 500ms",
        "12:00:01.200  WARNING  fetch  slow\n              very slow",
        "12:00:01.500  fetch attempt 2 of 3 started",
    ]
    assert follower.news(run, T0) == []


def test_news_names_a_nested_step_by_its_group_and_tells_each_status_change() -> None:
    run = _run()
    follower = RunFollower(tz=UTC)
    follower.know(run)
    at = T0 + timedelta(seconds=2)
    run.steps.append(
        StepRun(
            index=2,
            name="pack",
            status=StepStatus.COMPLETED,
            started_at=at,
            finished_at=at,
            parent=1,
            tags=["iteration 2"],
        )
    )
    run.status, run.wait_until = RunStatus.WAITING, T0 + timedelta(minutes=5)
    assert follower.news(run, at + timedelta(seconds=1)) == [
        "12:00:02.000  pack (iteration 2) completed in 0ms",
        "12:00:03.000  run waiting until 12:05:00",
    ]
    # Back to running: told before the step it went on with, though read after it.
    run.status, run.wait_until, run.worker = RunStatus.RUNNING, None, "host:7:w"
    run.steps.append(StepRun(index=3, name="ship", status=StepStatus.RUNNING, started_at=at))
    run.steps[3].attempts = [Attempt(number=1, started_at=at + timedelta(seconds=3))]
    assert follower.news(run, at + timedelta(seconds=9)) == [
        "12:00:05.000  run running on host:7:w",
        "12:00:05.000  ship started",
    ]
    run.status, run.wait_until = RunStatus.WAITING, None
    assert follower.news(run, at + timedelta(seconds=9)) == ["12:00:11.000  run waiting"]
    run.status, run.finished_at, run.output = RunStatus.COMPLETED, at + timedelta(seconds=10), 1
    assert follower.news(run, at + timedelta(seconds=60)) == [
        "12:00:12.000  run completed in 12.0s, output 1"
    ]


def test_news_tells_a_runs_end_after_its_steps_ends() -> None:
    """The run's record may say it ended a hair before its last step did (recovery closes the
    run, then its open steps): its end is still told last."""
    run = _run()
    follower = RunFollower(tz=UTC)
    follower.know(run)
    fetch = run.steps[0]
    fetch.status, fetch.finished_at = StepStatus.FAILED, T0 + timedelta(seconds=3, microseconds=900)
    fetch.error = "crashed: its worker died"
    run.status, run.finished_at = RunStatus.CRASHED, T0 + timedelta(seconds=3, microseconds=400)
    run.error = "crashed: its worker died"
    assert follower.news(run, T0 + timedelta(seconds=4)) == [
        "12:00:03.000  fetch failed in 3.0s: crashed: its worker died",
        "12:00:03.000  run crashed in 3.0s: crashed: its worker died",
    ]


def test_news_never_goes_back_in_time_after_a_line_stamped_when_read() -> None:
    """A status line is stamped when the follower read it; a moment of the next read whose
    record time is a hair earlier is told at that line's time, so the lines stay in order."""
    run = _run()
    run.status = RunStatus.QUEUED
    follower = RunFollower(tz=UTC)
    follower.know(run)
    run.status = RunStatus.DELAYED
    read = T0 + timedelta(milliseconds=532)
    assert follower.news(run, read) == ["12:00:00.532  run delayed"]
    run.steps[0].logs.append(
        LogLine(ts=T0 + timedelta(milliseconds=531), level="info", message="late", step=0)
    )
    assert follower.news(run, read) == ["12:00:00.532  info     fetch  late"]
    assert follower.after().line(T0, "next") == "12:00:00.532  next"


def test_news_tells_a_start_that_went_on_to_a_wait_between_two_reads() -> None:
    """Queued at one read, waiting at the next: "run queued", its steps, "run waiting", and
    never the start nor the worker it ran on (PostgreSQL's follower read it so)."""
    run = _run()
    run.status, run.started_at, run.worker = RunStatus.QUEUED, None, None
    follower = RunFollower(tz=UTC)
    follower.know(run)
    run.status, run.started_at, run.worker = RunStatus.WAITING, T0, "vm:1:aa"
    run.steps[0].status = StepStatus.WAITING
    assert follower.news(run, T0 + timedelta(seconds=1)) == [
        "12:00:00.000  run running on vm:1:aa",
        "12:00:00.000  fetch waiting",
        "12:00:01.000  run waiting",
    ]
    assert follower.news(run, T0 + timedelta(seconds=2)) == []  # said once


def test_a_run_that_ended_before_the_first_read_is_told_whole() -> None:
    """`replay --follow` of a run of a moment: the replay ended before the follower first read
    it, and `follow` ended at once without a line of it (no "run completed in"; the CI run at
    6f63011 met it). Followed from nothing told, an ended run's moments are all news."""
    quick = Workflow(
        name="quick", trigger=WorkerTrigger(queue="quick"), steps=[Step("one", lambda ctx: 1)]
    )
    said: list[str] = []

    async def main() -> Run:
        async with Engine(workflows=[quick]) as engine, engine.events() as events:
            run = await engine.wait_for_job(await engine.enqueue("quick", {}), timeout=10)
            with anyio.fail_after(10):
                return await follow(engine, events, run, RunFollower(tz=UTC), said.append)

    run = anyio.run(main)
    assert run.status is RunStatus.COMPLETED
    texts = [line[14:] for line in said]
    assert texts[-1].startswith("run completed in "), said
    assert any(text.startswith("one completed") for text in texts), said
