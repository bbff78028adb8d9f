"""Workflows the console tests drive: one that runs until cancelled, one that fails its first
attempt then succeeds, one that always fails, and one that returns at once."""

from __future__ import annotations

import anyio

from engine import Retry, Step, WorkerTrigger, Workflow, for_each, subworkflow, wait


async def sleep_long(ctx) -> dict:
    ctx.logger.info("started sleeping for %s", ctx.body.get("order_id"))
    await anyio.sleep(60)
    return {"slept": 60}


def fail_first(ctx) -> dict:
    if ctx.attempt == 1:
        raise ConnectionError("upstream reset the connection (first attempt always fails)")
    return {"attempt": ctx.attempt}


def always_fail(ctx) -> None:
    raise ValueError(f"bad order {ctx.body.get('order_id')!r}")


def echo(ctx) -> dict:
    return {"echo": ctx.body}


SLOW = Workflow(
    name="slow.sleep",
    trigger=WorkerTrigger(queue="slow", concurrency=2),
    steps=[Step("sleep", sleep_long)],
)
FLAKY = Workflow(
    name="flaky.retry",
    trigger=WorkerTrigger(queue="flaky", concurrency=2),
    steps=[
        Step("call", fail_first, retry=Retry(max_attempts=3, min_timeout="20ms")),
        Step("after", echo),
    ],
)
BROKEN = Workflow(
    name="broken.always",
    trigger=WorkerTrigger(queue="broken", concurrency=2),
    steps=[Step("check", always_fail)],
)
QUICK = Workflow(
    name="quick.echo",
    trigger=WorkerTrigger(queue="quick", concurrency=4),
    steps=[Step("echo", echo)],
)
ALL = [SLOW, FLAKY, BROKEN, QUICK]


DOOMED = Workflow(
    name="doomed.retry",
    trigger=WorkerTrigger(queue="doomed", retries=1, delay=10),
    steps=[Step("check", always_fail)],
)
ALL.append(DOOMED)


def prepare(ctx) -> dict:
    return {"prepared": ctx.body.get("order_id")}


def charge_unless_fixed(ctx) -> dict:
    if not ctx.body.get("fixed"):
        raise ValueError(f"card declined for {ctx.body.get('order_id')!r}")
    return {"charged": True}


FIXABLE = Workflow(
    name="fixable.charge",
    trigger=WorkerTrigger(queue="fixable", concurrency=2),
    steps=[Step("prepare", prepare), Step("charge", charge_unless_fixed)],
)
# A step in a long backoff after its first failure: "retrying now" until the operator cuts it.
PATIENT = Workflow(
    name="patient.retry",
    trigger=WorkerTrigger(queue="patient", concurrency=2),
    steps=[Step("call", fail_first, retry=Retry(max_attempts=3, min_timeout="60s"))],
)
CHILD = Workflow(
    name="child.echo",
    trigger=WorkerTrigger(queue="child", concurrency=2),
    steps=[Step("echo", echo)],
)
PARENT = Workflow(
    name="parent.batch",
    trigger=WorkerTrigger(queue="parent", concurrency=2),
    steps=[
        Step("before", echo),
        for_each(
            "items",
            "$.body.items",
            steps=[subworkflow("ship", workflow="child.echo", wait=True)],
        ),
    ],
)
ALL += [FIXABLE, PATIENT, CHILD, PARENT]


async def sleep_for(ctx) -> dict:
    await anyio.sleep(ctx.body["seconds"])
    return {"slept": ctx.body["seconds"]}


# Usually quick, sometimes hung: the hung one is "stuck" against the median of the quick ones.
MOODY = Workflow(
    name="moody.sleep",
    trigger=WorkerTrigger(queue="moody", concurrency=4),
    steps=[Step("sleep", sleep_for)],
)
ALL.append(MOODY)


def big_output(ctx) -> list[dict]:
    return [{"item": n, "sku": f"SKU-{n:04d}"} for n in range(2000)]


def hostile(ctx) -> None:
    # A run-provided error that would set the terminal's title and clear its screen.
    raise ValueError("bad input \x1b]0;pwned\x07\x1b[2J done")


async def then_wait(ctx) -> dict:
    return {"ready": True}


BIG = Workflow(
    name="big.output",
    trigger=WorkerTrigger(queue="big", concurrency=2),
    steps=[Step("list", big_output)],
)
HOSTILE = Workflow(
    name="hostile.error",
    trigger=WorkerTrigger(queue="hostile", concurrency=2),
    steps=[Step("explode", hostile)],
)
WAITER = Workflow(
    name="waiter.pause",
    trigger=WorkerTrigger(queue="waiter", concurrency=2),
    steps=[Step("ready", then_wait), wait.for_("10m"), Step("after", echo)],
)
ALL += [BIG, HOSTILE, WAITER]


async def chatty(ctx) -> dict:
    for n in range(80):
        ctx.logger.info("progress line %d", n)
        await anyio.sleep(0.01)
    await anyio.sleep(60)
    return {}


CHATTY = Workflow(
    name="chatty.log",
    trigger=WorkerTrigger(queue="chatty", concurrency=2),
    steps=[Step("talk", chatty)],
)
ALL.append(CHATTY)


def fail_first_delivery(ctx) -> dict:
    if ctx.job.attempt == 1:
        raise ConnectionError(f"POST {ctx.body.get('url')}: connection reset")
    return {"status": 200}


# A job whose first delivery fails and whose second goes through: a failed run, then a
# completed one, of one job.
RECOVERS = Workflow(
    name="recovers.hook",
    trigger=WorkerTrigger(queue="recovers", concurrency=2, retries=2, delay=10),
    steps=[Step("deliver", fail_first_delivery)],
)
ALL.append(RECOVERS)
