"""Deliver a webhook. An endpoint that is gone fails every time, so after its job retries the
job lands in the dead-letter queue; one that is waking up (`warming`) refuses the job's first
delivery and takes the next: a failed run whose job then completed."""

from __future__ import annotations

import anyio

from engine import Retry, Step, WorkerTrigger, Workflow


class EndpointGone(RuntimeError):
    pass


class EndpointUnavailable(RuntimeError):
    pass


async def deliver(ctx, url: str) -> dict:
    await anyio.sleep(0.1)
    if "gone" in url:
        raise EndpointGone(f"POST {url}: 410 Gone")
    if "warming" in url and ctx.job.attempt == 1:
        raise EndpointUnavailable(f"POST {url}: 503 Service Unavailable")
    return {"status": 200}


workflow = Workflow(
    name="webhooks.deliver",
    description="POST an event to a subscriber, with job retries then dead letter",
    trigger=WorkerTrigger(queue="webhooks", concurrency=2, retries=2, delay="500ms"),
    steps=[
        Step(
            "deliver",
            deliver,
            inputs={"url": "$.body.url"},
            retry=Retry(max_attempts=2, min_timeout="200ms"),
        ),
    ],
)
