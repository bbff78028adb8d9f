"""OpenTelemetry behind the engine's hooks (engine/telemetry.py): spans, trace context, metrics.

Imported only when `opentelemetry-api` is installed, the first time an engine starts
(engine/telemetry.py); the hooks it implements are described in engine/observer.py.

Traces. A job carries the trace context it was enqueued in as a W3C `traceparent` header: with
a tracer provider set where it is enqueued, a short PRODUCER span `enqueue <queue>` is made in
the current trace and the header points at it; with none, the current span context (if any) is
passed on as it is; a `traceparent` the caller put in the headers itself is kept. Each delivery
of the run is a CONSUMER span `run <workflow>`, a child of that context, in whichever process
claims the job, and each step attempt a child span `step <name>` of it; both are current while
their code runs, so a node's own spans (an HTTP client's) nest under its step, and a sub-workflow
enqueued by a step joins the same trace. A run that waits ends its span; the delivery that
resumes it (here or in another process, after a restart too) starts another span under the same
parent, so the run stays one trace. A job enqueued with no trace context at all starts a new
trace at its first delivery, whose context is kept in the run's headers for the deliveries that
resume it. A replay's spans link to its source run's trace.

Waits. Each wait step (wait.for_, wait.until, wait.for_event) is a span `wait <name>` of its
own, under the same parent as the run's spans (the run's first span, for a run that started its
trace), lasting from when the wait began to when it ended: `blok.wait.kind` ("time" or
"event"), `blok.wait.event` (an event wait's event), `blok.wait.until` (the moment, or the
event's timeout), `blok.wait.outcome` ("time_reached", "event_received", "timed_out" or
"cancelled"). The wait may end in another process than the one it began in, after a restart
too, so the span is made, whole, when it ends: by the delivery that finds its moment reached or
its event come (`wait_ended`), or by the process that cancels the waiting run (`run_finished`).
It ends then and lasts what its step record says (`started_at` to `finished_at`, which any
process reads).

Metrics: see engine/metrics.py.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .metrics import Instruments, collected, start_sampling
from .models import RunStatus, StepStatus
from .observer import (
    INSTRUMENTATION,
    NOTHING,
    TRACE_LINK,
    TRACEPARENT,
    Observer,
    WaitOutcome,
    traceparent_of,
)

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from anyio import CancelScope
    from anyio.abc import TaskGroup

    from .context import Context
    from .metrics import QueueReader, ServedQueues
    from .models import Job, Run, StepRun

# The header the job carries is ours to read, whatever propagator the application configured.
PROPAGATOR = TraceContextTextMapPropagator()
_FAILED = frozenset({RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.CRASHED})
_UNSET = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
PROVIDER_LOOK_S = 1.0  # while none is set, a tracer or meter provider is looked for this often
WAIT_KINDS = {"wait": "time", "event": "event"}  # a wait step record's kind: blok.wait.kind


def _context_of(traceparent: str | None) -> otel_context.Context | None:
    """The context a `traceparent` value names; None if it names none (absent or malformed)."""
    if not traceparent:
        return None
    found = PROPAGATOR.extract({TRACEPARENT: traceparent})
    if not trace.get_current_span(found).get_span_context().is_valid:
        return None
    return found


def _links(job: Job) -> Sequence[Link] | None:
    linked = _context_of(job.meta.get(TRACE_LINK)) if job.meta else None
    if linked is None:
        return None
    return [Link(trace.get_current_span(linked).get_span_context(), {"blok.link": "replay_of"})]


def _traceparent(span: Span) -> str | None:
    """The span's context as a W3C traceparent; None for a span that has none (a disabled SDK,
    `OTEL_SDK_DISABLED=true`, gives out spans with an invalid context, and the propagator
    writes nothing for them)."""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT)


def _wait_span(
    tracer: Tracer,
    parent: otel_context.Context,
    run: Run,
    record: StepRun,
    outcome: WaitOutcome,
) -> None:
    """The span of a wait that ended just now, as `outcome` says."""
    started, finished = record.started_at, record.finished_at
    if started is None or finished is None:
        return
    # The record's moments are on the backend's clock, which may be off this process's (a
    # PostgreSQL server's, engine/clock.py) while the spans around are on this one's: the span
    # ends now, here, and lasts as long as the record says.
    end = time.time_ns()
    start = end - max(0, (finished - started) // timedelta(microseconds=1)) * 1000
    attributes: dict[str, Any] = {
        "blok.run.id": run.id,
        "blok.queue": run.queue,
        "blok.workflow.name": run.workflow_name,
        "blok.step.name": record.name,
        "blok.step.index": record.index,
        "blok.wait.kind": WAIT_KINDS.get(record.kind, record.kind),
        "blok.wait.outcome": outcome,
    }
    event = (record.input or {}).get("event") if record.kind == "event" else None
    if event is not None:
        attributes["blok.wait.event"] = str(event)
    if record.wait_until is not None:
        attributes["blok.wait.until"] = record.wait_until.isoformat()
    span = tracer.start_span(
        f"wait {record.name}", context=parent, attributes=attributes, start_time=start
    )
    span.end(end_time=end)


def _run_attributes(run: Run) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "blok.run.id": run.id,
        "blok.job.id": run.job_id,
        "blok.queue": run.queue,
        "blok.workflow.name": run.workflow_name,
        "blok.job.attempt": run.job_attempt,
        "messaging.system": "blok",
        "messaging.destination.name": run.queue,
        "messaging.message.id": run.job_id,
    }
    if run.workflow_version:
        attributes["blok.workflow.version"] = run.workflow_version
    return attributes


def _step_attributes(run: Run, ctx: Context, name: str) -> dict[str, Any]:
    """What finds a step's span (an attempt's, a flow step's); the rest of the run's attributes
    are on its parent span."""
    attributes: dict[str, Any] = {
        "blok.run.id": run.id,
        "blok.queue": run.queue,
        "blok.workflow.name": run.workflow_name,
        "blok.step.name": name,
    }
    if ctx.step_index is not None:
        attributes["blok.step.index"] = ctx.step_index
    return attributes


class _StepAttempt:
    """One step attempt: its span (current while the node runs) and its duration."""

    __slots__ = ("_ctx", "_name", "_run", "_scope", "_span", "_started", "_token", "_tracing")

    def __init__(
        self,
        tracing: OtelTelemetry,
        run: Run,
        ctx: Context,
        name: str,
        scope: CancelScope | None,
    ) -> None:
        self._tracing = tracing
        self._run = run
        self._ctx = ctx
        self._name = name
        self._scope = scope
        self._span: Span | None = None
        self._token: object = None
        self._started = 0.0

    def __enter__(self) -> None:
        # A step is traced when its run is (the provider is looked up once per run).
        traced = self._tracing.traced.get(self._run.id)
        if traced is not None:
            tracer = traced.tracer
            run, ctx = self._run, self._ctx
            attributes = _step_attributes(run, ctx, self._name)
            attributes["blok.step.attempt"] = ctx.attempt
            self._span = span = tracer.start_span(f"step {self._name}", attributes=attributes)
            self._token = otel_context.attach(trace.set_span_in_context(span))
        self._started = time.perf_counter()

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        elapsed = time.perf_counter() - self._started
        # The step's own timeout (max_duration) is caught by its scope, inside this one: the
        # attempt ends here with no exception and the scope says it was cut short.
        if error is None:
            timed_out = self._scope is not None and self._scope.cancelled_caught
            status = "timed_out" if timed_out else "completed"
        elif isinstance(error, Exception):
            status = "failed"
        else:
            status = "cancelled"  # the run was cancelled, lost its lease, or the worker stops
        span = self._span
        if span is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
        run = self._run
        if self._tracing.metering():
            self._tracing.metrics.step_duration.record(
                elapsed,
                {"workflow": run.workflow_name, "step": self._name, "status": status},
            )
        if span is None:
            return
        span.set_attribute("blok.step.status", status)
        if status == "failed":
            assert isinstance(error, Exception)
            ctx = self._ctx
            # What the node raised may quote a secret header: recorded as the run's record
            # keeps it, redacted.
            message = ctx.redact(str(error) or type(error).__name__)
            span.record_exception(
                error,
                attributes={
                    "exception.message": message,
                    "exception.stacktrace": ctx.redact("".join(traceback.format_exception(error))),
                },
            )
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {message}"))
        elif status == "timed_out":
            span.set_status(Status(StatusCode.ERROR, "timed out (max_duration)"))
        span.end()


class _FlowStep:
    """A flow step's span, current while its inner steps run: their spans are its children
    (they were the run's, a for_each's hundred attempts side by side with the steps around
    it)."""

    __slots__ = ("_pausing", "_span", "_token")

    def __init__(self, span: Span, pausing: type[BaseException]) -> None:
        self._span = span
        self._pausing = pausing
        self._token: object = None

    def __enter__(self) -> None:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        otel_context.detach(self._token)  # type: ignore[arg-type]
        span = self._span
        if error is None:
            status = "completed"
        elif isinstance(error, self._pausing):
            status = "waiting"  # the run waits inside it: the rest is another delivery's span
        elif isinstance(error, Exception):
            status = "failed"
            span.set_status(Status(StatusCode.ERROR, str(error) or type(error).__name__))
        else:
            status = "cancelled"
        span.set_attribute("blok.step.status", status)
        span.end()


class _Traced(NamedTuple):
    """A delivery of a run traced here."""

    span: Span
    token: object  # what made the span current (detached as the delivery ends)
    tracer: Tracer
    # The parent of the run's spans, the waits' too: the context the job carried, else the
    # run's first span (the one that started its trace).
    parent: otel_context.Context


class OtelTelemetry(Observer):
    enabled = True

    def __init__(self) -> None:
        self._provider: object = None
        self._tracer: Tracer | None = None
        # Runs traced here, by id (the delivery running here now).
        self.traced: dict[str, _Traced] = {}
        self.metrics = Instruments()
        self._counted_active: set[str] = set()  # runs whose start `blok.runs.active` counted
        # Which providers the application had set when last looked for (`_look`), and when
        # to look again (a monotonic time; 0: at the next hook).
        self._tracing = False
        self._metered = False
        self._look_at = 0.0

    def engine_started(self) -> None:
        self._look_at = 0.0

    def _look(self) -> None:
        """Which providers the application set. While none is set, OpenTelemetry's lookups
        read the environment (a KeyError raised and caught each), and a hook runs several
        times a job: the answers hold for PROVIDER_LOOK_S, so a provider set while an engine
        runs is used within that time, one set before an engine starts at once (each engine's
        start looks again, `engine_started`)."""
        self._tracing = not isinstance(trace.get_tracer_provider(), _UNSET)
        self._metered = collected()
        self._look_at = time.monotonic() + PROVIDER_LOOK_S

    def metering(self) -> bool:
        """Whether the application set a meter provider. Until it does, the instruments are
        OpenTelemetry's stand-ins, which drop what they are given."""
        if time.monotonic() >= self._look_at:
            self._look()
        return self._metered

    def tracer(self) -> Tracer | None:
        """The tracer of the provider the user set; None while none is set (no spans then)."""
        if time.monotonic() >= self._look_at:
            self._look()
        if not self._tracing:
            return None
        provider = trace.get_tracer_provider()
        if isinstance(provider, _UNSET):  # unset since the look (only tests reset providers)
            return None
        if provider is not self._provider:
            self._tracer = provider.get_tracer(INSTRUMENTATION)
            self._provider = provider
        return self._tracer

    # ---- enqueue ---------------------------------------------------------------------------
    def enqueuing(self, job: Job) -> None:
        if traceparent_of(job.headers) is not None:
            return  # the caller's own trace context wins
        carrier: dict[str, str] = {}
        tracer = self.tracer()
        if tracer is not None:
            attributes = {
                "blok.job.id": job.id,
                "blok.queue": job.queue,
                "blok.workflow.name": job.workflow_name,
                "messaging.system": "blok",
                "messaging.destination.name": job.queue,
                "messaging.message.id": job.id,
            }
            span = tracer.start_span(
                f"enqueue {job.queue}",
                kind=SpanKind.PRODUCER,
                attributes=attributes,
                links=_links(job),
            )
            PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
            span.end()
        elif otel_context.get_current() and trace.get_current_span().get_span_context().is_valid:
            # Nothing recorded here, but the context goes on. (With no provider set the
            # context is nearly always empty: one lookup, not the span's five.)
            PROPAGATOR.inject(carrier)
        if carrier:
            job.headers = {**job.headers, **carrier}

    def replay_link(self, source: Run) -> dict[str, str]:
        traceparent = traceparent_of(source.headers)
        return {TRACE_LINK: traceparent} if traceparent else {}

    def enqueued(self, jobs: list[Job], added: list[str]) -> None:
        if not added or not self.metering():
            return
        counter = self.metrics.enqueued
        if len(jobs) == 1:
            counter.add(1, {"queue": jobs[0].queue})
            return
        fresh = set(added)
        counts: dict[str, int] = {}
        for job in jobs:
            if job.id in fresh:
                counts[job.queue] = counts.get(job.queue, 0) + 1
        for queue, count in counts.items():
            counter.add(count, {"queue": queue})

    # ---- a run in this worker --------------------------------------------------------------
    def run_started(self, run: Run, job: Job, version: str) -> None:
        if self.metering():
            self.metrics.active.add(1, {"queue": run.queue})
            self._counted_active.add(run.id)  # so that its end takes back only what it added
        tracer = self.tracer()
        if tracer is None:
            return
        # Enqueued with no trace context, the run's first delivery started a trace, kept in
        # the run's headers for the deliveries that resume it.
        parent = _context_of(traceparent_of(job.headers))
        if parent is None:
            parent = _context_of(traceparent_of(run.headers))
        attributes = _run_attributes(run)
        attributes["blok.workflow.version"] = version
        attributes["blok.run.resumed"] = run.started_at is not None
        if run.replay_of:
            attributes["blok.run.replay_of"] = run.replay_of
        if run.parent_run_id:
            attributes["blok.run.parent_run_id"] = run.parent_run_id
        span = tracer.start_span(
            f"run {run.workflow_name}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=_links(job),
        )
        traceparent = _traceparent(span) if parent is None else None
        if traceparent is not None:
            # Written with the run's start record (the ledger saves it next).
            run.headers = {**run.headers, TRACEPARENT: traceparent}
        current = trace.set_span_in_context(span)
        token = otel_context.attach(current)
        self.traced[run.id] = _Traced(span, token, tracer, current if parent is None else parent)

    def run_ended(self, run: Run) -> None:
        if run.id in self._counted_active:
            self._counted_active.discard(run.id)
            self.metrics.active.add(-1, {"queue": run.queue})
        entry = self.traced.pop(run.id, None)
        if entry is None:
            return
        span, token = entry.span, entry.token
        otel_context.detach(token)  # type: ignore[arg-type]
        span.set_attribute("blok.run.status", str(run.status))
        if run.status in _FAILED:
            span.set_status(Status(StatusCode.ERROR, run.error or str(run.status)))
        elif run.status is RunStatus.WAITING and run.wait_until is not None:
            span.add_event("wait", {"blok.run.wait_until": run.wait_until.isoformat()})
        span.end()

    def step(
        self, run: Run, ctx: Context, name: str, scope: CancelScope | None
    ) -> AbstractContextManager[None]:
        if run.id not in self.traced and not self.metering():
            return NOTHING  # neither a span nor a duration to record
        return _StepAttempt(self, run, ctx, name, scope)

    def flow_step(
        self, run: Run, ctx: Context, name: str, kind: str, pausing: type[BaseException]
    ) -> AbstractContextManager[None]:
        traced = self.traced.get(run.id)
        if traced is None:
            return NOTHING
        attributes = _step_attributes(run, ctx, name)
        attributes["blok.step.kind"] = kind
        span = traced.tracer.start_span(f"{kind} {name}", attributes=attributes)
        return _FlowStep(span, pausing)

    def wait_ended(self, run: Run, record: StepRun, outcome: WaitOutcome) -> None:
        traced = self.traced.get(run.id)
        if traced is not None:
            _wait_span(traced.tracer, traced.parent, run, record, outcome)

    def _cancelled_waits(self, run: Run) -> None:
        """The wait spans of a run cancelled while it waited (the cancel closed its waiting
        steps `cancelled`): ended here, by whichever process cancelled it."""
        waits = [
            record
            for record in run.steps
            if record.status is StepStatus.CANCELLED and record.kind in WAIT_KINDS
        ]
        if not waits:
            return
        tracer = self.tracer()
        # A run that was traced has a trace context in its headers (the job's, or the one its
        # first delivery started): with none, it has no trace to add to.
        parent = _context_of(traceparent_of(run.headers))
        if tracer is None or parent is None:
            return
        for record in waits:
            _wait_span(tracer, parent, run, record, "cancelled")

    # ---- outcomes --------------------------------------------------------------------------
    def job_failed(self, run: Run, outcome: str) -> None:
        if not self.metering():
            return
        attributes = {"queue": run.queue, "workflow": run.workflow_name}
        self.metrics.failed.add(1, attributes)
        if outcome == "retried":
            self.metrics.retried.add(1, attributes)
        elif outcome == "dead":
            self.metrics.dead_lettered.add(1, attributes)

    def run_finished(self, run: Run) -> None:
        if run.status is RunStatus.CANCELLED:
            self._cancelled_waits(run)
        if not self.metering():
            return
        attributes = {"queue": run.queue, "workflow": run.workflow_name}
        if run.status is RunStatus.COMPLETED:
            self.metrics.completed.add(1, attributes)
        if run.started_at is not None and run.finished_at is not None:
            took: timedelta = run.finished_at - run.started_at
            attributes["status"] = str(run.status)
            self.metrics.run_duration.record(took.total_seconds(), attributes)

    def sample_queues(self, tg: TaskGroup, operator: QueueReader, served: ServedQueues) -> None:
        start_sampling(self.metrics, tg, operator, served)
