"""Upload an export to a slow storage bucket; the upload step has a time limit, and big
exports run past it (a step that times out)."""

from __future__ import annotations

import anyio

from engine import Step, WorkerTrigger, Workflow


async def prepare(ctx, size_mb: int) -> dict:
    await anyio.sleep(0.2)
    return {"size_mb": size_mb, "parts": max(1, size_mb // 10)}


async def upload(ctx, size_mb: int) -> dict:
    ctx.logger.info("uploading %d MB at 20 MB/s", size_mb)
    await anyio.sleep(size_mb / 20)
    return {"url": f"s3://exports/{ctx.run_id}.csv"}


workflow = Workflow(
    name="exports.upload",
    description="Prepare an export and upload it within 2 s",
    trigger=WorkerTrigger(queue="exports", concurrency=2),
    steps=[
        Step("prepare", prepare, inputs={"size_mb": "$.body.size_mb"}),
        Step("upload", upload, inputs={"size_mb": "$.body.size_mb"}, max_duration="2s"),
    ],
)
