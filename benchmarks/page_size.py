"""The contract path on SQLite files created with different page sizes, A/B in one invocation.

    python benchmarks/page_size.py                       # 1024 against 4096, 5 rounds
    python benchmarks/page_size.py --sizes 512,1024,4096 --body three --rounds 3

blok creates a SQLite file with 1 KB pages (`engine/backends/sqlite/db.py`, PAGE_SIZE): a
commit appends every page it changed to the WAL, whole, so smaller pages write fewer unchanged
bytes. This script measures that choice against SQLite's default: each round runs every size
once, each in a fresh process (the sizes interleaved, as this machine drifts within minutes),
with the engine's PAGE_SIZE set to the size before the file is created. The shape is the
contract path's headline, `submit-all` (contract.py): N enqueues one call each, then
`wait_for_job` each. Reported: jobs/s, the process's CPU time a job (user + system) and the
bytes it wrote a job (Linux's wchar: the WAL's appends and the checkpoints' copies), the median
over the rounds, and each size's ratio to the first. The bytes do not depend on the machine's
mood; jobs/s and CPU do, and on a noisy day the difference can sink into the noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's engine, not an installed one

import contract  # noqa: E402
from fresh import emit, run_fresh  # noqa: E402
from queues import engine_source, machine  # noqa: E402

from engine.backends.sqlite import db  # noqa: E402


def written() -> int:
    """Bytes this process has handed to write() so far (Linux; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def one(size: int, body: str, n: int, concurrency: int) -> None:
    """The child: one measurement on a new file with `size`-byte pages."""
    db.PAGE_SIZE = size
    with tempfile.TemporaryDirectory() as folder:
        cpu, wrote = time.process_time(), written()
        seconds = anyio.run(
            contract.run_contract, "sqlite", body, "submit-all", n, concurrency, Path(folder)
        )
        cpu, wrote = time.process_time() - cpu, written() - wrote
        [found] = Path(folder).glob("*.db")
        with found.open("rb") as file:  # the header's page size: bytes 16-17, big-endian
            created = int.from_bytes(file.read(18)[16:18], "big")
    if created != size:
        raise SystemExit(f"the file has {created}-byte pages, not {size}")
    emit({"jobs_s": n / seconds, "cpu_us": cpu / n * 1e6, "kb": wrote / n / 1024})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--body", default="echo", choices=("echo", "three", "sleep10"))
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        one(args.one, args.body, args.n, args.concurrency)
        return
    sizes = [int(size) for size in args.sizes.split(",")]
    rates: dict[int, list[float]] = {size: [] for size in sizes}
    cpus: dict[int, list[float]] = {size: [] for size in sizes}
    kbs: dict[int, list[float]] = {size: [] for size in sizes}
    for round_ in range(args.rounds):
        for size in sizes:
            child = ["--one", str(size), "--body", args.body, "-n", str(args.n)]
            result = run_fresh(__file__, [*child, "--concurrency", str(args.concurrency)])
            rates[size].append(result["jobs_s"])
            cpus[size].append(result["cpu_us"])
            kbs[size].append(result["kb"])
            print(
                f"  round {round_ + 1}  {size:>5} B pages  {result['jobs_s']:>7,.0f} jobs/s"
                f"  {result['cpu_us']:>5,.0f} µs CPU a job  {result['kb']:>5,.1f} KB written a job",
                flush=True,
            )
    print()
    print("blok on SQLite, contract path (submit-all), by the page size the file was created with")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(
        f"workflow {args.body}, N = {args.n}, concurrency = {args.concurrency}, "
        f"median of {args.rounds} round(s), sizes interleaved"
    )
    base = sizes[0]
    print(
        f"| page size | jobs/s | range | CPU µs a job | KB written a job | jobs/s ratio to {base} |"
    )
    print("|----------:|-------:|-------|-------------:|-----------------:|------:|")
    for size in sizes:
        rate = statistics.median(rates[size])
        ratio = rate / statistics.median(rates[base])
        print(
            f"| {size:>9} | {rate:>6,.0f} | {min(rates[size]):,.0f}-{max(rates[size]):,.0f} "
            f"| {statistics.median(cpus[size]):>12,.0f} | {statistics.median(kbs[size]):>16,.1f} "
            f"| {ratio:.2f}x |"
        )


if __name__ == "__main__":
    main()
