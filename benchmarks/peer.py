"""blok against huey on the path users take, in one invocation: jobs/s and the ratio blok/huey.

    pip install -e '.[bench]'          # huey (and DBOS, pyinstrument) are the bench extra
    python benchmarks/peer.py                          # every section, N = 2000 and 5000
    python benchmarks/peer.py --sections contract --ns 2000 --repeat 3
    python benchmarks/peer.py --providers postgres --sections contract,producers,sequential

Sections (rows), each for the memory and the SQLite provider, concurrency C = 8:
(`--providers memory,sqlite,postgres` adds PostgreSQL rows: blok on the server at `--url`
against huey's `SqlHuey` there, each measurement on a database of its own; see huey_peer.py)

- `contract` (the headline): the contract path, `submit-all` shape: N jobs enqueued one call
  each, then each awaited (`wait_for_job` / huey's `result.get(blocking=True)`) in order.
  Why this shape is the fair headline: it is the per-call API a user of the contract writes,
  with the queue's C slots kept busy, so it compares the work each system does per job rather
  than how long a waiter sleeps between two looks at the result store (huey polls results from
  50 ms up; blok is woken). The issue's goals were measured on it.
- `producers`: C concurrent producers, each enqueue → wait in a loop (a web app's C request
  handlers). Bound by one job's round trip; for huey as shipped that is its polling intervals.
- `sequential`: one job in flight at a time (the round trip's latency, as jobs/s), smaller N.
- `bulk`: the earlier benchmark, kept as extra rows: blok's `enqueue_many` and counting
  completions with `queue_stats`, against huey's per-call enqueue counted with its
  `SIGNAL_COMPLETE` hook, huey as shipped and huey tuned (see `huey_peer.py`).
- `sleep10`: 10 ms-sleep jobs (`await anyio.sleep(0.01)` in blok, `time.sleep(0.01)` in huey's
  threads), `submit-all` and `bulk`, as a share of the C x 100 = 800 jobs/s ceiling.

What is measured, for every system alike: the consumer is started and idle; the clock starts;
the jobs go in; the clock stops when the last job is done (contract shapes: the last result is
in the producer's hands). Every measurement runs in its own fresh Python subprocess, the
systems are interleaved within each repetition (so that background load hits them alike), and
the tables show the median of `--repeat` runs. blok keeps its full records (a run, its step and
attempt records per job), checked after the clock stops; huey keeps a result per task on the
contract path and nothing on the bulk path.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
import huey_peer  # noqa: E402
from fresh import emit, run_fresh  # noqa: E402
from queues import engine_source, machine, run_blok  # noqa: E402
from scratch_pg import DEFAULT_URL, scratch_database  # noqa: E402

PROVIDERS = ("memory", "sqlite", "postgres")
SECTIONS = ("contract", "producers", "sequential", "bulk", "sleep10")


@dataclass(frozen=True)
class Cell:
    section: str
    path: str  # a contract shape, or "bulk"
    provider: str
    body: str  # contract: echo | sleep10; bulk: noop | sleep10
    n: int

    @property
    def systems(self) -> tuple[str, ...]:
        return ("blok", "huey", "huey-tuned") if self.path == "bulk" else ("blok", "huey")

    def argv(self, system: str, args: argparse.Namespace) -> list[str]:
        return [
            "--one",
            f"{system}:{self.path}:{self.provider}:{self.body}:{self.n}",
            "--concurrency",
            str(args.concurrency),
            "--url",
            args.url,
        ]


def measure_here(
    system: str, path: str, provider: str, body: str, n: int, c: int, server: str
) -> float:
    """One measurement in this (fresh) process: seconds. On PostgreSQL, in a database of its
    own on `server`, dropped afterwards."""
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="blok-peer-")))
        url = None
        if provider == "postgres":
            url = stack.enter_context(scratch_database(server, f"blok_peer_{system[:4]}"))
        if system == "blok" and path == "bulk":
            return asyncio.run(run_blok(provider, body, n, c, folder, url)).seconds
        if system == "blok":
            run = contract.run_contract(provider, body, path, n, c, folder, database=url)
            return asyncio.run(run)
        if path == "bulk":
            return huey_peer.run_bulk(provider, body, n, c, folder, system == "huey-tuned", url)
        return huey_peer.run_contract(provider, body, path, n, c, folder, url)


def plan(args: argparse.Namespace) -> list[Cell]:
    ns = [int(n) for n in args.ns.split(",")]
    cells: list[Cell] = []
    providers = args.providers.split(",")
    for provider in providers:
        if provider not in PROVIDERS:
            raise SystemExit(f"unknown provider {provider!r}; choose from {PROVIDERS}")
    for section in args.sections.split(","):
        for provider in providers:
            if section == "contract":
                cells += [Cell(section, "submit-all", provider, "echo", n) for n in ns]
            elif section == "producers":
                cells += [Cell(section, "producers", provider, "echo", n) for n in ns]
            elif section == "sequential":
                cells.append(Cell(section, "sequential", provider, "echo", args.sequential_n))
            elif section == "bulk":
                cells += [Cell(section, "bulk", provider, "noop", n) for n in ns]
            elif section == "sleep10":
                cells.append(Cell(section, "submit-all", provider, "sleep10", args.sleep_n))
                cells.append(Cell(section, "bulk", provider, "sleep10", args.sleep_n))
            else:
                raise SystemExit(f"unknown section {section!r}; choose from {SECTIONS}")
    return cells


def print_tables(
    cells: list[Cell], times: dict[tuple[Cell, str], list[float]], args: argparse.Namespace
) -> None:
    rates = {key: key[0].n / statistics.median(t) for key, t in times.items()}
    spread = args.repeat > 1
    print("\nblok vs huey: jobs/s end to end (the clock: first enqueue to last job done)")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"concurrency = {args.concurrency}, median of {args.repeat} run(s) each")
    ceiling = args.concurrency * 100
    for section in dict.fromkeys(c.section for c in cells):
        rows = [c for c in cells if c.section == section]
        tuned = any(c.path == "bulk" for c in rows)
        print(f"\n[{section}]")
        head = "| path       | queue    | job     |     N |   blok |   huey | blok/huey |"
        if tuned:
            head += " huey tuned | blok/tuned |"
        if section == "sleep10":
            head += " blok % of ceiling | huey % of ceiling |"
        if spread:
            head += " range (blok; huey) |"
        print(head)
        print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
        for cell in rows:
            blok, huey = rates[(cell, "blok")], rates[(cell, "huey")]
            line = (
                f"| {cell.path:<10} | {cell.provider:<8} | {cell.body:<7} | {cell.n:>5} "
                f"| {blok:>6,.0f} | {huey:>6,.0f} | {blok / huey:>8.2f}x |"
            )
            if tuned:
                if cell.path == "bulk":
                    t = rates[(cell, "huey-tuned")]
                    line += f" {t:>10,.0f} | {blok / t:>9.2f}x |"
                else:
                    line += f" {'':>10} | {'':>10} |"
            if section == "sleep10":
                line += f" {blok / ceiling:>16.0%} | {huey / ceiling:>16.0%} |"
            if spread:
                line += f" {span(cell, 'blok', times)}; {span(cell, 'huey', times)} |"
            print(line)
    print(
        "\n(huey = huey as shipped, results awaited with result.get(blocking=True); huey tuned ="
        "\n fast polling, no result store, synchronous=NORMAL like blok; see huey_peer.py;"
        "\n on PostgreSQL huey is SqlHuey, on peewee)"
    )


def span(cell: Cell, system: str, times: dict[tuple[Cell, str], list[float]]) -> str:
    """The slowest and the fastest of the repetitions, in jobs/s."""
    seconds = times[(cell, system)]
    return f"{cell.n / max(seconds):,.0f}-{cell.n / min(seconds):,.0f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--providers", default="memory,sqlite", help=",".join(PROVIDERS))
    parser.add_argument("--url", default=DEFAULT_URL, help="the PostgreSQL server (postgres)")
    parser.add_argument("--ns", default="2000,5000", help="N for contract, producers, bulk")
    parser.add_argument("--sequential-n", type=int, default=200)
    parser.add_argument("--sleep-n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        system, path, provider, body, n = args.one.split(":")
        seconds = measure_here(system, path, provider, body, int(n), args.concurrency, args.url)
        emit({"seconds": seconds})
        return
    cells = plan(args)
    times: dict[tuple[Cell, str], list[float]] = {}
    for _ in range(args.repeat):
        for cell in cells:
            for system in cell.systems:
                result = run_fresh(__file__, cell.argv(system, args))
                times.setdefault((cell, system), []).append(result["seconds"])
                rate = cell.n / result["seconds"]
                label = f"{cell.section}: {cell.path} {cell.provider} {cell.body} N={cell.n}"
                print(f"  {system:<10} {label}: {rate:,.0f} jobs/s", file=sys.stderr)
    print_tables(cells, times, args)


if __name__ == "__main__":
    main()
