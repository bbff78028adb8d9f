"""A run's one-line error says where it came from: the innermost line of the user's own code,
past the engine's, the standard library's and installed packages' frames, after the error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import raised_at

from engine import Engine, Retry, Step, WorkerTrigger, Workflow, runner, wait
from engine.origin import failed_for_good, is_engine_frame, user_line

pytestmark = pytest.mark.anyio

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
        "[step 1/1] parse failed: Expecting property name enclosed in double quotes: line 1 "
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


def line_of(marker: str) -> str:
    """`file:line` of the line of this file that holds `marker`."""
    lines = Path(__file__).read_text().splitlines()
    number = next(n for n, line in enumerate(lines, 1) if marker in line and "line_of" not in line)
    return f"{Path(__file__).resolve().relative_to(Path.cwd().resolve())}:{number}"


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
    ]
    async with Engine(workflows=flows, database=None) as engine:
        runs = {
            queue: await engine.wait_for_job(await engine.enqueue(queue, {}), timeout=10)
            for queue in ("hooks", "tenants", "later")
        }
    errors = {queue: run.error or "" for queue, run in runs.items()}
    assert errors["hooks"] == (
        "[step 1/1] deliver failed: bad input: $.body.url: $.body has no key 'url' (it has "
        f"nothing) (at {line_of('# hooks')})"
    )
    assert errors["tenants"] == (
        f"[step 1/1] bill failed: bad input: no tenant (at {line_of('the callable input')})"
    )
    assert errors["later"].startswith("[step 1/1] nap failed: "), errors["later"]
    assert errors["later"].endswith(f" (at {line_of('# later')})"), errors["later"]
