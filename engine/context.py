"""The context a node receives, and the logger whose records are stored with the run."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from difflib import get_close_matches
from typing import TYPE_CHECKING, Any

from .expressions import did_you_mean
from .redact import redact_text, redact_value, secret_values

if TYPE_CHECKING:
    from .models import Job, Run
    from .origin import Stopped

_engine_log = logging.getLogger("blok.run")


class MissingStateKey(KeyError):
    """`ctx.state[key]` for a key it does not have: a KeyError (its `args[0]` the key, as any
    dict's), whose message says what the state has. A mistyped step name in a loop's `until`
    or a node read "KeyError: 'chek'", and nothing said which names there were."""

    def __init__(self, key: Any, known: tuple[str, ...] = ()) -> None:
        super().__init__(key)
        self.known = known

    def __str__(self) -> str:
        key = self.args[0]
        if not self.known:
            return f"ctx.state has no {key!r}: no step has put anything in it yet"
        has = ", ".join(repr(k) for k in self.known[:8]) + (", …" if len(self.known) > 8 else "")
        meant = did_you_mean(key, self.known) if isinstance(key, str) else ""
        return f"ctx.state has no {key!r} (it has {has}){meant}"


class RunState(dict[str, Any]):
    """`ctx.state`: the outputs of the steps so far, by name; a plain dict but for the error
    of a key it does not have (`MissingStateKey`). `.get` and `in` are a dict's."""

    __slots__ = ()

    def __missing__(self, key: Any) -> Any:
        raise MissingStateKey(key, tuple(self))


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
        if record.args:
            _fit_arguments(record)
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


def _fit_arguments(record: logging.LogRecord) -> None:
    """A log call whose arguments do not fit its format (`info("%s %s", 1)`) fails no step: a
    logging handler says so and goes on. It is kept as written, saying why."""
    try:
        record.getMessage()
    except Exception as error:  # whatever the arguments' own __str__ raises, too
        record.msg = (
            f"{record.msg} {record.args!r} (the log call's arguments do not fit its format: "
            f"{type(error).__name__}: {error})"
        )
        record.args = None


def own_copy(value: Any) -> Any:
    """A JSON value's containers copied, its strings and numbers shared: a node may change its
    `ctx.body` as it likes without changing the job's payload (what its next delivery, a
    replay and the run's record read), or the enqueuer's dict, as a queue that stores
    payloads as bytes never lets it."""
    kind = type(value)
    if kind is dict:
        for item in value.values():
            if type(item) in _CONTAINERS:
                return {key: own_copy(item) for key, item in value.items()}
        return dict(value)  # flat, as most bodies are: one copy, no call a value
    if kind in _CONTAINERS:
        return [own_copy(item) for item in value]
    return value


_CONTAINERS = (dict, list, tuple)


def _discard(record: logging.LogRecord) -> None:
    pass


@dataclass(frozen=True, slots=True)
class JobInfo:
    """The job a run executes, as `ctx.job` (the seed's `_worker_job`): a node can tell, for
    one, that it runs on the job's last attempt."""

    id: str
    queue: str
    attempt: int  # which attempt of the job this run is: 1, then one more per job retry
    max_retries: int  # the job's retry budget (the trigger's, or enqueue(retries=...))
    delivery: int  # times the job was handed to a worker, this one included
    created_at: datetime
    delay_ms: int  # the delay it was enqueued with
    timeout_ms: int | None  # the whole run's time limit (the trigger's, or enqueue(timeout=))
    priority: int

    @property
    def last_attempt(self) -> bool:
        """No job retry is left after this one."""
        return self.attempt > self.max_retries


class StopFlag:
    """The run is being stopped (an operator's cancel, the job's timeout, a stop): shared by the
    contexts of one run, parallel branches included."""

    __slots__ = ("set",)

    def __init__(self) -> None:
        self.set = False


class Context:
    """What a node sees: the job's input, earlier steps' outputs, a logger, cancellation."""

    __slots__ = (
        "__weakref__",  # the log sink's way back to its context (Runner.log_sink)
        "_logger",
        "_secrets",
        "_sink",
        "_stop",
        "attempt",
        "attempt_stopped",
        "body",
        "headers",
        "job",
        "params",
        "run_id",
        "state",
        "step_index",
        "stopped_at",
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
        stop: StopFlag | None = None,
        job: JobInfo | None = None,
    ) -> None:
        self.run_id = run_id
        self.workflow_name = workflow_name
        self.body = body
        self.headers = headers
        self.params = params
        self.state = state if type(state) is RunState else RunState(state)
        self.attempt = 1
        self._stop = stop if stop is not None else StopFlag()
        self.attempt_stopped = False  # this step attempt timed out
        self.stopped_at: Stopped | None = None  # where the last stopped async node was
        self.job = job
        self.step_index: int | None = None
        self._sink = sink
        self._logger: RunLogger | None = None
        self._secrets: tuple[str, ...] | None = None

    @property
    def cancelled(self) -> bool:
        """True once the run is being stopped or the current attempt timed out: a node that
        cannot be interrupted (a sync node in its thread, a polling loop) should return."""
        return self._stop.set or self.attempt_stopped

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        self._stop.set = value

    def branch(self, state: dict[str, Any]) -> Context:
        """A context for a parallel branch of this run: its own state and logs, the run's
        cancellation."""
        return Context(
            run_id=self.run_id,
            workflow_name=self.workflow_name,
            body=self.body,
            headers=self.headers,
            params=self.params,
            state=state,
            sink=_discard,
            stop=self._stop,
            job=self.job,
        )

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
    def for_job(
        cls,
        run: Run,
        job: Job,
        state: dict[str, Any] | None = None,
        timeout_ms: int | None = None,
    ) -> Context:
        """The context of `run` executing `job`, logging nowhere until a sink is set."""
        info = JobInfo(
            id=job.id,
            queue=job.queue,
            attempt=run.job_attempt,
            max_retries=job.max_retries,
            delivery=job.deliveries,
            created_at=job.created_at,
            delay_ms=int(job.meta.get("delay_ms", 0)),
            timeout_ms=timeout_ms,
            priority=job.priority,
        )
        return cls(
            run_id=run.id,
            workflow_name=run.workflow_name,
            body=own_copy(job.payload),
            headers=job.headers,
            params={
                "queue": job.queue,
                "job_id": job.id,
                "attempt": run.job_attempt,
                "priority": job.priority,
            },
            state=RunState(state) if state is not None else RunState(),
            sink=_discard,
            job=info,
        )

    def __repr__(self) -> str:
        return f"Context(run_id={self.run_id!r}, workflow={self.workflow_name!r})"

    def __getattr__(self, name: str) -> Any:
        # Only for a name the context does not have: the error names the one meant. Python
        # suggests names in a printed traceback only, and a node's error is read from its
        # message (`'Context' object has no attribute 'log'`).
        if name.startswith("__"):
            raise AttributeError(name)
        meant = _MEANT.get(name) or next(iter(get_close_matches(name, _PUBLIC, n=1)), None)
        hint = f": did you mean ctx.{meant}?" if meant else f" (it has: {', '.join(_PUBLIC)})"
        raise AttributeError(f"the context has no attribute {name!r}{hint}", name=name, obj=self)


# What a node's context offers (the CONTRACT's), and the names other engines gave to them.
_PUBLIC = (
    "run_id",
    "workflow_name",
    "body",
    "headers",
    "params",
    "state",
    "logger",
    "attempt",
    "cancelled",
    "job",
)
_MEANT = {
    "log": "logger",
    "input": "body",
    "inputs": "body",
    "payload": "body",
    "data": "body",
    "event": "body",
    "outputs": "state",
    "results": "state",
    "steps": "state",
    "job_id": "params['job_id'] (or ctx.job.id)",
    "queue": "params['queue']",
    "is_cancelled": "cancelled",
    "canceled": "cancelled",
}
