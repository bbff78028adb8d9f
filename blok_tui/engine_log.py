"""The engine's own warnings, in the console.

Under the console, log lines go to a file (they would tear the screen), and a warning there was
read by no one: an async node blocking the event loop, a sub-workflow name that matches no
workflow, two deployments serving one queue, a job id enqueued again with another payload. Each
warning of an engine logger (`blok.*`) becomes a line of the logs view (`:logs`, its run column
"engine") and, one every few seconds at most, a toast. Warnings of the runs themselves are not:
a run's own lines reach the view as its events do, and its failure shows where runs are shown;
nor a workflow file that failed to load, which the banner shows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from engine import LogRecorded
from engine.catalog import RELOAD_ERROR

ENGINE = "engine"  # the run column of an engine line: no run to open
RUNS_LOGGERS = ("blok.run", "blok.runs")  # a run's lines, and its end said again: shown already
TOAST_EVERY_S = 10.0  # one toast in this long at most; the logs view has every line
TOAST_CHARS = 320  # of a warning in its toast (a did-you-mean comes last)
EARLY = 100  # warnings kept before the console is up, the newest


class EngineWarnings(logging.Handler):
    """Hands each warning of the `blok` loggers to the console (`attach`), in the event loop's
    thread (a warning may come from another: the loop watchdog's). Those logged before the
    console is up (a workflow file's, as the engine loads it) are kept until it attaches."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._deliver: Callable[[LogRecorded], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._early: deque[LogRecorded] = deque(maxlen=EARLY)

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(RUNS_LOGGERS) or getattr(record, RELOAD_ERROR, False):
            return  # a run's own line, or a file that failed to load: the banner says it
        try:
            line = LogRecorded(
                run_id=ENGINE,
                step=None,
                level=record.levelname.lower(),
                message=f"{record.name}: {record.getMessage()}",
                ts=record.created,
            )
            if self._deliver is None or self._loop is None:
                self._early.append(line)
            else:
                self._loop.call_soon_threadsafe(self._deliver, line)
        except Exception:  # a closed loop (the console gone): logging's own report
            self.handleError(record)

    def attach(self, deliver: Callable[[LogRecorded], None]) -> None:
        """From now on to `deliver` (called in the running event loop), the early ones first."""
        self._loop = asyncio.get_running_loop()
        self._deliver = deliver
        while self._early:
            deliver(self._early.popleft())

    def remove(self) -> None:
        """The console is gone: nothing more is kept or handed on."""
        self._deliver = self._loop = None
        logging.getLogger("blok").removeHandler(self)


def installed() -> EngineWarnings:
    """The handler on the `blok` logger, installed by the first call: the command installs it
    before the engine opens, the console attaches to it (tests' consoles install their own)."""
    logger = logging.getLogger("blok")
    for handler in logger.handlers:
        if isinstance(handler, EngineWarnings):
            return handler
    handler = EngineWarnings()
    logger.addHandler(handler)
    return handler


class Toasts:
    """Whether a warning gets a toast now: one in TOAST_EVERY_S at most (a node that blocks
    the loop is warned of at each of its runs)."""

    def __init__(self, every_s: float = TOAST_EVERY_S) -> None:
        self.every_s = every_s
        self._last = -every_s

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.every_s:
            return False
        self._last = now
        return True
