"""`blok-tui show RUN_ID`: one run as the console's run screen shows it, as text, from the
database a worker wrote; and the text itself, for runs in each state."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
from cli_helpers import blok, blok_json, cli_env

from blok_tui.run_text import run_text
from engine import Engine, JobState, Run, RunQueued, RunStatusChanged, WaitReason
from engine.ledger import make_job
from engine.records import assign

SHOP = """
from engine import Retry, Step, WorkerTrigger, Workflow, for_each, try_catch


def check(ctx):
    ctx.logger.info("checking order %s", ctx.body["order"])
    return {"ok": True}


def pack(ctx, item):
    return {"packed": item}


def risky(ctx):
    raise LookupError("no such warehouse")


def charge(ctx):
    ctx.logger.warning("card refused\\nsecond line of the message")
    raise ValueError(f"card declined on try {ctx.attempt}")


workflow = Workflow(
    name="shop.charge",
    trigger=WorkerTrigger(queue="charges"),
    steps=[
        Step("check", check),
        for_each("items", "$.body.items", steps=[Step("pack", pack, inputs={"item": "$.state.items.item"})]),
        try_catch("safe", try_=[Step("risky", risky)], catch=[Step("recover", lambda ctx: 1)]),
        Step("charge", charge, retry=Retry(max_attempts=3, min_timeout="1ms")),
    ],
)
"""


def _show(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    # From the folder above the workflows: a traceback's paths are shown relative to it.
    return subprocess.run(
        [sys.executable, "-m", "blok_tui", "show", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=30,
        env=cli_env(),
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    root = tmp_path_factory.mktemp("show")
    (root / "workflows").mkdir()
    (root / "workflows" / "shop.py").write_text(SHOP)
    database = root / "blok.db"

    async def run_two() -> list[Run]:
        async with Engine(workflows=root / "workflows", database=database) as engine:
            jobs = [
                await engine.enqueue("charges", {"order": order, "items": ["pen", "ink"]})
                for order in ("A1", "B2")
            ]
            return [await engine.wait_for_job(job, timeout=20) for job in jobs]

    run, other = anyio.run(run_two)
    assert str(run.status) == "failed", run.error
    assert other.id != run.id
    return database, run


def test_show_prints_the_run_its_steps_in_order_its_failures_and_its_log(
    failed_run: tuple[Path, Run],
) -> None:
    database, run = failed_run
    done = _show(run.id, "--db", database, cwd=database.parent)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    facts, steps, failures, log = text.split("\n\n")
    assert facts.splitlines()[:3] == [
        f"run        {run.id}",
        f"status     failed: {run.error}",
        f"workflow   shop.charge  version {run.workflow_version}",
    ]
    assert (
        f"job        {run.job_id}  dead: in the dead-letter queue (blok-tui requeue {run.job_id}"
        in facts
    )
    assert "queue      charges\n" in facts  # one delivery: nothing to count
    assert 'input      {"order": "A1", "items": ["pen", "ink"]}' in facts
    assert "replay of" not in facts
    # The rail's order and nesting: each iteration and arm under its parent, indented.
    names = [line[:12].rstrip() for line in steps.splitlines()[1:]]
    assert names == [
        "check",
        "items",
        "  iteration",  # "iteration 1:" cut at 12 columns
        "    pack",
        "  iteration",
        "    pack",
        "safe",
        "  try:",
        "    risky",
        "  catch:",
        "    recover",
        "charge",
    ], steps
    charge_row = steps.splitlines()[-1].split()
    assert charge_row[:2] == ["charge", "failed"]
    assert "3/3" in charge_row and "ValueError:" in charge_row
    # Every failed attempt in a line; the last one of each step with its traceback, folded to
    # the user's file.
    lines = failures.splitlines()
    assert lines[0] == "FAILED ATTEMPTS"
    # A nested step by its path: its name alone named any of a for_each's iterations' steps.
    assert lines[1].startswith("safe › try › risky, attempt 1: failed")
    assert "LookupError: no such warehouse" in lines[1]
    tried = [line for line in lines if line.startswith("charge, attempt")]
    assert [line.split(":")[0] for line in tried] == [f"charge, attempt {n}" for n in (1, 2, 3)]
    assert "ValueError: card declined on try 1; next in 1ms" in tried[0]
    raised = 1 + SHOP.splitlines().index(
        '    raise ValueError(f"card declined on try {ctx.attempt}")'
    )
    assert f'File "workflows/shop.py", line {raised}, in charge' in failures
    assert "engine frame" in failures and "/engine/" not in failures
    # The log in the order written, each line with its step; a second line of a message under
    # the first one's text.
    log_lines = log.splitlines()
    assert log_lines[0] == f"LOG ({datetime.now().astimezone().strftime('%Z')})"  # the zone
    assert "  info     check   checking order A1" in log_lines[1]
    refused = [n for n, line in enumerate(log_lines) if "card refused" in line]
    assert len(refused) == 3
    after = log_lines[refused[0] + 1]
    assert after.strip() == "second line of the message"
    assert after.index("second") == log_lines[refused[0]].index("card refused")


def test_show_json_is_the_whole_record_and_an_unknown_run_is_one_line(
    failed_run: tuple[Path, Run],
) -> None:
    database, run = failed_run
    whole = json.loads(blok("show", run.id, "--json", "--db", database).stdout)
    assert whole["id"] == run.id
    charge = next(step for step in whole["steps"] if step["name"] == "charge")
    assert [a["status"] for a in charge["attempts"]] == ["failed"] * 3
    assert "Traceback" in charge["attempts"][-1]["traceback"]
    missing = blok("show", "run_nope", "--db", database)
    assert missing.returncode == 1
    assert missing.stderr.strip() == "blok-tui: error: unknown run 'run_nope'"
    assert missing.stdout == ""


def _run(status: str, **fields: object) -> Run:
    start = datetime(2026, 1, 15, 9, 30, tzinfo=UTC)
    record: dict[str, object] = {
        "id": "run_1",
        "workflow_name": "orders.ship",
        "workflow_version": "abc",
        "queue": "orders",
        "job_id": "job_1",
        "status": status,
        "created_at": start,
        "started_at": start,
        "input": {"order": "A1"},
    }
    record.update(fields)
    return Run.model_validate(record)


def test_a_live_run_shows_how_long_it_has_run_and_what_its_steps_wait_for() -> None:
    start = datetime(2026, 1, 15, 9, 30, tzinfo=UTC)
    now = start + timedelta(seconds=75)
    running = _run(
        "running",
        steps=[
            {
                "index": 0,
                "name": "prepare",
                "status": "completed",
                "started_at": start,
                "finished_at": start + timedelta(milliseconds=120),
                "attempts": [{"number": 1, "status": "completed", "started_at": start}],
            },
            {
                "index": 1,
                "name": "ship",
                "status": "running",
                "started_at": start,
                "max_attempts": 4,
                "attempts": [{"number": 1, "status": "running", "started_at": start}],
            },
        ],
    )
    text = run_text(running, now, tz=UTC)
    assert "running    for 1m15s\n" in text
    # Within 3× its workflow's usual time: nothing more; past it, how far and what to type.
    assert "running    for 1m15s\n" in run_text(running, now, usual=30.0, tz=UTC)
    assert (
        "running    for 1m15s, 75× its workflow's usual 1.0s: stuck? "
        f"(blok-tui where {running.id} says where it is)\n"
    ) in run_text(running, now, usual=1.0, tz=UTC)
    # No run of its workflow completed: stuck past 10 minutes, as `runs --stuck` has it.
    assert (
        "running    for 11m15s, and no run of its workflow has completed: stuck? "
        f"(blok-tui where {running.id} says where it is)\n"
    ) in run_text(running, now + timedelta(minutes=10), tz=UTC)
    assert "finished" not in text and "output" not in text
    rows = [line.split() for line in text.split("\n\n")[1].splitlines()]
    assert rows[1] == ["prepare", "completed", "120ms", "1"]
    assert rows[2] == ["ship", "running", "1m15s", "1/4"]
    waiting = _run(
        "waiting",
        wait_until=start + timedelta(hours=1),
        steps=[
            {
                "index": 0,
                "name": "approval",
                "kind": "wait",
                "status": "waiting",
                "started_at": start,
                "wait_until": start + timedelta(hours=1),
            }
        ],
    )
    text = run_text(waiting, now, tz=UTC)
    assert "waits      until 2026-01-15 10:30:00 UTC" in text
    assert text.split("\n\n")[1].splitlines()[1].split() == [
        "approval",
        "waiting",
        "1m15s",
        "until",
        "2026-01-15",
        "10:30:00",
        "UTC",
    ]


def test_a_timed_out_steps_note_says_it_once() -> None:
    start = datetime(2026, 1, 15, 9, 30, tzinfo=UTC)
    error = "TimeoutError: timed out after 200ms (max_duration)"
    run = _run(
        "timed_out",
        steps=[
            {
                "index": 0,
                "name": "upload",
                "status": "failed",
                "timed_out": True,
                "error": error,
                "started_at": start,
                "finished_at": start + timedelta(milliseconds=200),
            }
        ],
    )
    step_rows = run_text(run, start, tz=UTC).split("\n\n")[1].splitlines()
    assert step_rows[1].split(None, 3)[3] == error


def test_an_event_waits_note_says_whether_its_event_came_or_its_timeout_passed() -> None:
    """An event wait completes either way (its payload, or None at its timeout): the table
    said "completed" and nothing more, the run view says which."""
    start = datetime(2026, 1, 15, 9, 30, tzinfo=UTC)
    deadline = start + timedelta(seconds=30)

    def review(status: str, output: object, finished: datetime | None) -> str:
        step = {
            "index": 0,
            "name": "review",
            "kind": "event",
            "status": status,
            "input": {"event": "reviewed"},
            "output": output,
            "started_at": start,
            "finished_at": finished,
            "wait_until": deadline,
        }
        run_status = "waiting" if status == "waiting" else "completed"
        text = run_text(_run(run_status, steps=[step]), deadline, tz=UTC)
        return " ".join(text.split("\n\n")[1].splitlines()[1].split()[3:])

    assert review("completed", None, deadline) == (
        "no event 'reviewed' before its timeout at 09:30:30"
    )
    assert review("completed", {"ok": True}, start + timedelta(seconds=12)) == (
        "got event 'reviewed' at 09:30:12"
    )
    assert review("waiting", None, None) == (
        "waits for event 'reviewed' until 2026-01-15 09:30:30 UTC"
    )


def test_the_steps_an_ended_run_never_reached_say_so() -> None:
    """A cancelled run's later steps read "pending", as if still to come."""
    start = datetime(2026, 1, 15, 9, 30, tzinfo=UTC)
    steps = [
        {"index": 0, "name": "pack", "status": "cancelled", "started_at": start},
        {"index": 1, "name": "ship", "status": "pending"},
    ]
    cancelled = run_text(_run("cancelled", steps=steps), start, tz=UTC)
    assert cancelled.split("\n\n")[1].splitlines()[2].split() == [
        "ship",
        "pending",
        "not",
        "reached",
    ]
    running = run_text(_run("running", steps=steps), start, tz=UTC)
    assert running.split("\n\n")[1].splitlines()[2].split() == ["ship", "pending"]


def test_a_long_error_keeps_where_it_came_from_and_a_gates_says_its_status_once() -> None:
    """Cut at 200 characters, the error lost its "(at file:line)"; a throttled run read
    `throttled: throttled: rate limit …`."""
    start = datetime(2026, 1, 15, 9, 30, tzinfo=UTC)
    long = "[step 1/1] tick failed: " + "why " * 80 + "(at workflows/nan.py:11)"
    status = run_text(_run("failed", error=long), start, tz=UTC).splitlines()[1]
    assert status.startswith("status     failed: [step 1/1] tick failed: why why")
    assert status.endswith("… (at workflows/nan.py:11)") and len(status) <= 11 + 208
    throttled = _run("throttled", error="throttled: rate limit: 1/1 runs started in the last 2s")
    status = run_text(throttled, start, tz=UTC).splitlines()[1]
    assert status == "status     throttled: rate limit: 1/1 runs started in the last 2s"


def test_a_retried_delivery_points_to_the_one_that_runs_now() -> None:
    start = datetime(2026, 1, 15, 9, 30, tzinfo=UTC)
    first = _run("failed", job_attempt=1, finished_at=start, error="boom")
    job = make_job(
        queue="orders",
        workflow_name="orders.ship",
        payload={"order": "A1"},
        headers=None,
        priority=0,
        run_at=None,
        max_retries=2,
        job_id="job_1",
    )
    assign(job, state=JobState.ACTIVE, attempts=2, run_id="run_2")
    text = run_text(first, start, job=job, tz=UTC)
    assert "queue      orders  delivery 1 of 3\n" in text
    assert "job        job_1  active: its delivery 2 is run run_2\n" in text
    assert "job        job_1  (no longer kept)" in run_text(first, start, tz=UTC)


def test_what_a_run_wrote_cannot_drive_the_terminal_and_long_values_are_cut() -> None:
    start = datetime(2026, 1, 15, 9, 30, tzinfo=UTC)
    run = _run(
        "failed",
        error="boom \x1b[2J cleared",
        input={"blob": "x" * 1000},
        finished_at=start + timedelta(seconds=2),
        logs=[{"ts": start, "level": "info", "message": "title \x1b]0;owned\x07 set"}],
    )
    text = run_text(run, start, tz=UTC)
    assert "\x1b" not in text and "\x07" not in text
    assert "status     failed: boom \\x1b[2J cleared" in text
    assert "finished   2026-01-15 09:30:02 UTC  (2.0s)" in text
    value = next(line for line in text.splitlines() if line.startswith("input"))
    assert value.endswith(f"… ({len(json.dumps(run.input)):,} characters; --json shows all)")
    assert len(value) < 500


def test_a_run_is_found_by_the_start_of_its_id_or_by_its_job(
    failed_run: tuple[Path, Run],
) -> None:
    """The console shows ids shortened (the shortest start no other shown id shares): every
    RUN_ID argument takes such a start, with or without `run_`, in any case, or the id of the
    run's job."""
    database, run = failed_run
    short = run.id.removeprefix("run_")[:16]  # the 11-digit time and 5 random digits
    for given in (short, f"run_{short}", short.upper()):
        shown = blok("show", given, "--db", database)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith(f"run        {run.id}\n")
    # The start of both runs' ids: which one is meant cannot be told, so nothing is done.
    listed = blok_json("runs", "--json", "--db", database)
    first, second = (r["id"] for r in listed)
    same = next(n for n, (a, b) in enumerate(zip(first, second, strict=True)) if a != b)
    both = first[:same].removeprefix("run_")
    for command in (["show"], ["replay"], ["cancel"], ["send"]):
        args = [*command, both, *(["approved", "{}"] if command == ["send"] else [])]
        done = blok(*args, "--db", database)
        assert done.returncode == 1, command
        error = done.stderr.strip()
        assert error.startswith(f"blok-tui: error: '{both}' is the start of 2 run ids ("), error
        assert error.count("\n") == 0 and run.id in error
        assert "): give more of it" in error
        # Each named with its workflow and status, to tell which one is meant.
        assert all(f"{r['id']} {r['workflow_name']} {r['status']}" in error for r in listed), error
    assert len(blok_json("runs", "--json", "--db", database)) == len(listed)  # no replay made
    # The other commands act on the run the start names.
    replayed = blok("replay", short, "--db", database)
    assert replayed.returncode == 0, replayed.stderr
    new_id = replayed.stdout.strip()
    assert f"replay of  {run.id}" in blok("show", new_id, "--db", database).stdout
    ended = blok("send", short, "approved", "{}", "--db", database)
    assert ended.stderr.strip() == (
        f"blok-tui: error: run {run.id} has already ended (failed): event 'approved' not sent"
    )
    cancelled = blok("cancel", new_id.removeprefix("run_")[:16], "--db", database)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"{new_id} cancelled"
    unknown = blok("show", "ffffffff", "--db", database)
    assert unknown.stderr.strip() == (
        "blok-tui: error: unknown run 'ffffffff': no run id starts with it"
    )
    unsent = blok("send", "ffffffff", "approved", "{}", "--db", database)
    assert unsent.stderr.strip() == (
        "blok-tui: error: unknown run 'ffffffff': no run id starts with it: "
        "event 'approved' not sent"
    )
    # The job id `enqueue` printed names its run too.
    by_job = blok("show", run.job_id, "--db", database)
    assert by_job.stdout.startswith(f"run        {run.id}\n"), by_job.stderr
    assert blok("show", "job_nope", "--db", database).stderr.strip() == (
        "blok-tui: error: unknown job 'job_nope'"
    )


WAITS_FOR_AN_EVENT = """
from engine import Step, Workflow, WorkerTrigger, wait

workflow = Workflow(
    name="ev.ship",
    trigger=WorkerTrigger(queue="ship"),
    steps=[
        Step("prepare", lambda ctx: 1),
        wait.for_event("approved by", timeout="1h", name="approval"),
        Step("ship", lambda ctx: ctx.state["approval"]),
    ],
)
"""


def test_show_says_what_a_run_waits_for_and_the_command_that_sends_its_event(
    tmp_path: Path,
) -> None:
    """A run waiting for an event: `show` says which, until when, and the `send` command to
    type; typed (with its JSON), it lets the run go on."""
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "ev.py").write_text(WAITS_FOR_AN_EVENT)
    database = tmp_path / "blok.db"

    async def main() -> tuple[str, Run]:
        async with Engine(workflows=tmp_path / "workflows", database=database) as engine:
            events = engine.events()
            job_id = await engine.enqueue("ship", {})
            with anyio.fail_after(10):
                async for event in events:
                    if isinstance(event, RunStatusChanged) and event.status == "waiting":
                        break
            shown = await anyio.to_thread.run_sync(
                lambda: _show(job_id, "--db", database, cwd=tmp_path)
            )
            assert shown.returncode == 0, shown.stderr
            why = next(line for line in shown.stdout.splitlines() if line.startswith("why "))
            command = why.split("send it: ")[1].replace("JSON", """'{"by": "ann"}'""")
            # As typed: to the database the show was given, not the default one.
            sent = await anyio.to_thread.run_sync(lambda: blok(*shlex.split(command)[1:]))
            assert sent.returncode == 0, sent.stderr
            return why, await engine.wait_for_job(job_id, timeout=10)

    why, run = anyio.run(main)
    assert why.startswith("why        waiting for event 'approved by' until "), why
    assert why.endswith(
        f"; send it: blok-tui send {run.id} 'approved by' JSON --db {shlex.quote(str(database))}"
    ), why
    assert (run.status, run.output) == ("completed", {"by": "ann"})


def test_show_says_an_event_came_and_that_no_worker_is_there_to_take_it(
    tmp_path: Path,
) -> None:
    """Sent while no worker ran, the event waits in the run's mailbox: `show` went on saying
    the run waited for it until its timeout, and to send it."""
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "ev.py").write_text(WAITS_FOR_AN_EVENT)
    database = tmp_path / "blok.db"

    async def until_waiting() -> str:
        async with Engine(workflows=tmp_path / "workflows", database=database) as engine:
            events = engine.events()
            await engine.enqueue("ship", {})
            with anyio.fail_after(10):
                async for event in events:
                    if isinstance(event, RunStatusChanged) and event.status == "waiting":
                        return event.run_id
        raise AssertionError("never waited")

    run_id = anyio.run(until_waiting)  # and the worker stops with the engine
    sent = blok("send", run_id, "approved by", '{"by": "ann"}', "--db", database)
    assert sent.returncode == 0, sent.stderr
    shown = _show(run_id, "--db", database, cwd=tmp_path)
    why = next(line for line in shown.stdout.splitlines() if line.startswith("why "))
    assert why.startswith("why        event 'approved by' came at "), why
    assert why.endswith(
        "; no live worker serves queue 'ship': it goes on once one does (blok-tui worker)"
    ), why


def test_show_says_why_a_queued_run_has_not_started() -> None:
    queued = _run("queued", started_at=None)
    why = WaitReason(
        queued.id, queued.status, "paused", "queue 'orders' is paused: nothing new starts"
    )
    lines = run_text(queued, queued.created_at, why=why, tz=UTC).splitlines()
    assert lines[:3] == [
        "run        run_1",
        "status     queued",
        "why        queue 'orders' is paused: nothing new starts",
    ]
    assert "why" not in run_text(queued, queued.created_at, tz=UTC)


def test_a_moment_of_another_day_says_its_date() -> None:
    """A delay of 25 hours read "delayed until 10:18:25", like one of an hour (and one of a
    hundred years too); a throttled run's status line gave the raw ISO moment."""
    now = datetime(2026, 12, 6, 9, 18, 25, tzinfo=UTC)
    for delay, said in (
        (timedelta(hours=25), "2026-12-07 10:18:25"),
        (timedelta(hours=1), "10:18:25"),
    ):
        until = now + delay
        delayed = _run("delayed", started_at=None, run_at=until)
        why = WaitReason(delayed.id, delayed.status, "delay", f"delayed until {until.isoformat()}")
        lines = run_text(delayed, now, why=why, tz=UTC).splitlines()
        assert lines[2] == f"why        delayed until {said}"
    start = now + timedelta(seconds=9)
    throttled = _run(
        "throttled",
        started_at=None,
        error=f"throttled: rate limit: 1/1 runs started in the last 1m; may start at {start.isoformat()}",
    )
    status = run_text(throttled, now, tz=UTC).splitlines()[1]
    assert (
        status
        == "status     throttled: rate limit: 1/1 runs started in the last 1m; may start at 09:18:34"
    )
    # A failure's error is the node's own text, left as written.
    failed = _run("failed", error=f"deadline {start.isoformat()} passed")
    assert run_text(failed, now, tz=UTC).splitlines()[1] == (
        f"status     failed: deadline {start.isoformat()} passed"
    )


def test_on_a_terminal_long_lines_wrap_between_words_under_their_values() -> None:
    """At 80 columns the terminal broke `show`'s long lines mid-word and went on in the first
    column, under the labels: "https://\nwarming.example.com/e/4: 503", "run_1\na2500c8f"."""
    start = datetime(2026, 1, 15, 9, 30, tzinfo=UTC)
    error = "EndpointUnavailable: POST https://warming.example.com/e/4: 503 Service Unavailable"
    attempts = [
        {
            "number": n,
            "status": "failed",
            "started_at": start,
            "finished_at": start + timedelta(milliseconds=101),
            "error": error,
            "error_type": "EndpointUnavailable",
        }
        for n in (1, 2)
    ]
    step = {
        "index": 0,
        "name": "deliver",
        "status": "failed",
        "started_at": start,
        "max_attempts": 2,
        "error": error,
        "attempts": attempts,
    }
    run = _run(
        "failed",
        finished_at=start + timedelta(seconds=1),
        error=f"[step 1/1] deliver failed: {error} (at examples/webhooks.py:25, after 2 attempts)",
        input={"url": "https://warming.example.com/e/4", "event": "order.shipped", "n": 1234},
        steps=[step],
    )
    whole = run_text(run, start, tz=UTC)
    narrow = run_text(run, start, tz=UTC, width=80)
    lines = narrow.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert max(len(line) for line in whole.splitlines()) > 80  # into a pipe: whole, for grep
    # The status's words, all of them, its continuations under the value, not the labels.
    status = lines.index(next(line for line in lines if line.startswith("status")))
    assert lines[status + 1].startswith(" " * 11 + "https://warming.example.com/e/4:")
    facts = narrow.split("\n\n")[0]
    assert " ".join(facts.split()) == " ".join(whole.split("\n\n")[0].split())
    # A failed attempt's error goes on under the error, past "deliver, attempt 1: ".
    attempt = next(n for n, line in enumerate(lines) if line.startswith("deliver, attempt 1:"))
    hang = len("deliver, attempt 1: ")
    assert lines[attempt + 1][:hang].isspace() and lines[attempt + 1][hang] != " "
    # The step's note is cut to the room its row leaves, the row on one line.
    row = next(line for line in lines if line.startswith("deliver  failed"))
    assert row.endswith("…") and len(row) <= 80


def _warehouse(ctx: object, item: int) -> int:
    if item == 20:
        raise LookupError("no such warehouse")
    return item


def test_a_long_for_each_shows_its_first_and_last_iterations_and_those_that_failed() -> None:
    # A for_each of 2,000 items printed 4,000 lines of "iteration N: square completed".
    from engine import Step, WorkerTrigger, Workflow, for_each, try_catch

    guarded = try_catch(
        "safe",
        try_=[Step("risky", _warehouse, inputs={"item": "$.state.each.item"})],
        catch=[Step("recover", lambda ctx: 1)],
    )
    flow = Workflow(
        name="fold",
        trigger=WorkerTrigger(queue="fold"),
        steps=[for_each("each", "$.body.items", steps=[guarded])],
    )

    async def ran() -> Run:
        async with Engine(workflows=[flow]) as engine:
            job = await engine.enqueue("fold", {"items": list(range(1, 41))})
            return await engine.wait_for_job(job, timeout=10)

    run = anyio.run(ran)
    lines = [line.rstrip() for line in run_text(run, datetime.now(UTC)).splitlines()]
    groups = [
        line.split()[0:3] for line in lines if line.startswith("  ") and not line.startswith("    ")
    ]
    assert groups == [
        ["iteration", "1:"],
        ["iteration", "2:"],
        ["iteration", "3:"],
        ["…", "16", "more"],
        ["iteration", "20:"],
        ["…", "18", "more"],
        ["iteration", "39:"],
        ["iteration", "40:"],
    ]
    folded = next(line for line in lines if "16 more" in line)
    assert folded.split() == [
        "…",
        "16",
        "more",
        "completed",
        "iteration",
        "4",
        "to",
        "iteration",
        "19",
    ]
    assert any(line.split()[:2] == ["risky", "failed"] for line in lines)


FAILS_ONCE_THEN_WAITS = """
from engine import Step, WorkerTrigger, Workflow

def charge(ctx):
    raise RuntimeError("card declined")

workflow = Workflow(
    name="pay",
    trigger=WorkerTrigger(queue="pay", retries=1, delay="30s"),
    steps=[Step("charge", charge)],
)
"""


def test_a_failed_run_whose_retry_waits_its_backoff_names_the_delivery_to_come(
    tmp_path: Path,
) -> None:
    """The retry's run exists, delayed, before anything claims it: `show` of the failed run
    said "delayed: its delivery 1 is run …" and the console "went on to delivery 1 of 2",
    the failed run's own number (the job's claims so far)."""
    from blok_tui.jobs import then_text

    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "pay.py").write_text(FAILS_ONCE_THEN_WAITS)
    database = tmp_path / "blok.db"

    async def main() -> tuple[str, str]:
        async with Engine(workflows=tmp_path / "workflows", database=database) as engine:
            events = engine.events()
            job_id = await engine.enqueue("pay", {})
            with anyio.fail_after(10):
                async for event in events:
                    if isinstance(event, RunQueued) and event.status == "delayed":
                        break  # the retry's run, as the failed one ended
            failed = await engine.runs(status="failed")
            job = await engine.get_job(job_id)
            retry = await engine.get_run(job.run_id)
            assert (job.state, retry.status, retry.job_attempt) == ("delayed", "delayed", 2)
            shown = await anyio.to_thread.run_sync(
                lambda: _show(failed[0].id, "--db", database, cwd=tmp_path)
            )
            assert shown.returncode == 0, shown.stderr
            return shown.stdout, then_text(job, long=True, delivery=retry.job_attempt).plain

    shown, console = anyio.run(main)
    line = next(line for line in shown.splitlines() if line.startswith("job "))
    assert line.endswith(" delayed: its delivery 2 is run " + line.rsplit(" ", 1)[1]), line
    assert "its job went on to delivery 2 of 2" in console, console
