"""The order pipeline: validate, charge (a flaky gateway, retried), wait for the fraud check
window, pack, notify. Shows step retries with backoff and a run that waits."""

from __future__ import annotations

from _shop import call_gateway, pack

from engine import Retry, Step, WorkerTrigger, Workflow, wait


def validate(ctx, order_id: str, amount: int, items: int) -> dict:
    if amount <= 0:
        raise ValueError(f"order {order_id}: amount must be positive, got {amount}")
    ctx.logger.info("order %s: %d item(s), %d ¢", order_id, items, amount)
    return {"order_id": order_id, "amount": amount, "items": items}


async def charge(ctx, order_id: str, amount: int, flaky: int) -> dict:
    ctx.logger.info("charging %s, attempt %d", order_id, ctx.attempt)
    return await call_gateway(order_id, amount, ctx.attempt, flaky)


async def pack_order(ctx, items: int) -> dict:
    ctx.logger.info("packing %d item(s)", items)
    return await pack(items)


def notify(ctx, order_id: str, reference: str) -> dict:
    ctx.logger.info("mailed receipt %s for %s", reference, order_id)
    return {"sent": True}


workflow = Workflow(
    name="orders.pipeline",
    description="Validate, charge, wait out the fraud window, pack and notify",
    trigger=WorkerTrigger(queue="orders", concurrency=4, retries=1, delay="1s"),
    steps=[
        Step(
            "validate",
            validate,
            inputs={
                "order_id": "$.body.order_id",
                "amount": "$.body.amount",
                "items": lambda ctx: ctx.body.get("items", 1),
            },
        ),
        Step(
            "charge",
            charge,
            inputs={
                "order_id": "$.body.order_id",
                "amount": "$.body.amount",
                "flaky": lambda ctx: ctx.body.get("flaky", 0),
            },
            retry=Retry(max_attempts=4, min_timeout="400ms", max_timeout="5s", factor=2),
            idempotency_key="$.body.order_id",
        ),
        wait.for_("4s", name="fraud_window"),
        Step("pack", pack_order, inputs={"items": "$.state.validate.items"}),
        Step(
            "notify",
            notify,
            inputs={"order_id": "$.body.order_id", "reference": "$.state.charge.reference"},
        ),
    ],
)
