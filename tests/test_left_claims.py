"""A claim the worker leaves unstarted because its lease may have run out (the process stalled,
or the database was out of reach while the claim came back) goes back to the queue. It stayed
the worker's in the database, and the lease loop renewed it for ever while nothing ran it: in
a walkthrough, 12 to 32 of 40 jobs were held that way after a cut between worker and server."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support import durable_database

from engine import Engine, JobState, RunStatus, Step, WorkerTrigger, Workflow
from engine.backends.base import Claim

pytestmark = pytest.mark.anyio
database = durable_database


def echo(ctx: Any) -> Any:
    return ctx.body


LEFT = {
    # Before the start: given back to the queue at once, and claimed again.
    1: "job {job}: the lease ran out before it started; left to others",
    # After the run: its outcome is not recorded; its lease runs out (no longer renewed), and
    # the next claim records the run crashed and runs the job again.
    2: "lost the lease on job {job} ",
}


@pytest.mark.parametrize("look", LEFT)
async def test_a_claim_left_for_a_lost_lease_is_claimed_again_and_runs(
    database: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    look: int,
) -> None:
    caplog.set_level(logging.WARNING, logger="blok.worker")
    looks: dict[str, int] = {}
    real = Claim.lease_lost

    def stalled_once(self: Claim, now: float | None = None) -> bool:
        # The `look`th look at the job's claim finds the lease gone, as after a stall longer
        # than the lease (before the start, or while it was written); the database's lease
        # is still the worker's, and renewed.
        if self.job.queue == "echo":
            looks[self.job.id] = looks.get(self.job.id, 0) + 1
            if looks[self.job.id] == look:
                return True
        return real(self, now)

    monkeypatch.setattr(Claim, "lease_lost", stalled_once)
    flow = Workflow(name="echo", trigger=WorkerTrigger(queue="echo"), steps=[Step("echo", echo)])
    async with Engine(workflows=[flow], database=database, lease="1s") as engine:
        job_id = await engine.enqueue("echo", {"n": 1})
        run = await engine.wait_for_job(job_id, timeout=10)
        assert run.status is RunStatus.COMPLETED and run.output == {"n": 1}
        job = await engine.get_job(job_id)
        assert job.state is JobState.COMPLETED
        # Left before it started, the claim was no delivery; after the run, the next claim
        # ran the job again: a second delivery.
        assert job.deliveries == look
    said = LEFT[look].format(job=job_id)
    assert [r for r in caplog.records if said in r.getMessage()], caplog.text
