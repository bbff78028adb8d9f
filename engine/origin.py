"""Where an error came from: the innermost frame of the user's own code in its traceback, past
the frames of blok's engine, of the standard library and of installed packages (an error a
library raised is placed at the user's line that called it). A run's one-line error names it,
as a workflow file's load error names its file and line; the console folds the other frames."""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import FrameType, TracebackType

# Folders, each with its separator: `/srv/engine_tools/x.py` is not in `/srv/engine`.
_ENGINE_DIR = str(Path(__file__).resolve().parent) + os.sep
_LIBRARY_DIRS = tuple(
    {
        str(Path(sysconfig.get_paths()[name]).resolve()) + os.sep
        for name in ("stdlib", "platstdlib", "purelib", "platlib")
    }
)


@lru_cache(maxsize=4096)  # a path's answer never changes; resolving it costs a system call
def is_engine_frame(path: str) -> bool:
    """A frame of blok's engine, of the standard library or of an installed package (or of no
    file: `<string>`, `<frozen ...>`)."""
    if path.startswith("<"):
        return True
    resolved = str(Path(path).resolve()) if path.startswith("/") else path
    return resolved.startswith(_ENGINE_DIR) or resolved.startswith(_LIBRARY_DIRS)


def user_line(error: BaseException, cwd: Path | None = None) -> str | None:
    """`path:line` of the innermost user frame in `error`'s traceback (the path relative to
    `cwd`, this process's by default, when it is under it); None when every frame is the
    engine's or a library's."""
    found: TracebackType | None = None
    tb = error.__traceback__
    while tb is not None:
        if not is_engine_frame(tb.tb_frame.f_code.co_filename):
            found = tb
        tb = tb.tb_next
    if found is None:
        return None
    return _shown(found.tb_frame.f_code.co_filename, found.tb_lineno, cwd)


def running_line(frame: FrameType | None) -> str | None:
    """`path:line` of the innermost user frame of a thread's stack, `frame` its innermost (as
    `sys._current_frames()` gives it); None when every frame is the engine's or a library's."""
    while frame is not None:
        if not is_engine_frame(frame.f_code.co_filename):
            return _shown(frame.f_code.co_filename, frame.f_lineno, None)
        frame = frame.f_back
    return None


def caller_source() -> tuple[str, int] | None:
    """(file name as its code object has it, line) of the innermost frame of the user's code
    in the calls that led here: where the user wrote the `Step(...)` or `Workflow(...)` being
    made, past pydantic's and the engine's frames. A workflow file's load error compares the
    file name with the file's path; a message shows it with `shown_path`."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and is_engine_frame(frame.f_code.co_filename):
        frame = frame.f_back
    return None if frame is None else (frame.f_code.co_filename, frame.f_lineno)


def _shown(filename: str, line: int, cwd: Path | None) -> str:
    return f"{shown_path(filename, cwd)}:{line}"


def shown_path(path: str, cwd: Path | None = None) -> str:
    """`path` relative to `cwd` (this process's working directory by default) when it is under
    it, else as it is: how a run's error and the console's tracebacks name a file."""
    try:
        here = str((cwd or Path.cwd()).resolve()) + os.sep
    except OSError:  # the working directory was removed
        return path
    return path[len(here) :] if path.startswith(here) else path


@dataclass(frozen=True, slots=True)
class Stopped:
    """Where a node was when it was stopped (its time ran out, or its run's): the innermost
    line of the user's code (`path:line`, None when none was on the stack) and the stack in a
    traceback's form, which a timed-out attempt keeps as its traceback."""

    line: str | None
    stack: str

    @property
    def note(self) -> str:
        """What a one-line error ends with: ' (stopped at workflows/shop.py:14)', or
        nothing without a line."""
        return f" (stopped at {self.line})" if self.line else ""


_STOPPED_HEADER = "Stopped here (most recent call last):\n"


def stopped_by(cancellation: BaseException) -> Stopped:
    """Where an async node was: its frames are those the cancellation passed through on its
    way out, from the await it was thrown into."""
    return _stopped(traceback.extract_tb(cancellation.__traceback__))


def thread_stack(ident: int | None) -> traceback.StackSummary | None:
    """The stack of a thread now; None for one not started (no ident) or ended."""
    frame = sys._current_frames().get(ident) if ident is not None else None
    return None if frame is None else traceback.extract_stack(frame)


def stopped_in_thread(ident: int | None) -> Stopped | None:
    """Where a sync node's thread is now; None once it has returned."""
    stack = thread_stack(ident)
    return None if stack is None else _stopped(stack)


def _stopped(stack: traceback.StackSummary) -> Stopped:
    return Stopped(_innermost(stack), _STOPPED_HEADER + "".join(stack.format()))


def _innermost(stack: traceback.StackSummary) -> str | None:
    innermost = next((f for f in reversed(stack) if not is_engine_frame(f.filename)), None)
    if innermost is None or innermost.lineno is None:
        return None
    return _shown(innermost.filename, innermost.lineno, None)


# How each line of an answer to `where` begins, on the run's log: the asker finds the answer by
# it (engine/whereabouts.py).
WHERE_ANSWER = "where: "


def where_text(where: str, stack: traceback.StackSummary) -> str:
    """Where a running node is, for an operator who asked: "where: [step 1/2] fetch is at
    workflows/feeds.py:12", then its own frames, outermost first, a line each with the code
    on it (the engine's and libraries' left out)."""
    line = _innermost(stack)
    if line is None:
        return (
            f"{WHERE_ANSWER}{where} is in library code (no frame of the workflow's own is on "
            "its stack)"
        )
    frames = [
        f"  {_shown(f.filename, f.lineno, None)} in {f.name}: {(f.line or '').strip()}"
        for f in stack
        if f.lineno is not None and not is_engine_frame(f.filename)
    ]
    return "\n".join([f"{WHERE_ANSWER}{where} is at {line}", *frames])


# Exception types whose message is all a step's one-line error needs ("card declined"); any
# other type is named with it ("KeyError: 'amount'", where "'amount'" alone said nothing, and
# "SystemExit: 3" where "3" did).
PLAIN_TYPES = frozenset(
    {"Exception", "RuntimeError", "ValueError", "NonRetryable", "TimeoutError", "UnstorableOutput"}
)


def error_said(kind: str | None, message: str) -> str:
    """A failed attempt's error as a step's one-line error says it."""
    return (
        message if kind is None or kind in PLAIN_TYPES or message == kind else f"{kind}: {message}"
    )


def failed_for_good(
    where: str,
    error: str,
    failure: BaseException | None,
    attempts: int,
    stopped: Stopped | None = None,
    defined_at: str | None = None,
    given_up: bool = False,
) -> str:
    """The one-line error of a step whose last attempt failed: "[step 2/4] charge failed:
    card declined (at workflows/shop.py:14, after 3 attempts)"; at the step's definition when
    no frame of the error is the user's (the engine refused what the node returned, or the
    node is a library's function); for a step whose time ran out, where it was then:
    "(stopped at workflows/shop.py:14, ...)". Where it came from goes after the error: a table
    that cuts the line keeps the error."""
    origin = (user_line(failure) or defined_at) if failure is not None else None
    notes = [f"at {origin}"] if origin else []
    notes += [f"stopped at {stopped.line}"] if stopped is not None and stopped.line else []
    notes += [f"after {attempts} attempts"] if attempts > 1 else []
    notes += ["not retried"] if given_up else []
    return f"{where} failed: {error}" + (f" ({', '.join(notes)})" if notes else "")


def failed_before_running(
    where: str, detail: str, error: BaseException | None, defined_at: str | None
) -> str:
    """The one-line error of a step that failed before its node ran (its input, its wait's
    deadline or key) or of a flow step's own (a for_each's items no list): at the user's line
    when a callable of theirs raised `error`, else at the step's definition, whose expression
    it was."""
    origin = (user_line(error) if error is not None else None) or defined_at
    return f"{where} failed: {detail}" + (f" (at {origin})" if origin else "")
