"""A terminal that closes (its window, an ssh connection dropped, `tmux kill-session`) sends
SIGHUP. The console and a worker in it stop as on SIGTERM, with the runs' grace; Python's
default ended them at once, and the run going then was recorded crashed at the next start, a
delivery of its job used. Real processes: the console on a pseudo-terminal, a worker."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from cli_helpers import (
    Terminal,
    Worker,
    blok,
    eventually,
    open_console,
    quit_with_a_run_going,
    run_of,
    start_worker,
    write_workflows,
)
from textual.drivers._writer_thread import MAX_QUEUED_WRITES, WriterThread

from blok_tui.terminal_driver import TerminalOutput


def test_a_console_whose_terminal_closes_hands_its_run_back(tmp_path: Path) -> None:
    code, _, database, job_id = quit_with_a_run_going(tmp_path, Terminal.hang_up)
    # It quit as on `q`: the run had its grace (2 s), then went back to the queue.
    assert code == 0
    run = run_of(database, job_id)
    assert run is not None and run["status"] == "queued", run  # not left running, to crash


def _sigterm_then_hang_up(console: Terminal) -> None:
    """What `tmux kill-server` does: SIGTERM, then SIGHUP, here once the console has left the
    screen and its engine gives the runs their grace."""
    console.process.send_signal(signal.SIGTERM)
    eventually(lambda: "blok-tui: stopping 1 run" in console.text)
    console.process.send_signal(signal.SIGHUP)


def test_a_terminal_closing_after_a_sigterm_leaves_the_consoles_runs_their_grace(
    tmp_path: Path,
) -> None:
    # The console put Python's defaults back once its screen was gone, and the SIGHUP that
    # follows `tmux kill-server`'s SIGTERM ended it in the runs' grace: the run stayed
    # `running`, to be recorded crashed at the next start, a delivery of its job spent.
    code, _, database, job_id = quit_with_a_run_going(tmp_path, _sigterm_then_hang_up)
    assert code == 0
    run = run_of(database, job_id)
    assert run is not None and run["status"] == "queued", run


def test_a_sigcont_with_nothing_suspended_leaves_the_console_as_it_is(tmp_path: Path) -> None:
    """The kernel follows a hang-up's SIGHUP with SIGCONT. Textual's driver took any SIGCONT
    for the end of a ctrl+z and started its application mode again: on a terminal that is
    gone, a second output thread that died on its first write, and the console's exit blocked
    for good once 30 writes waited for it (a console found hung long after `tmux
    kill-session`, its worker "stalled"). Here a stray SIGCONT on a live terminal: the console
    does not start over (the switch to the alternate screen is written once) and still
    answers keys."""
    console, _ = open_console(tmp_path)
    try:
        console.process.send_signal(signal.SIGCONT)
        console.type("?")  # handled after the signal: the help screen comes up
        eventually(lambda: "keys and commands" in console.text)
        switches = console.text.count("\x1b[?1049h")
        assert switches == 1, f"{switches} switches to the alternate screen"
        console.type("q")  # the help screen's: back
        console.type("q")  # quits: no run is going
    except BaseException:
        console.process.kill()
        raise
    finally:
        code = console.finish()
    assert code == 0, console.text[-2000:]


def test_the_consoles_output_outlives_its_terminal() -> None:
    """Textual's output thread ended at its first write to a terminal gone (EIO), and the
    writes after it filled its queue of 30: the 31st, or the stop's own, blocked the console
    for good. Its writes go nowhere now, and the thread drains the queue to the end."""
    master, child = os.openpty()
    writer = WriterThread(TerminalOutput(os.fdopen(child, "w")))
    writer.start()
    os.close(master)  # the terminal hangs up
    stopped = threading.Event()

    def write_then_stop() -> None:
        for n in range(MAX_QUEUED_WRITES * 2):
            writer.write(f"line {n}\n")
        writer.stop()
        stopped.set()

    threading.Thread(target=write_then_stop, daemon=True).start()
    assert stopped.wait(10), "the output thread ended: its queue filled and the writes blocked"


def _a_held_run(database: Path, tmp_path: Path) -> tuple[str, Path]:
    """A run going, whose nap ends once the file returned exists: its job's id, the file."""
    release = tmp_path / "release"
    body = f'{{"seconds": 60, "until": "{release}"}}'
    job_id = blok("enqueue", "naps", body, "--db", database).stdout.strip()
    eventually(lambda: (r := run_of(database, job_id)) and r["status"] == "running")
    return job_id, release


def _ended(worker: Worker) -> int:
    """The worker's exit status, once it stopped by itself (a kill, if it did not)."""
    try:
        return worker.process.wait(timeout=20)
    finally:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait()


def test_a_worker_whose_terminal_closes_drains(tmp_path: Path) -> None:
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"), "--grace", "20")
    job_id, release = _a_held_run(database, tmp_path)
    worker.process.send_signal(signal.SIGHUP)
    eventually(lambda: "SIGHUP: draining" in worker.stderr())
    release.touch()  # the run ends within its grace
    assert _ended(worker) == 0, worker.stderr()
    run = run_of(database, job_id)
    assert run is not None and run["status"] == "completed", run


def test_a_terminal_closing_after_a_sigterm_is_not_a_second_sigterm(tmp_path: Path) -> None:
    """`tmux kill-server` sends SIGTERM, then SIGHUP: the stop's grace stands (a second
    SIGTERM cuts it short, and the run would go back to the queue)."""
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"), "--grace", "20")
    job_id, release = _a_held_run(database, tmp_path)
    worker.process.send_signal(signal.SIGTERM)
    eventually(lambda: "SIGTERM: draining" in worker.stderr())
    worker.process.send_signal(signal.SIGHUP)
    release.touch()
    assert _ended(worker) == 0, worker.stderr()
    assert "stopping now" not in worker.stderr()
    run = run_of(database, job_id)
    assert run is not None and run["status"] == "completed", run


def test_a_worker_started_with_nohup_outlives_its_terminal(tmp_path: Path) -> None:
    database = tmp_path / "blok.db"
    folder = write_workflows(tmp_path / "workflows")
    worker = start_worker(database, folder, launcher=("nohup",))
    try:
        worker.process.send_signal(signal.SIGHUP)
        # Still serving: a job enqueued after the hangup runs.
        job_id = blok("enqueue", "naps", '{"seconds": 0}', "--db", database).stdout.strip()
        eventually(lambda: (r := run_of(database, job_id)) and r["status"] == "completed")
        assert worker.process.poll() is None
    finally:
        assert worker.stop() == 0, worker.stderr()
    assert "SIGHUP" not in worker.stderr()
