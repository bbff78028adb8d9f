"""`liveness.LiveWorkers.may_hold`: whether another live process may hold the job of a memory
queue's pending run, from the worker the run names (the behaviour, with real engines, is in
test_engine_core's memory-queue tests)."""

from __future__ import annotations

from backends.builders import QUEUE, a_run

from engine.liveness import LiveWorkers
from engine.models import RunStatus

OTHERS = LiveWorkers(ids=frozenset({"w-live"}), serving=frozenset({QUEUE}))


def test_a_run_naming_a_worker_is_held_while_that_worker_lives() -> None:
    assert OTHERS.may_hold(a_run(status=RunStatus.WAITING, worker="w-live"))
    assert not OTHERS.may_hold(a_run(status=RunStatus.QUEUED, worker="w-gone"))


def test_a_run_naming_none_may_be_held_by_any_live_worker_serving_its_queue() -> None:
    """A run written by an older blok-tui, which named no worker on a run it queued."""
    assert OTHERS.may_hold(a_run(status=RunStatus.QUEUED))
    assert not OTHERS.may_hold(a_run(status=RunStatus.QUEUED, queue="elsewhere"))
