"""The engine's own warnings, in the console.

Under the console, log lines go to a file (they would tear the screen), and a warning there was
read by no one: an async node blocking the event loop, a sub-workflow name that matches no
workflow, two deployments serving one queue, a job id enqueued again with another payload. Each
warning of an engine logger (`blok.*`) becomes a line of the logs view (`:logs`, its run column
"engine") and, one every few seconds at most, a toast. Warnings of the runs themselves are not:
a run's own lines reach the view as its events do, and its failure shows where runs are shown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from engine import LogRecorded

ENGINE = "engine"  # the run column of an engine line: no run to open
RUNS_LOGGERS = ("blok.run", "blok.runs")  # a run's lines, and its end said again: shown already
TOAST_EVERY_S = 10.0  # one toast in this long at most; the logs view has every line


class EngineWarnings(logging.Handler):
    """Hands each warning of the `blok` loggers to `deliver`, in the event loop's thread
    (a warning may come from another: the loop watchdog's)."""

    def __init__(
        self, deliver: Callable[[LogRecorded], None], loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(logging.WARNING)
        self.deliver = deliver
        self.loop = loop

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(RUNS_LOGGERS):
            return
        try:
            line = LogRecorded(
                run_id=ENGINE,
                step=None,
                level=record.levelname.lower(),
                message=f"{record.name}: {record.getMessage()}",
                ts=record.created,
            )
            self.loop.call_soon_threadsafe(self.deliver, line)
        except Exception:  # a closed loop (the console gone): logging's own report
            self.handleError(record)

    def install(self) -> None:
        logging.getLogger("blok").addHandler(self)

    def remove(self) -> None:
        logging.getLogger("blok").removeHandler(self)


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
