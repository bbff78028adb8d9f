"""blok and huey with the worker in another process: the path of a deployment that outgrew one
process (a web app enqueues and awaits results, workers elsewhere run the jobs).

    python benchmarks/split.py                              # SQLite and PostgreSQL, N = 1000
    python benchmarks/split.py --providers postgres -n 2000 --repeat 3
    python benchmarks/split.py --shapes submit-all,producers --url postgresql://...

For each system, provider and shape, with the two systems alternating: a fresh database, a
worker process on it, and this process as the producer, all run the way each system ships.

- blok: `blok-tui worker --db ...` serving `contract.py`'s one-step `echo` workflow at
  concurrency 8 (its own workflow file), and here an `Engine(database=...)` that serves nothing:
  `enqueue` one call each, `wait_for_job` each.
- huey: `huey_consumer` with 8 worker threads (`-k thread -w 8`, polling as shipped: 0.1 s,
  backing off to 10 s) on `SqliteHuey` / `SqlHuey`, and here the task's call and
  `result.get(blocking=True)` (which polls the result store: at once, then from 50 ms up).

The clock runs from the first enqueue to the last result, after one job through each pair (so
both workers are up and polling). Shapes are `contract.py`'s: `submit-all` (enqueue N, then
await each in order), `producers` (8 producers, each enqueue → await in a loop), `sequential`
(one job at a time: the round trip). The worker process's CPU is not counted; the table prints
jobs/s and blok/huey.
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]  # this checkout's engine, not an installed one

import anyio  # noqa: E402
import contract  # noqa: E402
import huey_peer  # noqa: E402
from queues import engine_source, machine  # noqa: E402
from scratch_pg import DEFAULT_URL, scratch_database  # noqa: E402

SHAPES = ("submit-all", "producers", "sequential")
CONCURRENCY = 8
READY_S = 60

BLOK_WORKFLOWS = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
from contract import workflow
workflows = [workflow("echo", {CONCURRENCY}, None)]
"""

HUEY_MODULE = """
import os
from huey import SqliteHuey

DATABASE = os.environ["SPLIT_HUEY_DATABASE"]
if DATABASE.startswith("postgresql://"):
    from huey.contrib.sql_huey import SqlHuey

    huey = SqlHuey("bench", database=DATABASE)
else:
    huey = SqliteHuey("bench", filename=DATABASE)


@huey.task(name="bench.echo")
def echo(i):
    return i
"""


def environment(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("BLOK_DB", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *extra.pop("path", "").split(os.pathsep)])
    env.update(extra)
    return env


@contextmanager
def process(command: list[str], env: dict[str, str], cwd: Path, ready: str) -> Iterator[None]:
    """A worker process, from the line it prints once ready (`ready`, on stdout or stderr)
    until it is stopped (SIGTERM, as an operator stops it)."""
    log = cwd / f"worker-{time.monotonic_ns()}.log"
    with log.open("w") as sink:
        child = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=sink, text=True
        )
    assert child.stdout is not None
    try:
        deadline = time.monotonic() + READY_S
        while ready not in log.read_text():
            if child.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{' '.join(command[:4])} did not start:\n{log.read_text()}")
            readable, _, _ = select.select([child.stdout], [], [], 0.05)
            if readable and ready in child.stdout.readline():
                break
        yield
    finally:
        child.terminate()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@contextmanager
def blok_worker(database: str, folder: Path) -> Iterator[None]:
    """`blok-tui worker` on `database`, serving BLOK_WORKFLOWS, until the block ends."""
    workflows = folder / "workflows"
    workflows.mkdir(exist_ok=True)
    (workflows / "bench.py").write_text(BLOK_WORKFLOWS)
    command = [sys.executable, "-m", "blok_tui", "worker", "--db", database]
    command += ["--workflows", str(workflows), "--no-watch"]
    with process(command, environment(), folder, "blok worker "):
        yield


def blok_seconds(database: str, folder: Path, shape: str, n: int) -> float:
    with blok_worker(database, folder):
        return anyio.run(_blok_producer, database, shape, n)


async def _blok_producer(database: str, shape: str, n: int) -> float:
    from engine import Engine

    async with Engine(database=database, create=False) as engine:
        await engine.wait_for_job(await engine.enqueue(contract.QUEUE, {"i": -1}), timeout=60)
        started = time.perf_counter()
        runs = await contract.DRIVERS[shape](engine, n, CONCURRENCY)
        seconds = time.perf_counter() - started
        await contract.check(engine, runs, n, "echo", f"blok split {shape}")
    return seconds


def huey_seconds(database: str, folder: Path, shape: str, n: int) -> float:
    (folder / "hueybench.py").write_text(HUEY_MODULE)
    env = environment(path=str(folder), SPLIT_HUEY_DATABASE=database)
    command = [sys.executable, "-m", "huey.bin.huey_consumer", "hueybench.huey"]
    command += ["-k", "thread", "-w", str(CONCURRENCY)]
    os.environ["SPLIT_HUEY_DATABASE"] = database
    sys.path.insert(0, str(folder))
    try:
        sys.modules.pop("hueybench", None)
        import hueybench  # the producer's side of the same huey

        with process(command, env, folder, "consumer started"):
            echo: Callable[[int], Any] = hueybench.echo
            echo(-1).get(blocking=True, timeout=60)
            started = time.perf_counter()
            values = huey_peer.drive(echo, shape, n, CONCURRENCY)
            seconds = time.perf_counter() - started
    finally:
        sys.path.remove(str(folder))
    if sorted(values) != list(range(n)):
        raise SystemExit(f"huey split {shape}: {len(values)} of {n} results")
    return seconds


SYSTEMS: dict[str, Callable[[str, Path, str, int], float]] = {
    "blok": blok_seconds,
    "huey": huey_seconds,
}


T = TypeVar("T")


def in_scratch(system: str, provider: str, url: str, run: Callable[[str, Path], T]) -> T:
    """`run(database, folder)` on a fresh database of `provider` and a scratch folder."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        databases = (
            scratch_database(url, f"bench_{system}")
            if provider == "postgres"
            else nullcontext(str(folder / f"{system}.db"))
        )
        with databases as database:
            return run(database, folder)


def measure(system: str, provider: str, shape: str, n: int, url: str) -> float:
    seconds = in_scratch(
        system, provider, url, lambda database, folder: SYSTEMS[system](database, folder, shape, n)
    )
    return n / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", default="sqlite,postgres")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("-n", type=int, default=1000)
    parser.add_argument("--sequential-n", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--url", default=DEFAULT_URL, help="the PostgreSQL server (postgres)")
    args = parser.parse_args()
    rows = []
    for provider in args.providers.split(","):
        for shape in args.shapes.split(","):
            n = args.sequential_n if shape == "sequential" else args.n
            rates: dict[str, list[float]] = {system: [] for system in SYSTEMS}
            for _ in range(args.repeat):
                for system in SYSTEMS:
                    rate = measure(system, provider, shape, n, args.url)
                    rates[system].append(rate)
                    print(f"  {system:5} {provider} {shape} N={n}: {rate:,.0f} jobs/s", flush=True)
            blok, huey = (statistics.median(rates[system]) for system in SYSTEMS)
            rows.append((provider, shape, n, blok, huey, rates))
    print()
    print("blok vs huey, the worker in another process: jobs/s (first enqueue to last result)")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"concurrency = {CONCURRENCY}, median of {args.repeat}, a fresh database and worker each")
    print()
    print("| queue | shape | N | blok | huey | blok/huey | range (blok; huey) |")
    print("|---|---|--:|--:|--:|--:|---|")
    for provider, shape, n, blok, huey, rates in rows:
        spans = "; ".join(f"{min(r):,.0f}-{max(r):,.0f}" for r in rates.values())
        print(
            f"| {provider} | {shape} | {n} | {blok:,.0f} | {huey:,.0f} | {blok / huey:.2f}x | {spans} |"
        )


if __name__ == "__main__":
    main()
