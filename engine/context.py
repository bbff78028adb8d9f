"""The context a node receives, and the logger whose records are stored with the run."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

_engine_log = logging.getLogger("blok.run")


class RunLogger(logging.Logger):
    """A logger that stores every record with its run and step, then passes it on to `blok.run`.

    Made directly (not through logging.getLogger) so that one per run does not pile up in the
    logging module's registry.
    """

    def __init__(self, name: str, sink: Callable[[logging.LogRecord], None]) -> None:
        super().__init__(name, logging.DEBUG)
        self._sink = sink
        self.parent = _engine_log

    def callHandlers(self, record: logging.LogRecord) -> None:
        self._sink(record)
        if _engine_log.isEnabledFor(record.levelno):
            _engine_log.handle(record)


class Context:
    """What a node sees: the job's input, earlier steps' outputs, a logger, cancellation."""

    __slots__ = (
        "_logger",
        "_sink",
        "attempt",
        "body",
        "cancelled",
        "headers",
        "params",
        "run_id",
        "state",
        "step_index",
        "workflow_name",
    )

    def __init__(
        self,
        *,
        run_id: str,
        workflow_name: str,
        body: Any,
        headers: dict[str, str],
        params: dict[str, Any],
        state: dict[str, Any],
        sink: Callable[[logging.LogRecord], None],
    ) -> None:
        self.run_id = run_id
        self.workflow_name = workflow_name
        self.body = body
        self.headers = headers
        self.params = params
        self.state = state
        self.attempt = 1
        self.cancelled = False
        self.step_index: int | None = None
        self._sink = sink
        self._logger: RunLogger | None = None

    @property
    def logger(self) -> logging.Logger:
        # Created on first use: most no-op nodes never log.
        if self._logger is None:
            self._logger = RunLogger(f"blok.run.{self.workflow_name}", self._sink)
        return self._logger

    def __repr__(self) -> str:
        return f"Context(run_id={self.run_id!r}, workflow={self.workflow_name!r})"
