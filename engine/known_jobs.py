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

SHOWN = 5  # differing fields a warning names


async def known_job(backend: Backend, job: Job, queue: str) -> None:
    """`job` was not added: its id is known. Read after the add (atomic in each store), so no
    racing enqueue slips by."""
    found = await backend.find_job(job.id)
    if found is None:
        return
    known = found[1]
    if known.queue != queue:
        raise EngineError(f"job id {job.id!r} is already a job of queue {known.queue!r}")
    if _canonical(job.payload) != _canonical(known.payload):
        # Where they differ, not the values: a payload may hold what a log must not.
        log.warning(
            "job id %r is already a job of queue %r (%s) whose payload differs%s: that job "
            "stays as it is, and this payload is not enqueued (a new job needs a new id)",
            job.id,
            queue,
            known.state,
            _where(job.payload, known.payload),
        )


def _where(given: Any, known: Any) -> str:
    """ " at $.body.n, $.body.items" where both are objects, else ""."""
    if not isinstance(given, dict) or not isinstance(known, dict):
        return ""
    fields = [
        str(key)
        for key in sorted({*given, *known}, key=str)
        if key not in given or key not in known or _canonical(given[key]) != _canonical(known[key])
    ]
    more = ", …" if len(fields) > SHOWN else ""
    return " at " + ", ".join(f"$.body.{name}" for name in fields[:SHOWN]) + more


def _canonical(payload: Any) -> str:
    """The payload as JSON with its keys sorted: a tuple given and the list stored alike."""
    return json.dumps(payload, sort_keys=True, default=str)
