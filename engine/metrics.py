"""The engine's OpenTelemetry metrics, and a Prometheus scrape endpoint for `blok-tui worker`.

Imported only when `opentelemetry-api` is installed (see engine/telemetry.py). Instruments are
made on the global meter provider; until the application sets one they are the API's no-ops.
What each process reports is what it saw (OpenTelemetry's model: every service reports its
own): a producer process counts the jobs it enqueued, a worker the runs it ran.

| OpenTelemetry name     | Prometheus name (exporter)       | kind             | attributes            |
|------------------------|----------------------------------|------------------|-----------------------|
| blok.jobs.enqueued     | blok_jobs_enqueued_total         | counter          | queue                 |
| blok.jobs.completed    | blok_jobs_completed_total        | counter          | queue, workflow       |
| blok.jobs.failed       | blok_jobs_failed_total           | counter          | queue, workflow       |
| blok.jobs.retried      | blok_jobs_retried_total          | counter          | queue, workflow       |
| blok.jobs.dead_lettered| blok_jobs_dead_lettered_total    | counter          | queue, workflow       |
| blok.run.duration      | blok_run_duration_seconds        | histogram (s)    | queue, workflow, status |
| blok.step.duration     | blok_step_duration_seconds       | histogram (s)    | workflow, step, status |
| blok.runs.active       | blok_runs_active                 | up-down counter  | queue                 |
| blok.queue.depth       | blok_queue_depth                 | gauge            | queue                 |
| blok.queue.oldest_age  | blok_queue_oldest_age_seconds    | gauge (s)        | queue                 |
| blok.queue.delayed     | blok_queue_delayed               | gauge            | queue                 |

`failed` counts every failed delivery (a step that failed for good, a timeout), as the seed's
worker_jobs_failed does; `retried` and `dead_lettered` say what became of it (the rest ended
failed). A run's duration is from its start to its end, waits included. Depth (jobs due now and
not started), the age of the oldest of them, and the jobs not due yet (`delayed`: a backoff
or a start delay, a rate limit or a concurrency key holding them, a wait in the workflow: a
rate limit's backlog is there, not in the depth) are sampled every SAMPLE_S seconds (or
$BLOK_METRICS_SAMPLE_S) by each worker for the queues it serves, while a meter provider is set.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

import anyio
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, NoOpMeterProvider, Observation

from .errors import EngineError
from .models import QueueStats
from .observer import INSTRUMENTATION

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from .backends.base import Backend

log = logging.getLogger("blok.metrics")

SAMPLE_S = 5.0  # how often a worker samples the depth of the queues it serves
SAMPLE_ENV = "BLOK_METRICS_SAMPLE_S"  # another interval, in seconds
# Seconds: a no-op job takes well under a millisecond, a workflow with waits may take days.
DURATION_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    21600.0,
    86400.0,
)


class QueueReader(Protocol):
    """What sampling reads (the operator API)."""

    backend: Backend  # its clock: the one a job's times are on

    async def queue_stats(self, queue: str) -> QueueStats: ...

    async def oldest_waiting(self, queue: str) -> datetime | None: ...


ServedQueues = Callable[[], Iterable[str]]


@dataclass(frozen=True, slots=True)
class QueueSample:
    depth: int
    oldest_age_s: float
    delayed: int = 0


def collected() -> bool:
    """Has the application set a meter provider (anything but the API's placeholder)?"""
    provider = metrics.get_meter_provider()
    # The API's stand-in until one is set is a private class: known by its name.
    return not isinstance(provider, NoOpMeterProvider) and (
        type(provider).__name__ != "_ProxyMeterProvider"
    )


class Instruments:
    """The engine's instruments, made once per process on the global meter provider."""

    def __init__(self) -> None:
        meter = metrics.get_meter(INSTRUMENTATION)
        self.enqueued = meter.create_counter(
            "blok.jobs.enqueued", unit="{job}", description="Jobs added to a queue"
        )
        self.completed = meter.create_counter(
            "blok.jobs.completed", unit="{job}", description="Jobs whose run completed"
        )
        self.failed = meter.create_counter(
            "blok.jobs.failed",
            unit="{job}",
            description="Failed deliveries of jobs (retried, dead-lettered or ended failed)",
        )
        self.retried = meter.create_counter(
            "blok.jobs.retried", unit="{job}", description="Failed deliveries that will be retried"
        )
        self.dead_lettered = meter.create_counter(
            "blok.jobs.dead_lettered",
            unit="{job}",
            description="Jobs moved to the dead-letter queue, their retries used up",
        )
        self.run_duration = meter.create_histogram(
            "blok.run.duration",
            unit="s",
            description="From a run's start to its end, waits included",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.step_duration = meter.create_histogram(
            "blok.step.duration",
            unit="s",
            description="One attempt of a step",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.active = meter.create_up_down_counter(
            "blok.runs.active", unit="{run}", description="Runs executing in this process"
        )
        # Latest samples, per sampling engine (several engines may share a process).
        self.samples: dict[int, dict[str, QueueSample]] = {}
        meter.create_observable_gauge(
            "blok.queue.depth",
            callbacks=[self._depths],
            unit="{job}",
            description="Jobs due now and not started, by queue",
        )
        meter.create_observable_gauge(
            "blok.queue.oldest_age",
            callbacks=[self._ages],
            unit="s",
            description="How long the oldest job due now has waited, by queue",
        )
        meter.create_observable_gauge(
            "blok.queue.delayed",
            callbacks=[self._delayed],
            unit="{job}",
            description="Jobs not due yet (backoff, start delay, rate limit, concurrency key, "
            "a wait), by queue",
        )

    def _merged(self) -> dict[str, QueueSample]:
        merged: dict[str, QueueSample] = {}
        for samples in list(self.samples.values()):  # read from the exporter's thread
            merged.update(samples)
        return merged

    def _depths(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(s.depth, {"queue": q}) for q, s in self._merged().items()]

    def _ages(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(s.oldest_age_s, {"queue": q}) for q, s in self._merged().items()]

    def _delayed(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(s.delayed, {"queue": q}) for q, s in self._merged().items()]


def start_sampling(
    instruments: Instruments, tg: TaskGroup, operator: QueueReader, served: ServedQueues
) -> None:
    """Sample the depth of the queues `served()` names every SAMPLE_S seconds, in `tg`."""
    tg.start_soon(_sample, instruments, operator, served)


def _interval() -> float:
    try:
        every = float(os.environ.get(SAMPLE_ENV, SAMPLE_S))
    except ValueError:
        log.warning(
            "%s=%r is not a number of seconds: sampling every %gs",
            SAMPLE_ENV,
            os.environ[SAMPLE_ENV],
            SAMPLE_S,
        )
        return SAMPLE_S
    return every if every > 0 else SAMPLE_S


async def _sample(instruments: Instruments, operator: QueueReader, served: ServedQueues) -> None:
    key = id(operator)
    every = _interval()
    try:
        while True:
            if collected():
                samples: dict[str, QueueSample] = {}
                now = operator.backend.clock.now()  # the clock a job's times are on
                for queue in list(served()):
                    try:
                        stats = await operator.queue_stats(queue)
                        since = await operator.oldest_waiting(queue)
                    except Exception as error:
                        # A sample is not worth the worker: a queue that went away meanwhile or
                        # a busy database costs this one reading, said in the log.
                        log.warning("queue %s: depth not sampled: %s", queue, error)
                        continue
                    age = (now - since).total_seconds() if since is not None else 0.0
                    samples[queue] = QueueSample(stats.waiting, max(age, 0.0), stats.delayed)
                instruments.samples[key] = samples
            await anyio.sleep(every)
    finally:
        instruments.samples.pop(key, None)


@dataclass
class PrometheusEndpoint:
    """A running scrape endpoint: where it listens, and how to stop it."""

    host: str
    port: int
    stop: Callable[[], None]


def serve_prometheus(port: int, host: str = "0.0.0.0") -> PrometheusEndpoint:
    """Serve this process's metrics for Prometheus at http://host:port/metrics: an SDK meter
    provider with OpenTelemetry's Prometheus reader, set as the global one, and
    prometheus_client's HTTP server. Port 0 picks a free port."""
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from prometheus_client import start_http_server
    except ImportError as error:
        raise EngineError(
            f'metrics need the "metrics" extra: pip install "blok-tui[metrics]" ({error})'
        ) from None
    if collected():
        raise EngineError(
            "a meter provider is already set in this process (opentelemetry-instrument?): "
            "give it a Prometheus reader there instead of --metrics-port"
        )
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: "blok-tui"}
    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader], resource=Resource.create(attributes))
    try:
        server, thread = start_http_server(port, addr=host)
    except OSError as error:
        provider.shutdown()
        raise EngineError(f"cannot serve metrics on {host}:{port}: {error.strerror}") from None
    metrics.set_meter_provider(provider)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        provider.shutdown()

    return PrometheusEndpoint(host, server.server_port, stop)
