"""How much of the memory gap to MemoryHuey the engine's optional per-job parts explain: blok
with them and without them, against MemoryHuey, in one invocation.

    python benchmarks/ablation.py                  # N = 3000, median of 3
    python benchmarks/ablation.py -n 5000 --repeat 5

The shape is `floor.py`'s (submit-all: N jobs enqueued one call each, each awaited, one-step
`echo`, 8 worker tasks, the memory provider), each engine and level in a fresh process,
interleaved within each repetition:

- this checkout's engine, at `floor.py`'s `runner` level (blok's queue and runner with no
  engine around them) and at `blok` (the engine itself);
- the same commit with each of four per-job parts cut out, and with all four cut, each in a
  temporary git worktree (`CUTS` below): the run's cancel scope (the operator's cancel, a lost
  lease and the trigger's timeout), the log sink that stores `ctx.logger` lines, the
  OpenTelemetry hooks, and the payload check at enqueue (standard JSON, the size cap);
- MemoryHuey, as `peer.py` runs it.

None of the cut parts can go: each is in the contract or guards it. The engine without all four
bounds what trimming them could win, and each one alone says which is worth a look. If the
engine without all four is still below MemoryHuey, so is every trim of them, and the gap is in
what blok must do for a job at all (a run, a step and an attempt recorded, a fenced queue, the
runner), which the `runner` row shows with no engine around it.

The worktrees are of HEAD: commit before measuring a change. A cut whose text is no longer in
the engine stops the script and says which.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from fresh import run_fresh  # noqa: E402
from queues import engine_source, machine  # noqa: E402
from versus import worktree  # noqa: E402

# Each part by name: (file, text in it, what replaces the text). A cut keeps the engine running
# the contract path's job, without the part.
Cut = tuple[str, str, str]
CUTS: dict[str, list[Cut]] = {
    "the cancel scope": [
        (
            "engine/worker.py",
            """            with anyio.CancelScope(deadline=deadline) as scope:
                if handle.open_scope(scope):
                    outcome = await self.runner.run(
                        workflow, run, ctx, FencedRecorder(queue, claim.fence)
                    )""",
            """            outcome = await self.runner.run(
                workflow, run, ctx, FencedRecorder(queue, claim.fence)
            )
            scope = anyio.CancelScope()  # never entered: never cancelled""",
        )
    ],
    "the log sink": [
        ("engine/worker.py", "            ctx._sink = self.runner.log_sink(run, ctx)\n", "")
    ],
    "the telemetry hooks": [
        (
            "engine/worker.py",
            "            telemetry.OBSERVE.run_started(run, job, workflow.version)\n",
            "",
        ),
        ("engine/worker.py", "                telemetry.OBSERVE.run_ended(handle.run)\n", ""),
        ("engine/operator.py", "        telemetry.OBSERVE.enqueuing(job)\n", ""),
    ],
    "the payload check": [
        ("engine/operator.py", "        self.check_payload(payload, what)\n", "")
    ],
}
ALL = "all four"


def cut(path: Path, cuts: list[Cut]) -> None:
    for name, text, replacement in cuts:
        file = path / name
        source = file.read_text()
        if source.count(text) != 1:
            raise SystemExit(f"{name}: the text to cut is not there once:\n{text}")
        file.write_text(source.replace(text, replacement))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    variants = {**{name: [name] for name in CUTS}, ALL: list(CUTS)}
    # (label, which floor.py, its level)
    rows = [("this checkout", "here", "runner"), ("this checkout", "here", "blok")]
    rows += [(f"without {name}", name, "blok") for name in variants]
    rows += [("MemoryHuey", "here", "MemoryHuey")]
    with ExitStack() as stack:
        floors = {"here": HERE / "floor.py"}
        for name, parts in variants.items():
            copy = stack.enter_context(worktree("HEAD"))
            cut(copy, [c for part in parts for c in CUTS[part]])
            floors[name] = copy / "benchmarks" / "floor.py"
        seen: list[list[float]] = [[] for _ in rows]
        for _ in range(args.repeat):
            for row, (_, which, level) in enumerate(rows):
                result = run_fresh(floors[which], ["--one", level, "-n", str(args.n)])
                seen[row].append(result["jobs_s"])
    print("the engine's optional per-job parts: blok with and without them, memory provider")
    print(f"machine: {machine()}")
    print(f"engine: {engine_source()}")
    print(f"date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"N = {args.n}, submit-all, concurrency 8, median of {args.repeat}, fresh processes\n")
    huey = statistics.median(seen[-1])
    blok = 1e6 / statistics.median(seen[1])
    print(
        "| engine | level | jobs/s | µs a job | saved, µs a job | vs MemoryHuey | range (jobs/s) |"
    )
    print("|---|---|--:|--:|--:|--:|---|")
    for row, (label, which, level) in enumerate(rows):
        rate = statistics.median(seen[row])
        micros = 1e6 / rate
        saved = f"{blok - micros:.0f}" if which in variants else ""
        spread = f"{min(seen[row]):,.0f}-{max(seen[row]):,.0f}"
        print(
            f"| {label} | {level} | {rate:,.0f} | {micros:.0f} | {saved} | {rate / huey:.2f}x "
            f"| {spread} |"
        )


if __name__ == "__main__":
    main()
