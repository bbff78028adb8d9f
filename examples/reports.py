"""A monthly report that takes a long time to render: the run worth cancelling."""

from __future__ import annotations

import anyio

from engine import Step, WorkerTrigger, Workflow


async def gather(ctx, month: str) -> dict:
    await anyio.sleep(0.3)
    return {"month": month, "rows": 48_000}


async def render(ctx, rows: int, seconds: int) -> dict:
    # Renders in chunks and logs progress, so the console has something to show live.
    chunks = 10
    for chunk in range(1, chunks + 1):
        await anyio.sleep(seconds / chunks)
        ctx.logger.info("rendered %d%% (%d rows)", chunk * 10, rows * chunk // chunks)
    return {"pages": rows // 600}


workflow = Workflow(
    name="reports.monthly",
    description="Gather and render a long report",
    trigger=WorkerTrigger(queue="reports", concurrency=2),
    steps=[
        Step("gather", gather, inputs={"month": "$.body.month"}),
        Step(
            "render",
            render,
            inputs={
                "rows": "$.state.gather.rows",
                "seconds": lambda ctx: ctx.body.get("seconds", 45),
            },
        ),
    ],
)
