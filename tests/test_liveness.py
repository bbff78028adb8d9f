"""`liveness.orphaned`: whether nobody runs a run recorded running any more, from the run, its
job as read now (None when no queue here has it: a memory queue's, in another process) and the
workers as read now. Records built by hand, on workers of another machine (judged by their
heartbeat)."""

from __future__ import annotations

from datetime import timedelta

from backends.builders import a_run, job_and_run, worker

from engine.liveness import LOST_WITH_IT, NONE_ALIVE, TAKEN_OVER, Orphan, orphaned
from engine.models import JobState, RunStatus, WorkerInfo, utcnow

NOW = utcnow()


def _silent_for(seconds: float) -> WorkerInfo:
    """A worker of another machine whose last heartbeat was `seconds` ago."""
    return worker().model_copy(update={"heartbeat_at": NOW - timedelta(seconds=seconds)})


DEAD = _silent_for(300)
ALIVE = _silent_for(1)
GONE = f"its worker {DEAD.id} is gone (no heartbeat since {DEAD.heartbeat_at.isoformat(timespec='seconds')})"


def test_a_memory_queues_run_whose_worker_is_dead_is_lost_with_it() -> None:
    run = a_run(status=RunStatus.RUNNING, worker=DEAD.id)
    assert orphaned(run, None, [ALIVE, DEAD], NOW) == Orphan(GONE, LOST_WITH_IT, DEAD.heartbeat_at)
    # With no worker alive, nothing records it until one starts: said so.
    assert str(orphaned(run, None, [DEAD], NOW)) == f"{GONE}; {LOST_WITH_IT}{NONE_ALIVE}"


def test_a_memory_queues_run_is_not_orphaned_while_its_worker_may_live() -> None:
    assert orphaned(a_run(status=RunStatus.RUNNING, worker=ALIVE.id), None, [ALIVE], NOW) is None
    # One not registered (yet, or any more) is not known dead.
    assert orphaned(a_run(status=RunStatus.RUNNING, worker="w-unknown"), None, [DEAD], NOW) is None
    assert orphaned(a_run(status=RunStatus.RUNNING), None, [DEAD], NOW) is None  # no worker


def test_a_run_that_is_not_running_is_never_orphaned() -> None:
    for status in (RunStatus.QUEUED, RunStatus.WAITING, RunStatus.COMPLETED, RunStatus.CRASHED):
        assert orphaned(a_run(status=status, worker=DEAD.id), None, [DEAD], NOW) is None


def test_a_held_job_of_a_dead_worker_is_taken_over() -> None:
    job, run = job_and_run()
    job = job.model_copy(
        update={
            "state": JobState.ACTIVE,
            "worker": DEAD.id,
            "lease_until": NOW + timedelta(seconds=30),
        }
    )
    run = run.model_copy(update={"status": RunStatus.RUNNING, "worker": DEAD.id})
    assert orphaned(run, job, [ALIVE, DEAD], NOW) == Orphan(GONE, TAKEN_OVER, DEAD.heartbeat_at)
    assert orphaned(run, job, [DEAD], NOW) == Orphan(
        GONE, TAKEN_OVER + NONE_ALIVE, DEAD.heartbeat_at
    )
    # Its worker alive, its lease run out: frozen, or gone.
    lapsed = job.model_copy(update={"worker": ALIVE.id, "lease_until": NOW - timedelta(seconds=5)})
    found = orphaned(run, lapsed, [ALIVE], NOW)
    assert found is not None and found.then == TAKEN_OVER
    # It held the job until its lease ran out, though it heartbeats on.
    assert found.since == lapsed.lease_until
    assert found.why.startswith(f"its worker {ALIVE.id} let the lease on its job run out at ")
    # The job went on to another run, or is no longer held: this run is not the one to say so.
    assert orphaned(run, job.model_copy(update={"run_id": "run_next"}), [DEAD], NOW) is None
    assert orphaned(run, job.model_copy(update={"state": JobState.WAITING}), [DEAD], NOW) is None
