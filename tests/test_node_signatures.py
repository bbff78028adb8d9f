"""A node is called `node(ctx, **inputs)` (engine/node_calls.py). One that cannot be called so
(no place for the context, an input it has no parameter for, a parameter no input gives) or a
generator function failed every run that reached it, with Python's TypeError; each is refused
when the workflow is defined, naming the workflow, the step and what to write instead. Nodes
that can be called so are kept, however they are written."""

from __future__ import annotations

import functools
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, RunStatus, Step, WorkerTrigger, Workflow, WorkflowDefinitionError
from engine.primitives import for_each

pytestmark = pytest.mark.anyio


def flow(*steps: Any) -> Workflow:
    return Workflow(name="w", trigger=WorkerTrigger(queue="w"), steps=list(steps))


# ---- nodes that cannot be called as the runner calls them ------------------------------------
def no_ctx(order_id: str) -> str:
    return order_id


def keyword_only(*, order_id: str) -> str:
    return order_id


def nothing() -> None:
    return None


def takes_x(ctx: Any, x: int) -> int:
    return x


async def takes_x_and_y(ctx: Any, x: int, y: int) -> int:
    return x + y


def takes_x_by_position(ctx: Any, x: int, /) -> int:
    return x


def gen(ctx: Any) -> Iterator[int]:
    yield 1


async def agen(ctx: Any) -> AsyncIterator[int]:
    yield 1


class Charger:
    def __call__(self, ctx: Any, amount: int) -> int:
        return amount

    def charge(self, ctx: Any, amount: int) -> int:
        return amount

    def batches(self, ctx: Any) -> Iterator[int]:
        yield 1


class Forgetful:
    """A class as a node, and a callable object, both without the context."""

    def __init__(self, amount: int) -> None:
        self.amount = amount

    def __call__(self, amount: int) -> int:
        return amount


REFUSED = [
    (
        no_ctx,
        {"order_id": "$.body.id"},
        "node no_ctx(order_id) must take the context first: def no_ctx(ctx, order_id)",
    ),
    (
        keyword_only,
        {"order_id": "$.body.id"},
        "node keyword_only(*, order_id) must take the context first: "
        "def keyword_only(ctx, *, order_id)",
    ),
    (nothing, {}, "node nothing() must take the context first: def nothing(ctx)"),
    (lambda: 1, {}, "node <lambda>() must take the context first: lambda ctx: ..."),
    (takes_x, {"y": 1}, "input 'y' is not a parameter of takes_x(ctx, x)"),
    (
        takes_x,
        {"x": 1, "xx": 2},
        "input 'xx' is not a parameter of takes_x(ctx, x); did you mean 'x'?",
    ),
    (
        takes_x_by_position,
        {"x": 1},
        "input 'x' is a positional-only parameter of takes_x_by_position(ctx, x, /); inputs are "
        "passed by keyword",
    ),
    (takes_x, {}, "takes_x needs 'x', which inputs does not give: takes_x(ctx, x)"),
    (
        takes_x_and_y,
        {},
        "takes_x_and_y needs 'x' and 'y', which inputs does not give: takes_x_and_y(ctx, x, y)",
    ),
    (
        takes_x,
        {"ctx": 1, "x": 2},
        "input 'ctx' is the name of the first parameter of takes_x(ctx, x), which takes the "
        "context: rename the input",
    ),
    (Charger(), {}, "Charger needs 'amount', which inputs does not give: Charger(ctx, amount)"),
    (
        Charger().charge,
        {"amont": 1},
        "input 'amont' is not a parameter of charge(ctx, amount); did you mean 'amount'?",
    ),
    (
        functools.partial(takes_x_and_y, x=1),
        {},
        "takes_x_and_y needs 'y', which inputs does not give: takes_x_and_y(ctx, *, x=1, y)",
    ),
    (
        Forgetful,
        {"amount": 1},
        "node Forgetful(amount) must take the context first: def __init__(self, ctx, amount)",
    ),
    (
        Forgetful(1),
        {"amount": 1},
        "node Forgetful(amount) must take the context first: def __call__(self, ctx, amount)",
    ),
    (gen, {}, "node gen is a generator function; return the value instead"),
    (agen, {}, "node agen is an async generator function; return the value instead"),
    (Charger().batches, {}, "node batches is a generator function; return the value instead"),
    (
        functools.partial(Charger().batches),
        {},
        "node batches is a generator function; return the value instead",
    ),
]


@pytest.mark.parametrize(("node", "inputs", "says"), REFUSED)
def test_a_node_the_runner_cannot_call_is_refused_when_defined(
    node: Any, inputs: dict[str, Any], says: str
) -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        flow(Step("first", takes_x, inputs={"x": 1}), Step("s", node, inputs=inputs))
    assert str(refused.value) == f"workflow 'w', step 's': {says}"


def test_a_node_inside_a_flow_step_is_checked_too() -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        flow(
            for_each(
                "each", "$.body.items", steps=[Step("inner", no_ctx, inputs={"order_id": "$.body"})]
            )
        )
    assert str(refused.value) == (
        "workflow 'w', step 'inner': node no_ctx(order_id) must take the context first: "
        "def no_ctx(ctx, order_id)"
    )


async def test_a_node_refused_in_a_file_names_the_steps_line(tmp_path: Path) -> None:
    path = tmp_path / "charge.py"
    path.write_text(
        textwrap.dedent(
            """
            from engine import Step, WorkerTrigger, Workflow


            def charge(order_id, amount):
                return {"charged": amount}


            workflow = Workflow(
                name="charge",
                trigger=WorkerTrigger(queue="charge"),
                steps=[
                    Step("charge", charge,
                         inputs={"order_id": "$.body.id", "amount": "$.body.amount"}),
                ],
            )
            """
        ).lstrip()
    )
    async with Engine(workflows=tmp_path) as engine:
        key = str(path.resolve())
        assert engine.reload_errors == {
            key: f"{key}:12: WorkflowDefinitionError: workflow 'charge', step 'charge': node "
            "charge(order_id, amount) must take the context first: "
            "def charge(ctx, order_id, amount)"
        }


# ---- nodes that can: kept, and they run ------------------------------------------------------
async def anything(*args: Any, **kwargs: Any) -> Any:
    return sorted(kwargs)


def context_named_otherwise(context: Any, x: int, *, y: int = 2) -> int:
    return x + y


def positional_ctx(c: Any, /, x: int) -> int:
    return x


def ctx_in_args(*args: Any, x: int) -> int:
    return x


def some_kwargs(ctx: Any, x: int, **more: Any) -> list[str]:
    return sorted(more)


class Node(dict[str, int]):
    """A class as a node: `Node(ctx, x)` makes one (a dict, which a step may return)."""

    def __init__(self, ctx: Any, x: int) -> None:
        super().__init__(x=x)


class AsyncCharger:
    async def __call__(self, ctx: Any, amount: int = 1) -> int:
        return amount


def traced(fn: Any) -> Any:
    """A decorator that calls what it wraps with an argument of its own: its signature is the
    wrapper's, whatever `functools.wraps` says."""

    @functools.wraps(fn)
    def wrapper(ctx: Any, **inputs: Any) -> Any:
        return fn(ctx, "db", **inputs)

    return wrapper


@traced
def uses_db(ctx: Any, db: str, x: int) -> str:
    return f"{db}:{x}"


def a_generator_made(ctx: Any) -> list[int]:
    return list(i for i in range(3))


KEPT: list[tuple[str, Any, dict[str, Any], Any]] = [
    ("anything", anything, {"a": 1, "b": 2}, ["a", "b"]),
    ("named", context_named_otherwise, {"x": 1}, 3),
    ("named_kw", context_named_otherwise, {"x": 1, "y": 5}, 6),
    ("positional", positional_ctx, {"x": 4}, 4),
    ("in_args", ctx_in_args, {"x": 5}, 5),
    ("kwargs", some_kwargs, {"x": 1, "z": 2}, ["z"]),
    ("partial", functools.partial(some_kwargs, x=1), {}, []),
    ("partial_given", functools.partial(some_kwargs, x=1), {"x": 2}, []),
    ("bound", Charger().charge, {"amount": 7}, 7),
    ("object", Charger(), {"amount": 8}, 8),
    ("async_object", AsyncCharger(), {}, 1),
    ("lambda", lambda ctx, x=3: x, {}, 3),
    ("decorated", uses_db, {"x": 9}, "db:9"),
    ("generator_inside", a_generator_made, {}, [0, 1, 2]),
    ("no_signature", print, {}, None),
    ("async", takes_x_and_y, {"x": 1, "y": 2}, 3),
    ("class", Node, {"x": 1}, {"x": 1}),
]


async def test_every_way_of_writing_a_callable_node_is_kept_and_runs() -> None:
    steps = [Step(name, node, inputs=inputs) for name, node, inputs, _ in KEPT]
    workflow = flow(*steps)
    async with Engine(workflows=[workflow]) as engine:
        run = await engine.wait_for_job(await engine.enqueue("w", {}), timeout=10)
        assert run.status is RunStatus.COMPLETED, run.error
        outputs = {step.name: step.output for step in run.steps}
    assert {name: outputs[name] for name, *_ in KEPT} == {name: out for name, _, _, out in KEPT}
