"""The context a node receives, and the logger whose records are stored with the run."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .redact import redact_text, redact_value, secret_values

if TYPE_CHECKING:
    from .models import Job, Run

_engine_log = logging.getLogger("blok.run")


class RunLogger(logging.Logger):
    """A logger that stores every record with its run and step, then passes it on to `blok.run`.

    Made directly (not through logging.getLogger) so that one per run does not pile up in the
    logging module's registry.
    """

    def __init__(
        self,
        name: str,
        sink: Callable[[logging.LogRecord], None],
        secrets: tuple[str, ...] = (),
    ) -> None:
        super().__init__(name, logging.DEBUG)
        self._sink = sink
        self._secrets = secrets
        self.parent = _engine_log

    def callHandlers(self, record: logging.LogRecord) -> None:
        if self._secrets:
            self._redact(record)
        self._sink(record)
        if _engine_log.isEnabledFor(record.levelno):
            _engine_log.handle(record)

    def _redact(self, record: logging.LogRecord) -> None:
        """Secret header values a node logs (`ctx.logger.info("%s", ctx.headers)`) are hidden
        before the record is stored or reaches any handler, traceback text included."""
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        redacted = redact_text(text, self._secrets)
        if redacted != text:
            record.msg, record.args = redacted, None
            record.exc_info, record.exc_text = None, None


def _discard(record: logging.LogRecord) -> None:
    pass


class Context:
    """What a node sees: the job's input, earlier steps' outputs, a logger, cancellation."""

    __slots__ = (
        "_logger",
        "_secrets",
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
        self._secrets: tuple[str, ...] | None = None

    @property
    def logger(self) -> logging.Logger:
        # Created on first use: most no-op nodes never log.
        if self._logger is None:
            self._logger = RunLogger(f"blok.run.{self.workflow_name}", self._sink, self.secrets)
        return self._logger

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secret header values to keep out of anything stored (see engine.redact)."""
        if self._secrets is None:
            self._secrets = secret_values(self.headers)
        return self._secrets

    def redact(self, text: str) -> str:
        """`text` (a log line, an error, a traceback) with secret header values hidden."""
        return redact_text(text, self.secrets) if self.secrets else text

    def redact_value(self, value: Any) -> Any:
        """A JSON value to record (a step's input or output, a state snapshot) with secret
        header values hidden wherever they land; the node itself saw the real ones."""
        return redact_value(value, self.secrets) if self.secrets else value

    @classmethod
    def for_job(cls, run: Run, job: Job, state: dict[str, Any] | None = None) -> Context:
        """The context of `run` executing `job`, logging nowhere until a sink is set."""
        return cls(
            run_id=run.id,
            workflow_name=run.workflow_name,
            body=job.payload,
            headers=job.headers,
            params={
                "queue": job.queue,
                "job_id": job.id,
                "attempt": run.job_attempt,
                "priority": job.priority,
            },
            state=state if state is not None else {},
            sink=_discard,
        )

    def __repr__(self) -> str:
        return f"Context(run_id={self.run_id!r}, workflow={self.workflow_name!r})"
