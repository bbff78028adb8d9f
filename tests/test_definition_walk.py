"""Workflow definitions a user walkthrough found lost or refused badly: each is refused when it
is defined or loaded, with one line naming the file and line it came from, and the engine goes
on serving the rest."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from support import marked_line

from engine import (
    Engine,
    EngineError,
    RunStatus,
    Step,
    UnknownQueue,
    WorkerTrigger,
    Workflow,
    WorkflowDefinitionError,
    wait,
)

pytestmark = pytest.mark.anyio

GOOD_FILE = """
from engine import Step, WorkerTrigger, Workflow


async def echo(ctx):
    return ctx.body


workflow = Workflow(name="good", trigger=WorkerTrigger(queue="good"), steps=[Step("echo", echo)])
"""


async def echo(ctx: Any) -> Any:
    return ctx.body


def write(folder: Path, name: str, source: str) -> str:
    """Write a workflow file; its key in reload_errors."""
    path = folder / name
    path.write_text(textwrap.dedent(source).lstrip())
    return str(path.resolve())


async def serves(engine: Engine, queue: str) -> str:
    """The engine runs a job on `queue` end to end; the workflow that ran it."""
    run = await engine.wait_for_job(await engine.enqueue(queue, {"n": 1}), timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    return run.workflow_name


async def errors_of(folder: Path) -> dict[str, str]:
    """The load errors of a folder, once the good file in it is served. The good file was
    there first (of two files that clash, the older is kept)."""
    good = folder / "good.py"
    good.write_text(GOOD_FILE)
    before = time.time() - 3600
    os.utime(good, (before, before))
    async with Engine(workflows=folder) as engine:
        assert await serves(engine, "good") == "good"
        return dict(engine.reload_errors)


# ---- Engine(workflows=[...]): two workflows of one name or on one queue -----------------------
async def test_two_inline_workflows_on_one_queue_are_refused() -> None:
    first = Workflow(name="w1", trigger=WorkerTrigger(queue="q"), steps=[Step("s", echo)])  # w1
    second = Workflow(name="w2", trigger=WorkerTrigger(queue="q"), steps=[Step("s", echo)])  # w2
    with pytest.raises(WorkflowDefinitionError) as refused:
        async with Engine(workflows=[first, second]):
            pass
    at, there = marked_line(__file__, "# w2"), marked_line(__file__, "# w1")
    assert str(refused.value) == (
        f"{at}: queue 'q' is already consumed by workflow 'w1' (at {there})"
    )


async def test_two_inline_workflows_of_one_name_are_refused() -> None:
    first = Workflow(name="w", trigger=WorkerTrigger(queue="q1"), steps=[Step("s", echo)])  # q1
    second = Workflow(name="w", trigger=WorkerTrigger(queue="q2"), steps=[Step("s", echo)])  # q2
    with pytest.raises(WorkflowDefinitionError) as refused:
        async with Engine(workflows=[first, second]):
            pass
    at, there = marked_line(__file__, "# q2"), marked_line(__file__, "# q1")
    assert str(refused.value) == (
        f"{at}: workflow 'w' is defined twice in Engine(workflows=[...]) (first at {there})"
    )


async def test_the_same_inline_workflow_given_twice_is_served_once() -> None:
    flow = Workflow(name="w", trigger=WorkerTrigger(queue="q"), steps=[Step("s", echo)])
    async with Engine(workflows=[flow, flow]) as engine:
        assert [w.name for w in await engine.workflows()] == ["w"]
        assert await serves(engine, "q") == "w"


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (5, "workflows= takes a folder, a file or a list of Workflow objects, not int"),
        ([print], "workflows= takes Workflow objects; one given is builtin_function_or_method"),
    ],
)
async def test_workflows_that_are_not_workflows_are_refused_in_one_line(
    given: Any, says: str
) -> None:
    with pytest.raises(EngineError) as refused:
        async with Engine(workflows=given):
            pass
    assert str(refused.value) == says


# ---- a file whose definitions would be lost -------------------------------------------------
async def test_a_file_that_assigns_workflow_twice_is_refused_at_the_second(tmp_path: Path) -> None:
    key = write(
        tmp_path,
        "twice.py",
        """
        from engine import Step, WorkerTrigger, Workflow

        workflow = Workflow(name="one", trigger=WorkerTrigger(queue="one"), steps=[Step("s", print)])

        workflow = Workflow(name="two", trigger=WorkerTrigger(queue="two"), steps=[Step("s", print)])
        """,
    )
    assert await errors_of(tmp_path) == {
        key: f"{key}:5: `workflow` is assigned twice (first at line 3) and only the last would "
        "be served; put both in `workflows = [...]`"
    }


async def test_a_file_that_defines_workflow_and_workflows_is_refused(tmp_path: Path) -> None:
    key = write(
        tmp_path,
        "both.py",
        """
        from engine import Step, WorkerTrigger, Workflow

        workflow = Workflow(name="one", trigger=WorkerTrigger(queue="one"), steps=[Step("s", print)])
        workflows = [
            Workflow(name="two", trigger=WorkerTrigger(queue="two"), steps=[Step("s", print)]),
        ]
        """,
    )
    assert await errors_of(tmp_path) == {
        key: f"{key}:4: defines both `workflow` (line 3) and `workflows` (line 4); only "
        "`workflows` would be served: put every workflow in `workflows`"
    }


async def test_workflows_that_lists_workflow_too_loses_nothing(tmp_path: Path) -> None:
    write(
        tmp_path,
        "listed.py",
        """
        from engine import Step, WorkerTrigger, Workflow


        async def echo(ctx):
            return ctx.body


        workflow = Workflow(name="one", trigger=WorkerTrigger(queue="one"), steps=[Step("s", echo)])
        workflows = [
            workflow,
            Workflow(name="two", trigger=WorkerTrigger(queue="two"), steps=[Step("s", echo)]),
        ]
        """,
    )
    async with Engine(workflows=tmp_path) as engine:
        assert engine.reload_errors == {}
        assert await serves(engine, "one") == "one"
        assert await serves(engine, "two") == "two"


# ---- load errors name what the file defined, and its line -----------------------------------
async def test_a_workflow_that_is_not_a_workflow_names_the_variable_and_line(
    tmp_path: Path,
) -> None:
    key = write(tmp_path, "number.py", "import os\n\nworkflow = 42\n")
    listed = write(tmp_path, "listed.py", "import os\nworkflows = [1, 2]\n")
    assert await errors_of(tmp_path) == {
        key: f"{key}:3: `workflow` must be a Workflow, got int",
        listed: f"{listed}:2: `workflows` must be a list of Workflow objects, not of int",
    }


async def test_a_queue_clash_between_files_names_the_line(tmp_path: Path) -> None:
    key = write(
        tmp_path,
        "same_queue.py",
        """
        from engine import Step, WorkerTrigger, Workflow

        workflow = Workflow(
            name="other",
            trigger=WorkerTrigger(queue="good"),
            steps=[Step("s", print)],
        )
        """,
    )
    assert await errors_of(tmp_path) == {
        key: f"{key}:3: queue 'good' is already consumed by workflow 'good'"
    }


async def test_of_two_files_of_one_workflow_the_older_is_kept_whatever_their_names(
    tmp_path: Path,
) -> None:
    """By name, `a_dup.py` took the workflow from `good.py` at a restart, where the hot reload
    that saw it arrive had refused it: the same folder served another queue."""
    key = write(
        tmp_path,
        "a_dup.py",
        """
        from engine import Step, WorkerTrigger, Workflow

        workflow = Workflow(
            name="good",
            trigger=WorkerTrigger(queue="dupq"),
            steps=[Step("s", print)],
        )
        """,
    )
    errors = await errors_of(tmp_path)  # good.py is the older: it serves, a_dup.py is refused
    assert list(errors) == [key]
    assert errors[key].startswith(f"{key}:3: workflow 'good' is already defined in ")


BASE_EXCEPTIONS = {
    "interrupt.py": ("raise KeyboardInterrupt('at import')\n", "KeyboardInterrupt: at import"),
    "skipped.py": (
        "class Skipped(BaseException):\n    pass\n\n\nraise Skipped('no numpy here')\n",
        "Skipped: no numpy here",
    ),
}


async def test_a_file_raising_a_base_exception_at_import_fails_alone(tmp_path: Path) -> None:
    """A `raise KeyboardInterrupt` (or pytest's importorskip, any BaseException) in a workflow
    file took the whole engine down, at a start as at a hot reload."""
    keys = {write(tmp_path, name, source): said for name, (source, said) in BASE_EXCEPTIONS.items()}
    errors = await errors_of(tmp_path)
    assert set(errors) == set(keys)
    for key, said in keys.items():
        assert errors[key].endswith(said), errors[key]


async def test_the_import_limit_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLOK_IMPORT_TIMEOUT", "200ms")
    key = write(tmp_path, "slow.py", "import time\n\ntime.sleep(2)\n")
    said = (await errors_of(tmp_path))[key]
    assert "import did not finish within 0.2s" in said and "BLOK_IMPORT_TIMEOUT" in said
    monkeypatch.setenv("BLOK_IMPORT_TIMEOUT", "soon")
    with pytest.raises(EngineError, match="BLOK_IMPORT_TIMEOUT='soon': cannot parse"):
        Engine(workflows=tmp_path)


async def test_a_duplicate_step_in_a_file_is_reported_at_the_steps_line(tmp_path: Path) -> None:
    key = write(
        tmp_path,
        "dupsteps.py",
        """
        from engine import Step, WorkerTrigger, Workflow

        workflow = Workflow(
            name="dup",
            trigger=WorkerTrigger(queue="dup"),
            steps=[
                Step("a", print),
                Step("a", print),
            ],
        )
        """,
    )
    errors = await errors_of(tmp_path)
    assert errors[key].startswith(
        f"{key}:8: WorkflowDefinitionError: workflow 'dup': step name 'a' is used twice (first at "
    )
    assert errors[key].endswith("dupsteps.py:7)")


# ---- a bare $.state -------------------------------------------------------------------------
def test_a_bare_state_expression_is_a_definition_error() -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        Workflow(
            name="w",
            trigger=WorkerTrigger(queue="q"),
            steps=[Step("a", echo), Step("b", echo, inputs={"x": "$.state"})],
        )
    assert str(refused.value) == ("step 'b': expression '$.state' must name a step: $.state.<step>")


def test_a_bare_state_expression_in_a_wait_is_a_definition_error() -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        Workflow(
            name="w",
            trigger=WorkerTrigger(queue="q"),
            steps=[Step("a", echo), wait.until("$.state", name="later")],
        )
    assert str(refused.value) == (
        "step 'later': expression '$.state' must name a step: $.state.<step>"
    )


async def test_a_bare_state_expression_in_a_file_points_at_the_step(tmp_path: Path) -> None:
    key = write(
        tmp_path,
        "state.py",
        """
        from engine import Step, WorkerTrigger, Workflow

        workflow = Workflow(
            name="state",
            trigger=WorkerTrigger(queue="state"),
            steps=[
                Step("a", print),
                Step("b", print, inputs={"x": "$.state"}),
            ],
        )
        """,
    )
    assert await errors_of(tmp_path) == {
        key: f"{key}:8: WorkflowDefinitionError: step 'b': expression '$.state' must name a "
        "step: $.state.<step>"
    }


# ---- a zero time limit is refused, not taken as none ----------------------------------------
@pytest.mark.parametrize("zero", [0, "0", "0ms", "0s"])
def test_a_zero_max_duration_is_refused(zero: object) -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        Step("a", echo, max_duration=zero)
    assert str(refused.value) == f"step 'a': max_duration must be above zero, not {zero!r}"


@pytest.mark.parametrize("zero", [0, "0ms"])
def test_a_zero_trigger_timeout_is_refused(zero: object) -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        WorkerTrigger(queue="q", timeout=zero)
    assert str(refused.value) == f"WorkerTrigger: timeout must be above zero, not {zero!r}"


def test_a_zero_event_timeout_is_refused() -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        wait.for_event("approved", timeout=0)
    assert str(refused.value) == "wait.for_event('approved'): timeout must be above zero, not 0"


def test_the_smallest_time_limits_are_kept() -> None:
    assert Step("a", echo, max_duration=1).max_duration == 1
    assert WorkerTrigger(queue="q", timeout="1ms").timeout == 1
    assert Step("a", echo).max_duration is None  # none given: no limit


# ---- a negative duration string -------------------------------------------------------------
def test_a_negative_duration_string_is_refused_as_negative() -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        Step("a", echo, max_duration="-1s")
    assert str(refused.value) == "step 'a': max_duration: duration '-1s' is negative"


# ---- a file whose workflow is under another name, or that has none ---------------------------
async def test_a_workflow_under_another_name_is_named_with_its_line(tmp_path: Path) -> None:
    key = write(
        tmp_path,
        "misnamed.py",
        """
        from engine import Step, WorkerTrigger, Workflow


        async def echo(ctx):
            return ctx.body

        wf = Workflow(name="misnamed", trigger=WorkerTrigger(queue="m"), steps=[Step("s", echo)])
        """,
    )
    listed = write(
        tmp_path,
        "lists.py",
        """
        from engine import Step, WorkerTrigger, Workflow

        flows = [Workflow(name="l", trigger=WorkerTrigger(queue="l"), steps=[Step("s", print)])]
        """,
    )
    two = write(
        tmp_path,
        "two.py",
        """
        from engine import Step, WorkerTrigger, Workflow

        one = Workflow(name="one", trigger=WorkerTrigger(queue="one"), steps=[Step("s", print)])
        other = Workflow(name="other", trigger=WorkerTrigger(queue="o"), steps=[Step("s", print)])
        """,
    )
    helper = write(tmp_path, "helpers.py", "def price(amount):\n    return amount * 100\n")
    assert await errors_of(tmp_path) == {
        key: f"{key}:7: defines neither `workflow` nor `workflows` (it has a Workflow in `wf`, "
        "line 7: name it `workflow`)",
        listed: f"{listed}:3: defines neither `workflow` nor `workflows` (it has a list of "
        "Workflow in `flows`, line 3: name it `workflows`)",
        two: f"{two}:3: defines neither `workflow` nor `workflows` (it has workflows in `one`, "
        "line 3, `other`, line 4: list them in `workflows = [...]`)",
        helper: f"{helper}: defines neither `workflow` nor `workflows` (a helper module? name it "
        "_helpers.py)",
    }


async def test_a_helper_or_a_file_not_python_given_alone_is_said_to_be_one(tmp_path: Path) -> None:
    # `--workflows workflows/_pricing.py` said "(a helper module? name it _pricing.py)", of a
    # file named so; `--workflows notes.txt` ran the text file as Python.
    helper = write(tmp_path, "_pricing.py", "def price(amount):\n    return amount * 100\n")
    async with Engine(workflows=helper) as engine:
        assert engine.reload_errors == {
            str(helper): f"{helper}: defines neither `workflow` nor `workflows` (a helper "
            "module: give the workflow file that imports it, or their folder)"
        }
    notes = write(tmp_path, "notes.txt", "print('ran')\n")
    with pytest.raises(EngineError) as refused:
        async with Engine(workflows=notes):
            pass
    assert str(refused.value) == f"{notes}: not a workflow file (a folder of them, or one .py)"


# ---- a syntax error says its place once ------------------------------------------------------
async def test_a_syntax_error_names_its_line_once(tmp_path: Path) -> None:
    key = write(tmp_path, "syntax.py", "import os\n\n\nvalues = {'a': 1\n")
    indent = write(tmp_path, "indent.py", "def f():\nreturn 1\n")
    assert await errors_of(tmp_path) == {
        key: f"{key}:4: SyntaxError: '{{' was never closed",
        indent: f"{indent}:2: IndentationError: expected an indented block after function "
        "definition on line 1",
    }


async def test_a_syntax_error_in_a_helper_keeps_the_helpers_place(tmp_path: Path) -> None:
    (tmp_path / "_helper.py").write_text("x = (\n")
    key = write(tmp_path, "uses.py", "import os\n\nimport _helper\n")
    said = (await errors_of(tmp_path))[key]
    assert said.startswith(f"{key}:3: SyntaxError: '(' was never closed (")
    assert said.endswith("_helper.py, line 1)")


async def test_an_unknown_queue_says_which_workflow_files_failed_to_load(tmp_path: Path) -> None:
    """A syntax error in the file of queue 'bad' read as a mistyped queue name: "unknown queue
    'bad' (queues: none)", while the load error went to a log the caller did not look at."""
    key = write(tmp_path, "bad.py", "from engine import Workflow\n\nworkflow = Workflow(\n")
    async with Engine(workflows=tmp_path) as engine:
        with pytest.raises(UnknownQueue) as unknown:
            await engine.enqueue("bad", {})
    said = str(unknown.value)
    assert said.startswith("unknown queue 'bad' (queues: none")
    assert f"; 1 workflow file failed to load: {key}:3: SyntaxError" in said


async def test_an_unknown_queue_named_after_a_workflow_with_no_trigger_says_so() -> None:
    helper = Workflow(name="notrig", steps=[Step("s", echo)])
    served = Workflow(name="served", trigger=WorkerTrigger(queue="served"), steps=[Step("s", echo)])
    async with Engine(workflows=[helper, served]) as engine:
        with pytest.raises(UnknownQueue, match="workflow 'notrig' has no trigger, so no queue"):
            await engine.enqueue("notrig", {})


async def test_an_error_raised_in_a_helper_at_import_names_the_helpers_line_too(
    tmp_path: Path,
) -> None:
    """It named only the workflow file's `from _helpers import fmt` line: the helper's own
    line, where the NameError was, was for the user to find."""
    (tmp_path / "_helpers.py").write_text("def fmt(x):\n    return x\n\nundefined_thing()\n")
    key = write(
        tmp_path,
        "uses_helper.py",
        """
        from _helpers import fmt
        from engine import Step, WorkerTrigger, Workflow

        workflow = Workflow(name="h", trigger=WorkerTrigger(queue="h"), steps=[Step("s", fmt)])
        """,
    )
    assert (await errors_of(tmp_path))[key] == (
        f"{key}:1: NameError: name 'undefined_thing' is not defined (at _helpers.py:4)"
    )
