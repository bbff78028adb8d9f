"""`blok-tui` with `--db postgresql://...`: a worker process, one-shot commands and an attached
client on one URL, and the faults a user meets (a URL that cannot be used, a server that is
down, a login the server refuses, a database that is not blok's) as one line and exit 1."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from cli_helpers import Follower, blok, blok_json, eventually, write_workflows
from pg import NO_DRIVER, database_url, server_url, unavailable

from .server import private_server

pytest.importorskip("asyncpg", reason=NO_DRIVER)

from engine import Engine, LogRecorded, RunFinished, RunQueued, RunStarted, RunStatus, StepStarted

pytestmark = pytest.mark.anyio


@contextmanager
def pg_worker(
    url: str, folder: Path, *extra: str, killed: bool = False
) -> Iterator[subprocess.Popen[str]]:
    """`blok-tui worker --db URL`, once it printed its ready line; SIGTERM and exit 0 after
    (`killed`: the test kills it, and its exit is not checked)."""
    stderr_path = folder / f"worker-{time.monotonic_ns()}.stderr"
    env = {k: v for k, v in os.environ.items() if k not in ("BLOK_DB", "BLOK_WORKER_ADAPTER")}
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "blok_tui", "worker", "--db", url, "--no-watch", *extra],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 30)
    line = process.stdout.readline() if ready else ""
    try:
        assert line.startswith("blok worker "), (line, stderr_path.read_text())
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        assert killed or code == 0, stderr_path.read_text()


@pytest.fixture
async def served(pg_url: str, tmp_path: Path) -> AsyncIterator[str]:
    workflows = write_workflows(tmp_path / "workflows")
    with pg_worker(pg_url, tmp_path, "--workflows", str(workflows)):
        yield pg_url


async def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return await anyio.to_thread.run_sync(lambda: blok(*args))


async def test_worker_enqueue_runs_and_an_attached_client(served: str) -> None:
    url = served
    async with Engine(database=url, create=False) as attached:
        assert attached.capabilities.location == url
        assert {q.name for q in await attached.queues()} == {"naps", "single"}
        events = attached.events()
        done = await cli("enqueue", "naps", '{"seconds": 0.05}', "--db", url)
        assert done.returncode == 0, done.stderr
        job_id = done.stdout.strip()
        run_id = (await attached.get_job(job_id)).run_id
        seen = []
        with anyio.fail_after(15):
            async for event in events:
                if getattr(event, "run_id", None) == run_id:
                    seen.append(type(event))
                    if isinstance(event, RunFinished):
                        assert event.status == "completed"
                        break
        assert seen[0] is RunQueued
        assert seen.index(RunStarted) < seen.index(StepStarted) < seen.index(RunFinished)
        assert LogRecorded in seen
    runs = await anyio.to_thread.run_sync(lambda: blok_json("runs", "--json", "--db", url))
    assert [(r["id"], r["status"], r["output"]) for r in runs] == [
        (run_id, "completed", {"slept": 0.05})
    ]
    table = await cli("runs", "--db", url)
    assert table.returncode == 0 and run_id in table.stdout


async def test_a_cancel_from_another_process_reaches_the_worker_at_once(served: str) -> None:
    url = served
    async with Engine(database=url, create=False) as attached:
        events = attached.events()
        job_id = await attached.enqueue("naps", {"seconds": 30})
        run_id = (await attached.get_job(job_id)).run_id
        with anyio.fail_after(15):
            async for event in events:
                if isinstance(event, StepStarted) and event.run_id == run_id:
                    break
        started = time.monotonic()
        run = await attached.cancel(run_id)
        took = time.monotonic() - started
        assert run.status is RunStatus.CANCELLED
        assert took < 1.5, f"cancel took {took:.2f}s"


async def _napping(url: str, release: Path) -> str:
    """A nap enqueued from another process, once the worker runs its node: its job id."""
    done = await cli("enqueue", "naps", f'{{"seconds": 30, "until": "{release}"}}', "--db", url)
    assert done.returncode == 0, done.stderr
    job_id: str = done.stdout.strip()

    def napping() -> bool:
        return "napping 30" in blok("show", job_id, "--db", url).stdout

    await anyio.to_thread.run_sync(eventually, napping)
    return job_id


async def test_show_follow_tells_another_processes_run_until_it_ends(
    served: str, tmp_path: Path
) -> None:
    url = served
    release = tmp_path / "release"
    job_id = await _napping(url, release)  # followed from its nap on
    follower = Follower(job_id, "--db", url)
    await anyio.to_thread.run_sync(follower.read_until, "FOLLOWING")
    assert any(line.startswith("status     running") for line in follower.lines), follower.lines
    release.touch()
    code, _, stderr = await anyio.to_thread.run_sync(follower.finish)
    assert code == 0, stderr
    news = follower.news()
    # The step's end and the run's, each once (the nap's start and log line were in `show`).
    assert [line[14:].split(" in ")[0] for line in news] == ["nap completed", "run completed"]


async def test_where_is_answered_by_the_worker_process_that_runs_the_run(
    served: str, tmp_path: Path
) -> None:
    url = served
    release = tmp_path / "release"
    job_id = await _napping(url, release)
    where = await cli("where", job_id, "--db", url)
    release.touch()
    assert where.returncode == 0, where.stderr
    first, *frames = where.stdout.splitlines()
    assert first.startswith("where: [step 1/1] nap is at "), where.stdout
    assert first.endswith(frames[-1].split()[0]), where.stdout  # its innermost frame's line
    # In its sleep, or (rarely) in the look for the release file between two sleeps.
    assert " in nap: " in frames[-1], where.stdout


async def test_a_worker_killed_under_its_run_is_named_gone(pg_url: str, tmp_path: Path) -> None:
    """kill -9 of the worker process that runs a run, on PostgreSQL: `where` says at once that
    nobody runs it and why, `show` and `runs` too, until a live worker takes the job over."""
    url = pg_url
    workflows = write_workflows(tmp_path / "workflows")
    with pg_worker(url, tmp_path, "--workflows", str(workflows), killed=True) as worker:
        job_id = await _napping(url, tmp_path / "release")
        worker.kill()
        worker.wait()
    gone = f"is gone (its process {worker.pid} no longer runs)"
    where = await cli("where", job_id, "--db", url, "--timeout", "30s")
    assert where.returncode == 1 and where.stdout == "", where
    holder = f"its worker {socket.gethostname()}:{worker.pid}:"
    assert f": none of its code runs now: {holder}" in where.stderr, where.stderr
    assert f"{gone}; a live worker takes its job over" in where.stderr, where.stderr
    shown = await cli("show", job_id, "--db", url)
    assert f"; nobody runs it now: {holder}" in shown.stdout, shown.stdout
    assert gone in " ".join(shown.stdout.split()), shown.stdout
    listed = await cli("runs", "--db", url)
    then = (
        "a live worker takes its job over: the run is recorded crashed and its job gets a new run "
        "(no worker is alive now: start one)"
    )
    assert listed.stdout.rstrip().endswith(f"{gone}; {then}"), listed.stdout


async def test_runs_follow_tells_a_failure_another_process_ran(served: str) -> None:
    url = served
    failures = Follower("--status", "failed", "--db", url, command=("runs", "-f"))
    try:
        await anyio.to_thread.run_sync(failures.read_until, "FOLLOWING")
        bad = await cli("enqueue", "naps", '{"seconds": "soon"}', "--wait", "--db", url)
        failed_id = bad.stderr.split()[3]  # "blok-tui: error: run RUN_ID failed: ..."
        lines = await anyio.to_thread.run_sync(failures.read_until, failed_id)
    finally:
        failures.process.kill()
        failures.process.wait()
    assert lines[-1][14:].startswith(f"failed     {failed_id}  test.nap     naps    "), lines


async def test_a_follower_rides_out_a_server_restart_with_one_line_warnings(
    tmp_path: Path,
) -> None:
    """The server restarts under a worker and a follower: the follower goes on to the run's
    end, and what the driver says while it reconnects reaches its stderr as one line each, no
    traceback between the lines it prints."""
    workflows = write_workflows(tmp_path / "workflows")
    release = tmp_path / "release"
    with private_server() as server, pg_worker(server.url, tmp_path, "--workflows", str(workflows)):
        done = await cli(
            "enqueue", "naps", f'{{"seconds": 60, "until": "{release}"}}', "--db", server.url
        )
        assert done.returncode == 0, done.stderr
        job_id = done.stdout.strip()
        follower = Follower(job_id, "--db", server.url)
        await anyio.to_thread.run_sync(follower.read_until, "FOLLOWING")
        await anyio.to_thread.run_sync(server.restart)
        release.touch()
        code, lines, stderr = await anyio.to_thread.run_sync(follower.finish, 60)
    assert code == 0, stderr
    assert "run completed in" in lines[-1], lines
    assert "Traceback" not in stderr
    assert all(line.startswith("blok-tui: ") for line in stderr.splitlines()), stderr
    # The worker's log says the driver's retries in a line each too.
    [worker_log] = [path.read_text() for path in tmp_path.glob("worker-*.stderr")]
    assert "Traceback" not in worker_log, worker_log


async def test_the_attached_console_shows_another_processes_run(served: str) -> None:
    from blok_tui.app import BlokApp
    from blok_tui.run_screen import RunScreen

    url = served
    async with Engine(database=url, create=False, follow=True) as attached:
        job_id = await attached.enqueue("naps", {"seconds": 0.5})
        run_id = (await attached.get_job(job_id)).run_id
        app = BlokApp(attached)
        async with app.run_test(size=(150, 45)) as pilot:
            with anyio.fail_after(10):
                await app.ready.wait()
            app.open_run(run_id)
            with anyio.fail_after(15):
                while not (
                    isinstance(app.screen, RunScreen)
                    and app.screen.run is not None
                    and app.screen.run.terminal
                ):
                    await pilot.pause(0.05)
            assert app.screen.run.status is RunStatus.COMPLETED


def closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fault_urls() -> list[tuple[str, str, str]]:
    """(case, URL, what the error line says)."""
    base = server_url()
    host = base.split("@", 1)[1].split("/", 1)[0]
    return [
        ("bad-url", "postgresql://postgres@127.0.0.1:notaport/test", "not a usable PostgreSQL URL"),
        (
            "server-down",
            f"postgresql://postgres@127.0.0.1:{closed_port()}/test",
            "the server refused the connection (is PostgreSQL running there?)",
        ),
        (
            "refused-login",
            f"postgresql://blok_nobody:s3cret@{host}/test",
            'the server refused the login: role "blok_nobody" does not exist',
        ),
        (
            "no-database",
            database_url(base, "blok_no_such_database"),
            'database "blok_no_such_database" does not exist',
        ),
    ]


@pytest.mark.parametrize("command", ["runs", "enqueue", "attach", "worker"])
async def test_faults_are_one_line_and_exit_1(command: str, tmp_path: Path) -> None:
    reason = await unavailable()
    if reason is not None:
        pytest.skip(reason)  # the refused login and missing database need a server
    args = {
        "runs": ["runs"],
        "enqueue": ["enqueue", "naps", "{}"],
        "attach": ["attach"],
        "worker": ["worker", "--workflows", str(write_workflows(tmp_path / "wf")), "--no-watch"],
    }[command]
    for case, url, says in fault_urls():
        done = await cli(*args, "--db", url)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1, (case, done.stderr)
        assert len(lines) == 1 and "Traceback" not in done.stderr, (case, done.stderr)
        assert lines[0].startswith("blok-tui: error: postgresql://"), (case, lines[0])
        assert says in lines[0], (case, lines[0])
        assert "s3cret" not in done.stderr, "the password was shown"


async def test_a_read_only_command_on_a_database_without_blok_says_so(pg_url: str) -> None:
    done = await cli("runs", "--db", pg_url)
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line == (
        f"blok-tui: error: {pg_url}: not a blok database (no 'blok' schema in it; start a"
        " worker on it first: blok-tui worker --db URL)"
    )
