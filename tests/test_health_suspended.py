"""`blok-tui health` and `blok-tui workers` on a worker suspended by SIGSTOP: its pid is alive
but it serves nothing, so once its heartbeat is stale (`STALE_HEARTBEAT_S`) health does not
count it and names it; recovery still leaves its job alone (its process runs, its lease has not
run out), as before. Real `blok-tui worker` processes on a real SQLite file, real signals."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from cli_helpers import Worker, blok, blok_json, eventually, run_of, start_worker, write_workflows

from engine.liveness import STALE_HEARTBEAT_S

# Past the staleness window, with room for a loaded machine.
STALE_WAIT_S = STALE_HEARTBEAT_S + 20


def _health(db: Path) -> subprocess.CompletedProcess[str]:
    return blok("health", "--db", db, "--max-age", "1h")


def _state(db: Path, worker: Worker) -> dict[str, Any]:
    [row] = [w for w in blok_json("workers", "--json", "--db", db) if w["id"] == worker.id]
    return row


def _stop(worker: Worker) -> None:
    """Resumed first: a stopped process does not act on SIGTERM until it runs again."""
    if worker.process.poll() is None:
        os.kill(worker.process.pid, signal.SIGCONT)
    worker.stop()


def test_a_suspended_worker_is_not_counted_alive_by_health(tmp_path: Path) -> None:
    db = tmp_path / "blok.db"
    folder = write_workflows(tmp_path / "workflows")
    release = tmp_path / "release"
    # A lease far longer than the test: only recovery's own rule could take its job over.
    frozen = start_worker(db, folder, "--no-watch", "--lease", "10m", name="frozen")
    workers = [frozen]
    try:
        body = json.dumps({"seconds": 120, "until": str(release)})
        enqueued = blok("enqueue", "single", body, "--db", db)
        assert enqueued.returncode == 0, enqueued.stderr
        job_id = enqueued.stdout.strip()
        eventually(lambda: (run_of(db, job_id) or {}).get("status") == "running", timeout=15)
        assert _health(db).returncode == 0

        frozen.process.send_signal(signal.SIGSTOP)

        def unhealthy() -> subprocess.CompletedProcess[str] | None:
            done = _health(db)
            return done if done.returncode == 1 else None

        done = eventually(unhealthy, timeout=STALE_WAIT_S, every=0.5)
        pid = frozen.process.pid
        said = f"blok-tui: error: unhealthy: no worker alive on {db}; worker {frozen.id} is "
        stopped = f"suspended (process {pid} is stopped, as by SIGSTOP or Ctrl-Z; no heartbeat"
        assert done.stderr.startswith(f"{said}{stopped} for "), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        # `alive` stays recovery's judgement (its process runs); the state says it serves not.
        row = _state(db, frozen)
        assert (row["alive"], row["state"]) == (True, "suspended")
        assert f" {pid}  suspended  " in blok("workers", "--db", db).stdout

        # A second worker comes: healthy again, the suspended one still named; its recovery
        # (at its start, and in its loop) leaves the held job alone, as before.
        other = start_worker(db, folder, "--no-watch", name="other")
        workers.append(other)
        ok = _health(db)
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.startswith(f"healthy: database {db} ok, 1 worker alive, "), ok.stdout
        assert f"; worker {frozen.id} is suspended (process {pid} " in ok.stdout
        run = run_of(db, job_id)
        assert run is not None and (run["status"], run["worker"]) == ("running", frozen.id)

        os.kill(pid, signal.SIGCONT)

        def both_alive() -> subprocess.CompletedProcess[str] | None:
            done = _health(db)
            return done if "2 workers alive" in done.stdout else None

        resumed = eventually(both_alive, timeout=STALE_WAIT_S, every=0.5)
        assert f"worker {frozen.id}" not in resumed.stdout, resumed.stdout
        assert _state(db, frozen)["state"] == "alive"
        release.touch()
        eventually(lambda: (run_of(db, job_id) or {}).get("status") == "completed", timeout=15)
        assert run_of(db, job_id)["worker"] == frozen.id  # type: ignore[index]
    finally:
        release.touch()
        for worker in workers:
            # Killed by Worker.stop if it would not stop: the next one is stopped all the same.
            with contextlib.suppress(subprocess.TimeoutExpired):
                _stop(worker)


def test_a_draining_worker_is_said_stopping_and_not_counted_serving(tmp_path: Path) -> None:
    # SIGTERMed, a worker drains for up to its grace: it claims nothing more, but `health`
    # said all was well and the workers view "alive" until it was gone (a deploy that hung
    # in its drain looked like a healthy worker).
    db = tmp_path / "blok.db"
    release = tmp_path / "release"
    worker = start_worker(db, write_workflows(tmp_path / "workflows"), "--grace", "60")
    try:
        body = json.dumps({"seconds": 120, "until": str(release)})
        job_id = blok("enqueue", "single", body, "--db", db).stdout.strip()
        eventually(lambda: (run_of(db, job_id) or {}).get("status") == "running", timeout=15)
        assert _health(db).returncode == 0
        worker.process.send_signal(signal.SIGTERM)

        def unhealthy() -> subprocess.CompletedProcess[str] | None:
            done = _health(db)
            return done if done.returncode == 1 else None

        done = eventually(unhealthy, timeout=15, every=0.2)
        said = f"blok-tui: error: unhealthy: no worker alive on {db}; worker {worker.id} is "
        assert done.stderr.startswith(f"{said}stopping (for "), done.stderr
        assert done.stderr.rstrip().endswith("s: it claims nothing more and ends its runs)")
        row = _state(db, worker)
        assert (row["alive"], row["state"]) == (True, "stopping") and row["stopping_since"]
        # Its queue has no worker to serve it now, for `queues` as for the console (which
        # reads `Engine.queues`, as `--json` prints it): the console said served, `queues` not.
        [queue] = [q for q in blok_json("queues", "--json", "--db", db) if q["name"] == "single"]
        assert (queue["served"], queue["concurrency"]) == (False, 1)
        assert " no worker " in next(
            line for line in blok("queues", "--db", db).stdout.splitlines() if "single" in line
        )
        release.touch()  # its run ends within the grace, and the worker with it
        assert worker.process.wait(timeout=30) == 0
        assert (run_of(db, job_id) or {}).get("status") == "completed"
    finally:
        release.touch()
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.stop()
