"""Tracing with OpenTelemetry: a run and its steps are spans in the trace of the code that
enqueued the job, in this process or another, across waits and restarts, and each wait a span
between them; a replay links back.

The spans are read with the SDK's in-memory exporter, on a tracer provider set for each test
(and reset after it: the provider is process-wide).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_helpers import blok
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.test.globals_test import reset_trace_globals
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from support import until

from engine import (
    Engine,
    Retry,
    Run,
    RunStatus,
    Step,
    WorkerTrigger,
    Workflow,
    for_each,
    loop,
    subworkflow,
    tracing,
    try_catch,
    wait,
)

SECRET = "sk-live-0123456789abcdef"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    reset_trace_globals()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()
    reset_trace_globals()


def database(kind: str, tmp_path: Path) -> Path | None:
    return tmp_path / "blok.db" if kind == "sqlite" else None


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def only(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = named(spans, name)
    assert len(found) == 1, [s.name for s in spans.get_finished_spans()]
    return found[0]


def parent_id(span: ReadableSpan) -> int:
    assert span.parent is not None, f"{span.name} has no parent"
    return span.parent.span_id


def traceparent_ids(traceparent: str) -> tuple[int, int]:
    """(trace id, parent span id) of a W3C traceparent."""
    _, trace_id, span_id, _ = traceparent.split("-")
    return int(trace_id, 16), int(span_id, 16)


async def flaky(ctx: Any) -> str:
    if ctx.attempt == 1:
        raise ValueError(f"the API refused key {ctx.headers['x-api-key']}")
    return "ok"


async def first(ctx: Any) -> int:
    return 1


async def last(ctx: Any) -> int:
    return int(ctx.state["first"]) + 1


def charge_flow() -> Workflow:
    return Workflow(
        name="orders.charge",
        trigger=WorkerTrigger(queue="orders"),
        steps=[
            Step("first", first),
            Step("flaky", flaky, retry=Retry(max_attempts=2, min_timeout="1ms")),
        ],
    )


def waiting_flow() -> Workflow:
    return Workflow(
        name="orders.ship",
        trigger=WorkerTrigger(queue="ship"),
        steps=[Step("first", first), wait.for_("300ms"), Step("last", last)],
    )


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_run_and_its_step_attempts_are_spans_in_the_enqueuers_trace(
    kind: str, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async with Engine(workflows=[charge_flow()], database=database(kind, tmp_path)) as engine:
        with trace.get_tracer("app").start_as_current_span("POST /orders") as request:
            job_id = await engine.enqueue("orders", {}, headers={"x-api-key": SECRET})
        run = await engine.wait_for_job(job_id, timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    trace_id = request.get_span_context().trace_id

    enqueue = only(spans, "enqueue orders")
    run_span = only(spans, "run orders.charge")
    assert enqueue.kind is SpanKind.PRODUCER and run_span.kind is SpanKind.CONSUMER
    assert parent_id(enqueue) == request.get_span_context().span_id
    assert parent_id(run_span) == enqueue.context.span_id
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {trace_id}
    attributes = run_span.attributes or {}
    assert attributes["blok.run.id"] == run.id
    assert attributes["blok.job.id"] == job_id
    assert attributes["blok.queue"] == "orders"
    assert attributes["blok.job.attempt"] == 1
    assert attributes["blok.workflow.version"] == run.workflow_version
    assert attributes["blok.run.status"] == "completed"
    assert run_span.status.status_code is not StatusCode.ERROR

    steps = named(spans, "step first") + named(spans, "step flaky")
    assert [(s.name, (s.attributes or {})["blok.step.attempt"]) for s in steps] == [
        ("step first", 1),
        ("step flaky", 1),
        ("step flaky", 2),
    ]
    assert all(parent_id(s) == run_span.context.span_id for s in steps)
    failed, retried = named(spans, "step flaky")
    assert (failed.attributes or {})["blok.step.status"] == "failed"
    assert failed.status.status_code is StatusCode.ERROR
    (exception,) = [e for e in failed.events if e.name == "exception"]
    message = str((exception.attributes or {})["exception.message"])
    assert "the API refused key [redacted]" in message
    assert SECRET not in message + str((exception.attributes or {})["exception.stacktrace"])
    assert (retried.attributes or {})["blok.step.status"] == "completed"


@pytest.mark.anyio
async def test_a_failed_run_is_an_error_span(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    async def broken(ctx: Any) -> None:
        raise RuntimeError("card declined")

    flow = Workflow(name="pay", trigger=WorkerTrigger(queue="pay"), steps=[Step("pay", broken)])
    async with Engine(workflows=[flow], database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("pay", {}), timeout=10)
    assert run.status is RunStatus.FAILED
    run_span = only(spans, "run pay")
    assert run_span.status.status_code is StatusCode.ERROR
    assert "card declined" in (run_span.status.description or "")
    assert (run_span.attributes or {})["blok.run.status"] == "failed"


async def run_across_a_restart(path: Path, enqueue: Any) -> Run:
    """Enqueue, let the run reach its wait, stop the engine, finish it in a new engine."""
    async with Engine(workflows=[waiting_flow()], database=path) as engine:
        job_id = await enqueue(engine)

        async def waits() -> bool:
            return (await engine.get_job(job_id)).resume

        await until(waits)
    async with Engine(workflows=[waiting_flow()], database=path) as engine:
        return await engine.wait_for_job(job_id, timeout=10)


@pytest.mark.anyio
async def test_a_run_that_waits_stays_in_its_trace_across_a_restart(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async def enqueue(engine: Engine) -> str:
        with trace.get_tracer("app").start_as_current_span("checkout"):
            return await engine.enqueue("ship", {})

    run = await run_across_a_restart(tmp_path / "blok.db", enqueue)
    assert run.status is RunStatus.COMPLETED, run.error
    checkout = only(spans, "checkout")
    enqueue_span = only(spans, "enqueue ship")
    before, after = named(spans, "run orders.ship")
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {checkout.context.trace_id}
    assert parent_id(before) == parent_id(after) == enqueue_span.context.span_id
    assert (before.attributes or {})["blok.run.status"] == "waiting"
    assert [e.name for e in before.events] == ["wait"]
    assert (after.attributes or {})["blok.run.resumed"] is True
    assert parent_id(only(spans, "step first")) == before.context.span_id
    assert parent_id(only(spans, "step last")) == after.context.span_id


@pytest.mark.anyio
async def test_a_job_enqueued_outside_any_trace_keeps_the_trace_its_run_started(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    path = tmp_path / "blok.db"

    async def enqueue(engine: Engine) -> str:
        # From a process with no tracer provider and no trace context: the job carries none.
        await engine.flush()
        env = {k: v for k, v in os.environ.items() if k != "TRACEPARENT"}
        done = await anyio.run_process(
            [sys.executable, "-m", "blok_tui", "enqueue", "ship", "{}", "--db", str(path)],
            check=False,
            env=env,
        )
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode().strip()

    run = await run_across_a_restart(path, enqueue)
    assert run.status is RunStatus.COMPLETED, run.error
    before, after = named(spans, "run orders.ship")
    assert before.parent is None  # the run started the trace
    assert parent_id(after) == before.context.span_id
    assert len({s.context.trace_id for s in spans.get_finished_spans()}) == 1


@pytest.mark.anyio
async def test_a_replay_links_to_the_trace_of_its_source_run(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async with Engine(workflows=[waiting_flow()], database=tmp_path / "blok.db") as engine:
        with trace.get_tracer("app").start_as_current_span("first try") as first_try:
            source = await engine.wait_for_job(await engine.enqueue("ship", {}), timeout=10)
        replay_id = await engine.replay(source.id)
        replay = await engine.wait_for_job((await engine.get_run(replay_id)).job_id, timeout=10)
    assert replay.status is RunStatus.COMPLETED
    replay_spans = [
        s
        for s in named(spans, "run orders.ship")
        if (s.attributes or {})["blok.run.id"] == replay.id
    ]
    assert replay_spans
    source_trace = first_try.get_span_context().trace_id
    for span in replay_spans:
        assert span.context.trace_id != source_trace
        assert [link.context.trace_id for link in span.links] == [source_trace]
        assert (span.attributes or {})["blok.run.replay_of"] == source.id


PRODUCER = """
import json, sys
import anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from engine import Engine

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


async def main():
    async with Engine(database=sys.argv[1]) as engine:
        with trace.get_tracer("web").start_as_current_span("POST /ship") as request:
            job_id = await engine.enqueue("ship", {})
    (enqueue,) = [s for s in exporter.get_finished_spans() if s.name == "enqueue ship"]
    print(json.dumps({
        "job_id": job_id,
        "trace_id": request.get_span_context().trace_id,
        "request": request.get_span_context().span_id,
        "enqueue": enqueue.context.span_id,
        "enqueue_parent": enqueue.parent.span_id,
    }))

anyio.run(main)
"""


@pytest.mark.anyio
async def test_a_run_joins_the_trace_of_a_producer_in_another_process(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    path = tmp_path / "blok.db"
    script = tmp_path / "producer.py"
    script.write_text(textwrap.dedent(PRODUCER))
    async with Engine(workflows=[waiting_flow()], database=path) as engine:
        await engine.flush()  # the queue it serves is known to other processes
        done = await anyio.run_process([sys.executable, str(script), str(path)], check=False)
        assert done.returncode == 0, done.stderr.decode()
        produced = json.loads(done.stdout)
        run = await engine.wait_for_job(produced["job_id"], timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    assert produced["enqueue_parent"] == produced["request"]
    runs = named(spans, "run orders.ship")
    assert len(runs) == 2  # before and after the wait
    for span in runs:
        assert span.context.trace_id == produced["trace_id"]
        assert parent_id(span) == produced["enqueue"]
    for name in ("step first", "step last"):
        assert only(spans, name).context.trace_id == produced["trace_id"]


@pytest.mark.anyio
async def test_blok_tui_enqueue_passes_a_traceparent_on_to_the_run(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    path = tmp_path / "blok.db"
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    from_env = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with Engine(workflows=[charge_flow()], database=path) as engine:
        await engine.flush()
        jobs = []
        for args, env in (
            (["--traceparent", given], {}),
            ([], {"TRACEPARENT": from_env}),
        ):
            command = ["enqueue", "orders", "{}", "--db", str(path), *args]
            done = await anyio.run_process(
                [sys.executable, "-m", "blok_tui", *command],
                check=False,
                env={**os.environ, **env},
            )
            assert done.returncode == 0, done.stderr.decode()
            jobs.append(done.stdout.decode().strip())
        runs = [await engine.wait_for_job(job_id, timeout=10) for job_id in jobs]
    for run, traceparent in zip(runs, (given, from_env), strict=True):
        (span,) = [
            s
            for s in named(spans, "run orders.charge")
            if (s.attributes or {})["blok.run.id"] == run.id
        ]
        assert (span.context.trace_id, parent_id(span)) == traceparent_ids(traceparent)


def test_blok_tui_enqueue_refuses_a_malformed_traceparent(tmp_path: Path) -> None:
    done = blok("enqueue", "orders", "{}", "--traceparent", "00-abc-def-01", "--db", tmp_path)
    assert done.returncode == 2
    assert "not a W3C traceparent" in done.stderr
    # Of the right shape, with an id the standard forbids: it said the shape was wrong.
    zero = "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
    done = blok("enqueue", "orders", "{}", "--traceparent", zero, "--db", tmp_path)
    assert done.returncode == 2 and "an all-zero trace id is invalid" in done.stderr


@pytest.mark.anyio
async def test_a_malformed_traceparent_in_the_environment_stops_no_enqueue(
    tmp_path: Path,
) -> None:
    """It made every `blok-tui enqueue` a usage error blaming --traceparent, which the user
    never gave."""
    path = tmp_path / "blok.db"
    async with Engine(workflows=[charge_flow()], database=path) as engine:
        await engine.flush()
        done = await anyio.run_process(
            [sys.executable, "-m", "blok_tui", "enqueue", "orders", "{}", "--db", str(path)],
            check=False,
            env={**os.environ, "TRACEPARENT": "garbage"},
        )
        assert done.returncode == 0, done.stderr.decode()
        assert done.stderr.decode() == (
            "blok-tui: warning: $TRACEPARENT is not a W3C traceparent ('garbage'): the job "
            "joins no trace\n"
        )
        run = await engine.wait_for_job(done.stdout.decode().strip(), timeout=10)
    assert "traceparent" not in run.headers


@pytest.mark.anyio
async def test_with_no_tracer_provider_set_jobs_carry_no_trace_context(tmp_path: Path) -> None:
    reset_trace_globals()
    async with Engine(workflows=[charge_flow()], database=tmp_path / "blok.db") as engine:
        with trace.get_tracer("app").start_as_current_span("unrecorded"):
            job_id = await engine.enqueue("orders", {}, headers={"x-api-key": SECRET})
        run = await engine.wait_for_job(job_id, timeout=10)
    assert run.status is RunStatus.COMPLETED
    assert run.headers == {"x-api-key": "[redacted]"}


@pytest.mark.anyio
async def test_with_no_tracer_provider_set_a_current_trace_context_goes_on_with_the_job(
    tmp_path: Path,
) -> None:
    """An application that propagates a caller's context without recording spans of its own
    (no provider set): the job carries that context on, for whichever process records."""
    reset_trace_globals()
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    context = TraceContextTextMapPropagator().extract({"traceparent": caller})
    async with Engine(workflows=[charge_flow()], database=tmp_path / "blok.db") as engine:
        token = otel_context.attach(context)
        try:
            job_id = await engine.enqueue("orders", {})
        finally:
            otel_context.detach(token)
        run = await engine.wait_for_job(job_id, timeout=10)
    assert run.status is RunStatus.COMPLETED
    assert run.headers["traceparent"] == caller


NO_OPENTELEMETRY = """
import sys
sys.modules["opentelemetry"] = None  # as if the extra were not installed
import anyio
from engine import Engine, Step, WorkerTrigger, Workflow
from engine import telemetry
from engine.observer import Observer

async def node(ctx):
    return 1

async def main():
    flow = Workflow(name="w", trigger=WorkerTrigger(queue="q"), steps=[Step("s", node)])
    async with Engine(workflows=[flow]) as engine:
        run = await engine.wait_for_job(await engine.enqueue("q", {}), timeout=10)
    assert run.status == "completed", run.error
    assert type(telemetry.OBSERVE) is Observer, telemetry.OBSERVE
    loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry.", "engine.tracing", "engine.metrics", "prometheus")))
    assert not loaded, loaded
    print("no-op")

anyio.run(main)
"""


def test_without_opentelemetry_nothing_of_it_is_imported(tmp_path: Path) -> None:
    script = tmp_path / "bare.py"
    script.write_text(textwrap.dedent(NO_OPENTELEMETRY))
    done = blok_python(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no-op"


def blok_python(script: Path) -> Any:
    import subprocess

    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)


@pytest.mark.anyio
async def test_a_step_attempt_cut_by_its_max_duration_is_a_timed_out_error_span(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async def slow(ctx: Any) -> None:
        await anyio.sleep_forever()

    flow = Workflow(
        name="slow",
        trigger=WorkerTrigger(queue="slow"),
        steps=[Step("slow", slow, max_duration="50ms")],
    )
    async with Engine(workflows=[flow], database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("slow", {}), timeout=10)
    assert run.status is RunStatus.TIMED_OUT
    step = only(spans, "step slow")
    assert (step.attributes or {})["blok.step.status"] == "timed_out"
    assert step.status.status_code is StatusCode.ERROR
    assert (only(spans, "run slow").attributes or {})["blok.run.status"] == "timed_out"


@pytest.mark.anyio
async def test_a_nodes_own_spans_nest_under_its_step(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async def call_async(ctx: Any) -> None:
        with trace.get_tracer("client").start_as_current_span("GET /async"):
            pass

    def call_sync(ctx: Any) -> None:  # runs in a worker thread
        with trace.get_tracer("client").start_as_current_span("GET /sync"):
            pass

    flow = Workflow(
        name="calls",
        trigger=WorkerTrigger(queue="calls"),
        steps=[Step("async", call_async), Step("sync", call_sync)],
    )
    async with Engine(workflows=[flow], database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("calls", {}), timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    assert parent_id(only(spans, "GET /async")) == only(spans, "step async").context.span_id
    assert parent_id(only(spans, "GET /sync")) == only(spans, "step sync").context.span_id


@pytest.mark.anyio
async def test_a_flow_steps_inner_steps_are_spans_under_its_own(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """A for_each's iterations, a loop's turns, a try_catch's arms were spans of the run, side
    by side with the steps around them: a trace of a hundred items showed no for_each at all.
    A flow step is a span now, its inner steps' spans its children (parallel ones too); a
    failure inside it is its error; a wait inside it ends it for that delivery, as waiting."""

    def fails(ctx: Any) -> None:
        raise ValueError("card declined")

    flow = Workflow(
        name="batch",
        trigger=WorkerTrigger(queue="batch"),
        steps=[
            Step("first", first),
            for_each("each", items="$.body.items", steps=[Step("item", first)], parallel=2),
            try_catch("guard", try_=[Step("charge", fails)], catch=[Step("refund", first)]),
            loop(
                "poll",
                steps=[Step("look", first), wait.for_("1ms")],
                until=lambda ctx: ctx.state["look"] == 1 and ctx.state["poll"]["iteration"] >= 2,
            ),
        ],
    )
    async with Engine(workflows=[flow], database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("batch", {"items": [1, 2, 3]}), 10)
    assert run.status is RunStatus.COMPLETED, run.error
    each, guard = only(spans, "for_each each"), only(spans, "try_catch guard")
    runs = named(spans, "run batch")
    assert parent_id(each) == parent_id(only(spans, "step first")) == runs[0].context.span_id
    items = named(spans, "step item")
    assert [parent_id(item) for item in items] == [each.context.span_id] * 3
    assert each.attributes is not None and each.attributes["blok.step.status"] == "completed"
    assert parent_id(only(spans, "step charge")) == guard.context.span_id
    assert parent_id(only(spans, "step refund")) == guard.context.span_id
    # Caught: the try_catch completed, its failed arm an error of its own span.
    assert guard.status.status_code is not StatusCode.ERROR
    assert only(spans, "step charge").status.status_code is StatusCode.ERROR
    # The loop pauses at its wait: a span a delivery, each with that delivery's look.
    polls = named(spans, "loop poll")
    statuses = [p.attributes["blok.step.status"] for p in polls if p.attributes is not None]
    assert statuses == ["waiting"] * (len(polls) - 1) + ["completed"], statuses
    looks = named(spans, "step look")
    # Each delivery but the last looked once (the last resumed after the wait, and was done).
    assert [parent_id(look) for look in looks] == [p.context.span_id for p in polls[:-1]]


@pytest.mark.anyio
async def test_a_child_run_joins_its_parents_trace(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    child = Workflow(name="child", trigger=WorkerTrigger(queue="child"), steps=[Step("one", first)])
    parent = Workflow(
        name="parent",
        trigger=WorkerTrigger(queue="parent"),
        steps=[subworkflow("call", workflow="child", wait=True)],
    )
    async with Engine(workflows=[parent, child], database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("parent", {}), timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    parent_runs = named(spans, "run parent")
    child_run = only(spans, "run child")
    assert {s.context.trace_id for s in parent_runs} == {child_run.context.trace_id}
    enqueue_child = only(spans, "enqueue child")
    assert parent_id(child_run) == enqueue_child.context.span_id
    # Enqueued by the parent's subworkflow step, a span of the parent's run.
    calls = {s.context.span_id: s for s in named(spans, "subworkflow call")}
    assert parent_id(calls[parent_id(enqueue_child)]) in {s.context.span_id for s in parent_runs}


@pytest.fixture
def late_spans() -> Iterator[InMemorySpanExporter]:
    """No tracer provider as the test begins: it sets one later (`set_provider`)."""
    reset_trace_globals()
    yield InMemorySpanExporter()
    reset_trace_globals()


def set_provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def one_step() -> Workflow:
    return Workflow(name="one", trigger=WorkerTrigger(queue="one"), steps=[Step("one", first)])


async def run_one(engine: Engine) -> Run:
    return await engine.wait_for_job(await engine.enqueue("one", {}), timeout=10)


@pytest.mark.anyio
async def test_a_provider_set_before_an_engine_starts_is_used_at_once(
    tmp_path: Path, late_spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With no provider, the answer "none" is kept a while (a look costs an exception); the
    # next engine's start looks again, however long that while is.
    monkeypatch.setattr(tracing, "PROVIDER_LOOK_S", 3600.0)
    async with Engine(workflows=[one_step()], database=tmp_path / "blok.db") as engine:
        await run_one(engine)
    provider = set_provider(late_spans)
    async with Engine(workflows=[one_step()], database=tmp_path / "blok.db") as engine:
        await run_one(engine)
    provider.shutdown()
    assert len(named(late_spans, "enqueue one")) == 1
    assert len(named(late_spans, "run one")) == 1


@pytest.mark.anyio
async def test_a_provider_set_while_an_engine_runs_is_used_once_it_looks_again(
    tmp_path: Path, late_spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing, "PROVIDER_LOOK_S", 0.05)
    async with Engine(workflows=[one_step()], database=tmp_path / "blok.db") as engine:
        await run_one(engine)
        assert not late_spans.get_finished_spans()
        provider = set_provider(late_spans)

        async def traced() -> bool:
            await run_one(engine)
            return bool(named(late_spans, "run one"))

        await until(traced, timeout=10, every=0.02)
    provider.shutdown()


# ---- waits -----------------------------------------------------------------------------------
# Each wait is a span `wait <name>` beside the run's spans (same parent), from when it began to
# when it ended, made by whichever process saw it end: the delivery that resumed the run, or
# the cancel.


def span_ns(record: Any) -> int:
    """How long a step record says its wait lasted, in ns (as its span does, to the µs)."""
    return int((record.finished_at - record.started_at) // timedelta(microseconds=1) * 1000)


def wait_attributes(span: ReadableSpan) -> dict[str, Any]:
    return {k: v for k, v in (span.attributes or {}).items() if k.startswith("blok.wait.")}


def event_flow(timeout: str | None = "30s") -> Workflow:
    async def ship(ctx: Any) -> Any:
        return ctx.state["approval"]

    return Workflow(
        name="orders.approve",
        trigger=WorkerTrigger(queue="approve"),
        steps=[
            Step("first", first),
            wait.for_event("approved", timeout=timeout, name="approval"),
            Step("ship", ship),
        ],
    )


async def waiting_run(engine: Engine, job_id: str) -> Run:
    async def parked() -> bool:
        return (await engine.get_job(job_id)).resume

    await until(parked)
    return await engine.get_run((await engine.get_job(job_id)).run_id)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_delay_is_a_wait_span_beside_the_run_spans(
    kind: str, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async with Engine(workflows=[waiting_flow()], database=database(kind, tmp_path)) as engine:
        with trace.get_tracer("app").start_as_current_span("checkout"):
            job_id = await engine.enqueue("ship", {})
        run = await engine.wait_for_job(job_id, timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    before, after = named(spans, "run orders.ship")
    record = run.steps[1]  # an unnamed wait's name is made unique in its workflow ("wait_2")
    span = only(spans, f"wait {record.name}")
    assert span.context.trace_id == before.context.trace_id
    assert parent_id(span) == parent_id(before) == only(spans, "enqueue ship").context.span_id
    assert record.wait_until is not None
    assert wait_attributes(span) == {
        "blok.wait.kind": "time",
        "blok.wait.outcome": "time_reached",
        "blok.wait.until": record.wait_until.isoformat(),
    }
    assert (span.attributes or {})["blok.run.id"] == run.id
    assert (span.attributes or {})["blok.step.index"] == 1
    # From the first delivery, where it began, into the one that resumed the run.
    assert span.start_time is not None and span.end_time is not None
    assert before.start_time is not None and after.start_time is not None
    assert span.end_time - span.start_time == span_ns(record) >= 300_000_000
    assert before.start_time < span.start_time < after.start_time
    assert after.start_time <= span.end_time <= (after.end_time or 0)
    assert span.status.status_code is StatusCode.UNSET


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_an_event_wait_is_a_span_that_says_the_event_came(
    kind: str, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async with Engine(workflows=[event_flow()], database=database(kind, tmp_path)) as engine:
        with trace.get_tracer("app").start_as_current_span("checkout"):
            job_id = await engine.enqueue("approve", {})
        run = await waiting_run(engine, job_id)
        await engine.send_event(run.id, "approved", {"by": "ann"})
        run = await engine.wait_for_job(job_id, timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    runs = named(spans, "run orders.approve")
    assert len(runs) == 2
    span = only(spans, "wait approval")
    assert {parent_id(s) for s in runs} == {parent_id(span)}
    record = run.step("approval")
    assert record.wait_until is not None
    assert wait_attributes(span) == {
        "blok.wait.kind": "event",
        "blok.wait.event": "approved",
        "blok.wait.outcome": "event_received",
        "blok.wait.until": record.wait_until.isoformat(),  # its timeout
    }
    assert span.end_time is not None and span.start_time is not None
    assert span.end_time - span.start_time == span_ns(record)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_an_event_wait_whose_timeout_passed_is_a_span_that_says_so(
    kind: str, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    flow = event_flow(timeout="300ms")
    async with Engine(workflows=[flow], database=database(kind, tmp_path)) as engine:
        run = await engine.wait_for_job(await engine.enqueue("approve", {}), timeout=10)
    assert run.status is RunStatus.COMPLETED and run.output is None, run.error
    span = only(spans, "wait approval")
    assert wait_attributes(span)["blok.wait.outcome"] == "timed_out"
    assert wait_attributes(span)["blok.wait.event"] == "approved"
    assert span.end_time is not None and span.start_time is not None
    assert span.end_time - span.start_time == span_ns(run.step("approval")) >= 300_000_000
    assert span.status.status_code is StatusCode.UNSET  # the run goes on: no error


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_run_cancelled_while_it_waits_ends_its_wait_span(
    kind: str, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async with Engine(workflows=[event_flow(None)], database=database(kind, tmp_path)) as engine:
        with trace.get_tracer("app").start_as_current_span("checkout"):
            job_id = await engine.enqueue("approve", {})
        run = await engine.cancel((await waiting_run(engine, job_id)).id)
    assert run.status is RunStatus.CANCELLED
    span = only(spans, "wait approval")
    assert parent_id(span) == parent_id(only(spans, "run orders.approve"))
    assert wait_attributes(span) == {
        "blok.wait.kind": "event",
        "blok.wait.event": "approved",
        "blok.wait.outcome": "cancelled",  # no timeout: no blok.wait.until
    }
    assert span.end_time is not None and span.start_time is not None
    assert span.end_time - span.start_time == span_ns(run.step("approval"))


@pytest.mark.anyio
async def test_a_wait_until_resumed_by_another_engine_is_a_span_in_the_runs_trace(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    path = tmp_path / "blok.db"
    moment = datetime.now(UTC) + timedelta(milliseconds=300)
    flow = Workflow(
        name="orders.ship",
        trigger=WorkerTrigger(queue="ship"),
        steps=[Step("first", first), wait.until(moment, name="ship-at"), Step("last", last)],
    )
    async with Engine(workflows=[flow], database=path) as engine:
        with trace.get_tracer("app").start_as_current_span("checkout"):
            job_id = await engine.enqueue("ship", {})
        await waiting_run(engine, job_id)
        assert not named(spans, "wait ship-at")  # the wait has not ended yet
    async with Engine(workflows=[flow], database=path) as engine:
        run = await engine.wait_for_job(job_id, timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    span = only(spans, "wait ship-at")
    assert span.context.trace_id == only(spans, "checkout").context.trace_id
    assert parent_id(span) == only(spans, "enqueue ship").context.span_id
    assert wait_attributes(span) == {
        "blok.wait.kind": "time",
        "blok.wait.outcome": "time_reached",
        "blok.wait.until": moment.isoformat(),
    }
    assert span.end_time is not None and span.start_time is not None
    assert span.end_time - span.start_time == span_ns(run.step("ship-at"))


@pytest.mark.anyio
async def test_the_waits_of_a_run_that_started_its_trace_are_under_its_first_span(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """A job enqueued with no trace context: its run's first span starts the trace and is the
    parent of its later spans, the waits' too; a wait whose moment had passed is a span all the
    same."""
    path = tmp_path / "blok.db"
    flow = Workflow(
        name="late",
        trigger=WorkerTrigger(queue="late"),
        steps=[
            wait.until("2001-01-01T00:00:00Z", name="past"),
            wait.for_("300ms", name="pause"),
            Step("one", first),
        ],
    )
    async with Engine(workflows=[flow], database=path) as engine:
        await engine.flush()
        env = {k: v for k, v in os.environ.items() if k != "TRACEPARENT"}
        done = await anyio.run_process(
            [sys.executable, "-m", "blok_tui", "enqueue", "late", "{}", "--db", str(path)],
            check=False,
            env=env,
        )
        assert done.returncode == 0, done.stderr.decode()
        run = await engine.wait_for_job(done.stdout.decode().strip(), timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    before, after = named(spans, "run late")
    past, pause = only(spans, "wait past"), only(spans, "wait pause")
    assert before.parent is None
    assert parent_id(after) == parent_id(past) == parent_id(pause) == before.context.span_id
    assert wait_attributes(past)["blok.wait.outcome"] == "time_reached"
    assert past.end_time == past.start_time  # it began and ended at once
    assert pause.end_time is not None and pause.start_time is not None
    assert pause.end_time - pause.start_time == span_ns(run.step("pause")) >= 300_000_000


@pytest.mark.anyio
async def test_a_disabled_sdk_traces_nothing_and_every_run_goes_on(
    tmp_path: Path, late_spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # OTEL_SDK_DISABLED=true, the switch that turns tracing off in one environment, failed
    # every run with "internal engine error: KeyError: 'traceparent'" and sent its job to the
    # dead-letter queue with its retries unused.
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    provider = set_provider(late_spans)
    async with Engine(workflows=[one_step()], database=tmp_path / "blok.db") as engine:
        run = await run_one(engine)
    provider.shutdown()
    assert run.status is RunStatus.COMPLETED, run.error
    assert "traceparent" not in run.headers
    assert late_spans.get_finished_spans() == ()
