"""A memory queue's run on a database: its runs are in the database, its job only in the memory
of the worker process serving it. From another process, `cancel` and `where` cannot reach that
job, and say so; once that process is killed, the job is gone with it and the run says
`running` until a live worker records it crashed: `runs`, `show` and `where` say nobody runs
it, and `cancel` records it cancelled at once, and its runs not started too. A real worker
process, killed with kill -9."""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import blok, eventually, serve, start_worker

# The schedule feeds the queue from inside the worker's process: a memory queue takes jobs
# only from the process serving it.
MEMORY_NAPS = """
import anyio
from engine import Schedule, Step, Workflow, WorkerTrigger


async def nap(ctx):
    await anyio.sleep(3600)


workflow = Workflow(
    name="naps",
    trigger=WorkerTrigger(queue="naps", provider="memory", concurrency=1),
    schedules=[Schedule(every="1s", catch_up="none")],
    steps=[Step("nap", nap)],
)
"""

LOST = (
    "a live worker records it crashed: its job was on a memory queue, in that worker's memory, "
    "and is lost with it"
)
NONE_ALIVE = " (no worker is alive now: start one)"


def _first(database: Path, status: str) -> str | None:
    listed = json.loads(blok("runs", "--db", database, "--json").stdout or "[]")
    return next((run["id"] for run in listed if run["status"] == status), None)


def _duration(row: str) -> str:
    """The DURATION of a `runs` row whose ERROR column says it is orphaned."""
    return row.partition(" orphaned: ")[0].split()[-1]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_memory_queues_run_is_out_of_reach_until_its_worker_dies_then_orphaned(
    tmp_path: Path,
) -> None:
    database, worker = serve(tmp_path, {"naps.py": MEMORY_NAPS})
    try:
        run_id = eventually(lambda: _first(database, "running"))
        queued = eventually(lambda: _first(database, "queued"))  # the schedule's next, behind
        # Alive in another process: only that process can act on the job.
        elsewhere = (
            f"run {run_id} is on memory queue 'naps': its job is in the memory of the process "
            f"serving it (worker {worker.id}), so only that process can act on it\n"
        )
        for command in ("cancel", "where"):
            refused = blok(command, run_id, "--db", database)
            assert refused.returncode == 1, refused
            assert refused.stderr == f"blok-tui: error: {elsewhere}", refused.stderr
        refused = blok("cancel", queued, "--db", database)
        assert refused.returncode == 1 and "so only that process can act on it" in refused.stderr
        shown = blok("show", run_id, "--db", database).stdout
        assert "(a memory queue's: in the memory of the process serving it)" in shown, shown
        assert "nobody runs it" not in shown, shown
    finally:
        worker.process.kill()
        worker.process.wait()
    why = f"its worker {worker.id} is gone (its process {worker.process.pid} no longer runs)"
    # Its job died with it; nothing moves the run on until a live worker records it crashed.
    listed = blok("runs", "--db", database, "--status", "running").stdout.splitlines()
    [row] = [line for line in listed if run_id in line]
    assert row.endswith(f"orphaned: {why}; {LOST}{NONE_ALIVE}"), listed
    records = json.loads(blok("runs", "--db", database, "--status", "running", "--json").stdout)
    assert [(r.get("orphaned"), r.get("orphaned_then")) for r in records] == [
        (why, f"{LOST}{NONE_ALIVE}")
    ]
    shown = _flat(blok("show", run_id, "--db", database).stdout)
    assert f"; nobody runs it now: {why}; {LOST}{NONE_ALIVE}" in shown, shown
    # Its time stopped when its worker was last seen: the same in every listing, however late,
    # and in `show`.
    took = _duration(row)
    again = blok("runs", "--db", database, "--status", "running").stdout.splitlines()
    assert [_duration(line) for line in again if run_id in line] == [took], (row, again)
    assert f"running ran {took}; nobody runs it now" in shown, shown
    gone = blok("where", run_id, "--db", database, "--timeout", "30s")
    assert gone.returncode == 1 and gone.stdout == "", gone
    assert gone.stderr == (
        f"blok-tui: error: run {run_id}: none of its code runs now: {why}; {LOST}{NONE_ALIVE}\n"
    ), gone.stderr
    # Nobody else would end it: a cancel records it so at once. A run not started waits in its
    # record for the next worker serving the queue (which would queue it again): cancelled too.
    for cancelled_id in (run_id, queued):
        cancelled = blok("cancel", cancelled_id, "--db", database)
        assert cancelled.returncode == 0, cancelled
    listed = json.loads(blok("runs", "--db", database, "--status", "cancelled", "--json").stdout)
    assert {record["id"]: record["error"] for record in listed} == {
        run_id: "cancelled by operator (its worker was gone)",
        queued: "cancelled by operator before it ran",
    }


def test_a_worker_takes_back_a_dead_ones_queued_runs_every_janitor_interval(
    tmp_path: Path,
) -> None:
    """Two workers serve one memory queue; the first is killed holding a queued run (the
    schedule's next, behind its running one). The other, started with `--janitor-interval 1s`
    while the first lived (so it left that run to it), takes the run back within about that
    long, not the default 60 s: the run names it then, and it runs it."""
    database, first = serve(tmp_path, {"naps.py": MEMORY_NAPS})
    second = None
    try:
        queued = eventually(lambda: _first(database, "queued"))
        second = start_worker(
            database, tmp_path / "workflows", "--janitor-interval", "1s", name="second"
        )
        first.process.kill()
        first.process.wait()

        def taken_back() -> bool:
            listed = json.loads(blok("runs", "--db", database, "--json").stdout or "[]")
            return any(run["id"] == queued and run["worker"] == second.id for run in listed)

        eventually(taken_back, timeout=20)
    finally:
        for worker in (first, second):
            if worker is not None:
                worker.process.kill()
                worker.process.wait()
