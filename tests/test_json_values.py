"""What pydantic makes JSON of is stored in that form: a payload, an event's payload or a node's
return value that is a pydantic model, a dataclass, a datetime, a UUID, a Decimal, an enum or a
set. A model in a workflow file failed as it was first used ("`Order` is not fully defined; you
should define `datetime`"), and a node returning one failed its step ("$ is a Order")."""

from __future__ import annotations

import gc
import textwrap
import weakref
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from pydantic import BaseModel
from support import any_database, run_when

from engine import Engine, JobState, RunStatus, Schedule
from engine.input_models import input_models, required_paths

database = any_database
pytestmark = pytest.mark.anyio

FLOW = """
import dataclasses, datetime, decimal, enum, uuid
from pydantic import BaseModel
from engine import Step, Workflow, WorkerTrigger, wait

class Order(BaseModel):
    id: str
    placed: datetime.datetime
    tags: set[str]

@dataclasses.dataclass
class Receipt:
    total: decimal.Decimal
    ref: uuid.UUID

class Color(enum.Enum):
    RED = "red"

def take(ctx, order: Order) -> Order:
    assert order.placed.tzinfo is not None  # the payload read back as the model it was
    return order

def charge(ctx, order: Order, history: list[Order], last: Order | None) -> dict:
    return {
        "years": [o.placed.year for o in history],  # a list of models, a model or None
        "last": last,
        # What the step before returned, as stored: here, and in a run resumed elsewhere;
        # given to a parameter annotated with its model, that model again.
        "saw": ctx.state["take"],
        "year": order.placed.year,
        "receipt": Receipt(decimal.Decimal("9.99"), uuid.UUID(int=7)),
        "color": Color.RED,
        "on": datetime.date(2026, 12, 8),
    }

workflow = Workflow(
    name="orders",
    trigger=WorkerTrigger(queue="orders"),
    steps=[
        Step("take", take, inputs={"order": "$.body"}),
        Step(
            "charge",
            charge,
            inputs={"order": "$.state.take", "history": lambda ctx: [ctx.state["take"]] * 2,
                    "last": lambda ctx: None},
        ),
        wait.for_event("approved"),
    ],
)
"""


class OrderIn(BaseModel):
    id: str
    placed: datetime
    tags: set[str]


class Approval(BaseModel):
    by: str
    at: datetime


@pytest.mark.parametrize("future", [False, True], ids=["annotations", "future-annotations"])
async def test_models_dataclasses_and_datetimes_are_stored_as_their_json(
    tmp_path: Path, database: Path | str | None, future: bool
) -> None:
    # `from __future__ import annotations` in the file makes pydantic look its types up in the
    # file's module by name; without it, the engine's own future import leaked into the file.
    folder = tmp_path / "workflows"
    folder.mkdir()
    header = "from __future__ import annotations\n" if future else ""
    (folder / "orders.py").write_text(header + textwrap.dedent(FLOW))
    placed = datetime(2026, 12, 8, 9, 30, tzinfo=UTC)
    async with Engine(workflows=folder, database=database) as engine:
        assert engine.reload_errors == {}
        take_node = engine.workflow("orders").steps[0].node  # type: ignore[union-attr]
        # The file's annotations are what the file says: objects, unless it postpones them.
        assert isinstance(take_node.__annotations__["return"], str) is future
        # What the console's inject template holds and `enqueue` warns of: the model's fields.
        (info,) = await engine.workflows()
        assert info.body_fields == ["id", "placed", "tags"]
        job = await engine.enqueue("orders", OrderIn(id="A1", placed=placed, tags={"gift"}))
        waiting = await run_when(engine, job, RunStatus.WAITING)
        await engine.send_event(waiting.id, "approved", Approval(by="ann", at=placed))
        run = await engine.wait_for_job(job, timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    order = {"id": "A1", "placed": "2026-12-08T09:30:00Z", "tags": ["gift"]}
    assert run.input == order
    take, charge, approved = run.steps
    assert take.output == order
    assert charge.output == {
        "years": [2026, 2026],
        "last": None,
        "saw": order,
        "year": 2026,
        "receipt": {"total": "9.99", "ref": "00000000-0000-0000-0000-000000000007"},
        "color": "red",
        "on": "2026-12-08",
    }
    assert approved.output == run.output == {"by": "ann", "at": "2026-12-08T09:30:00Z"}


async def test_an_input_that_is_not_a_valid_model_fails_its_step_once_in_one_line(
    tmp_path: Path, database: Path | str | None
) -> None:
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "orders.py").write_text(textwrap.dedent(FLOW))
    async with Engine(workflows=folder, database=database) as engine:
        job = await engine.enqueue("orders", {"id": "A1", "placed": "yesterday"})
        run = await engine.wait_for_job(job, timeout=10)
        dead = (await engine.get_job(job)).state
    assert run.status is RunStatus.FAILED
    # The body is what it is at every delivery: dead-lettered without the job's retries.
    assert dead is JobState.DEAD and len(run.steps[0].attempts) == 0
    assert run.error is not None and run.error.startswith(
        "[step 1/3] take failed: bad input order: not a valid Order: placed: Input should be a "
        "valid datetime or date, "
    ), run.error
    assert "; tags: Field required" in run.error and "\n" not in run.error, run.error
    # What it was given, to see beside why its model refused it.
    assert run.steps[0].input == {"order": {"id": "A1", "placed": "yesterday"}}


def test_a_schedules_payload_is_stored_as_enqueue_stores_it() -> None:
    # Refused where it was written ("$.since is a date") where enqueue takes the same payload.
    schedule = Schedule(
        every="1m",
        payload={
            "since": date(2026, 12, 8),
            "o": OrderIn(id="A1", placed=datetime(2026, 12, 8, tzinfo=UTC), tags=set()),
        },
    )
    assert schedule.payload == {
        "since": "2026-12-08",
        "o": {"id": "A1", "placed": "2026-12-08T00:00:00Z", "tags": []},
    }


def test_a_nodes_models_are_not_kept_once_the_node_is_gone() -> None:
    # Found once per node; a reload makes new functions, and a cache that held the old ones
    # held each old version of the file's module.
    def node(ctx: object, order: OrderIn) -> None:
        return None

    assert [name for name, *_ in input_models(node)] == ["order"]
    gone = weakref.ref(node)
    del node
    gc.collect()
    assert gone() is None


def test_a_models_required_fields_are_found_down_its_required_models() -> None:
    # The inject template held "buyer": null for a buyer that must have an email.
    class Buyer(BaseModel):
        email: str
        name: str = ""

    class Cart(BaseModel):
        id: str
        buyer: Buyer
        gift: Buyer | None = None
        note: str = ""

    assert required_paths(Cart, "$.body") == ["$.body.id", "$.body.buyer.email"]
