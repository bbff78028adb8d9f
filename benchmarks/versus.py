"""This checkout's engine against an earlier commit's, on the contract path, in one invocation.

    python benchmarks/versus.py --against 7c827fc                   # memory and SQLite, N = 2000
    python benchmarks/versus.py --against HEAD~3 --providers sqlite,postgres --repeat 7

A change that makes a job a tenth cheaper is smaller than how much this machine's speed moves
from one hour to the next (±40 %, see README.md), so a before and an after measured an hour
apart say nothing. Here both engines run in the same invocation, alternating: the earlier
commit is checked out into a temporary git worktree, and each measurement runs in a fresh
process that imports one of the two engines (and that engine's own `benchmarks/contract.py`).
The shape is `contract.py`'s (`submit-all` by default: N jobs enqueued one call each, then each
awaited with `wait_for_job`; one-step `echo` workflow, concurrency 8), checked afterwards as
`contract.py` checks it. The table prints, per provider and shape, the median jobs/s of each,
their ranges, and this checkout's ratio to the earlier one; and the process's CPU time a job
while the clock ran (every thread), which a host that takes the vCPU away now and then does not
stretch as it stretches the wall time. On PostgreSQL each measurement has a scratch database
of its own (the server's CPU is not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent
sys.path.insert(0, str(HERE))

from fresh import emit, run_fresh  # noqa: E402
from scratch_pg import DEFAULT_URL, database_for  # noqa: E402

PROVIDERS = ("memory", "sqlite", "postgres")
SHAPES = ("submit-all", "producers", "sequential")


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """`rev` checked out in a temporary worktree of this repository, removed afterwards."""

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            raise SystemExit(f"git {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout.strip()

    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    with tempfile.TemporaryDirectory(prefix="blok-versus-") as folder:
        path = Path(folder) / "engine-before"
        git("worktree", "add", "--detach", "--quiet", str(path), commit)
        try:
            if not (path / "benchmarks" / "contract.py").exists():
                raise SystemExit(f"{rev} has no benchmarks/contract.py to measure with")
            yield path
        finally:
            git("worktree", "remove", "--force", str(path))


def print_engines(title: str, against: str, before: Path) -> None:
    """A table's heading for this checkout against `against` (checked out at `before`): what
    it measures, the machine, and the two engines."""
    from queues import machine  # it imports this checkout's engine: here, never in a child

    print()
    print(title)
    print(f"machine: {machine()}")
    print(f"this:   {CHECKOUT} at {describe(CHECKOUT)}")
    print(f"before: {against} = {describe(before)}")


Case = TypeVar("Case")


def alternate(
    against: str,
    repeat: int,
    cases: Sequence[Case],
    measure: Callable[[str, Case], dict[str, Any]],
    progress: Callable[[Case, dict[str, Any]], str],
    title: str,
) -> dict[tuple[Case, str], list[dict[str, Any]]]:
    """Measure each case on this checkout and on `against` (checked out in a worktree),
    the two engines alternating, `repeat` times: `measure(engine_folder, case)` runs one (in
    a fresh process), and a line says what it gave as it comes (`progress`). Then the table's
    heading (`print_engines`, under `title`). Each case's results, by ("before" or "this")."""
    results: dict[tuple[Case, str], list[dict[str, Any]]] = {}
    with worktree(against) as before:
        engines = {"before": str(before), "this": str(CHECKOUT)}
        for repetition in range(repeat):
            for case in cases:
                for label, engine in engines.items():
                    result = measure(engine, case)
                    results.setdefault((case, label), []).append(result)
                    print(
                        f"  {repetition + 1}/{repeat} {label:6} {progress(case, result)}",
                        flush=True,
                    )
        print_engines(title, against, before)
    return results


def chosen(text: str, known: tuple[str, ...], what: str = "provider") -> list[str]:
    """The comma-separated names of `text`, each one of `known`, or exit saying which is not."""
    names = [name for name in text.split(",") if name]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"unknown {what} {', '.join(unknown)} (known: {', '.join(known)})")
    return names


def describe(path: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(path), "log", "-1", "--format=%h %s"], capture_output=True, text=True
    )
    return out.stdout.strip()[:70]


def import_engine(engine: str, *also: str) -> None:
    """In a child: import the engine in folder `engine` (a checkout), and make `also` (its
    folders) importable; fail if another engine was imported instead."""
    sys.path[:0] = [engine, *(str(Path(engine) / folder) for folder in also)]
    import engine as imported

    measured = Path(imported.__file__ or "").parent
    if measured != Path(engine) / "engine":
        raise SystemExit(f"meant to measure {engine}/engine, imported {measured}")


def one(engine: str, provider: str, shape: str, n: int, concurrency: int, url: str) -> None:
    """The child: one measurement with the engine in folder `engine`."""
    import_engine(engine, "benchmarks")
    import contract  # that engine's own

    cpu: list[float] = []

    @contextmanager
    def clocked() -> Iterator[None]:
        # The process's CPU time (every thread: SQLite's too) while the clock runs. A busy
        # host takes the vCPU away for a while: that stretches the wall time, not this.
        started = resource.getrusage(resource.RUSAGE_SELF)
        yield
        ended = resource.getrusage(resource.RUSAGE_SELF)
        cpu.append(ended.ru_utime + ended.ru_stime - started.ru_utime - started.ru_stime)

    async def measure() -> float:
        with tempfile.TemporaryDirectory() as folder:
            seconds: float = await contract.run_contract(
                provider,
                "echo",
                shape,
                n,
                concurrency,
                Path(folder),
                clocked=clocked,
                database=url or None,
            )
            return seconds

    seconds = asyncio.run(measure())
    emit({"seconds": seconds, "cpu": cpu[0]})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="the earlier commit (any git revision)")
    parser.add_argument("--providers", default="memory,sqlite")
    parser.add_argument("--shapes", default="submit-all")
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--url", default=DEFAULT_URL, help="the PostgreSQL server (postgres)")
    parser.add_argument("--one", nargs=4, metavar=("ENGINE", "PROVIDER", "SHAPE", "URL"))
    args = parser.parse_args(argv)
    if args.one:
        engine, provider, shape, url = args.one
        one(engine, provider, shape, args.n, args.concurrency, "" if url == "-" else url)
        return
    if not args.against:
        parser.error("--against is required: the commit to measure this checkout against")
    providers = chosen(args.providers, PROVIDERS)
    shapes = chosen(args.shapes, SHAPES, "shape")

    def measure(engine: str, case: tuple[str, str]) -> dict[str, Any]:
        provider, shape = case
        with database_for(provider, args.url, "blok_versus") as url:
            child = [
                *("--one", engine, provider, shape, url),
                *("-n", str(args.n), "--concurrency", str(args.concurrency)),
            ]
            result = run_fresh(__file__, child)
        return {"rate": args.n / result["seconds"], "cpu": result["cpu"] * 1e6 / args.n}

    def progress(case: tuple[str, str], result: dict[str, Any]) -> str:
        return (
            f"{case[0]:8} {case[1]}: {result['rate']:,.0f} jobs/s, "
            f"{result['cpu']:,.0f} µs of CPU a job"
        )

    cases = [(provider, shape) for provider in providers for shape in shapes]
    results = alternate(
        args.against,
        args.repeat,
        cases,
        measure,
        progress,
        "this checkout against an earlier commit: jobs/s on the contract path",
    )
    rates = {key: [r["rate"] for r in runs] for key, runs in results.items()}
    cpus = {key: [r["cpu"] for r in runs] for key, runs in results.items()}
    print(
        f"N = {args.n}, concurrency {args.concurrency}, echo, median of {args.repeat}, "
        "fresh processes, the two engines alternating"
    )
    print()
    print(
        "| queue | shape | jobs/s before | this | this/before | CPU µs a job before | this "
        "| before/this | range of jobs/s (before; this) |"
    )
    print("|---|---|--:|--:|--:|--:|--:|--:|---|")
    for provider in providers:
        for shape in shapes:
            old, new = rates[((provider, shape), "before")], rates[((provider, shape), "this")]
            old_cpu = statistics.median(cpus[((provider, shape), "before")])
            new_cpu = statistics.median(cpus[((provider, shape), "this")])
            print(
                f"| {provider} | {shape} | {statistics.median(old):,.0f} | "
                f"{statistics.median(new):,.0f} | "
                f"{statistics.median(new) / statistics.median(old):.2f}x | "
                f"{old_cpu:,.0f} | {new_cpu:,.0f} | {old_cpu / new_cpu:.2f}x | "
                f"{min(old):,.0f}-{max(old):,.0f}; {min(new):,.0f}-{max(new):,.0f} |"
            )


if __name__ == "__main__":
    main()
