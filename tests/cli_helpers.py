"""Real processes for the command-line tests: `blok-tui worker` subprocesses on a temp database,
and one-shot `blok-tui ...` commands."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import queue
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

WORKFLOWS = """
import anyio
from engine import Step, Workflow, WorkerTrigger


async def nap(ctx, seconds: float):
    ctx.logger.info("napping %s s", seconds)
    # {"until": path}: the nap ends when that file exists (a test's release), at most `seconds`.
    release = ctx.body.get("until")
    with anyio.move_on_after(seconds):
        while release is not None and not await anyio.Path(release).exists():
            await anyio.sleep(0.05)
        if release is None:
            await anyio.sleep(seconds)
    return {"slept": seconds}


workflows = [
    Workflow(
        name="test.nap",
        trigger=WorkerTrigger(queue="naps", concurrency=4),
        steps=[Step("nap", nap, inputs={"seconds": "$.body.seconds"})],
    ),
    Workflow(
        name="test.single",
        trigger=WorkerTrigger(queue="single", concurrency=1),
        steps=[Step("nap", nap, inputs={"seconds": "$.body.seconds"})],
    ),
]
"""


def write_workflows(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "naps.py").write_text(WORKFLOWS)
    return folder


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("BLOK_WORKER_ADAPTER", None)
    env.pop("BLOK_DB", None)
    return env


def blok(
    *args: str | Path, timeout: float = 30, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `python -m blok_tui ARGS` to the end (in `cwd`, if given)."""
    return subprocess.run(
        [sys.executable, "-m", "blok_tui", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
        cwd=cwd,
    )


def blok_json(*args: str | Path) -> Any:
    done = blok(*args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@dataclass
class Worker:
    process: subprocess.Popen[str]
    ready_line: str
    stderr_path: Path

    @property
    def id(self) -> str:
        # "blok worker HOST:PID serving queues a, b on PATH"
        return self.ready_line.split()[2]

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def stop(self, timeout: float = 15) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def start_worker(
    database: Path | str,
    workflows: Path,
    *extra: str,
    timeout: float = 20,
    name: str = "worker",
    logs: Path | None = None,
    launcher: tuple[str, ...] = (),
) -> Worker:
    """Start `blok-tui worker` (through `launcher`, a command such as `nohup`) and return once
    it printed its ready line. Its stderr goes to a file in `logs`, by default the SQLite
    `database`'s folder (give it for a URL)."""
    folder = logs if logs is not None else Path(database).parent
    stderr_path = folder / f"{name}-{time.monotonic_ns()}.stderr"
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [
                *launcher,
                sys.executable,
                "-m",
                "blok_tui",
                "worker",
                "--db",
                str(database),
                "--workflows",
                str(workflows),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=cli_env(),
        )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else ""
    if not line.startswith("blok worker "):
        process.kill()
        process.wait()
        raise AssertionError(f"worker did not get ready: {line!r}\n{stderr_path.read_text()}")
    return Worker(process, line.strip(), stderr_path)


def serve(tmp_path: Path, files: dict[str, str], *extra: str) -> tuple[Path, Worker]:
    """Workflow files (name → text) in `tmp_path/workflows`, served by a `blok-tui worker`
    on `tmp_path/blok.db`: the database and the worker."""
    folder = tmp_path / "workflows"
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    database = tmp_path / "blok.db"
    return database, start_worker(database, folder, *extra)


class Follower:
    """`blok-tui show ... --follow` (or another `command` that follows) as a process whose lines
    are read as they come (by a thread: a pipe's buffered reader and `select` do not mix)."""

    def __init__(self, *args: str | Path, command: tuple[str, ...] = ("show", "--follow")) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "blok_tui", *command, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        self.lines: list[str] = []
        self._read: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._read.put(line.rstrip("\n"))
        self._read.put(None)

    def read_until(self, text: str, timeout: float = 20) -> list[str]:
        """The lines up to the first that holds `text` (the command flushes each line)."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            try:
                line = self._read.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.process.kill()
                _, stderr = self.process.communicate()
                raise AssertionError(f"no {text!r} in {self.lines}; stderr: {stderr}")
            self.lines.append(line)
        return self.lines

    def news(self) -> list[str]:
        """The lines after `show`'s text: what happened since it was printed."""
        return self.lines[self.lines.index("FOLLOWING (ctrl-c stops)") + 1 :]

    def finish(self, timeout: float = 30) -> tuple[int, list[str], str]:
        """Its exit status, every line it printed, and its standard error."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:  # a follower that never ends must not outlive the test
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"still following after {timeout}s: {self.lines}") from None
        while (line := self._read.get(timeout=timeout)) is not None:
            self.lines.append(line)
        assert self.process.stderr is not None
        return code, self.lines, self.process.stderr.read()


# Run as `python -c TAKE_THE_TERMINAL ARGS...`: make stdin's terminal this session's controlling
# terminal, then become `python ARGS...`.
TAKE_THE_TERMINAL = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


class Terminal:
    """`python ARGS` (`-m blok_tui ...`, or a script) in a pseudo-terminal of 140x40 (`size`:
    columns, rows), as a person runs it: Textual draws only to a terminal, the CLI fits its
    tables to one. What it writes is collected by a thread (unread, the terminal's buffer
    fills and the console's writes block)."""

    def __init__(
        self, cwd: Path, *args: str, size: tuple[int, int] = (140, 40), controlling: bool = False
    ) -> None:
        """`controlling`: the terminal is the process's controlling terminal, as a terminal
        window's or tmux's is: closing it, the kernel sends the process SIGHUP and SIGCONT."""
        self.master, child = os.openpty()
        width, height = size
        fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
        # Without the COLUMNS and LINES pytest-xdist sets in its workers: they would overrule
        # the terminal's own size (`shutil.get_terminal_size` reads them first).
        env = {k: v for k, v in cli_env().items() if k not in ("COLUMNS", "LINES")}
        if controlling:  # taken as its session's (a new one) before `args` run
            args = ("-c", TAKE_THE_TERMINAL, *args)
        self.process = subprocess.Popen(
            [sys.executable, *args],
            stdin=child,
            stdout=child,
            stderr=child,
            cwd=cwd,
            env={**env, "TERM": "xterm-256color"},
            start_new_session=True,
        )
        os.close(child)
        self.output = bytearray()
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closing.is_set():
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if not ready:
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the child's side closed (EIO)
                return
            if not chunk:
                return
            self.output += chunk

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def hang_up(self) -> None:
        """What closing its window does: the line hung up, then SIGHUP to the process (the
        kernel sends it, and SIGCONT, to a controlling terminal's session leader; here, the
        test sends SIGHUP too)."""
        self._closing.set()
        self._reader.join(5)
        os.close(self.master)
        self.process.send_signal(signal.SIGHUP)

    def finish(self, timeout: float = 30) -> int:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"still running after {timeout}s: {self.text[-2000:]}") from None
        if not self._closing.is_set():
            self._reader.join(5)
            os.close(self.master)
        return code


def open_console(tmp_path: Path) -> tuple[Terminal, Path]:
    """`blok-tui` on `tmp_path/blok.db` and the test workflows, on a pseudo-terminal that is
    its controlling terminal, once its queues view is up: the terminal and the database."""
    folder = write_workflows(tmp_path / "workflows")
    database = tmp_path / "blok.db"
    console = Terminal(
        tmp_path,
        *("-m", "blok_tui", "--db", str(database), "--workflows", str(folder)),
        controlling=True,
    )
    try:
        eventually(lambda: "naps" in console.text, timeout=30)
    except BaseException:
        console.process.kill()
        console.finish()
        raise
    return console, database


def quit_with_a_run_going(
    tmp_path: Path, quit_: Callable[[Terminal], None]
) -> tuple[int, Terminal, Path, str]:
    """The console (`blok-tui` on a pseudo-terminal, on `tmp_path/blok.db`) with a 60 s nap
    running, ended by `quit_`: its exit status, the terminal, the database and the job."""
    console, database = open_console(tmp_path)
    try:
        done = blok("enqueue", "naps", '{"seconds": 60}', "--db", database)
        assert done.returncode == 0, done.stderr
        job_id = done.stdout.strip()
        eventually(lambda: (run_of(database, job_id) or {}).get("status") == "running")
        quit_(console)
    except BaseException:
        console.process.kill()
        raise
    finally:
        code = console.finish()
    return code, console, database, job_id


def eventually(check: Callable[[], T | None], timeout: float = 10, every: float = 0.05) -> T:
    """Poll another process's state (nothing to await across processes) until `check` gives
    a value; fail with the last one seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still not true after {timeout}s")
        time.sleep(every)


def run_of(database: Path, job_id: str) -> dict[str, Any] | None:
    """The newest run of a job, as `blok-tui runs --json` shows it."""
    for run in blok_json("runs", "--json", "--limit", "200", "--db", database):
        if run["job_id"] == job_id:
            return run
    return None


def answered_on_a_terminal(*args: str | Path, answer: str) -> tuple[int, str, str]:
    """`blok-tui ARGS` with its stdin and stderr on a pseudo-terminal, `answer` typed: its
    exit status, standard output, and what the terminal showed."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "blok_tui", *map(str, args)],
        stdin=follower,
        stderr=follower,
        stdout=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    os.close(follower)
    shown = b""
    while b"[y/N] " not in shown:  # the question, before the answer is typed
        chunk = os.read(leader, 4096)
        assert chunk, shown
        shown += chunk
    os.write(leader, answer.encode() + b"\n")
    out, _ = process.communicate(timeout=30)
    with contextlib.suppress(OSError):  # the rest, up to the terminal's close (EIO on Linux)
        while chunk := os.read(leader, 4096):
            shown += chunk
    os.close(leader)
    return process.returncode, out, shown.decode()
