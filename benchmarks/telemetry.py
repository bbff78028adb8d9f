"""What the tracing and metrics hooks cost a no-op job: the contract path (`contract.py`,
`submit-all`) under four telemetry setups, each measurement in a fresh process, setups
interleaved, median of `--repeat`.

- `off`: BLOK_TELEMETRY_DISABLED=1, the hooks that do nothing (what a user without the `otel`
  extra has: nothing of OpenTelemetry is imported).
- `api`: OpenTelemetry installed, no provider set (the extra installed, not configured).
- `traces`: an SDK tracer provider (every span sampled and ended; no exporter, so the number is
  the engine's and the SDK's work, not an exporter's).
- `traces+metrics`: the same and an SDK meter provider with an in-memory reader.

    python benchmarks/telemetry.py [--provider memory|sqlite] [--body echo|three] [-n 2000]
                                   [--repeat 5]
    python benchmarks/telemetry.py --hooks   # the hooks alone, per job, in µs

`--hooks` times, without the engine around them, the hook calls one single-step job makes
(enqueuing, enqueued, run_started, one step attempt, run_ended, run_finished) on real records.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SETUPS = ("off", "api", "traces", "traces+metrics")


def one(setup: str, provider: str, body: str, n: int) -> None:
    import anyio
    from contract import run_contract
    from fresh import emit

    if setup in ("traces", "traces+metrics"):
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
    if setup == "traces+metrics":
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    from engine import telemetry

    with tempfile.TemporaryDirectory() as folder:
        seconds = anyio.run(run_contract, provider, body, "submit-all", n, 8, Path(folder))
    active = type(telemetry.OBSERVE).__name__
    emit({"setup": setup, "seconds": seconds, "jobs_per_s": n / seconds, "hooks": active})


def time_one_jobs_hooks(setup: str, rounds: int = 20_000) -> None:
    import time

    from fresh import emit

    from engine import telemetry
    from engine.context import Context
    from engine.ledger import make_job, make_run
    from engine.models import RunStatus, utcnow
    from engine.observer import Observer

    if setup in ("traces", "traces+metrics"):
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
    if setup == "traces+metrics":
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    observe = Observer() if setup == "off" else telemetry.activate()

    def job_hooks() -> None:
        job = make_job(
            queue="q",
            workflow_name="w",
            payload={},
            headers=None,
            priority=0,
            run_at=None,
            max_retries=0,
        )
        observe.enqueuing(job)
        observe.enqueued([job], [job.id])
        run = make_run(job, workflow_version="v1")
        ctx = Context.for_job(run, job)
        observe.run_started(run, job, "v1")
        with observe.step(run, ctx, "s", None):
            pass
        run.status = RunStatus.COMPLETED
        run.started_at = run.finished_at = utcnow()
        observe.run_ended(run)
        observe.run_finished(run)

    for _ in range(1000):
        job_hooks()
    started = time.perf_counter()
    for _ in range(rounds):
        job_hooks()
    emit({"setup": setup, "seconds": time.perf_counter() - started, "rounds": rounds})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", default="memory", choices=["memory", "sqlite"])
    parser.add_argument("--body", default="echo", choices=["echo", "three"])
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hooks", action="store_true", help="time the hooks alone")
    parser.add_argument("--one", choices=SETUPS, help=argparse.SUPPRESS)
    parser.add_argument("--one-hooks", choices=SETUPS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_hooks:
        time_one_jobs_hooks(args.one_hooks)
        return
    if args.hooks:
        time_hooks(args.repeat)
        return
    if args.one:
        one(args.one, args.provider, args.body, args.n)
        return
    from fresh import run_fresh

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    seconds: dict[str, list[float]] = {setup: [] for setup in SETUPS}
    hooks: dict[str, str] = {}
    for _ in range(args.repeat):
        for setup in SETUPS:
            if setup == "off":
                os.environ["BLOK_TELEMETRY_DISABLED"] = "1"
            try:
                options = ["--provider", args.provider, "--body", args.body, "-n", str(args.n)]
                result = run_fresh(__file__, ["--one", setup, *options])
            finally:
                os.environ.pop("BLOK_TELEMETRY_DISABLED", None)
            seconds[setup].append(result["seconds"])
            hooks[setup] = result["hooks"]
    base = statistics.median(seconds["off"]) / args.n
    print(
        f"commit {commit}, {args.provider}/{args.body}, submit-all, N={args.n}, "
        f"median of {args.repeat}"
    )
    print(f"{'setup':<16} {'hooks':<14} {'jobs/s':>8} {'µs/job':>8} {'vs off':>8}")
    for setup in SETUPS:
        per_job = statistics.median(seconds[setup]) / args.n
        print(
            f"{setup:<16} {hooks[setup]:<14} {1 / per_job:>8,.0f} {per_job * 1e6:>8.1f} "
            f"{(per_job - base) * 1e6:>+8.1f}"
        )


def time_hooks(repeat: int) -> None:
    """Per job, the hooks alone, each setup in fresh processes; the baseline (`off`) includes
    making the records, which the others' numbers include too."""
    from fresh import run_fresh

    per_job: dict[str, list[float]] = {setup: [] for setup in SETUPS}
    for _ in range(repeat):
        for setup in SETUPS:
            result = run_fresh(__file__, ["--one-hooks", setup])
            per_job[setup].append(result["seconds"] / result["rounds"])
    # The fastest of the repeats, as timeit reports: what the code costs, less the noise of
    # other processes on a shared machine.
    base = min(per_job["off"])
    print(f"the hooks of one single-step job, best of {repeat}")
    print(f"{'setup':<16} {'µs/job':>8} {'vs off':>8}")
    for setup in SETUPS:
        best = min(per_job[setup])
        print(f"{setup:<16} {best * 1e6:>8.2f} {(best - base) * 1e6:>+8.2f}")


if __name__ == "__main__":
    main()
