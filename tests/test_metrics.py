"""`blok-tui worker --metrics-port`: the engine's OpenTelemetry metrics, scraped over HTTP from a
real worker process, read with prometheus_client's own parser."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from cli_helpers import blok, eventually, start_worker
from prometheus_client.parser import text_string_to_metric_families

WORKFLOWS = """
from engine import Step, Workflow, WorkerTrigger, subworkflow


async def fine(ctx):
    return "ok"


async def broken(ctx):
    raise RuntimeError("always")


workflows = [
    Workflow(name="fine", trigger=WorkerTrigger(queue="fine"), steps=[Step("fine", fine)]),
    Workflow(
        name="broken",
        trigger=WorkerTrigger(queue="broken", retries=1, delay="1ms"),
        steps=[Step("broken", broken)],
    ),
    Workflow(
        name="parent",
        trigger=WorkerTrigger(queue="parent"),
        steps=[subworkflow("child", workflow="fine", wait=True)],
    ),
    Workflow(name="held", trigger=WorkerTrigger(queue="held"), steps=[Step("fine", fine)]),
]
"""

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(
                sorted((k, v) for k, v in sample.labels.items() if not k.startswith("otel_"))
            )
            samples[(sample.name, labels)] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_a_worker_serves_its_metrics_for_prometheus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "flows.py").write_text(WORKFLOWS)
    database = tmp_path / "blok.db"
    monkeypatch.setenv("BLOK_METRICS_SAMPLE_S", "0.2")  # the worker inherits it
    worker = start_worker(database, folder, "--metrics-port", "0", "--no-watch")
    try:
        assert worker.process.stdout is not None
        line = worker.process.stdout.readline().strip()
        assert line.startswith("metrics at http://"), line
        url = line.removeprefix("metrics at ").replace("0.0.0.0", "127.0.0.1")
        assert blok("pause", "held", "--db", database).returncode == 0
        for queue, count in (("fine", 2), ("broken", 1), ("parent", 1), ("held", 3)):
            for _ in range(count):
                done = blok("enqueue", queue, "{}", "--db", database)
                assert done.returncode == 0, done.stderr
        # Not due for an hour (as a rate limit's backlog): counted apart from the depth.
        later = blok("enqueue", "fine", "{}", "--delay", "1h", "--db", database)
        assert later.returncode == 0, later.stderr

        def settled() -> Samples | None:
            samples = scrape(url)
            done = value(samples, "blok_jobs_completed_total", queue="fine", workflow="fine")
            dead = value(
                samples, "blok_jobs_dead_lettered_total", queue="broken", workflow="broken"
            )
            depth = value(samples, "blok_queue_depth", queue="held")
            later = value(samples, "blok_queue_delayed", queue="fine")
            return samples if (done, dead, depth, later) == (3.0, 1.0, 3.0, 1.0) else None

        samples = eventually(settled, timeout=20)
    finally:
        assert worker.stop() == 0, worker.stderr()

    # The parent's child job was enqueued in the worker's own process: counted there.
    assert value(samples, "blok_jobs_enqueued_total", queue="fine") == 1.0
    assert value(samples, "blok_jobs_completed_total", queue="parent", workflow="parent") == 1.0
    assert value(samples, "blok_jobs_failed_total", queue="broken", workflow="broken") == 2.0
    assert value(samples, "blok_jobs_retried_total", queue="broken", workflow="broken") == 1.0
    run_count = value(
        samples,
        "blok_run_duration_seconds_count",
        queue="fine",
        workflow="fine",
        status="completed",
    )
    assert run_count == 3.0
    step_failures = value(
        samples,
        "blok_step_duration_seconds_count",
        workflow="broken",
        step="broken",
        status="failed",
    )
    assert step_failures == 2.0
    assert value(samples, "blok_runs_active", queue="fine") == 0.0
    age = value(samples, "blok_queue_oldest_age_seconds", queue="held")
    assert age is not None and age > 0.0
    assert value(samples, "blok_queue_depth", queue="fine") == 0.0  # the delayed one: apart


def test_a_metrics_port_in_use_is_one_line_and_exit_1(tmp_path: Path) -> None:
    import socket

    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "flows.py").write_text(WORKFLOWS)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "blok_tui",
                "worker",
                "--db",
                str(tmp_path / "blok.db"),
                "--workflows",
                str(folder),
                "--metrics-port",
                str(port),
                "--metrics-host",
                "127.0.0.1",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 1
    assert done.stderr.startswith(f"blok-tui: error: cannot serve metrics on 127.0.0.1:{port}")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


LATE_METER = """
import json, sys
import anyio
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from engine import Engine, Step, WorkerTrigger, Workflow, tracing

tracing.PROVIDER_LOOK_S = 0.0  # look for a meter provider at every hook
started, release = anyio.Event(), anyio.Event()


async def held(ctx):
    started.set()
    await release.wait()


def points(reader, name):
    return [
        point.value
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


async def main():
    flow = Workflow(name="held", trigger=WorkerTrigger(queue="held"), steps=[Step("held", held)])
    reader = InMemoryMetricReader()
    async with Engine(workflows=[flow], database=sys.argv[1]) as engine:
        first = await engine.enqueue("held", {})
        with anyio.fail_after(10):
            await started.wait()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        release.set()
        await engine.wait_for_job(first, timeout=10)
        await engine.wait_for_job(await engine.enqueue("held", {}), timeout=10)
    print(json.dumps({
        "active": points(reader, "blok.runs.active"),
        "completed": points(reader, "blok.jobs.completed"),
    }))

anyio.run(main)
"""


def test_a_meter_provider_set_while_a_run_runs_counts_from_then_on(tmp_path: Path) -> None:
    # Until a meter provider is set the engine records nothing (its instruments would drop it
    # all). A run already under way when one is set is not taken off `blok.runs.active` at
    # its end, where its start was never counted: the gauge never goes below zero.
    script = tmp_path / "late_meter.py"
    script.write_text(LATE_METER)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "blok.db")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["active"] == [0]  # the second run: one up, one down; the first: neither
    assert sum(seen["completed"]) == 2  # both ended once a provider was set
