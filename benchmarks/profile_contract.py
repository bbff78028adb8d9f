"""Profile the contract path: where the time of `enqueue` + `wait_for_job` per job goes.

    python benchmarks/profile_contract.py                        # memory and SQLite, N = 2000
    python benchmarks/profile_contract.py --provider sqlite --label after

The workload is `contract.py`'s headline shape (`submit-all`: N jobs enqueued one call each,
then `wait_for_job` each; one-step `echo` workflow, concurrency 8) on a fresh engine. For each
provider, two fresh processes:

- pyinstrument (statistical, 1 ms, `async_mode="disabled"`: the main thread's real call stacks,
  so the event loop's idle time shows as its `select` call), its text report written to
  `<out>/contract-<provider>-<label>.pyinstrument.txt`;
- cProfile (deterministic, slower), the 40 functions with the most own time, written to
  `<out>/contract-<provider>-<label>.cprofile.txt`.

The run notes when the enqueue loop ended (the rest of the wall time is the `wait_for_job`
loop). Both profilers see the main thread only (the event loop, where the engine's Python runs). So each run
also prints the wall time, the process's CPU time and the main thread's: the difference is
CPU spent in other threads (aiosqlite's connection threads on SQLite).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
from fresh import emit, run_fresh  # noqa: E402
from queues import engine_source, machine  # noqa: E402

PROFILERS = ("pyinstrument", "cprofile")


async def workload(provider: str, n: int, folder: Path, profile: object) -> dict[str, float]:
    """The timed part only (engine started before, stopped after) runs under `profile`."""
    async with contract.open_engine(provider, "echo", 8, folder) as engine:
        wall, cpu, main_cpu = time.perf_counter(), time.process_time(), time.thread_time()
        profile.start()  # type: ignore[attr-defined]
        # contract.submit_all, with the moment its enqueue loop ends noted
        ids = [await engine.enqueue(contract.QUEUE, {"i": i}) for i in range(n)]
        enqueued = time.perf_counter() - wall
        runs = [await engine.wait_for_job(job_id, timeout=600) for job_id in ids]
        profile.stop()  # type: ignore[attr-defined]
        result = {
            "wall": time.perf_counter() - wall,
            "cpu": time.process_time() - cpu,
            "main_cpu": time.thread_time() - main_cpu,
            "enqueue_phase": enqueued,
        }
        await contract.check(engine, runs, n, "echo", f"profile {provider}")
    return result


class CProfileAdapter:
    def __init__(self) -> None:
        self.profile = cProfile.Profile()

    def start(self) -> None:
        self.profile.enable()

    def stop(self) -> None:
        self.profile.disable()

    def report(self) -> str:
        out = io.StringIO()
        stats = pstats.Stats(self.profile, stream=out)
        stats.sort_stats("tottime").print_stats(40)
        return out.getvalue()


def profile_here(provider: str, profiler: str, n: int, out: Path, label: str) -> dict[str, float]:
    target = out / f"contract-{provider}-{label}.{profiler}.txt"
    with tempfile.TemporaryDirectory(prefix="blok-profile-") as name:
        if profiler == "pyinstrument":
            from pyinstrument import Profiler

            profile = Profiler(interval=0.001, async_mode="disabled")
            times = asyncio.run(workload(provider, n, Path(name), profile))
            report = profile.output_text(unicode=True, color=False, show_all=False)
        else:
            adapter = CProfileAdapter()
            times = asyncio.run(workload(provider, n, Path(name), adapter))
            report = adapter.report()
    header = (
        f"contract path ({contract.SHAPES[0]}), {provider}, N = {n}, concurrency 8, {profiler}\n"
        f"machine: {machine()}\nengine: {engine_source()}\n"
        f"wall {times['wall']:.2f} s, process CPU {times['cpu']:.2f} s, "
        f"main thread CPU {times['main_cpu']:.2f} s; the enqueue loop ended at "
        f"{times['enqueue_phase']:.2f} s, the waits took the rest\n\n"
    )
    target.write_text(header + report)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", choices=["memory", "sqlite", "all"], default="all")
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--label", default="before")
    parser.add_argument("--out", type=Path, default=HERE / "profiles")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        provider, profiler = args.one.split(":")
        emit(profile_here(provider, profiler, args.n, args.out, args.label))
        return
    providers = ("memory", "sqlite") if args.provider == "all" else (args.provider,)
    print(f"machine: {machine()}\nengine: {engine_source()}\nN = {args.n}")
    for provider in providers:
        for profiler in PROFILERS:
            argv_one = ["--one", f"{provider}:{profiler}", "-n", str(args.n)]
            argv_one += ["--label", args.label, "--out", str(args.out)]
            t = run_fresh(__file__, argv_one)
            print(
                f"{provider:<7} {profiler:<13} wall {t['wall']:6.2f} s ({args.n / t['wall']:,.0f}"
                f" jobs/s)  process CPU {t['cpu']:6.2f} s  main thread CPU {t['main_cpu']:6.2f} s"
                f"  enqueue loop {t['enqueue_phase']:5.2f} s"
                f"  -> {args.out / f'contract-{provider}-{args.label}.{profiler}.txt'}"
            )


if __name__ == "__main__":
    main()
