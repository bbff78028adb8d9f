"""A job id enqueued again: the dedupe `enqueue(job_id=...)` promises, and what it says.

An id its queue knows already is not added twice, and that job stays as it is (an enqueue
retried after a timeout adds nothing). An id another queue has is an error. The same id with
another payload is most likely a caller's mistake (an order's id reused for another order, a
retry whose input changed): the payload given goes nowhere, so that is said, as Stripe refuses
an idempotency key reused with other parameters."""

from __future__ import annotations

import json
import logging
from typing import Any

from .backends.base import Backend
from .errors import EngineError
from .models import Job

log = logging.getLogger("blok.operator")

SHOWN = 200  # characters of the payload dropped that its warning shows


async def known_job(backend: Backend, job: Job, queue: str) -> None:
    """`job` was not added: its id is known. Read after the add (atomic in each store), so no
    racing enqueue slips by."""
    found = await backend.find_job(job.id)
    if found is None:
        return
    known = found[1]
    if known.queue != queue:
        raise EngineError(f"job id {job.id!r} is already a job of queue {known.queue!r}")
    given = _canonical(job.payload)
    if given != _canonical(known.payload):
        shown = given if len(given) <= SHOWN else given[:SHOWN] + "…"
        log.warning(
            "job id %r is already a job of queue %r, with another payload: that job stays as "
            "it is (%s), and this payload is not enqueued: %s (a new job needs a new id)",
            job.id,
            queue,
            known.state,
            shown,
        )


def _canonical(payload: Any) -> str:
    """The payload as JSON with its keys sorted: a tuple given and the list stored alike."""
    return json.dumps(payload, sort_keys=True, default=str)
