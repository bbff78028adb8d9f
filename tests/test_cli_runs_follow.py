"""`blok-tui runs --follow`: after the table, a line each time a run the filters select starts,
waits or ends, from a real worker process; and its lines from hand-made records."""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

from backends.builders import a_run
from cli_helpers import Follower, blok, blok_json, start_worker, write_workflows

from blok_tui.run_follow import fitted
from blok_tui.runs_follow import RunsFilter, run_line
from engine import Run, RunStatus


def _stop(follower: Follower) -> tuple[int, str]:
    """ctrl-c, as a user stops a tail: the exit status and standard error."""
    follower.process.send_signal(signal.SIGINT)
    code, _, stderr = follower.finish()
    return code, stderr


def test_runs_follow_tells_starts_and_ends_and_status_failed_only_the_failures(
    tmp_path: Path,
) -> None:
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"))
    every = Follower("--db", database, command=("runs", "--follow"))
    failures = Follower("--status", "failed", "--db", database, command=("runs", "-f"))
    other_queue = Follower("--queue", "single", "--db", database, command=("runs", "-f"))
    try:
        for follower in (every, failures, other_queue):
            assert follower.read_until("FOLLOWING")[0] == "no runs"
        ok = blok("enqueue", "naps", '{"seconds": 0.05}', "--wait", "--db", database)
        assert ok.returncode == 0, ok.stderr
        bad = blok("enqueue", "naps", '{"seconds": "soon"}', "--wait", "--db", database)
        failed_id = bad.stderr.split()[3]  # "blok-tui: error: run RUN_ID failed: ..."
        ok_id = next(
            r
            for r in blok("runs", "--db", database).stdout.split()
            if r.startswith("run_") and r != failed_id
        )
        told = failures.read_until(failed_id)
        every.read_until(f"failed     {failed_id}")
    finally:
        codes = [_stop(follower) for follower in (every, failures, other_queue)]
        assert worker.stop() == 0, worker.stderr()
    # ctrl-c ends a tail quietly, as it ends `tail -f`.
    assert codes == [(130, "")] * 3, codes
    # Every start and end, in the order they happened, the columns aligned.
    news = every.news()
    mine = [line[14:] for line in news if ok_id in line or failed_id in line]
    assert [line.split()[:2] for line in mine] == [
        ["running", ok_id],
        ["completed", ok_id],
        ["running", failed_id],
        ["failed", failed_id],
    ], news
    version = blok_json("show", ok_id, "--json", "--db", database)["workflow_version"]
    assert mine[0] == f"running    {ok_id}  test.nap     naps    on {worker.id}, version {version}"
    assert mine[1].startswith(f"completed  {ok_id}  test.nap     naps    ")
    assert mine[3].startswith(f"failed     {failed_id}  test.nap     naps    ")
    assert "nap failed: " in mine[3]
    # Only the failure, for --status failed; nothing for another queue's filter.
    assert [line.split()[1:3] for line in told[told.index("FOLLOWING (ctrl-c stops)") + 1 :]] == [
        ["failed", failed_id]
    ]
    assert other_queue.news() == []


def test_runs_follow_json_is_a_json_object_a_line_from_now_on(tmp_path: Path) -> None:
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"))
    failures = Follower("--status", "failed", "--json", "--db", database, command=("runs", "-f"))
    try:
        first = json.loads(failures.read_until("following")[0])
        bad = blok("enqueue", "naps", '{"seconds": "soon"}', "--wait", "--db", database)
        failed_id = bad.stderr.split()[3]  # "blok-tui: error: run RUN_ID failed: ..."
        failures.read_until(failed_id)
    finally:
        assert _stop(failures) == (130, "")
        assert worker.stop() == 0, worker.stderr()
    assert first["following"] == {"status": "failed", "workflow": None, "queue": None}
    told = [json.loads(line) for line in failures.lines[1:]]
    assert [(t["status"], t["run"]["id"], t["run"]["status"]) for t in told] == [
        ("failed", failed_id, "failed")
    ]
    assert told[0]["run"]["error"].startswith("[step 1/1] nap failed: ")
    assert "steps" not in told[0]["run"] and datetime.fromisoformat(told[0]["at"])


T0 = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)


def _run(status: RunStatus) -> Run:
    return a_run(
        status=status,
        queue="mail",
        workflow_name="mail.send",
        created_at=T0,
        started_at=T0,
        worker="host:1:w",
    )


def test_a_line_says_what_the_status_it_came_to_adds() -> None:
    run = _run(RunStatus.FAILED)
    run.finished_at, run.error = T0 + timedelta(seconds=2), "boom\nsecond line"
    now = T0 + timedelta(seconds=3)
    assert run_line(run, "failed", now, (12, 6), UTC) == (
        f"12:00:03.000  failed     {run.id}  mail.send     mail    2.0s  boom second line"
    )
    # Told as it started, though its record has ended since: no end's time or error.
    assert run_line(run, "running", now, (0, 0), UTC) == (
        f"12:00:03.000  running    {run.id}  mail.send  mail  on host:1:w, version v1"
    )
    waiting = _run(RunStatus.WAITING)
    waiting.wait_until = T0 + timedelta(minutes=5)
    assert run_line(waiting, "waiting", now, (0, 0), UTC).endswith(" mail  until 12:05:00")


def test_on_a_terminal_a_followers_long_line_goes_on_under_its_text() -> None:
    """At 80 columns nearly every `runs --follow` line was longer than the terminal, which
    broke it mid-word ("export" / "s") and went on under the times."""
    run = _run(RunStatus.RUNNING)
    run.worker = "vm:16370:62be3d"
    line = run_line(run, "running", T0, (16, 8), UTC)
    assert len(line) > 80
    lines = fitted(line, 80).splitlines()
    assert len(lines) == 2 and max(len(part) for part in lines) <= 80
    assert lines[1].startswith(" " * 14) and lines[1][14] != " "
    assert " ".join(" ".join(lines).split()) == " ".join(line.split())  # no word cut
    assert fitted(line, None) == line  # into a pipe: a line an event, for grep


def test_the_filters_select_by_status_workflow_and_queue() -> None:
    assert RunsFilter().selects("completed", "mail.send", "mail")
    assert RunsFilter(status="failed").selects("failed", None, "mail")
    assert not RunsFilter(status="failed").selects("completed", "mail.send", "mail")
    assert not RunsFilter(queue="post").selects("failed", "mail.send", "mail")
    assert not RunsFilter(workflow="post.send").selects("failed", "mail.send", "mail")
    # An event that does not name the workflow: the run's record decides.
    assert RunsFilter(workflow="post.send").selects("waiting", None, "mail")
