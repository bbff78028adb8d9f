"""The `blok-tui` command as a user runs it: real subprocesses on a real SQLite file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import anyio
import pytest
from cli_helpers import (
    WORKFLOWS,
    Follower,
    Terminal,
    Worker,
    answered_on_a_terminal,
    blok,
    blok_json,
    cli_env,
    eventually,
    run_of,
    start_worker,
    write_workflows,
)
from support import until

from engine import Engine, __version__


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Worker]]:
    """One worker for the module, on its own database."""
    root = tmp_path_factory.mktemp("cli")
    database = root / "blok.db"
    worker = start_worker(database, write_workflows(root / "workflows"))
    yield database, worker
    assert worker.stop() == 0, worker.stderr()


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("blok-tui: error: "), done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def test_version_and_help() -> None:
    version = blok("--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"blok-tui {__version__}"
    helped = blok("--help")
    assert helped.returncode == 0
    assert "examples:" in helped.stdout
    assert "blok-tui enqueue orders" in helped.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["enqueue", "naps", "{not json"], "argument JSON: not valid JSON"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["runs", "--colour"], "unrecognized arguments: --colour"),
        (["runs", "--status", "finished"], "argument --status: invalid choice: 'finished'"),
        (["enqueue", "naps", "{}", "--delay", "soon"], "argument --delay"),
        (["runs", "--limit", "0"], "must be at least 1"),
        (["cancel"], "give run ids, or filters that choose the runs"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], says: str) -> None:
    done = blok(*args)
    assert done.returncode == 2
    assert says in _one_error_line(done)


@pytest.mark.parametrize(
    "args",
    [
        ["runs"],
        ["show", "1a2b3c4d"],
        ["cancel", "1a2b3c4d"],
        ["replay", "1a2b3c4d"],
        ["where", "1a2b3c4d"],
        ["enqueue", "naps", "{}"],
        ["send", "1a2b3c4d", "approved", "{}"],
        ["schedules"],
        ["schedules", "pause", "orders.ship"],
        ["pause", "naps"],
        ["resume", "naps"],
        ["health"],
        ["attach"],
    ],
    ids=lambda args: "-".join(args[:2]) if args[0] == "schedules" else args[0],
)
def test_memory_on_a_command_that_reads_a_database_is_a_usage_error(
    tmp_path: Path, args: list[str]
) -> None:
    # It read ./.blok/blok.db instead, and said no such database exists (exit 1).
    done = blok("--memory", *args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    line = _one_error_line(done)
    command = args[0]
    assert line == (
        f"blok-tui: error: --memory has no meaning for {command!r}: an in-memory engine's runs "
        f"and queues live in its own process; use --db (see blok-tui {command} --help)"
    )
    assert not (tmp_path / ".blok").exists()


@pytest.mark.parametrize("args", [["runs"], ["enqueue", "naps", "{}"], ["attach"]], ids=str)
def test_workflows_on_a_command_that_reads_a_database_is_a_usage_error(
    tmp_path: Path, args: list[str]
) -> None:
    # It was ignored without a word: the workers that serve the database load the workflows.
    done = blok("--workflows", "flows", *args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    command = args[0]
    assert _one_error_line(done) == (
        f"blok-tui: error: --workflows has no meaning for {command!r}: it reads the database, "
        "and the workers that serve it load the workflows (blok-tui worker --workflows DIR) "
        f"(see blok-tui {command} --help)"
    )
    assert not (tmp_path / ".blok").exists()


def test_memory_is_taken_by_the_worker(tmp_path: Path) -> None:
    worker = start_worker(
        tmp_path / "unused.db", write_workflows(tmp_path / "workflows"), "--memory"
    )
    try:
        assert worker.ready_line.endswith(" on memory"), worker.ready_line
    finally:
        assert worker.stop() == 0, worker.stderr()
    assert not (tmp_path / "unused.db").exists()


def test_enqueue_then_the_run_completes_on_the_worker(served: tuple[Path, Worker]) -> None:
    database, worker = served
    done = blok("enqueue", "naps", '{"seconds": 0.05}', "--priority", "3", "--db", database)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert job_id.startswith("job_")
    run = eventually(lambda: (r := run_of(database, job_id)) and r["status"] == "completed" and r)
    assert run["worker"] == worker.id
    assert run["output"] == {"slept": 0.05}
    assert run["input"] == {"seconds": 0.05}
    assert run["priority"] == 3
    # The table and its filters.
    table = blok("runs", "--status", "completed", "--workflow", "test.nap", "--db", database)
    assert table.returncode == 0
    header, *rows = table.stdout.splitlines()
    assert header.split()[:5] == ["RUN", "WORKFLOW", "QUEUE", "STATUS", "WORKER"]
    assert any(
        row.split()[:5] == [run["id"], "test.nap", "naps", "completed", worker.id] for row in rows
    )
    assert blok_json("runs", "--json", "--status", "failed", "--db", database) == []


def test_enqueue_wait_prints_the_output_or_exits_1_with_the_runs_error(
    served: tuple[Path, Worker],
) -> None:
    """A shell script's `enqueue --wait`: stdout is the run's output as JSON, the status says
    whether it completed, and a failure names the run to look at."""
    database, _ = served
    done = blok("enqueue", "naps", '{"seconds": 0.05}', "--wait", "--db", database)
    assert (done.returncode, done.stdout, done.stderr) == (0, '{"slept": 0.05}\n', "")
    failed = blok("enqueue", "naps", '{"seconds": "soon"}', "--wait", "--db", database)
    assert (failed.returncode, failed.stdout) == (1, "")
    error = _one_error_line(failed)
    run_id = error.split()[3]
    assert error.startswith(f"blok-tui: error: run {run_id} failed: [step 1/1] nap failed: ")
    assert error.endswith(f"(blok-tui show {run_id})")
    assert blok_json("show", run_id, "--json", "--db", database)["status"] == "failed"


def test_replay_wait_and_follow_end_as_enqueues_do_with_the_replays_output_or_error(
    served: tuple[Path, Worker],
) -> None:
    """A failed run fixed with --input: `replay --wait` printed the replay's id and returned,
    and a script polled `show` to learn how it went. Now it waits as `enqueue --wait` does;
    `--follow` tells the replay's moments as `show --follow` does."""
    database, _ = served
    failed = blok("enqueue", "naps", '{"seconds": "later"}', "--wait", "--db", database)
    run_id = failed.stderr.split()[3]
    fixed = blok("replay", run_id, "--input", '{"seconds": 0.01}', "--wait", "--db", database)
    assert fixed.returncode == 0, fixed.stderr
    replayed, output = fixed.stdout.splitlines()
    assert (output, fixed.stderr) == ('{"slept": 0.01}', "")
    assert blok_json("show", replayed, "--json", "--db", database)["replay_of"] == run_id
    again = blok("replay", run_id, "--wait", "--yes", "--db", database)  # the same bad input
    assert again.returncode == 1 and len(again.stdout.splitlines()) == 1
    error = _one_error_line(again)
    assert "failed: [step 1/1] nap failed: " in error and error.endswith(")"), error
    followed = blok("replay", run_id, "--input", '{"seconds": 0}', "-f", "--yes", "--db", database)
    assert followed.returncode == 0, followed.stderr
    lines = followed.stdout.splitlines()
    assert lines[1].endswith(f"following run {lines[0]} (ctrl-c stops following)"), lines
    assert lines[-1].split(maxsplit=1)[1].startswith("run completed in "), lines
    for many in (["--wait"], ["--follow"]):
        refused = blok("replay", run_id, replayed, *many, "--db", database)
        assert refused.returncode == 2 and "one replay: give one RUN_ID" in refused.stderr
        filtered = blok("replay", "--status", "failed", *many, "--yes", "--db", database)
        assert filtered.returncode == 2 and "one replay: give one RUN_ID" in filtered.stderr


def test_a_wait_stopped_with_ctrl_c_names_the_job_that_goes_on(
    served: tuple[Path, Worker],
) -> None:
    """`enqueue --wait` on a slow run, stopped with ctrl-c, ended without a word: nothing named
    the job left running, and the user had no id to follow or cancel it by."""
    database, _ = served
    waiting = Follower("naps", '{"seconds": 60}', "--wait", "--db", database, command=("enqueue",))
    try:
        running = eventually(
            lambda: next(
                (
                    r
                    for r in blok_json("runs", "--json", "--db", database)
                    if r["status"] == "running" and r["input"] == {"seconds": 60}
                ),
                None,
            )
        )
    finally:
        waiting.process.send_signal(signal.SIGINT)
        code, lines, stderr = waiting.finish()
    assert (code, lines) == (130, []), stderr
    job_id = running["job_id"]
    assert stderr == (
        f"blok-tui: stopped waiting; job {job_id} goes on (blok-tui show {job_id} -f; "
        "or cancel it)\n"
    )
    assert blok_json("show", job_id, "--json", "--db", database)["status"] == "running"
    cancelled = blok("cancel", job_id, "--db", database)
    assert cancelled.stdout == f"{running['id']} cancelled\n", cancelled.stderr


def test_a_runs_log_line_on_the_workers_stderr_names_its_run_and_step(
    served: tuple[Path, Worker],
) -> None:
    database, worker = served
    done = blok("enqueue", "naps", '{"seconds": 0.07}', "--wait", "--db", database)
    assert done.returncode == 0, done.stderr
    run_id = blok_json("runs", "--json", "--limit", "1", "--db", database)[0]["id"]
    line = eventually(
        lambda: next((x for x in worker.stderr().splitlines() if "napping 0.07 s" in x), None)
    )
    assert line.endswith(f" INFO blok.run.test.nap [{run_id} nap]: napping 0.07 s"), line
    # A line that is not a run's is as it was.
    kept = next(x for x in worker.stderr().splitlines() if "runs that ended are kept" in x)
    assert kept.endswith(" INFO blok.cli: runs that ended are kept for 7d (--retention)"), kept


def test_a_failed_run_is_a_warning_in_the_workers_log(served: tuple[Path, Worker]) -> None:
    """A headless worker's operator sees failures in its log: one line each, with the run, its
    step, and where the error came from."""
    database, worker = served
    failed = blok("enqueue", "naps", '{"seconds": "later"}', "--wait", "--db", database)
    run_id = failed.stderr.split()[3]  # "blok-tui: error: run RUN_ID failed: ..."
    job_id = blok_json("show", run_id, "--json", "--db", database)["job_id"]
    line = eventually(
        lambda: next(
            (x for x in worker.stderr().splitlines() if f"[{run_id} " in x and "WARNING" in x), None
        )
    )
    assert (
        f" WARNING blok.runs [{run_id} nap]: test.nap failed (no retries: {job_id} moved to "
        "the dead-letter queue): [step 1/1] nap failed: "
    ) in line
    # Where: the nap's line that used the bad value, in the workflow file.
    where = WORKFLOWS.splitlines().index("    with anyio.move_on_after(seconds):") + 1
    assert line.endswith(f"/workflows/naps.py:{where})"), line
    # A run that completed adds no line.
    done = blok("enqueue", "naps", '{"seconds": 0.01}', "--wait", "--db", database)
    assert done.returncode == 0
    assert all("completed" not in x for x in worker.stderr().splitlines() if "blok.runs" in x)


@pytest.mark.anyio
async def test_replaying_a_run_whose_job_went_on_warns_of_the_two(tmp_path: Path) -> None:
    """A failed run whose job was retried: its replay runs the same input beside the job's
    next delivery. `replay` said nothing of it."""
    from engine import RunStatus, Step, WorkerTrigger, Workflow

    def fails(ctx: object) -> None:
        raise RuntimeError("no")

    flow = Workflow(
        name="retried",
        trigger=WorkerTrigger(queue="retried", retries=1, delay="1h"),  # its retry waits
        steps=[Step("fails", fails)],
    )
    database = tmp_path / "blok.db"
    async with Engine(workflows=[flow], database=database) as engine:
        job_id = await engine.enqueue("retried", {})
        await until(lambda: engine.runs(queue="retried", status="failed"))
        failed = await engine.runs(queue="retried", status="failed")
        await engine.flush()
        done = await anyio.to_thread.run_sync(
            lambda: blok("replay", failed[0].id, "--db", database)
        )
        job = await engine.get_job(job_id)
    assert done.returncode == 0, done.stderr
    assert job.run_id != failed[0].id and failed[0].status is RunStatus.FAILED
    assert done.stderr == (
        f"blok-tui: warning: run {failed[0].id}'s job went on as run {job.run_id} (delayed): "
        "the replay runs the same input beside it\n"
    )


def test_queues_dead_letters_requeue_and_workers_from_the_command_line(
    served: tuple[Path, Worker],
) -> None:
    """An operator with only a shell on the server could not list dead letters or requeue one
    (show said to use the console's d), and `where` named a `blok-tui workers` that was not
    there."""
    database, worker = served
    failed = blok("enqueue", "naps", '{"seconds": "later"}', "--wait", "--db", database)
    run_id = failed.stderr.split()[3]  # "blok-tui: error: run RUN_ID failed: ..."
    job_id = blok_json("show", run_id, "--json", "--db", database)["job_id"]
    shown = blok("show", run_id, "--db", database).stdout
    assert (
        f"dead: in the dead-letter queue (blok-tui requeue {job_id} or discard {job_id}, or the "
        "console's d)"
    ) in shown
    dead = blok("dead", "naps", "--db", database)
    assert dead.returncode == 0, dead.stderr
    [row] = [line for line in dead.stdout.splitlines() if line.startswith(job_id)]
    assert run_id in row and "[step 1/1] nap failed:" in row
    queues = {q["name"]: q for q in blok_json("queues", "--json", "--db", database)}
    assert queues["naps"]["dead"] >= 1 and queues["naps"]["workflow_name"] == "test.nap"
    assert "naps" in blok("queues", "--db", database).stdout
    requeued = blok("requeue", job_id, "--db", database)
    assert requeued.returncode == 0, requeued.stderr
    assert requeued.stdout.startswith(f"{job_id} requeued: its new run is run_"), requeued.stdout
    new_run = requeued.stdout.split()[-1]
    # The job's run now (it may have died again: its input is as bad as ever).
    assert blok_json("show", job_id, "--json", "--db", database)["id"] == new_run != run_id
    workers = blok_json("workers", "--json", "--db", database)
    assert [(w["id"], w["alive"]) for w in workers] == [(worker.id, True)]
    assert worker.id in blok("workers", "--db", database).stdout
    unknown = blok("requeue", "job_nope", "--db", database)
    assert unknown.returncode == 1 and _one_error_line(unknown) == (
        "blok-tui: error: unknown job 'job_nope'"
    )


def test_a_dead_letter_replayed_to_completion_is_not_requeued_unless_forced(
    served: tuple[Path, Worker],
) -> None:
    """Fixed and replayed from the console, a dead letter stays one: a requeue (a bulk one
    after the fix) ran its job again, its steps twice, without a word."""
    database, _ = served
    failed = blok("enqueue", "naps", '{"seconds": "later"}', "--wait", "--db", database)
    run_id = failed.stderr.split()[3]
    job_id = blok_json("show", run_id, "--json", "--db", database)["job_id"]
    replay = blok("replay", run_id, "--input", '{"seconds": 0}', "--db", database)
    assert replay.returncode == 0, replay.stderr
    replayed = replay.stdout.split()[-1]
    eventually(
        lambda: blok_json("show", replayed, "--json", "--db", database)["status"] == "completed"
    )
    refused = blok("requeue", job_id, "--db", database)
    assert (refused.returncode, refused.stdout) == (1, "")
    assert _one_error_line(refused) == (
        f"blok-tui: error: job {job_id}: its run {run_id} was replayed as run {replayed}, which "
        "completed; a requeue runs the job again (--force to requeue it anyway)"
    )
    # With another dead letter: that one is requeued, and the refusal does not hide it.
    other = blok("enqueue", "naps", '{"seconds": "later"}', "--wait", "--db", database)
    other_job = blok_json("show", other.stderr.split()[3], "--json", "--db", database)["job_id"]
    both = blok("requeue", job_id, other_job, "--db", database)
    assert both.returncode == 1
    assert both.stdout.startswith(f"{other_job} requeued: its new run is "), both.stdout
    assert both.stderr.splitlines()[-1] == "blok-tui: error: 1 of 2 job(s) requeued, 1 refused"
    forced = blok("requeue", job_id, "--force", "--db", database)
    assert forced.returncode == 0 and forced.stdout.startswith(
        f"{job_id} requeued: its new run is "
    )


def test_a_replay_of_a_run_already_replayed_is_asked_about_or_warned(
    served: tuple[Path, Worker],
) -> None:
    """`replay` of a run a replay had fixed ran its steps once more, without a word: an order
    charged twice (and a third time, with the command run again)."""
    database, _ = served
    failed = blok("enqueue", "naps", '{"seconds": "later"}', "--wait", "--db", database)
    run_id = failed.stderr.split()[3]
    first = blok("replay", run_id, "--input", '{"seconds": 0}', "--db", database)
    assert (first.returncode, first.stderr) == (0, ""), first.stderr
    replayed = first.stdout.split()[-1]
    eventually(
        lambda: blok_json("show", replayed, "--json", "--db", database)["status"] == "completed"
    )
    said = f"run {run_id}: it was replayed as run {replayed}, which completed"
    status, out, shown = answered_on_a_terminal("replay", run_id, "--db", database, answer="n")
    assert (status, out) == (1, ""), shown
    assert f"{said}. Replay it anyway? [y/N] " in shown
    assert f"blok-tui: error: run {run_id} not replayed" in shown
    # With no terminal to ask on (a script), it is said, and done as before.
    again = blok("replay", run_id, "--db", database)
    assert again.returncode == 0 and again.stdout.startswith("run_"), again.stderr
    assert again.stderr == f"blok-tui: warning: {said}; replayed all the same\n"
    quiet = blok("replay", run_id, "--yes", "--db", database)
    assert (quiet.returncode, quiet.stderr) == (0, "")


def test_requeue_takes_a_whole_queue_once_asked_and_a_job_named_twice_once(
    served: tuple[Path, Worker],
) -> None:
    """`discard --queue` existed and `requeue --queue` did not; `requeue X X` requeued X and
    then refused it ("X is waiting"); a requeue on a paused queue said nothing of the pause."""
    database, _ = served
    died = []
    for _ in range(2):
        failed = blok("enqueue", "single", '{"seconds": "later"}', "--wait", "--db", database)
        died.append(blok_json("show", failed.stderr.split()[3], "--json", "--db", database))
    assert blok("pause", "single", "--db", database).returncode == 0
    try:
        _requeue_on_the_paused_queue(database, died[0]["job_id"])
    finally:
        assert blok("resume", "single", "--db", database).returncode == 0


def _requeue_on_the_paused_queue(database: Path, first: str) -> None:
    twice = blok("requeue", first, first, "--db", database)
    assert twice.returncode == 0 and twice.stdout.count(" requeued: ") == 1, twice
    assert twice.stderr == (
        "blok-tui: note: queue 'single' is paused: nothing new starts (blok-tui resume single)\n"
    )
    unasked = blok("requeue", "--queue", "single", "--db", database)
    assert unasked.returncode == 2 and "add --yes" in unasked.stderr, unasked.stderr
    rest = blok("requeue", "--queue", "single", "--yes", "--db", database)
    said = "1 dead letter(s) of queue 'single' requeued\n"
    assert (rest.returncode, rest.stdout) == (0, said), rest.stderr
    assert "is paused" in rest.stderr
    assert blok("dead", "single", "--db", database).stdout == "no dead letters on queue 'single'\n"
    neither = blok("requeue", "--db", database)
    assert neither.returncode == 2 and "give job ids or --queue QUEUE" in neither.stderr


def test_discard_takes_dead_letters_out_one_by_one_or_a_whole_queue(tmp_path: Path) -> None:
    """Dead letters could only be requeued: a queue's failures nobody meant to retry stayed
    in `blok-tui dead` (and the console's list) for ever."""
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"))
    try:
        died = []
        for _ in range(3):
            failed = blok("enqueue", "naps", '{"seconds": "later"}', "--wait", "--db", database)
            died.append(blok_json("show", failed.stderr.split()[3], "--json", "--db", database))
        first = died[0]["job_id"]
        done = blok("discard", first, "job_nope", "--db", database)
        assert (done.returncode, done.stdout) == (1, f"{first} discarded\n")
        assert done.stderr.splitlines() == [
            "blok-tui: error: unknown job 'job_nope'",
            "blok-tui: error: 1 of 2 job(s) discarded, 1 refused",
        ]
        shown = blok("show", died[0]["id"], "--db", database).stdout
        assert "discarded: taken out of the dead-letter queue" in shown, shown
        again = blok("discard", first, "--db", database)
        assert again.returncode == 1 and _one_error_line(again) == (
            f"blok-tui: error: job {first} is cancelled, only dead letters are discarded "
            "(it is no longer in the dead-letter queue)"
        )
        # As the console's dead-letter view shows them: the start of an id, without `job_`.
        second = died[1]["job_id"].removeprefix("job_")
        both = blok("discard", second[:6], "--db", database)
        assert both.returncode == 1 and _one_error_line(both).startswith(
            f"blok-tui: error: '{second[:6]}' is the start of 2 dead letters' ids ("
        )
        short = blok("requeue", second, "--db", database)  # whole, but for its `job_`
        assert short.returncode == 0 and short.stdout.startswith(f"job_{second} requeued")
        assert eventually(lambda: len(blok_json("dead", "naps", "--json", "--db", database)) == 2)
        # A whole queue, for good: asked first; with no terminal to ask on, --yes.
        unasked = blok("discard", "--queue", "naps", "--db", database)
        assert unasked.returncode == 2 and "add --yes" in unasked.stderr, unasked.stderr
        assert len(blok_json("dead", "naps", "--json", "--db", database)) == 2
        rest = blok("discard", "--queue", "naps", "--yes", "--db", database)
        assert (rest.returncode, rest.stdout) == (0, "2 dead letter(s) of queue 'naps' discarded\n")
        assert blok("dead", "naps", "--db", database).stdout == "no dead letters on queue 'naps'\n"
        neither = blok("discard", "--db", database)
        assert neither.returncode == 2 and "give job ids or --queue QUEUE" in neither.stderr
    finally:
        assert worker.stop() == 0, worker.stderr()


def test_enqueue_to_a_queue_whose_workers_stopped_notes_it_waits(tmp_path: Path) -> None:
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"))
    assert worker.stop() == 0, worker.stderr()
    done = blok("enqueue", "naps", '{"seconds": 0}', "--db", database)
    assert done.returncode == 0 and done.stdout.startswith("job_"), done.stderr
    assert done.stderr == (
        "blok-tui: note: no live worker serves queue 'naps': it starts once one does "
        "(blok-tui worker)\n"
    )
    # Followed, it says so once, as the follower tells why the run waits.
    followed = Follower("naps", '{"seconds": 0}', "-f", "--db", database, command=("enqueue",))
    try:
        lines = followed.read_until("why: ")
    finally:
        followed.process.kill()
        followed.process.wait()
    assert lines[-1].endswith(
        " why: no live worker serves queue 'naps': it starts once one does (blok-tui worker)"
    ), lines
    assert followed.process.stderr is not None and "note" not in followed.process.stderr.read()


def test_a_filter_by_a_name_no_worker_declared_is_refused(served: tuple[Path, Worker]) -> None:
    """It printed "no runs (…)" and exited 0, and `--json` printed `[]`: a script could not
    tell a typo from an empty queue (the CONTRACT: an unknown queue exits non-zero)."""
    database, _ = served
    for args in (("runs",), ("runs", "--json"), ("runs", "--follow")):
        typo = blok(*args, "--workflow", "test.npa", "--db", database)
        assert (typo.returncode, typo.stdout) == (1, ""), typo
        assert typo.stderr == (
            "blok-tui: error: unknown workflow 'test.npa' (no worker declared it and no run has "
            "it; did you mean 'test.nap'?)\n"
        )
    # The first part of a dotted name is too short for a close match: both are named.
    part = blok("runs", "--workflow", "test", "--db", database)
    assert part.stderr.endswith("has it; did you mean one of 'test.nap', 'test.single'?)\n"), (
        part.stderr
    )
    queue = blok("runs", "--queue", "nasp", "--db", database)
    assert (queue.returncode, queue.stdout) == (1, "")
    assert (
        "unknown queue 'nasp' (no worker declared it and no run has it; did you mean 'naps'?)"
        in (queue.stderr)
    )
    # A known name with nothing to show is just that.
    none = blok("runs", "--queue", "single", "--status", "crashed", "--db", database)
    assert (none.returncode, none.stdout) == (0, "no runs\n")


def test_a_reader_that_stops_reading_gets_no_traceback(served: tuple[Path, Worker]) -> None:
    """`blok-tui runs | head`: once the reader has gone, the command stops quietly with the
    status of a process killed by SIGPIPE, as `git log | head` does, not with a traceback."""
    database, _ = served
    assert blok("enqueue", "naps", '{"seconds": 0}', "--db", database).returncode == 0
    for args in (["runs"], ["runs", "--json"]):
        read, write = os.pipe()
        os.close(read)  # gone before the command writes a byte
        try:
            done = subprocess.run(
                [sys.executable, "-m", "blok_tui", *args, "--db", str(database)],
                stdout=write,
                stderr=subprocess.PIPE,
                text=True,
                timeout=30,
                env=cli_env(),
            )
        finally:
            os.close(write)
        assert (done.returncode, done.stderr) == (141, ""), args


def test_delayed_enqueue_waits_its_delay(served: tuple[Path, Worker]) -> None:
    database, _ = served
    done = blok("enqueue", "naps", '{"seconds": 0}', "--delay", "1500ms", "--db", database)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    run = eventually(lambda: (r := run_of(database, job_id)) and r["status"] == "completed" and r)
    created = datetime.fromisoformat(run["created_at"])
    started = datetime.fromisoformat(run["started_at"])
    assert (started - created).total_seconds() >= 1.5


def test_an_enqueue_whose_payload_lacks_a_field_its_workflow_reads_warns(
    served: tuple[Path, Worker],
) -> None:
    # `$.body.seconds` missing: the step fails with "bad input", every retry alike. The job is
    # enqueued all the same (a branch not taken may be what reads it); its id alone on stdout.
    database, _ = served
    lacking = blok("enqueue", "naps", '{"second": 1}', "--db", database)
    assert lacking.returncode == 0, lacking.stderr
    assert lacking.stdout.strip().startswith("job_")
    assert lacking.stderr == (
        "blok-tui: warning: the payload has no $.body.seconds, which test.nap reads: the step"
        ' that reads it fails with "bad input" (unless in a branch the run does not take)\n'
    )
    run = eventually(lambda: (r := run_of(database, lacking.stdout.strip())) and r["error"] and r)
    assert "$.body has no key 'seconds'" in run["error"]  # what the warning said would come
    whole = blok("enqueue", "naps", '{"seconds": 0}', "--db", database)
    assert whole.returncode == 0 and whole.stderr == "", whole.stderr


def test_runs_since_a_duration_lists_the_runs_created_in_it(served: tuple[Path, Worker]) -> None:
    database, _ = served
    job_id = blok("enqueue", "naps", '{"seconds": 0}', "--db", database).stdout.strip()
    run = eventually(lambda: (r := run_of(database, job_id)) and r["status"] == "completed" and r)
    recent = blok_json("runs", "--since", "1h", "--json", "--limit", "500", "--db", database)
    assert run["id"] in [r["id"] for r in recent]
    # A window that closed before this command started (a process takes far longer than 1ms
    # to start): the run was created before it.
    none = blok("runs", "--since", "1ms", "--queue", "naps", "--db", database)
    assert none.returncode == 0, none.stderr
    assert none.stdout.startswith("no runs created since "), none.stdout
    bad = blok("runs", "--since", "1w", "--db", database)
    assert bad.returncode == 2 and "cannot parse duration '1w'" in bad.stderr
    following = blok("runs", "--follow", "--json", "--since", "1h", "--db", database)
    assert following.returncode == 2 and "--follow --json lists none" in following.stderr


def test_cancel_a_running_run_from_the_command_line(served: tuple[Path, Worker]) -> None:
    database, worker = served
    job_id = blok("enqueue", "naps", '{"seconds": 30}', "--db", database).stdout.strip()
    run = eventually(lambda: (r := run_of(database, job_id)) and r["status"] == "running" and r)
    done = blok("cancel", run["id"], "--db", database)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{run['id']} cancelled"
    after = run_of(database, job_id)
    assert after is not None and after["status"] == "cancelled"
    assert after["worker"] == worker.id
    # Cancelling it again is refused: it has ended.
    again = blok("cancel", run["id"], "--db", database)
    assert again.returncode == 1
    assert "has already ended (cancelled)" in _one_error_line(again)


def test_replay_starts_a_new_run_with_the_same_input(served: tuple[Path, Worker]) -> None:
    database, _ = served
    job_id = blok("enqueue", "naps", '{"seconds": 0.01}', "--db", database).stdout.strip()
    source = eventually(
        lambda: (r := run_of(database, job_id)) and r["status"] == "completed" and r
    )
    done = blok("replay", source["id"], "--db", database)
    assert done.returncode == 0, done.stderr
    new_id = done.stdout.strip()

    def replayed() -> dict | None:
        runs = blok_json("runs", "--json", "--db", database)
        return next((r for r in runs if r["id"] == new_id and r["status"] == "completed"), None)

    run = eventually(replayed)
    assert run["replay_of"] == source["id"]
    assert run["input"] == source["input"]
    assert done.stderr == ""
    # An input of its own that lacks what the step reads: replayed, and said to fail.
    edited = blok("replay", source["id"], "--input", '{"secs": 1}', "--yes", "--db", database)
    assert edited.returncode == 0, edited.stderr
    assert "blok-tui: warning: the payload has no $.body.seconds, which test.nap reads" in (
        edited.stderr
    )


def test_refusals_exit_1_with_one_clear_line(served: tuple[Path, Worker], tmp_path: Path) -> None:
    database, _ = served
    unknown_queue = blok("enqueue", "nowhere", "{}", "--db", database)
    assert unknown_queue.returncode == 1
    assert "unknown queue 'nowhere' (queues: naps, single" in _one_error_line(unknown_queue)

    unknown_run = blok("cancel", "run_missing", "--db", database)
    assert unknown_run.returncode == 1
    assert _one_error_line(unknown_run) == "blok-tui: error: unknown run 'run_missing'"
    assert blok("replay", "run_missing", "--db", database).returncode == 1

    job_id = blok("enqueue", "naps", '{"seconds": 0}', "--db", database).stdout.strip()
    finished = eventually(
        lambda: (r := run_of(database, job_id)) and r["status"] == "completed" and r
    )
    refused = blok("cancel", finished["id"], "--db", database)
    assert refused.returncode == 1
    assert "has already ended (completed); nothing to cancel" in _one_error_line(refused)

    not_sqlite = tmp_path / "notes.db"
    not_sqlite.write_text("these are my notes, not a database\n" * 20)
    garbage = blok("runs", "--db", not_sqlite)
    assert garbage.returncode == 1
    assert "not a usable SQLite database" in _one_error_line(garbage)

    no_folder = blok("worker", "--workflows", tmp_path / "nowhere", "--db", tmp_path / "w.db")
    assert no_folder.returncode == 1
    assert "no such workflows folder" in _one_error_line(no_folder)

    missing = blok("runs", "--db", tmp_path / "nope.db")
    assert missing.returncode == 1
    assert "no such database" in _one_error_line(missing)
    assert not (tmp_path / "nope.db").exists()


def test_sigterm_drains_and_the_queue_outlives_the_worker(tmp_path: Path) -> None:
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"), "--grace", "5")
    # A 3 s nap, well inside the 5 s grace: each `run_of` is a CLI process (about 1 s on a
    # slow machine), and a poll has to land while the run is still running.
    job_id = blok("enqueue", "naps", '{"seconds": 3}', "--db", database).stdout.strip()
    eventually(lambda: (r := run_of(database, job_id)) and r["status"] == "running")
    assert worker.stop(timeout=10) == 0
    assert "SIGTERM: draining" in worker.stderr()
    assert "handed back" not in worker.stderr()  # it finished within the grace
    run = run_of(database, job_id)
    assert run is not None and run["status"] == "completed", run  # finished within the grace
    # No worker now: the job is written to the durable queue, and the next worker runs it.
    later = blok("enqueue", "naps", '{"seconds": 0}', "--db", database)
    assert later.returncode == 0, later.stderr
    later_id = later.stdout.strip()
    assert (run_of(database, later_id) or {}).get("status") == "queued"
    assert blok("enqueue", "nowhere", "{}", "--db", database).returncode == 1
    # A job nobody holds is cancelled in the database itself.
    doomed = blok("enqueue", "naps", '{"seconds": 0}', "--db", database).stdout.strip()
    doomed_run = run_of(database, doomed)
    assert doomed_run is not None
    cancelled = blok("cancel", doomed_run["id"], "--db", database)
    assert cancelled.stdout.strip() == f"{doomed_run['id']} cancelled", cancelled.stderr
    second = start_worker(database, tmp_path / "workflows")
    try:
        run = eventually(
            lambda: (r := run_of(database, later_id)) and r["status"] == "completed" and r
        )
        assert run["worker"] == second.id
        assert (run_of(database, doomed) or {}).get("status") == "cancelled"  # never ran
    finally:
        assert second.stop() == 0


def _cell(table: str, column: str, row_start: str) -> str:
    """The text under `column` in the row that starts with `row_start`, of a table the CLI
    printed (its columns line up under the header's names)."""
    lines = table.splitlines()
    header = next(line for line in lines if column in line.split())
    names = header.split()
    start = header.index(column)
    after = names.index(column) + 1
    end = header.index(names[after], start) if after < len(names) else None
    row = next(line for line in lines if line.startswith(row_start))
    return row[start:end].strip()


def test_a_run_a_stop_sent_back_to_the_queue_shows_no_clock_running(tmp_path: Path) -> None:
    # Its record says queued, still naming the stopped worker, with no end: its DURATION in
    # `runs` and its step's TOOK in `show` grew (7.9s, then 16.6s) while nobody ran it.
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"), "--grace", "0.2")
    job_id = blok("enqueue", "naps", '{"seconds": 60}', "--db", database).stdout.strip()
    run = eventually(lambda: (r := run_of(database, job_id)) and r["status"] == "running" and r)
    eventually(
        lambda: (
            blok_json("show", run["id"], "--json", "--db", database)["steps"][0]["status"]
            == "running"
        )
    )
    assert worker.stop(timeout=10) == 0, worker.stderr()
    stopped = run_of(database, job_id)
    assert stopped is not None and stopped["status"] == "queued" and stopped["started_at"]
    # The worker's log names the job it handed back ("draining", then "stopped", had not).
    assert (
        "1 running job(s) did not finish within the grace of 0.2s: stopped, recorded where they "
        "stopped and handed back to the queue, to go on from there: "
        f"{job_id} (test.nap, run {run['id']})"
    ) in worker.stderr()

    def shown() -> tuple[str, str]:
        table = blok("runs", "--db", database)
        show = blok("show", run["id"], "--db", database)
        assert table.returncode == 0 and show.returncode == 0, table.stderr + show.stderr
        return _cell(table.stdout, "DURATION", run["id"]), _cell(show.stdout, "TOOK", "nap ")

    duration, took = shown()
    time.sleep(1.5)
    assert shown() == (duration, took)
    assert duration == "-"  # a listing has no steps to say how long it ran
    assert took.endswith(("ms", "s")), took  # the nap ran until the stop, and no longer


def test_two_workers_on_one_database_both_consume(tmp_path: Path) -> None:
    database = tmp_path / "blok.db"
    folder = write_workflows(tmp_path / "workflows")
    first = start_worker(database, folder, name="first")
    second = start_worker(database, folder, name="second")
    try:
        # `single` takes one job at a time: while one worker holds the first job (2 s), only
        # the other can take the second.
        jobs = [
            blok("enqueue", "single", '{"seconds": 2}', "--db", database).stdout.strip()
            for _ in range(2)
        ]

        def all_done() -> list | None:
            runs = [r for r in blok_json("runs", "--json", "--db", database) if r["job_id"] in jobs]
            done = len(runs) == 2 and all(r["status"] == "completed" for r in runs)
            return runs if done else None

        runs = eventually(all_done, timeout=15)
        assert {r["worker"] for r in runs} == {first.id, second.id}
        workers, queues = anyio.run(_attached_view, database)
        assert workers == sorted([first.id, second.id])
        assert queues["single"] == 2  # one slot on each worker
        assert queues["naps"] == 8
    finally:
        assert first.stop() == 0
        assert second.stop() == 0


def test_python_dash_m_and_the_entry_point_agree() -> None:
    script = Path(sys.executable).parent / "blok-tui"
    if not script.exists():
        pytest.skip("the blok-tui script is not installed in this environment")
    done = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == f"blok-tui {__version__}"


async def _attached_view(database: Path) -> tuple[list[str], dict[str, int]]:
    """What an attached console sees: the live workers, and each queue's total width."""
    async with Engine(database=database, create=False, follow=False) as engine:
        workers = sorted(w.id for w in await engine.live_workers())
        return workers, {q.name: q.concurrency for q in await engine.queues()}


def test_defaults_local_workflows_else_the_bundled_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    import examples
    from blok_tui.cli import _database, _workflows

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BLOK_DB", raising=False)
    none = argparse.Namespace(workflows=None, db=None)
    assert _workflows(none) == (Path(examples.__file__).parent, True)
    assert _database(none) == Path(".blok/blok.db")
    (tmp_path / "workflows").mkdir()
    assert _workflows(none) == (Path("workflows"), False)
    monkeypatch.setenv("BLOK_DB", "elsewhere.db")
    assert _database(none) == Path("elsewhere.db")
    assert _database(argparse.Namespace(db="given.db")) == Path("given.db")


@pytest.mark.parametrize("command", [(), ("worker",)])
def test_the_bundled_demo_serves_no_database_of_the_users(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """From a folder with no ./workflows, `blok-tui --db prod.db` served the demo on it: its
    orders.pipeline took over the user's `orders` queue and its producer wrote demo jobs."""
    done = blok(*command, "--db", tmp_path / "prod.db", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(
        f"blok-tui: error: no ./workflows in {tmp_path}: give --workflows DIR to serve "
        f"{tmp_path / 'prod.db'} (the bundled demo serves only the default database, "
        ".blok/blok.db, or --memory)"
    )
    assert list(tmp_path.iterdir()) == []


def test_pause_and_resume_from_the_command_line(served: tuple[Path, Worker]) -> None:
    database, _ = served
    done = blok("pause", "naps", "--db", database)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "naps paused"
    enqueued = blok("enqueue", "naps", '{"seconds": 0}', "--db", database)
    job_id = enqueued.stdout.strip()
    # Said, as for a queue no worker serves: `--wait` hung there without a word.
    assert enqueued.stderr == (
        "blok-tui: note: queue 'naps' is paused: nothing new starts (blok-tui resume naps)\n"
    )
    # A paused queue still takes jobs but claims none: give the worker time to prove it.
    with pytest.raises(AssertionError, match="still not true"):
        eventually(
            lambda: (r := run_of(database, job_id)) and r["status"] == "completed", timeout=1.5
        )
    assert blok("resume", "naps", "--db", database).stdout.strip() == "naps resumed"
    eventually(lambda: (r := run_of(database, job_id)) and r["status"] == "completed")
    unknown = blok("pause", "nowhere", "--db", database)
    assert unknown.returncode == 1
    assert "unknown queue 'nowhere'" in _one_error_line(unknown)


def test_a_workers_banner_names_the_queues_it_serves_not_the_databases(tmp_path: Path) -> None:
    """On a database another worker serves, the banner listed every queue of the database (an
    empty workflows folder "served" them all)."""
    database = tmp_path / "blok.db"
    first = start_worker(database, write_workflows(tmp_path / "workflows"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "other.py").write_text(
        "from engine import Step, WorkerTrigger, Workflow\n"
        "workflow = Workflow(name='other', trigger=WorkerTrigger(queue='other'),\n"
        "                    steps=[Step('one', lambda ctx: 1)])\n"
    )
    (tmp_path / "empty").mkdir()
    try:
        second = start_worker(database, tmp_path / "other", name="second")
        empty = start_worker(database, tmp_path / "empty", name="empty")
        try:
            assert (
                first.ready_line
                == f"blok worker {first.id} serving queues naps, single on {database}"
            )
            assert (
                second.ready_line == f"blok worker {second.id} serving queues other on {database}"
            )
            assert empty.ready_line == f"blok worker {empty.id} serving queues (none) on {database}"
            # Its log says which version of each it runs: a deploy checks what it started.
            ran = [line for line in second.stderr().splitlines() if "workflows: " in line]
            assert [line.split("workflows: ")[1] for line in ran] == [
                f"other@{_version_of(tmp_path / 'other' / 'other.py', 'other')} (queue other)"
            ]
            assert "workflows: " not in empty.stderr()
        finally:
            assert second.stop() == 0, second.stderr()
            assert empty.stop() == 0, empty.stderr()
    finally:
        assert first.stop() == 0, first.stderr()


@pytest.mark.parametrize("command", [(), ("attach",)])
def test_the_console_without_a_terminal_says_so(
    tmp_path: Path, served: tuple[Path, Worker], command: tuple[str, ...]
) -> None:
    """Run from a pipe, a service or cron, it drew its screen into stderr and hung until
    killed."""
    database, _ = served
    db = ("--db", str(database)) if command else ()
    done = subprocess.run(
        [sys.executable, "-m", "blok_tui", *command, *db],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=cli_env(),
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert _one_error_line(done).startswith(
        "blok-tui: error: the console needs a terminal (its input and output); "
    )
    assert list(tmp_path.iterdir()) == []  # nothing made for a console that cannot start


def test_the_attached_consoles_header_names_its_database_once(
    tmp_path: Path, served: tuple[Path, Worker]
) -> None:
    # "blok-tui · attached to /…/blok.db › queues      db /…/blok.db": a PostgreSQL URL
    # twice in one line, and at 80 columns the title, the view's name with it, cut away.
    database, _ = served
    console = Terminal(tmp_path, "-m", "blok_tui", "attach", "--db", str(database))
    try:
        eventually(lambda: "naps" in console.text, timeout=30)
        assert "blok-tui · attached" in console.text and f"db {database}" in console.text
        assert f"attached to {database}" not in console.text  # in any frame drawn
    finally:
        console.type("q")
        assert console.finish() == 0


def _version_of(path: Path, name: str) -> str:
    """The version the loader gives the workflow `name` of the file at `path`."""
    from engine.loader import load_file

    return next(w.version for w in load_file(path).workflows if w.name == name)


FIXED_FLOW = """
from engine import Step, WorkerTrigger, Workflow
workflow = Workflow(name="fixed", trigger=WorkerTrigger(queue="fixed"),
                    steps=[Step("s", lambda ctx: 1)])
"""


def test_a_worker_on_a_folder_with_no_workflow_says_it_has_no_queue_to_serve(
    tmp_path: Path,
) -> None:
    # `--workflows` given the wrong folder: "serving queues (none)", and nothing more.
    folder = tmp_path / "flows"
    folder.mkdir()
    worker = start_worker(tmp_path / "blok.db", folder)
    assert worker.stop() == 0
    assert (
        f"no queue to serve: {folder} holds no workflow with a WorkerTrigger (the .py files "
        "directly in it); each is served once it is saved there"
    ) in worker.stderr_path.read_text()


def test_a_worker_with_no_watch_whose_every_file_failed_exits_1(tmp_path: Path) -> None:
    """It served nothing, for good, alive and registered: a supervisor saw a healthy worker.
    With watching (the default) it waits for the fix; one file of several failing is served
    around, as before."""
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "broken.py").write_text("from engine import Workflow\nworkflow = Workflow(name=1)\n")
    database = tmp_path / "blok.db"
    done = blok("worker", "--no-watch", "--workflows", folder, "--db", database, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "workflows/broken.py:2" in done.stderr  # its error, above
    assert done.stderr.rstrip().splitlines()[-1] == (
        f"blok-tui: error: nothing to serve: every workflow file in {folder} failed to load "
        "(1; their errors are above), and --no-watch waits for no fix"
    )
    assert blok("workers", "--db", database).stdout.strip() == "no workers registered"
    # Watching, it waits for the fix, and says so (it said "serving queues (none)" alone).
    worker = start_worker(database, folder)
    try:
        (folder / "broken.py").write_text(FIXED_FLOW)
        eventually(lambda: "reloaded" in worker.stderr_path.read_text(), timeout=30)
    finally:
        assert worker.stop() == 0
    said = worker.stderr_path.read_text()
    assert worker.ready_line.endswith(f"serving queues (none) on {database}"), worker.ready_line
    assert (
        f"no workflow loaded: every workflow file in {folder} failed (their errors are above); "
        "each is served once it is fixed and saved"
    ) in said, said
