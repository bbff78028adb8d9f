"""The engine's observation hooks, as a class whose methods do nothing: what the engine has
without OpenTelemetry (engine/telemetry.py chooses; engine/tracing.py implements them).

The engine calls `telemetry.OBSERVE.<hook>(...)` at each point worth a span or a number, one call
per point:

- `enqueuing(job)` (Operator._job): the job carries the trace context of the code enqueuing it,
  as a W3C `traceparent` header, so its run joins that trace in whichever process runs it.
- `replay_link(source)` (Operator._replay_job): a replay's job notes its source run's trace.
- `enqueued(jobs, added)` (Ledger.add), `job_failed(run, outcome)` (Ledger.fail),
  `run_finished(run)` (every run that ends: Ledger.on_run_ended): counters and durations.
- `run_started(run, job, version)` / `run_ended(run)` (Worker._execute): the span of one
  delivery of a run, current while its steps run; `step(run, ctx, name, scope)` (Runner._node):
  a context manager around one step attempt, the span current while the node runs.
- `wait_ended(run, record, outcome)` (Runner._wait, Runner._event_wait): a wait step ended, in
  the delivery that found its time reached or its event come (or its timeout passed); it may
  have begun in an earlier delivery, in another process. A wait a cancel ends is seen by
  `run_finished` (the run is cancelled, its waiting step record `cancelled`).
- `sample_queues(tg, operator, served)` (a worker engine's start): the queue-depth gauges.
"""

from __future__ import annotations

import re
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from anyio import CancelScope
    from anyio.abc import TaskGroup

    from .context import Context
    from .models import Job, Run, StepRun

INSTRUMENTATION = "blok-tui"  # the tracer's and the meter's name
TRACEPARENT = "traceparent"
TRACE_LINK = "trace_link"  # job meta: the traceparent of the run a replay was made from
# How a wait ended: its moment came (wait.for_, wait.until), its event came, its timeout passed
# first (wait.for_event), or the run was cancelled while it waited.
WaitOutcome = Literal["time_reached", "event_received", "timed_out", "cancelled"]

# W3C Trace Context: version-traceid-parentid-flags, lowercase hex; all-zero ids are invalid and
# version ff is forbidden.
_TRACEPARENT = re.compile(
    r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
)


_SHAPE = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def valid_traceparent(value: str) -> bool:
    """A W3C `traceparent` value (`00-<32 hex>-<16 hex>-<2 hex>`)?"""
    return _TRACEPARENT.fullmatch(value.strip()) is not None


def traceparent_problem(value: str) -> str:
    """Why `value` is not a W3C `traceparent`: its shape, or the ids the standard forbids (a
    value of the right shape was refused with its shape only)."""
    parts = value.strip().split("-")
    shaped = _SHAPE.fullmatch(value.strip()) is not None
    if shaped and parts[0] == "ff":
        return "version ff is forbidden"
    if shaped and set(parts[1]) == {"0"}:
        return "an all-zero trace id is invalid"
    if shaped and set(parts[2]) == {"0"}:
        return "an all-zero parent id is invalid"
    return "00-<32 hex>-<16 hex>-<2 hex>"


def traceparent_of(headers: dict[str, str] | None) -> str | None:
    """The `traceparent` among headers, whatever the case of its name (HTTP's are any)."""
    if not headers:
        return None
    value = headers.get(TRACEPARENT)
    if value is not None:
        return value
    for name, value in headers.items():
        if name.lower() == TRACEPARENT:
            return value
    return None


class _Nothing:
    """A context manager that does nothing, cheaper than contextlib.nullcontext()."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


NOTHING = _Nothing()


class Observer:
    """The hooks, doing nothing: what the engine has without OpenTelemetry."""

    enabled = False

    def engine_started(self) -> None:
        """An engine starts: the providers the application set are looked up again."""

    def enqueuing(self, job: Job) -> None:
        """A job is about to be added: give it the current trace context."""

    def replay_link(self, source: Run) -> dict[str, str]:
        """Job meta that links a replay of `source` to its trace."""
        return {}

    def enqueued(self, jobs: list[Job], added: list[str]) -> None:
        """Jobs were added (`added`: the ids that were new)."""

    def run_started(self, run: Run, job: Job, version: str) -> None:
        """This worker starts (or resumes) `run` for `job`."""

    def run_ended(self, run: Run) -> None:
        """This worker is done with `run` for now: it ended, waits, or went back."""

    def step(
        self, run: Run, ctx: Context, name: str, scope: CancelScope | None
    ) -> AbstractContextManager[None]:
        """Around one attempt of step `name` (`scope`: its max_duration's, if any)."""
        return NOTHING

    def flow_step(
        self, run: Run, ctx: Context, name: str, kind: str, pausing: type[BaseException]
    ) -> AbstractContextManager[None]:
        """Around a flow step (a for_each, a loop, a switch, a try_catch, a sub-workflow), whose
        inner steps it holds; `pausing`: the exception that is the run pausing in it, not an
        error."""
        return NOTHING

    def wait_ended(self, run: Run, record: StepRun, outcome: WaitOutcome) -> None:
        """The wait step of `record` (kind "wait" or "event", its started_at and finished_at
        set) ended as `outcome` says."""

    def job_failed(self, run: Run, outcome: str) -> None:
        """A delivery failed: `outcome` is "retried", "dead" (dead-lettered) or "failed"."""

    def run_finished(self, run: Run) -> None:
        """`run` reached a terminal status."""

    def sample_queues(self, tg: TaskGroup, operator: Any, served: Any) -> None:
        """Start sampling the depth of the queues `served()` names, for the metrics."""


__all__ = [
    "INSTRUMENTATION",
    "NOTHING",
    "TRACEPARENT",
    "TRACE_LINK",
    "Observer",
    "WaitOutcome",
    "traceparent_of",
    "valid_traceparent",
]
