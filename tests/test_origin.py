"""A run's one-line error says where it came from: the innermost line of the user's own code,
past the engine's, the standard library's and installed packages' frames, after the error."""

from __future__ import annotations

import json
import threading
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import expect_events, marked_line, raised_at

from engine import (
    Engine,
    LogRecorded,
    Retry,
    Step,
    WorkerTrigger,
    Workflow,
    for_each,
    runner,
    wait,
)
from engine.origin import (
    Stopped,
    failed_for_good,
    is_engine_frame,
    stopped_in_thread,
    user_line,
    where_text,
)

pytestmark = pytest.mark.anyio

HERE = Path(__file__).resolve().relative_to(Path.cwd().resolve())

SHOP = """
import json
from engine import Step, Workflow, WorkerTrigger

def parse(ctx):
    return json.loads(ctx.body["text"])

workflow = Workflow(name="shop.parse", trigger=WorkerTrigger(queue="parse"), steps=[Step("parse", parse)])
"""


def sync_node(ctx: Any) -> None:
    json.loads("{bad")  # raised in the standard library, placed here


async def test_a_workflow_files_error_names_its_file_and_line(tmp_path: Path) -> None:
    """The file outside the working directory: its whole path; the line of the user's call,
    not the library's line that raised."""
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "shop.py").write_text(SHOP)
    async with Engine(workflows=tmp_path / "workflows", database=None) as engine:
        job_id = await engine.enqueue("parse", {"text": "{bad"})
        run = await engine.wait_for_job(job_id, timeout=10)
    assert run.error == (
        "[step 1/1] parse failed: JSONDecodeError: Expecting property name enclosed in double quotes: line 1 "
        f"column 2 (char 1) (at {tmp_path / 'workflows' / 'shop.py'}:6)"
    )


async def test_a_sync_nodes_error_is_placed_in_its_thread_and_a_retried_one_says_both() -> None:
    flows = [
        Workflow(name="once", trigger=WorkerTrigger(queue="once"), steps=[Step("s", sync_node)]),
        Workflow(
            name="twice",
            trigger=WorkerTrigger(queue="twice"),
            steps=[Step("s", sync_node, retry=Retry(max_attempts=2, min_timeout=1))],
        ),
    ]
    async with Engine(workflows=flows, database=None) as engine:
        once = await engine.wait_for_job(await engine.enqueue("once", {}), timeout=10)
        twice = await engine.wait_for_job(await engine.enqueue("twice", {}), timeout=10)
    assert once.error is not None and twice.error is not None
    assert once.error.endswith(f"(char 1) (at {raised_at(sync_node)})")
    assert twice.error.endswith(f"(char 1) (at {raised_at(sync_node)}, after 2 attempts)")


def test_an_error_with_no_frame_of_the_users_is_not_placed() -> None:
    assert user_line(ValueError("never raised")) is None
    try:
        json.loads("{bad")
    except ValueError as error:
        assert user_line(error) == raised_at(
            test_an_error_with_no_frame_of_the_users_is_not_placed, 3
        )
        # Its frame in this test dropped: only the standard library's are left.
        error.__traceback__ = error.__traceback__.tb_next if error.__traceback__ else None
        assert user_line(error) is None
    assert failed_for_good("[step 1/1] s", "boom", None, 1) == "[step 1/1] s failed: boom"
    assert failed_for_good("[step 1/1] s", "boom", None, 3) == (
        "[step 1/1] s failed: boom (after 3 attempts)"
    )


def test_the_engines_the_standard_librarys_and_no_files_frames_are_not_the_users() -> None:
    assert is_engine_frame(json.__file__)
    assert is_engine_frame(runner.__file__)
    assert is_engine_frame(str(Path(pytest.__file__)))
    assert is_engine_frame("<string>")
    assert not is_engine_frame(__file__)
    # A folder whose name starts like the engine's is not the engine's.
    assert not is_engine_frame(str(Path(runner.__file__).resolve().parent) + "_tools/x.py")


line_of = partial(marked_line, __file__)


def _refuse(ctx: Any) -> str:
    raise LookupError("no tenant")  # the callable input's own line


async def test_a_step_that_fails_on_its_definition_names_the_line_it_was_written_on() -> None:
    """An input expression with nothing at its path, a wait's deadline expression: the step's
    own `Step(...)` line; a callable input that raised: the callable's line."""
    flows = [
        Workflow(
            name="hooks",
            trigger=WorkerTrigger(queue="hooks"),
            steps=[Step("deliver", lambda ctx, url: url, inputs={"url": "$.body.url"})],  # hooks
        ),
        Workflow(
            name="tenants",
            trigger=WorkerTrigger(queue="tenants"),
            steps=[Step("bill", lambda ctx, tenant: tenant, inputs={"tenant": _refuse})],
        ),
        Workflow(
            name="later",
            trigger=WorkerTrigger(queue="later"),
            steps=[wait.until("$.body.when", name="nap")],  # later
        ),
        Workflow(
            name="orders",
            trigger=WorkerTrigger(queue="orders"),
            steps=[
                Step(
                    "charge",
                    lambda ctx, amount: amount,
                    inputs={"amount": lambda ctx: ctx.body["amount"]},  # a key the body lacks
                )
            ],
        ),
    ]
    async with Engine(workflows=flows, database=None) as engine:
        runs = {
            queue: await engine.wait_for_job(await engine.enqueue(queue, {}), timeout=10)
            for queue in ("hooks", "tenants", "later", "orders")
        }
    errors = {queue: run.error or "" for queue, run in runs.items()}
    assert errors["hooks"] == (
        "[step 1/1] deliver failed: bad input: $.body.url: $.body has no key 'url' (it has "
        f"nothing) (at {line_of('# hooks')})"
    )
    assert errors["orders"] == (
        "[step 1/1] charge failed: bad input amount: KeyError 'amount' "
        f"(at {line_of('a key the body lacks')})"
    )
    assert errors["tenants"] == (
        "[step 1/1] bill failed: bad input tenant: LookupError: no tenant "
        f"(at {line_of('the callable input')})"
    )
    assert errors["later"].startswith("[step 1/1] nap failed: "), errors["later"]
    assert errors["later"].endswith(f" (at {line_of('# later')})"), errors["later"]


# ---- where a timeout found the node --------------------------------------------------------
async def _waits_inside(ctx: Any) -> None:
    await _a_call_that_hangs()


async def _a_call_that_hangs() -> None:
    await anyio.sleep(30)  # where the async node hangs


def _loops_until_told(ctx: Any) -> None:
    while not ctx.cancelled:
        time.sleep(0.01)  # where the sync node spins


async def test_a_step_whose_time_ran_out_says_where_it_was_and_keeps_the_stack() -> None:
    """An async node waiting in a call of its own: the line of that call's await; a sync node:
    the line its thread was on; both attempts' stacks kept as their tracebacks."""
    flows = [
        Workflow(
            name="hangs",
            trigger=WorkerTrigger(queue="hangs"),
            steps=[
                Step(
                    "fetch",
                    _waits_inside,
                    max_duration=100,
                    retry=Retry(max_attempts=2, min_timeout=1),
                )
            ],
        ),
        Workflow(
            name="spins",
            trigger=WorkerTrigger(queue="spins"),
            # A whole second: said as a duration is written ("1s"), not "1000ms".
            steps=[Step("crunch", _loops_until_told, max_duration="1s")],
        ),
    ]
    async with Engine(workflows=flows, database=None) as engine:
        hangs = await engine.wait_for_job(await engine.enqueue("hangs", {}), timeout=10)
        spins = await engine.wait_for_job(await engine.enqueue("spins", {}), timeout=10)
    assert hangs.error == (
        "[step 1/1] fetch failed: timed out after 100ms (max_duration) (stopped at "
        f"{line_of('where the async node hangs')}, after 2 attempts)"
    )
    assert spins.error == (
        "[step 1/1] crunch failed: timed out after 1s (max_duration) (stopped at "
        f"{line_of('where the sync node spins')})"
    )
    for attempt in hangs.step("fetch").attempts:
        stack = attempt.traceback or ""
        assert stack.startswith("Stopped here (most recent call last):\n"), stack
        # The node's frame, then the call it was waiting in, innermost last.
        assert stack.index("in _waits_inside") < stack.index("in _a_call_that_hangs"), stack
    [spun] = spins.step("crunch").attempts
    assert "in _loops_until_told\n    time.sleep(0.01)" in (spun.traceback or "")


async def test_a_sync_node_that_goes_on_past_its_timeout_is_said_to_be_there() -> None:
    released = threading.Event()
    flows = [
        Workflow(
            name="sleeps",
            trigger=WorkerTrigger(queue="sleeps"),
            steps=[
                Step(
                    "nap",
                    _outlasts_its_run,
                    max_duration=100,
                    inputs={"release": lambda ctx: released},
                )
            ],
        )
    ]
    async with Engine(workflows=flows, database=None) as engine:
        async with expect_events(engine, LogRecorded, where=lambda e: "still runs" in e.message):
            job_id = await engine.enqueue("sleeps", {})
        released.set()  # the step ends once its thread returns
        run = await engine.wait_for_job(job_id, timeout=10)
    where = line_of("outlasts its run")
    assert run.error is not None and run.error.endswith(f"(stopped at {where})"), run.error
    [warning] = [line.message for line in run.logs if "still runs in its thread" in line.message]
    assert f"still runs in its thread (stopped at {where}); the step ends once" in warning


async def test_a_run_whose_job_timed_out_says_where_its_step_was() -> None:
    flows = [
        Workflow(
            name="long",
            trigger=WorkerTrigger(queue="long", timeout=150),
            steps=[Step("fetch", _waits_inside)],
        )
    ]
    async with Engine(workflows=flows, database=None) as engine:
        run = await engine.wait_for_job(await engine.enqueue("long", {}), timeout=10)
    assert run.error == (
        "run timed out after 150ms (the trigger's timeout) (stopped at "
        f"{line_of('where the async node hangs')})"
    )
    [attempt] = run.step("fetch").attempts
    assert "in _a_call_that_hangs" in (attempt.traceback or ""), attempt.traceback


def test_a_stop_with_no_frame_of_the_users_names_no_line() -> None:
    assert failed_for_good("[step 1/1] s", "timed out", None, 2, Stopped(None, "")) == (
        "[step 1/1] s failed: timed out (after 2 attempts)"
    )
    assert Stopped(None, "").note == ""
    assert stopped_in_thread(None) is None


async def _hangs_once(ctx: Any) -> None:
    if ctx.attempt == 1:
        await anyio.sleep(30)


def _outlasts_its_run(ctx: Any, release: threading.Event) -> None:
    release.wait(10)  # where the sync node outlasts its run


async def test_where_an_earlier_attempt_stopped_is_not_taken_for_a_later_stop() -> None:
    """A first step's first attempt timed out (an async node: where it was, noted), then the
    run's timeout stops the run: in a sync node of the next step, that node's line; in the
    backoff before the second attempt, no line. (Each second of the run's timeout is far more
    than the 50 ms the first attempt takes, whatever the load.)"""
    released = threading.Event()
    flows = [
        Workflow(
            name="later",
            trigger=WorkerTrigger(queue="later", timeout=1000),
            steps=[
                Step(
                    "first",
                    _hangs_once,
                    max_duration=50,
                    retry=Retry(max_attempts=2, min_timeout=1),
                ),
                Step("nap", _outlasts_its_run, inputs={"release": lambda ctx: released}),
            ],
        ),
        Workflow(
            name="backoff",
            trigger=WorkerTrigger(queue="backoff", timeout=1000),
            # The first attempt's backoff outlasts the run's timeout.
            steps=[
                Step(
                    "first",
                    _hangs_once,
                    max_duration=50,
                    retry=Retry(max_attempts=2, min_timeout="5s"),
                )
            ],
        ),
    ]
    async with Engine(workflows=flows, database=None) as engine:
        later_job = await engine.enqueue("later", {})
        backoff_job = await engine.enqueue("backoff", {})
        later = await engine.wait_for_job(later_job, timeout=10)
        released.set()
        backoff = await engine.wait_for_job(backoff_job, timeout=10)
    assert later.error == (
        f"run timed out after 1s (the trigger's timeout) (stopped at {line_of('outlasts its run')})"
    )
    assert backoff.error == "run timed out after 1s (the trigger's timeout)"


async def test_a_cancelled_run_says_where_it_was_stopped() -> None:
    """What an operator who cancels a stuck run wants to know: where it was stuck."""
    started = anyio.Event()

    async def stuck(ctx: Any) -> None:
        started.set()
        await _a_call_that_hangs()

    flows = [Workflow(name="stuck", trigger=WorkerTrigger(queue="stuck"), steps=[Step("s", stuck)])]
    async with Engine(workflows=flows, database=None) as engine:
        job_id = await engine.enqueue("stuck", {})
        with anyio.fail_after(10):
            await started.wait()
        await engine.cancel((await engine.get_job(job_id)).run_id)
        run = await engine.wait_for_job(job_id, timeout=10)
    assert run.error == f"cancelled by operator (stopped at {line_of('async node hangs')})"
    [attempt] = run.step("s").attempts
    assert "in _a_call_that_hangs" in (attempt.traceback or ""), attempt.traceback


async def test_a_return_value_the_engine_refuses_names_the_steps_line() -> None:
    """No frame of the error is the user's: the engine refused what the node returned (a
    spread of a non-dict, a value JSON cannot hold). The step's `Step(...)` line is where the
    user can see both the node and the option."""
    flows = [
        Workflow(
            name="spread",
            trigger=WorkerTrigger(queue="spread"),
            steps=[Step("rows", lambda ctx: [1, 2], spread=True)],  # spread
        ),
        Workflow(
            name="opaque",
            trigger=WorkerTrigger(queue="opaque"),
            steps=[Step("thing", lambda ctx: object())],  # opaque
        ),
    ]
    async with Engine(workflows=flows, database=None) as engine:
        spread = await engine.wait_for_job(await engine.enqueue("spread", {}), timeout=10)
        opaque = await engine.wait_for_job(await engine.enqueue("opaque", {}), timeout=10)
    assert spread.error == (
        "[step 1/1] rows failed: step 'rows' has spread=True but returned list, not a dict to "
        f"merge into ctx.state (at {line_of('# spread')})"
    )
    assert opaque.error is not None
    assert opaque.error.startswith("[step 1/1] thing failed: the return value of thing is not")
    assert opaque.error.endswith(f"(at {line_of('# opaque')})"), opaque.error


def test_where_a_node_is_names_only_the_users_frames_or_says_it_is_in_library_code() -> None:
    library = (json.__file__, 10, "decode", "obj, end = self.raw_decode(s)")
    users = (__file__, 20, "fetch", "    rows = json.loads(text)  ")
    place = traceback.StackSummary.from_list
    assert where_text("[step 1/1] s", place([library])) == (
        "where: [step 1/1] s is in library code (no frame of the workflow's own is on its stack)"
    )
    assert where_text("[step 1/1] s", place([users, library])) == (
        f"where: [step 1/1] s is at {HERE}:20\n  {HERE}:20 in fetch: rows = json.loads(text)"
    )


async def test_a_run_stopped_in_parallel_branches_says_where_one_was() -> None:
    """The nodes ran in branches of their own (a parallel `for_each`): the run's cancel still
    names where one of them was."""
    started = anyio.Event()

    async def each(ctx: Any) -> None:
        started.set()
        await _a_call_that_hangs()

    flows = [
        Workflow(
            name="fans",
            trigger=WorkerTrigger(queue="fans"),
            steps=[for_each("items", "$.body.items", steps=[Step("each", each)], parallel=2)],
        )
    ]
    async with Engine(workflows=flows, database=None) as engine:
        job_id = await engine.enqueue("fans", {"items": [1, 2]})
        with anyio.fail_after(10):
            await started.wait()
        await engine.cancel((await engine.get_job(job_id)).run_id)
        run = await engine.wait_for_job(job_id, timeout=10)
    assert run.error == f"cancelled by operator (stopped at {line_of('async node hangs')})"
