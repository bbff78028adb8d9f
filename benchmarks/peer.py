"""blok's queues against huey's, end to end, in one invocation: jobs/s and the ratio blok/huey.

    pip install -e '.[bench]'          # huey is an optional extra
    python benchmarks/peer.py          # N=5000, concurrency 8, no-op and 10 ms-sleep jobs
    python benchmarks/peer.py --body noop --repeat 5

What is measured, for every system alike: the consumer is started and idle; the clock starts;
N jobs are enqueued; the clock stops when the last job has completed. Every measurement runs in
its own fresh Python subprocess (so that one run's heap, threads and GC state cannot slow down
the next), the systems are interleaved within each repetition (so that background load hits
them alike), and the table shows the median of `--repeat` runs.

The setup, and why it is fair:

- blok: an `Engine` with one workflow of one step on one queue (`WorkerTrigger(concurrency=C)`),
  memory or SQLite provider. Jobs go in with `enqueue_many` (blok's bulk API: one transaction
  on SQLite), and the clock stops once `queue_stats` counts N completed — on SQLite that is
  after the jobs' acknowledgements and their runs' final records have committed together, with
  one run, one step and one attempt record per job. The script then checks those records.
- huey: `MemoryHuey` / `SqliteHuey` with huey's own consumer (`huey.create_consumer`), C worker
  threads — huey's threaded worker model, its natural choice for I/O-bound jobs. huey has no
  bulk enqueue, so jobs go in one call each, as huey users do. Completion is counted with
  huey's `SIGNAL_COMPLETE` hook, which fires right after a task ran; huey keeps no record of a
  task that returned None, so huey does strictly less work per job than blok does.
- huey is measured twice. `huey` is huey as shipped: default consumer polling (an idle
  worker sleeps 0.1 s, growing to 10 s), the default result store, and `SqliteHuey`'s default
  durability (WAL with SQLite's `synchronous=FULL`: an fsync per commit). `huey tuned` is huey
  made as fast as it goes and matched to blok where blok differs: polling at
  `initial_delay=0.001, max_delay=0.01` (blok's claim loop is woken by the enqueue, it never
  idles), `results=False`, and WAL with `synchronous=NORMAL`, blok's own durability (a commit
  survives a process crash; fsync only at checkpoints).
- Job bodies: `noop` returns at once; `sleep10` sleeps 10 ms — `await anyio.sleep(0.01)` in
  blok's async node, `time.sleep(0.01)` in huey's thread, each system's idiomatic way to wait.
  With C = 8 the sleep10 ceiling is 800 jobs/s for both; it shows the per-job overhead under
  I/O-bound work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from queues import BODIES, PROVIDERS, Result, machine, run_blok  # noqa: E402

SYSTEMS = ("blok", "huey", "huey-tuned")


def run_huey(
    provider: str, body: str, n: int, concurrency: int, folder: Path, tuned: bool
) -> Result:
    from huey import MemoryHuey, SqliteHuey
    from huey.signals import SIGNAL_COMPLETE, SIGNAL_ERROR
    from huey.storage import SqliteStorage

    class NormalSyncStorage(SqliteStorage):
        """huey's storage with blok's durability level: WAL + synchronous=NORMAL."""

        def _create_connection(self):  # type: ignore[no-untyped-def]
            conn = super()._create_connection()
            conn.execute("pragma synchronous=1")
            return conn

    options: dict[str, object] = {"results": False} if tuned else {}
    if provider == "memory":
        huey = MemoryHuey("bench", **options)
    else:
        path = str(folder / f"huey-{body}-{time.monotonic_ns()}.db")
        if tuned:
            options["storage_class"] = NormalSyncStorage
        huey = SqliteHuey("bench", filename=path, **options)

    if body == "noop":

        def job(i: int) -> None:
            return None
    else:

        def job(i: int) -> None:
            time.sleep(0.01)

    task = huey.task(name=f"bench.{body}")(job)
    done = threading.Event()
    lock = threading.Lock()
    count = 0
    errors: list[str] = []

    @huey.signal(SIGNAL_COMPLETE)
    def completed(signal: str, task: object) -> None:
        nonlocal count
        with lock:
            count += 1
            if count == n:
                done.set()

    @huey.signal(SIGNAL_ERROR)
    def failed(signal: str, task: object, exc: BaseException | None = None) -> None:
        errors.append(f"{task}: {exc!r}")
        done.set()

    polling = {"initial_delay": 0.001, "max_delay": 0.01} if tuned else {}
    consumer = huey.create_consumer(
        workers=concurrency, worker_type="thread", periodic=False, **polling
    )
    consumer.start()
    time.sleep(0.2)  # the consumer's threads are up and polling, as blok's engine is
    started = time.perf_counter()
    for i in range(n):
        task(i)
    finished = done.wait(600)
    seconds = time.perf_counter() - started
    consumer.stop(graceful=True)
    if errors or not finished:
        raise SystemExit(f"huey {provider}/{body}: {count} of {n} completed; {errors[:1]}")
    return Result("huey-tuned" if tuned else "huey", provider, body, n, concurrency, seconds)


def one(args: argparse.Namespace) -> None:
    """One measurement, in this (fresh) process; prints its result as JSON."""
    import asyncio

    with tempfile.TemporaryDirectory(prefix="blok-peer-") as folder:
        if args.one == "blok":
            result = asyncio.run(
                run_blok(args.provider, args.body, args.n, args.concurrency, Path(folder))
            )
        else:
            tuned = args.one == "huey-tuned"
            result = run_huey(
                args.provider, args.body, args.n, args.concurrency, Path(folder), tuned
            )
    print(json.dumps({"seconds": result.seconds}))


def measure(system: str, provider: str, body: str, args: argparse.Namespace) -> float:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        system,
        "--provider",
        provider,
        "--body",
        body,
        "-n",
        str(args.n),
        "--concurrency",
        str(args.concurrency),
    ]
    out = subprocess.run(command, capture_output=True, text=True, timeout=900, env=os.environ)
    if out.returncode != 0:
        raise SystemExit(f"{system} {provider}/{body} failed:\n{out.stdout}\n{out.stderr}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", choices=[*PROVIDERS, "all"], default="all")
    parser.add_argument("--body", choices=[*BODIES, "all"], default="all")
    parser.add_argument("-n", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        one(args)
        return
    providers = PROVIDERS if args.provider == "all" else (args.provider,)
    bodies = BODIES if args.body == "all" else (args.body,)
    cells = [(p, b) for p in providers for b in bodies]
    times: dict[tuple[str, str, str], list[float]] = {}
    for _ in range(args.repeat):
        for provider, body in cells:
            for system in SYSTEMS:
                seconds = measure(system, provider, body, args)
                times.setdefault((system, provider, body), []).append(seconds)
    print("\nblok vs huey: end-to-end jobs/s (enqueue N, until the last job completed)")
    print(f"machine: {machine()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"N = {args.n}, concurrency = {args.concurrency}, median of {args.repeat} runs each")
    header = (
        f"| {'queue':<7} | {'job':<8} | {'blok':>7} | {'huey':>7} | {'blok/huey':>9} |"
        f" {'huey tuned':>10} | {'blok/huey tuned':>15} |"
    )
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    for provider, body in cells:
        rate = {s: args.n / statistics.median(times[(s, provider, body)]) for s in SYSTEMS}
        blok, huey, tuned = rate["blok"], rate["huey"], rate["huey-tuned"]
        print(
            f"| {provider:<7} | {body:<8} | {blok:>7,.0f} | {huey:>7,.0f} | {blok / huey:>8.2f}x |"
            f" {tuned:>10,.0f} | {blok / tuned:>14.2f}x |"
        )
    print("(jobs/s; huey = huey as shipped; huey tuned = fast polling, no result store and")
    print(" synchronous=NORMAL like blok: see the docstring)")


if __name__ == "__main__":
    main()
