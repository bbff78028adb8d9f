"""Hot reload with real files in tmp_path, real watchfiles events and a real SQLite database.

Nodes in the workflow files block on gates from a `reload_gates` module the test puts in
`sys.modules`, so a test knows for certain that a run is mid-step, and lets it go when it wants.
Every wait is for an event (engine events, gates, `wait_for_job`) under `anyio.fail_after`.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import textwrap
import threading
import time
import types
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream

from engine import Engine, JobState, RunStatus, UnknownQueue
from engine.events import (
    AttemptFailed,
    Event,
    QueueChanged,
    ReloadErrorCleared,
    ReloadFailed,
    RunStatusChanged,
    WorkflowReloaded,
)
from engine.reload import wait_until_watching

pytestmark = pytest.mark.anyio

TIMEOUT = 10.0  # generous for a loaded CI machine; a working reload takes ~0.1 s


class Gates:
    """Named checkpoints for nodes: `entered` says a node reached it, `open` lets it through."""

    def __init__(self) -> None:
        self._entered: dict[str, anyio.Event] = {}
        self._opened: dict[str, anyio.Event] = {}
        self.stuck_import = threading.Event()  # set it to let a looping import finish

    def entered(self, name: str) -> anyio.Event:
        return self._entered.setdefault(name, anyio.Event())

    def open(self, name: str) -> None:
        self._opened.setdefault(name, anyio.Event()).set()

    async def gate(self, name: str) -> None:
        self.entered(name).set()
        await self._opened.setdefault(name, anyio.Event()).wait()


@pytest.fixture
def gates(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gates]:
    instance = Gates()
    module = types.ModuleType("reload_gates")
    module.gates = instance  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "reload_gates", module)
    yield instance
    instance.stuck_import.set()  # never leave an import thread spinning after a test


def flow_source(
    label: str,
    *,
    name: str = "orders",
    queue: str = "orders",
    concurrency: int = 4,
    retries: int = 0,
    steps: str = 'Step("work", work)',
    header: str = "",
    label_from: str | None = None,
) -> str:
    """A workflow file whose node returns {"label": label} (or the value of the expression
    `label_from`, `orders.LABEL` of a module its `header` imports), waiting at the gate named
    in the job's body when there is one."""
    extra = f", retries={retries}" if retries else ""
    label_source = label_from if label_from is not None else repr(label)
    return textwrap.dedent(
        f"""\
        from reload_gates import gates
        from engine import Step, WorkerTrigger, Workflow, wait
        {header}
        LABEL = {label_source}


        async def work(ctx):
            if ctx.body and ctx.body.get("gate"):
                await gates.gate(ctx.body["gate"])
            return {{"label": LABEL}}


        workflow = Workflow(
            name={name!r},
            trigger=WorkerTrigger(queue={queue!r}, concurrency={concurrency}{extra}),
            steps=[{steps}],
        )
        """
    )


@dataclass
class Watch:
    """The engine's events since just after it started, to wait on."""

    receive: MemoryObjectReceiveStream[Event]
    seen: list[Event] = field(default_factory=list)

    async def expect(self, kind: type[Event], where: Callable[[Any], bool] = lambda e: True) -> Any:
        with anyio.fail_after(TIMEOUT):
            async for event in self.receive:
                self.seen.append(event)
                if isinstance(event, kind) and where(event):
                    return event
        raise AssertionError("the event stream ended")

    async def reloaded(self, path: Path) -> WorkflowReloaded:
        return await self.expect(WorkflowReloaded, lambda e: e.path == str(path))


@asynccontextmanager
async def running(
    source: Path,
    database: Path | None,
    *,
    import_timeout: float | None = None,
    on_start: Callable[[], None] = lambda: None,
) -> AsyncIterator[tuple[Engine, Watch]]:
    """The engine on `source` with watch=True, subscribed to before it starts (no event is
    missed), once its watcher sees changes. `on_start` runs the moment `__aenter__` returns."""
    engine = Engine(workflows=source, database=database, watch=True, grace_period=2)
    if import_timeout is not None:
        engine.import_timeout = import_timeout  # type: ignore[attr-defined]
    send, receive = anyio.create_memory_object_stream[Event](10_000)

    async def pump() -> None:
        async with send:
            async for event in engine.events():
                await send.send(event)

    async with anyio.create_task_group() as tg:
        tg.start_soon(pump)
        with anyio.fail_after(TIMEOUT):
            while not engine.bus.active:  # subscribed: nothing published from now is missed
                await anyio.lowlevel.checkpoint()
        async with engine:
            on_start()
            with anyio.fail_after(TIMEOUT):
                await wait_until_watching(engine)
            yield engine, Watch(receive)
        tg.cancel_scope.cancel()


@pytest.fixture(params=["sqlite", "memory"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    return tmp_path / "blok.db" if request.param == "sqlite" else None


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "workflows"
    path.mkdir()
    return path


async def version_of(engine: Engine, name: str = "orders") -> str:
    return engine.workflow(name).version


async def test_v1_run_mid_step_ends_on_v1_while_the_next_job_runs_v2(
    folder: Path, database: Path | None, gates: Gates
) -> None:
    file = folder / "orders.py"
    file.write_text(flow_source("v1"))
    async with running(folder, database) as (engine, events):
        v1 = await version_of(engine)
        first = await engine.enqueue("orders", {"gate": "first"})
        with anyio.fail_after(TIMEOUT):
            await gates.entered("first").wait()

        file.write_text(flow_source("v2"))
        reloaded = await events.reloaded(file.resolve())
        v2 = reloaded.versions[0]
        assert v2 != v1 and await version_of(engine) == v2

        second = await engine.enqueue("orders", {})
        run2 = await engine.wait_for_job(second, timeout=TIMEOUT)
        assert (run2.workflow_version, run2.output) == (v2, {"label": "v2"})

        still = await engine.get_run((await engine.get_job(first)).run_id)
        assert still.status is RunStatus.RUNNING  # the reload did not touch it
        gates.open("first")
        run1 = await engine.wait_for_job(first, timeout=TIMEOUT)
        assert (run1.status, run1.workflow_version, run1.output) == (
            RunStatus.COMPLETED,
            v1,
            {"label": "v1"},
        )


async def test_a_job_enqueued_after_a_reload_takes_the_new_triggers_settings(
    folder: Path, database: Path | None, gates: Gates
) -> None:
    # An enqueue before the reload as well: the queue's settings are not those it first saw.
    file = folder / "orders.py"
    file.write_text(flow_source("v1"))
    async with running(folder, database) as (engine, events):
        before = await engine.enqueue("orders", {})
        assert (await engine.get_job(before)).max_retries == 0
        file.write_text(flow_source("v2", retries=3))
        await events.reloaded(file.resolve())
        after = await engine.enqueue("orders", {})
        assert (await engine.get_job(after)).max_retries == 3
        run = await engine.wait_for_job(after, timeout=TIMEOUT)
        assert run.output == {"label": "v2"}


@pytest.mark.parametrize(
    ("broken", "line", "message"),
    [
        ("from engine import Step\n\ndef work(ctx)\n    return 1\n", 3, "SyntaxError"),
        (
            "from engine import Workflow\nimport json\n\nworkflow = Workflow(name='orders', steps=[])\n",
            4,
            "has no steps",
        ),
        ("import json\n\nraise RuntimeError('config missing')\n", 3, "config missing"),
    ],
    ids=["syntax", "validation", "exception"],
)
async def test_a_broken_file_keeps_v1_serving_until_fixed(
    folder: Path, tmp_path: Path, gates: Gates, broken: str, line: int, message: str
) -> None:
    file = folder / "orders.py"
    file.write_text(flow_source("v1"))
    async with running(folder, tmp_path / "blok.db") as (engine, events):
        v1 = await version_of(engine)
        file.write_text(broken)
        failed = await events.expect(ReloadFailed)
        key = str(file.resolve())
        assert failed.path == key
        assert failed.message.startswith(f"{key}:{line}: ") and message in failed.message
        assert engine.reload_errors == {key: failed.message}

        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert (run.workflow_version, run.output) == (v1, {"label": "v1"})

        file.write_text(flow_source("v2"))
        cleared = await events.expect(ReloadErrorCleared)
        assert cleared.path == key and engine.reload_errors == {}
        await events.reloaded(file.resolve())
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert run.output == {"label": "v2"} and run.workflow_version != v1


async def test_a_broken_file_fixed_back_to_its_last_good_version_says_it_loads_again(
    folder: Path, tmp_path: Path, gates: Gates, caplog: pytest.LogCaptureFixture
) -> None:
    # The error was logged, the fix not (it came out the same as the version serving): a
    # worker's log, all a headless user has, ended on the error.
    file = folder / "orders.py"
    file.write_text(flow_source("v1"))
    async with running(folder, tmp_path / "blok.db") as (engine, events):
        v1 = await version_of(engine)
        file.write_text("x = (\n")
        await events.expect(ReloadFailed)
        caplog.set_level(logging.INFO, logger="blok.reload")
        file.write_text(flow_source("v1"))
        await events.expect(ReloadErrorCleared)
        await events.reloaded(file.resolve())
    said = [r.getMessage() for r in caplog.records if r.name == "blok.reload"]
    assert f"reloaded {file.resolve()}: orders@{v1} (loads again, as its last good version)" in (
        said
    ), said


async def test_deleted_file_stops_claiming_and_its_queued_jobs_run_when_it_returns(
    folder: Path, database: Path | None, gates: Gates
) -> None:
    file = folder / "orders.py"
    file.write_text(flow_source("v1", concurrency=1))
    async with running(folder, database) as (engine, events):
        first = await engine.enqueue("orders", {"gate": "first"})
        with anyio.fail_after(TIMEOUT):
            await gates.entered("first").wait()
        queued = [await engine.enqueue("orders", {"n": n}) for n in range(3)]

        file.unlink()
        gone = await events.reloaded(file.resolve())
        assert gone.workflows == ()
        assert await engine.workflows() == []
        # Listed while it holds runs not ended, served by no one: they wait for it to return.
        assert [(q.name, q.served) for q in await engine.queues()] == [("orders", False)]
        with pytest.raises(UnknownQueue):
            await engine.enqueue("orders", {})

        gates.open("first")  # the run in flight finishes on the deleted version
        run1 = await engine.wait_for_job(first, timeout=TIMEOUT)
        assert run1.output == {"label": "v1"}
        for job_id in queued:  # its slot is free, yet nothing claims: the file is gone
            assert (await engine.get_job(job_id)).state is JobState.WAITING

        file.write_text(flow_source("v2", concurrency=1))
        back = await events.reloaded(file.resolve())
        assert back.workflows == ("orders",)
        for job_id in queued:
            run = await engine.wait_for_job(job_id, timeout=TIMEOUT)
            assert (run.status, run.output) == (RunStatus.COMPLETED, {"label": "v2"})


@pytest.mark.parametrize("source", ["folder", "file"])
async def test_helper_module_edit_reloads_the_workflows_that_use_it(
    folder: Path, tmp_path: Path, gates: Gates, source: str
) -> None:
    helper = folder / "_greetings.py"
    helper.write_text("def greet(name):\n    return f'hello {name}'\n")
    file = folder / "orders.py"
    file.write_text(
        flow_source(
            "v1",
            header="from _greetings import greet",
            steps='Step("greet", lambda ctx: greet(ctx.body["name"]))',
        )
    )
    watched = folder if source == "folder" else file  # Engine(workflows=FILE) watches its folder
    async with running(watched, tmp_path / "blok.db") as (engine, events):
        before = await version_of(engine)
        run = await engine.wait_for_job(
            await engine.enqueue("orders", {"name": "ada"}), timeout=TIMEOUT
        )
        assert run.output == "hello ada"

        helper.write_text("def greet(name):\n    return f'bonjour {name}'\n")
        reloaded = await events.reloaded(file.resolve())
        assert reloaded.versions[0] != before  # the version covers the helper's source
        run = await engine.wait_for_job(
            await engine.enqueue("orders", {"name": "ada"}), timeout=TIMEOUT
        )
        assert (run.output, run.workflow_version) == ("bonjour ada", reloaded.versions[0])


async def test_a_workflow_file_another_imports_reloads_its_importer_too(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    # shipping.py took its label from orders.py ("from orders import LABEL"): orders.py
    # saved, only orders.py was imported again, and shipping ran the old label for good.
    orders = folder / "orders.py"
    orders.write_text(flow_source("v1"))
    shipping = folder / "shipping.py"
    shipping.write_text(
        flow_source(
            "", name="shipping", queue="shipping", header="import orders", label_from="orders.LABEL"
        )
    )
    async with running(folder, tmp_path / "blok.db") as (engine, events):
        run = await engine.wait_for_job(await engine.enqueue("shipping", {}), timeout=TIMEOUT)
        assert run.output == {"label": "v1"}
        orders.write_text(flow_source("v2"))
        await events.reloaded(shipping.resolve())
        run = await engine.wait_for_job(await engine.enqueue("shipping", {}), timeout=TIMEOUT)
        assert run.output == {"label": "v2"}


async def test_a_helper_not_named_with_an_underscore_is_a_helper_once_a_workflow_imports_it(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    # `pricing.py` beside the workflow that imports it: "defines neither `workflow` nor
    # `workflows` (a helper module? name it _pricing.py)" in a red banner for good.
    helper = folder / "pricing.py"
    helper.write_text("PRICE = 10\n")
    file = folder / "orders.py"
    file.write_text(flow_source("", header="import pricing", label_from="pricing.PRICE"))
    async with running(folder, tmp_path / "blok.db") as (engine, events):
        assert engine.reload_errors == {}
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert run.output == {"label": 10}
        helper.write_text("PRICE = 20\n")
        await events.reloaded(file.resolve())
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert (run.output, engine.reload_errors) == ({"label": 20}, {})


async def test_a_workflow_file_in_a_subfolder_is_said_to_be_passed_over(
    folder: Path, tmp_path: Path, gates: Gates, caplog: pytest.LogCaptureFixture
) -> None:
    # `workflows/billing/invoice.py` served nothing and nothing said why.
    (folder / "billing").mkdir()
    (folder / "billing" / "invoice.py").write_text(
        flow_source("", name="billing.invoice", queue="invoices")
    )
    # Imported by a file of the folder, a subfolder's workflow is served: nothing to say.
    (folder / "shop").mkdir()
    (folder / "shop" / "__init__.py").write_text("")
    (folder / "shop" / "cart.py").write_text(flow_source("", name="shop.cart", queue="carts"))
    (folder / "shop_flows.py").write_text("from shop.cart import workflow\n")
    (folder / "_lib").mkdir()  # private, as helpers are: not looked at
    (folder / "_lib" / "flows.py").write_text(flow_source("", name="lib", queue="lib"))
    caplog.set_level(logging.WARNING, logger="blok.catalog")
    async with running(folder, tmp_path / "blok.db") as (engine, _):
        assert sorted(engine.served_queues()) == ["carts"]
    said = [r.getMessage() for r in caplog.records if "subfolder" in r.getMessage()]
    assert said == [
        f"{(folder / 'billing' / 'invoice.py').resolve()} defines a workflow in a subfolder, "
        f"and is not loaded: only the .py files directly in {folder} are (move it up, or "
        "import its workflow from a file there)"
    ], said


async def test_a_helpers_edit_says_only_the_workflows_it_changed(
    folder: Path, tmp_path: Path, gates: Gates, caplog: pytest.LogCaptureFixture
) -> None:
    """A helper's edit reloads every workflow file (any may import it): each said "reloaded",
    the ones that came out the same too, and their lines hid the one that changed."""
    helper = folder / "_greetings.py"
    helper.write_text("def greet(name):\n    return f'hello {name}'\n")
    file = folder / "orders.py"
    file.write_text(flow_source("v1", header="from _greetings import greet"))
    other = folder / "shipping.py"
    other.write_text(flow_source("s1", name="shipping", queue="shipping"))
    async with running(folder, tmp_path / "blok.db") as (_, events):
        caplog.set_level(logging.INFO, logger="blok.reload")
        helper.write_text("def greet(name):\n    return f'bonjour {name}'\n")
        await events.reloaded(file.resolve())
        await events.reloaded(other.resolve())
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
        assert [m.split(":")[0] for m in said if m.startswith("reloaded")] == [
            f"reloaded {file.resolve()}"
        ], said


async def test_concurrency_change_takes_effect_live(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    file = folder / "orders.py"
    file.write_text(flow_source("v1", concurrency=1))
    async with running(folder, tmp_path / "blok.db") as (engine, events):
        a = await engine.enqueue("orders", {"gate": "a"})
        b = await engine.enqueue("orders", {"gate": "b"})
        with anyio.fail_after(TIMEOUT):
            await gates.entered("a").wait()
        stats = await engine.queue_stats("orders")
        assert (stats.active, stats.waiting) == (1, 1)
        assert not gates.entered("b").is_set()

        file.write_text(flow_source("v1", concurrency=2))
        await events.reloaded(file.resolve())
        with anyio.fail_after(TIMEOUT):
            await gates.entered("b").wait()  # the second slot opened without a restart
        assert [q.concurrency for q in await engine.queues()] == [2]
        gates.open("a")
        gates.open("b")
        for job_id in (a, b):
            assert (
                await engine.wait_for_job(job_id, timeout=TIMEOUT)
            ).status is RunStatus.COMPLETED


async def test_queue_rename_moves_claiming_to_the_new_queue(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    file = folder / "orders.py"
    file.write_text(flow_source("v1", concurrency=1))
    async with running(folder, tmp_path / "blok.db") as (engine, events):
        first = await engine.enqueue("orders", {"gate": "first"})
        with anyio.fail_after(TIMEOUT):
            await gates.entered("first").wait()
        left = await engine.enqueue("orders", {})

        file.write_text(flow_source("v2", queue="orders-v2", concurrency=1))
        await events.reloaded(file.resolve())
        # The old queue stays listed, served by no one, while it holds runs not ended.
        assert [(q.name, q.served) for q in await engine.queues()] == [
            ("orders", False),
            ("orders-v2", True),
        ]
        run = await engine.wait_for_job(await engine.enqueue("orders-v2", {}), timeout=TIMEOUT)
        assert run.output == {"label": "v2"}
        with pytest.raises(UnknownQueue):
            await engine.enqueue("orders", {})
        gates.open("first")
        assert (await engine.wait_for_job(first, timeout=TIMEOUT)).output == {"label": "v1"}
        assert (await engine.get_job(left)).state is JobState.WAITING

        file.write_text(flow_source("v3", queue="orders", concurrency=1))
        await events.reloaded(file.resolve())
        run = await engine.wait_for_job(left, timeout=TIMEOUT)
        assert run.output == {"label": "v3"}


async def a_waiting_run(engine: Engine, events: Watch) -> tuple[str, str]:
    """A job enqueued on "orders", once its run waits: (its job id, its run id)."""
    job_id = await engine.enqueue("orders", {})
    run_id = (await engine.get_job(job_id)).run_id
    await events.expect(RunStatusChanged, lambda e: e.run_id == run_id and e.status == "waiting")
    return job_id, run_id


STEPS_V1 = 'Step("a", work), wait.for_("1500ms"), Step("b", work)'
STEPS_INCOMPATIBLE = 'Step("a", work), wait.for_("1500ms"), Step("extra", work), Step("b", work)'


@pytest.mark.parametrize("compatible", [False, True], ids=["steps-changed", "steps-same"])
async def test_waiting_run_resumes_on_the_version_its_steps_fit(
    folder: Path, tmp_path: Path, gates: Gates, compatible: bool
) -> None:
    file = folder / "orders.py"
    file.write_text(flow_source("v1", steps=STEPS_V1))
    async with running(folder, tmp_path / "blok.db") as (engine, events):
        v1 = await version_of(engine)
        job_id, run_id = await a_waiting_run(engine, events)

        file.write_text(flow_source("v2", steps=STEPS_V1 if compatible else STEPS_INCOMPATIBLE))
        v2 = (await events.reloaded(file.resolve())).versions[0]
        # The reload must land inside the wait, or this test would prove nothing.
        assert (await engine.get_run(run_id)).status is RunStatus.WAITING

        run = await engine.wait_for_job(job_id, timeout=TIMEOUT)
        assert run.status is RunStatus.COMPLETED
        logs = [line.message for line in run.logs]
        if compatible:
            assert (run.workflow_version, run.output) == (v2, {"label": "v2"})
            assert any(f"resumed on version {v2}" in m and "unchanged" in m for m in logs), logs
        else:
            assert (run.workflow_version, run.output) == (v1, {"label": "v1"})
            assert [s.name for s in run.steps] == ["a", "wait_2", "b"]
            assert any(f"resumed on version {v1}, the version it started on" in m for m in logs), (
                logs
            )
            current = engine.workflow("orders")  # new runs start on the new steps
            assert current.version == v2
            assert [s.name for s in current.steps] == ["a", "wait_2", "extra", "b"]


EVENT_V1 = 'Step("a", work), wait.for_event("approved", timeout="1h", name="approval")'
EVENT_RENAMED = EVENT_V1.replace('"approved"', '"approval_granted"')


async def test_a_waiting_run_whose_event_a_reload_renamed_takes_the_event_it_waits_for(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    # Resumed on the new version ("its steps are unchanged": names and kinds were compared),
    # the run took another event than the one it waited for: the approver recorded was not
    # the one who approved, and their event was left untaken.
    file = folder / "orders.py"
    file.write_text(flow_source("v1", steps=EVENT_V1))
    async with running(folder, tmp_path / "blok.db") as (engine, events):
        v1 = await version_of(engine)
        job_id, run_id = await a_waiting_run(engine, events)
        file.write_text(flow_source("v2", steps=EVENT_RENAMED))
        await events.reloaded(file.resolve())
        await engine.send_event(run_id, "approval_granted", {"by": "carl"})
        await engine.send_event(run_id, "approved", {"by": "dora"})
        run = await engine.wait_for_job(job_id, timeout=TIMEOUT)
        taken = {m.event: m.taken_by for m in await engine.events_of(run_id)}
    assert run.status is RunStatus.COMPLETED and run.workflow_version == v1
    assert run.step("approval").output == {"by": "dora"}
    assert taken["approved"] is not None and taken["approval_granted"] is None


FLAKY = """\
from engine import Retry, Step, WorkerTrigger, Workflow

LABEL = {label!r}


async def work(ctx):
    if LABEL == "v1":
        raise RuntimeError("the bug")
    return {{"label": LABEL}}


workflow = Workflow(
    name="orders",
    trigger=WorkerTrigger(queue="orders"),
    steps=[Step("work", work, retry=Retry(max_attempts=2, min_timeout="2s")){more}],
)
"""


@pytest.mark.parametrize("compatible", [False, True], ids=["steps-changed", "steps-same"])
async def test_a_step_in_its_backoff_retries_with_the_code_a_reload_brought(
    folder: Path, database: Path | None, compatible: bool
) -> None:
    """A developer fixes the step that keeps failing: its next attempt runs the fix (the run
    hands itself back at its backoff's end and resumes on the new version). Where the reload
    changed the steps, the run cannot go on on the new version by position: it keeps its own."""
    file = folder / "orders.py"
    file.write_text(FLAKY.format(label="v1", more=""))
    async with running(folder, database) as (engine, events):
        v1 = await version_of(engine)
        job_id = await engine.enqueue("orders", {})
        run_id = (await engine.get_job(job_id)).run_id
        await events.expect(AttemptFailed, lambda e: e.run_id == run_id and e.attempt == 1)

        more = ', Step("after", work)' if not compatible else ""
        file.write_text(FLAKY.format(label="v2", more=more))
        v2 = (await events.reloaded(file.resolve())).versions[0]
        # The reload must land inside the 2 s backoff, or this test would prove nothing.
        assert (await engine.get_run(run_id)).finished_at is None

        run = await engine.wait_for_job(job_id, timeout=TIMEOUT)
        attempts = [a.status for a in run.steps[0].attempts]
        if compatible:
            assert (run.status, run.workflow_version, run.output) == (
                RunStatus.COMPLETED,
                v2,
                {"label": "v2"},
            ), run.error
            assert attempts == ["failed", "completed"]
            logs = [line.message for line in run.logs]
            assert any(f"version {v2} of its workflow was loaded" in m for m in logs), logs
        else:
            assert (run.status, run.workflow_version) == (RunStatus.FAILED, v1)
            assert "the bug" in (run.error or "") and attempts == ["failed", "failed"]


HANGING = """\
import time
from reload_gates import gates

while not gates.stuck_import.is_set():
    time.sleep(0.01)
"""


async def test_an_import_that_never_finishes_is_reported_not_waited_for(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    file = folder / "orders.py"
    file.write_text(flow_source("v1"))
    async with running(folder, tmp_path / "blok.db", import_timeout=0.5) as (engine, events):
        file.write_text(HANGING)
        failed = await events.expect(ReloadFailed)
        assert failed.message.startswith(f"{file.resolve()}:5: import did not finish within 0.5s")
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert run.output == {"label": "v1"}
        gates.stuck_import.set()

        file.write_text(flow_source("v2"))
        await events.expect(ReloadErrorCleared)
        await events.reloaded(file.resolve())


async def test_a_hanging_file_at_startup_does_not_stop_the_others(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    (folder / "stuck.py").write_text(HANGING)
    (folder / "orders.py").write_text(flow_source("v1"))
    with anyio.fail_after(TIMEOUT):
        async with running(folder, tmp_path / "blok.db", import_timeout=0.5) as (engine, _):
            message = engine.reload_errors[str((folder / "stuck.py").resolve())]
            assert "import did not finish within 0.5s" in message
            run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
            assert run.output == {"label": "v1"}


async def test_new_file_adds_its_queue_and_a_burst_of_saves_is_one_reload(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    file = folder / "orders.py"
    file.write_text(flow_source("v1"))
    async with running(folder, tmp_path / "blok.db") as (engine, events):
        for n in range(2, 7):  # an editor saving several times in a row
            file.write_text(flow_source(f"v{n}"))
        await events.reloaded(file.resolve())
        # shipping.py sorts after orders.py, so a needless reload of orders.py (or a second
        # one from a burst split in two) would be published before shipping.py's event.
        other = folder / "shipping.py"
        other.write_text(flow_source("s1", name="shipping", queue="shipping"))
        added = await events.reloaded(other.resolve())
        assert added.workflows == ("shipping",)
        assert any(isinstance(e, QueueChanged) and e.queue == "shipping" for e in events.seen)
        reloads = [
            e
            for e in events.seen
            if isinstance(e, WorkflowReloaded) and e.path == str(file.resolve())
        ]
        assert len(reloads) == 1, reloads
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert run.output == {"label": "v6"}
        run = await engine.wait_for_job(await engine.enqueue("shipping", {}), timeout=TIMEOUT)
        assert run.output == {"label": "s1"}


async def test_a_workflow_moved_between_files_in_one_save_is_not_a_clash(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    first, second = folder / "a_orders.py", folder / "b_orders.py"
    first.write_text(flow_source("in-b", name="placeholder", queue="placeholder"))
    second.write_text(flow_source("in-a"))
    async with running(folder, tmp_path / "blok.db") as (engine, events):
        # orders moves from b_orders.py to a_orders.py; a_orders.py is loaded first.
        first.write_text(flow_source("moved"))
        second.write_text(flow_source("p", name="placeholder", queue="placeholder"))
        await events.reloaded(first.resolve())
        assert engine.reload_errors == {}
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert run.output == {"label": "moved"}


async def test_a_file_refused_at_start_for_a_clash_loads_once_the_other_file_goes(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    """Refused at the engine's start, a file was never tried again: only files refused by a
    hot reload were. Removing the file it clashed with left its queue unserved."""
    older, newer = folder / "z_first.py", folder / "a_second.py"
    older.write_text(flow_source("first"))
    newer.write_text(flow_source("second"))  # the same workflow: refused, the older is kept
    before = time.time() - 60  # a file system's clock may give both writes one mtime
    os.utime(older, (before, before))
    async with running(folder, tmp_path / "blok.db") as (engine, events):
        assert list(engine.reload_errors) == [str(newer.resolve())]
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert run.output == {"label": "first"}
        older.unlink()
        await events.reloaded(newer.resolve())
        assert engine.reload_errors == {}
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert run.output == {"label": "second"}


async def test_a_clash_clears_once_the_other_file_gives_the_name_up(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    first, second = folder / "a_orders.py", folder / "b_orders.py"
    first.write_text(flow_source("a"))
    second.write_text(flow_source("b", name="placeholder", queue="placeholder"))
    async with running(folder, tmp_path / "blok.db") as (engine, events):
        second.write_text(flow_source("b-takes-over"))
        failed = await events.expect(ReloadFailed)
        assert failed.path == str(second.resolve())
        assert f"'orders' is already defined in {first.resolve()}" in failed.message
        assert [w.name for w in await engine.workflows()] == ["orders", "placeholder"]

        first.write_text(flow_source("a", name="renamed", queue="renamed"))
        await events.expect(ReloadErrorCleared, lambda e: e.path == str(second.resolve()))
        await events.reloaded(second.resolve())
        assert engine.reload_errors == {}
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert run.output == {"label": "b-takes-over"}


async def test_a_trigger_the_engine_cannot_serve_is_refused_not_fatal(
    folder: Path, gates: Gates
) -> None:
    file = folder / "orders.py"
    file.write_text(flow_source("v1"))
    async with running(folder, None) as (engine, events):  # in memory: no sqlite queue
        file.write_text(
            flow_source("v2").replace("concurrency=4)", "concurrency=4, provider='sqlite')")
        )
        failed = await events.expect(ReloadFailed)
        assert "provider 'sqlite' needs a SQLite file: pass database=" in failed.message
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert run.output == {"label": "v1"}


async def test_a_save_while_the_watcher_starts_is_caught_up(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    file = folder / "orders.py"
    file.write_text(flow_source("v1"))
    # Written after the first load and before the watcher runs: no file event will report it.
    in_the_gap = lambda: file.write_text(flow_source("v2"))  # noqa: E731
    async with running(folder, tmp_path / "blok.db", on_start=in_the_gap) as (engine, events):
        reloaded = await events.reloaded(file.resolve())
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert (run.output, run.workflow_version) == ({"label": "v2"}, reloaded.versions[0])


async def test_a_broken_file_fixed_while_the_watcher_starts_is_caught_up(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    """A file that failed to load, fixed in that gap, was never loaded again: the catch-up
    looked only at the files that had loaded (seen as a flake of an attach test in CI)."""
    file = folder / "orders.py"
    file.write_text("from engine import Workflow\n\nworkflow = Workflow(name=)\n")
    in_the_gap = lambda: file.write_text(flow_source("v1"))  # noqa: E731
    async with running(folder, tmp_path / "blok.db", on_start=in_the_gap) as (engine, events):
        cleared = await events.expect(ReloadErrorCleared)
        assert cleared.path == str(file.resolve()) and engine.reload_errors == {}
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert run.output == {"label": "v1"}


async def test_a_broken_helper_fails_its_workflow_files_with_the_helpers_line(
    folder: Path, tmp_path: Path, gates: Gates
) -> None:
    helper = folder / "_greetings.py"
    helper.write_text("def greet(name):\n    return f'hello {name}'\n")
    file = folder / "orders.py"
    file.write_text(
        flow_source(
            "v1",
            header="from _greetings import greet",
            steps='Step("greet", lambda ctx: greet(ctx.body["name"]))',
        )
    )
    async with running(folder, tmp_path / "blok.db") as (engine, events):
        helper.write_text("def greet(name)\n    return name\n")
        failed = await events.expect(ReloadFailed)
        # The workflow file's import line, and the helper's own file and line in the message.
        assert failed.message.startswith(f"{file.resolve()}:3: SyntaxError")
        assert "_greetings.py, line 1" in failed.message
        run = await engine.wait_for_job(
            await engine.enqueue("orders", {"name": "ada"}), timeout=TIMEOUT
        )
        assert run.output == "hello ada"

        helper.write_text("def greet(name):\n    return f'hi {name}'\n")
        await events.expect(ReloadErrorCleared)
        run = await engine.wait_for_job(
            await engine.enqueue("orders", {"name": "ada"}), timeout=TIMEOUT
        )
        assert run.output == "hi ada"


async def test_a_folder_removed_and_made_again_is_watched_again(
    folder: Path,
    database: Path | None,
    gates: Gates,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A deploy by `rm -rf workflows && cp -r new workflows`: the OS watch was on the removed
    # folder, so the worker served nothing from then on (every file "removed"), alive and
    # "healthy", until restarted.
    caplog.set_level(logging.WARNING, logger="blok.reload")
    (folder / "orders.py").write_text(flow_source("v1"))
    new = tmp_path / "new"
    new.mkdir()
    (new / "orders.py").write_text(flow_source("v2"))
    async with running(folder, database) as (engine, events):
        v1 = await version_of(engine)
        shutil.rmtree(folder)
        shutil.copytree(new, folder)
        reloaded = await events.expect(
            WorkflowReloaded, lambda e: e.path == str(folder / "orders.py") and e.versions != ()
        )
        assert reloaded.versions[0] != v1
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert run.output == {"label": "v2"}
        # And the new folder is watched: an edit in it reloads as any.
        (folder / "orders.py").write_text(flow_source("v3"))
        await events.expect(WorkflowReloaded, lambda e: e.versions not in ((), reloaded.versions))
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert run.output == {"label": "v3"}
    said = [r.getMessage() for r in caplog.records]
    assert f"workflow folder {folder.resolve()} was replaced: watching the new one" in said


async def test_a_folder_removed_for_a_while_is_watched_once_it_is_back(
    folder: Path, database: Path | None, gates: Gates, tmp_path: Path
) -> None:
    (folder / "orders.py").write_text(flow_source("v1"))
    async with running(folder, database) as (engine, events):
        shutil.rmtree(folder)
        await events.expect(WorkflowReloaded, lambda e: e.versions == ())  # removed: none
        with pytest.raises(UnknownQueue):
            await engine.enqueue("orders", {})
        folder.mkdir()
        (folder / "orders.py").write_text(flow_source("v2"))
        await events.expect(WorkflowReloaded, lambda e: e.versions != ())
        run = await engine.wait_for_job(await engine.enqueue("orders", {}), timeout=TIMEOUT)
        assert run.output == {"label": "v2"}
