"""`Ahead`: the claims a database queue keeps beyond what its claims asked for (both database
queues use it; their contract tests cover it through the queue, these the rules themselves)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from engine.backends.ahead import Ahead
from engine.backends.base import Claim
from engine.models import Job, JobState

MADE = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
LEASE_S = 30.0


def claim(n: int, *, lost: bool = False, epoch: int = 1, **fields: Any) -> Claim:
    job = Job(
        id=f"job{n}",
        queue="q",
        workflow_name="echo",
        run_id=f"run{n}",
        created_at=MADE + timedelta(seconds=n),
        state=JobState.ACTIVE,
        epoch=epoch,
        **fields,
    )
    held_since = time.monotonic() - (2 * LEASE_S if lost else 0)
    return Claim(job=job, lease_s=LEASE_S, held_since=held_since)


def test_claims_are_served_oldest_first_skipping_lost_leases() -> None:
    ahead = Ahead()
    ahead.keep("q", [claim(1), claim(2, lost=True), claim(3), claim(4, lost=True), claim(5)])

    assert [c.job.id for c in ahead.take("q", 2)] == ["job1", "job3"]
    assert ahead.count("q") == 2
    one = ahead.take_one("q")
    assert one is not None and one.job.id == "job5"
    assert (ahead.take_one("q"), ahead.take("q", 5), ahead.count("q")) == (None, [], 0)
    assert ahead.take_one("other") is None


def test_a_lost_lease_is_not_the_oldest() -> None:
    ahead = Ahead()
    ahead.keep("q", [claim(1, lost=True), claim(3), claim(5)])

    assert ahead.count("q") == 3
    assert ahead.oldest_due("q", None) == (MADE + timedelta(seconds=3)).timestamp()
    older = (MADE - timedelta(seconds=1)).timestamp()
    assert ahead.oldest_due("q", older) == older  # the database's own is older
    assert ahead.oldest_due("other", None) is None


def test_a_job_delayed_past_its_creation_is_due_when_its_time_came() -> None:
    due = MADE + timedelta(minutes=5)
    ahead = Ahead()
    ahead.keep("q", [claim(1, run_at=due)])

    assert ahead.oldest_due("q", None) == due.timestamp()


def test_given_back_jobs_wait_again_as_they_were_before_the_claim() -> None:
    due = MADE + timedelta(minutes=5)
    ahead = Ahead()
    ahead.keep("q", [claim(1, epoch=7, resume=True, run_at=due), claim(2, force=True)])
    ahead.keep("p", [claim(3)])

    given = ahead.give_back("q")

    assert [(t.job_id, t.epoch) for t in given] == [("job1", 7), ("job2", 1)]
    first, second = (t.update for t in given)
    assert first is not None and second is not None
    assert (first.state, first.resume, first.run_at, first.force) == (
        JobState.WAITING,
        True,
        due,
        False,
    )
    assert (second.state, second.resume, second.force) == (JobState.WAITING, False, True)
    assert (ahead.count("q"), ahead.count("p"), ahead.give_back("q")) == (0, 1, [])


def test_a_renewal_keeps_only_the_leases_it_held_at_their_epoch() -> None:
    ahead = Ahead()
    kept, stale, gone = claim(1, lost=True), claim(2, lost=True, epoch=1), claim(3, lost=True)
    ahead.keep("q", [kept, stale])
    ahead.keep("p", [gone])
    asked = time.monotonic()

    ahead.renewed({"job1": 1, "job2": 2}, asked)  # job2 moved on (epoch 2); job3 not held

    assert kept.held_since == asked and not kept.lease_lost()
    assert stale.lease_lost() and gone.lease_lost()
    assert [c.job.id for c in ahead.take("q", 5) + ahead.take("p", 5)] == ["job1"]
