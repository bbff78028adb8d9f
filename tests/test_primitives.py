"""Flow-control steps on the SQLite store: for_each, loop, switch, try_catch, subworkflow and the
middleware chain, including waits inside them that resume after a restart."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from engine import (
    Engine,
    ForEach,
    Loop,
    RunStatus,
    RunStatusChanged,
    Step,
    StepStatus,
    Subworkflow,
    Switch,
    TryCatch,
    WorkerTrigger,
    Workflow,
    WorkflowDefinitionError,
    for_each,
    loop,
    subworkflow,
    switch,
    try_catch,
    wait,
)
from engine.models import Run

pytestmark = pytest.mark.anyio


def flow(name: str, *steps: Any, **options: Any) -> Workflow:
    trigger = options.pop("trigger", {})
    return Workflow(
        name=name, trigger=WorkerTrigger(queue=name, **trigger), steps=list(steps), **options
    )


def nested(run: Run, parent: str) -> list[tuple[str, list[str], str]]:
    """(name, tags, status) of the records directly under the step named `parent`."""
    index = run.step(parent).index
    return [(s.name, s.tags, str(s.status)) for s in run.steps if s.parent == index]


async def until_status(engine: Engine, run_id: str, status: str) -> None:
    """Return once the run reports `status`: subscribed first, so the change cannot slip by."""
    with anyio.fail_after(10):
        async with engine.bus.subscribe() as events:
            if str((await engine.get_run(run_id)).status) == status:
                return
            async for event in events:
                if (
                    isinstance(event, RunStatusChanged)
                    and event.run_id == run_id
                    and event.status == status
                ):
                    return


async def test_for_each_runs_steps_per_item_with_nested_records(tmp_path: Path) -> None:
    async def double(ctx, n: int) -> int:
        ctx.logger.info("doubling %d", n)
        return n * 2

    wf = flow(
        "nums",
        for_each(
            "each",
            "$.body.items",
            steps=[
                Step("double", double, inputs={"n": "$.state.each.item"}),
                Step("plus_index", lambda ctx: ctx.state["double"] + ctx.state["each"]["index"]),
            ],
        ),
        Step("total", lambda ctx: sum(ctx.state["each"])),
    )
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        job = await engine.enqueue("nums", {"items": [1, 2, 3]})
        run = await engine.wait_for_job(job, timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.step("each").output == [2, 5, 8]
    assert run.output == 15
    under = nested(run, "each")
    assert [(n, t) for n, t, _ in under] == [
        ("double", ["iteration 1"]),
        ("plus_index", ["iteration 1"]),
        ("double", ["iteration 2"]),
        ("plus_index", ["iteration 2"]),
        ("double", ["iteration 3"]),
        ("plus_index", ["iteration 3"]),
    ]
    assert all(status == "completed" for _, _, status in under)
    logs = [line.message for s in run.steps if s.name == "double" for line in s.logs]
    assert logs == ["doubling 1", "doubling 2", "doubling 3"]


async def test_parallel_for_each_keeps_to_its_limit(tmp_path: Path) -> None:
    running = 0
    peak = 0

    async def work(ctx, n: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.02)
        running -= 1
        return n * n

    wf = flow(
        "squares",
        for_each(
            "each",
            "$.body",
            steps=[Step("square", work, inputs={"n": "$.state.each.item"})],
            parallel=3,
        ),
    )
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("squares", list(range(10))), 10)
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.output == [n * n for n in range(10)]
    assert peak == 3


async def test_failure_inside_for_each_names_the_inner_step(tmp_path: Path) -> None:
    def check(ctx, n: int) -> int:
        if n == 2:
            raise ValueError(f"item {n} is bad")
        return n

    wf = flow(
        "checks",
        for_each("each", "$.body", steps=[Step("check", check, inputs={"n": "$.state.each.item"})]),
    )
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("checks", [1, 2, 3]), 10)
    assert run.status is RunStatus.FAILED
    assert run.error_step == "check"
    assert "[step 1/1] each[2/3] › check failed: item 2 is bad" in (run.error or "")
    assert [status for _, _, status in nested(run, "each")] == ["completed", "failed"]
    assert run.step("each").status is StepStatus.FAILED


async def test_loop_until_and_max_iterations(tmp_path: Path) -> None:
    def tick(ctx) -> int:
        return ctx.state["poll"]["iteration"] + 1

    polls = flow(
        "polls",
        loop("poll", steps=[Step("tick", tick)], until=lambda ctx: ctx.state["tick"] >= 3),
    )
    endless = flow(
        "endless",
        loop(
            "spin", steps=[Step("turn", lambda ctx: 1)], while_=lambda ctx: True, max_iterations=4
        ),
    )
    async with Engine(workflows=[polls, endless], database=tmp_path / "blok.db") as engine:
        done = await engine.wait_for_job(await engine.enqueue("polls", {}), 10)
        stuck = await engine.wait_for_job(await engine.enqueue("endless", {}), 10)
    assert done.status is RunStatus.COMPLETED, done.error
    assert done.output == 3
    assert [t for _, t, _ in nested(done, "poll")] == [[f"iteration {i}"] for i in (1, 2, 3)]
    assert stuck.status is RunStatus.FAILED
    assert "max_iterations=4" in (stuck.error or "")
    assert len(nested(stuck, "spin")) == 4


async def test_a_flow_steps_own_failure_names_its_file_and_line(tmp_path: Path) -> None:
    """A node's failure ends "(at workflows/x.py:12)"; a for_each whose items were no list, a
    loop out of iterations or with a condition that raised said no file or line."""
    here = Path(__file__).resolve().relative_to(Path.cwd().resolve())  # as the engine says it

    def line_of(text: str) -> int:
        lines = Path(__file__).read_text().splitlines()
        return next(n for n, line in enumerate(lines, 1) if text in line)

    def never(ctx: Any) -> bool:
        return False

    def missing(ctx: Any) -> bool:
        return bool(ctx.state["nope"])  # raises KeyError

    turn = [Step("turn", lambda ctx: 1)]
    not_a_list = flow("not_a_list", for_each("each", "$.body.items", steps=[Step("s", print)]))
    endless = flow("spins", loop("spin", steps=turn, until=never, max_iterations=2))
    raising = flow("raising", loop("spin", steps=turn, while_=missing))
    flows = [not_a_list, endless, raising]
    async with Engine(workflows=flows, database=tmp_path / "blok.db") as engine:
        errors = {}
        for name, body in (("not_a_list", {"items": "abc"}), ("spins", {}), ("raising", {})):
            run = await engine.wait_for_job(await engine.enqueue(name, body), 10)
            assert run.status is RunStatus.FAILED, run.error
            errors[name] = run.error or ""
    defined = line_of('flow("not_a_list", for_each(')
    assert errors["not_a_list"].endswith(f"items must be a list, not str (at {here}:{defined})")
    defined = line_of('flow("spins", loop(')
    assert errors["spins"].endswith(f"max_iterations=2 (at {here}:{defined})"), errors
    raised = line_of("# raises KeyError")  # the user's line that raised, not the definition
    assert errors["raising"].endswith(
        f"MissingStateKey: ctx.state has no 'nope': no step has put anything in it yet "
        f"(at {here}:{raised})"
    ), errors


async def test_a_key_ctx_state_lacks_is_said_with_the_keys_it_has(tmp_path: Path) -> None:
    # A step's name mistyped in a loop's `until` or read by a node failed the run with
    # "KeyError: 'chek'", and nothing said which names there were.
    async def check(ctx: Any) -> dict[str, bool]:
        return {"ready": True}

    async def read(ctx: Any) -> Any:
        assert ctx.state.get("chek") is None and "chek" not in ctx.state  # a dict's, as ever
        try:
            ctx.state["chek"]
        except KeyError as error:  # what a node that looks before it leaps catches
            assert error.args == ("chek",)
        return ctx.state["chek"]["ready"]

    polls = flow(
        "polls",
        loop(
            "poll",
            steps=[Step("check", check)],
            until=lambda ctx: ctx.state["chek"]["ready"],
            max_iterations=3,
        ),
    )
    reads = flow("reads", Step("check", check), Step("read", read))
    async with Engine(workflows=[polls, reads], database=tmp_path / "blok.db") as engine:
        errors = {}
        for name in ("polls", "reads"):
            run = await engine.wait_for_job(await engine.enqueue(name, {}), 10)
            assert run.status is RunStatus.FAILED, run.error
            errors[name] = run.error or ""
    polled = "ctx.state has no 'chek' (it has 'poll', 'check'); did you mean 'check'?"
    assert f"until condition raised MissingStateKey: {polled}" in errors["polls"], errors
    read = "ctx.state has no 'chek' (it has 'check'); did you mean 'check'?"
    assert f"read failed: MissingStateKey: {read}" in errors["reads"], errors


async def test_switch_picks_the_case_or_the_default(tmp_path: Path) -> None:
    wf = flow(
        "route",
        switch(
            "by_kind",
            on="$.body.kind",
            cases={
                "refund": [Step("refund", lambda ctx: "refunded")],
                "charge": [Step("charge", lambda ctx: "charged")],
            },
            default=[Step("ignore", lambda ctx: "ignored")],
        ),
    )
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        charge = await engine.wait_for_job(await engine.enqueue("route", {"kind": "charge"}), 10)
        other = await engine.wait_for_job(await engine.enqueue("route", {"kind": "gift"}), 10)
    assert charge.output == "charged"
    assert nested(charge, "by_kind") == [("charge", ["case charge"], "completed")]
    assert charge.step("by_kind").input["case"] == "charge"
    assert other.output == "ignored"
    assert nested(other, "by_kind") == [("ignore", ["default"], "completed")]


def switch_class_with_empty_default() -> Workflow:
    """The class written as the user's files write it, `Switch(..., default=[])`."""
    return flow(
        "quiet.class",
        Switch("by_kind", on="$.body.kind", cases={"a": [Step("a", lambda ctx: 1)]}, default=[]),
    )


async def test_a_value_no_case_matches_without_a_default_is_said_in_the_runs_log(
    tmp_path: Path,
) -> None:
    """A typo in the value a switch reads ran nothing and the run completed without a word.
    An empty default given (`default=[]`, nothing is to run) is no typo: it is not warned of
    (it was, each run, as "there is no default")."""

    def routing(name: str, **default: Any) -> Workflow:
        return flow(
            name,
            Step("first", lambda ctx: "ok"),
            switch(
                "by_kind",
                on="$.body.kind",
                cases={"refund": [Step("refund", lambda ctx: "refunded")]},
                **default,
            ),
        )

    workflows = [routing("route"), routing("quiet", default=[]), switch_class_with_empty_default()]
    async with Engine(workflows=workflows, database=tmp_path / "blok.db") as engine:
        typo = await engine.wait_for_job(await engine.enqueue("route", {"kind": "refnd"}), 10)
        right = await engine.wait_for_job(await engine.enqueue("route", {"kind": "refund"}), 10)
        quiet = [
            await engine.wait_for_job(await engine.enqueue(queue, {"kind": "other"}), 10)
            for queue in ("quiet", "quiet.class")
        ]
    assert [run.status for run in quiet] == [RunStatus.COMPLETED] * 2
    assert [line.message for run in quiet for line in run.logs] == []
    assert typo.status is RunStatus.COMPLETED, typo.error
    said = [(line.level, line.message) for line in typo.logs if line.step is None]
    assert said == [
        (
            "warning",
            "[step 2/2] by_kind: 'refnd' matched no case ('refund') and there is no default: "
            "nothing ran (default=[] says nothing is to)",
        )
    ]
    assert not [line for line in right.logs if "matched no case" in line.message]


async def test_try_catch_hands_the_error_and_failing_step_to_catch(tmp_path: Path) -> None:
    def charge(ctx) -> None:
        raise ConnectionError("card declined")

    wf = flow(
        "safe",
        try_catch(
            "guarded",
            try_=[Step("prepare", lambda ctx: "ok"), Step("charge", charge)],
            catch=[
                Step(
                    "report",
                    lambda ctx, error, step: f"{step}: {error}",
                    inputs={"error": "$.state.guarded.error", "step": "$.state.guarded.step"},
                )
            ],
        ),
        Step("after", lambda ctx: ctx.state["guarded"]),
    )
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("safe", {}), 10)
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.output == "charge: card declined"
    assert nested(run, "guarded") == [
        ("prepare", ["try"], "completed"),
        ("charge", ["try"], "failed"),
        ("report", ["catch"], "completed"),
    ]
    assert run.step("guarded").input["caught"]["type"] == "ConnectionError"


async def test_restart_mid_wait_inside_for_each_inside_switch(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []

    def before(ctx, item: str) -> str:
        calls.append(("before", ctx.state["each"]["index"]))
        return item.upper()

    def after(ctx) -> str:
        calls.append(("after", ctx.state["each"]["index"]))
        return f"{ctx.state['before']}!"

    wf = flow(
        "batch",
        Step("start", lambda ctx: calls.append(("start", 0)) or "started"),
        switch(
            "route",
            on="$.body.kind",
            cases={
                "bulk": [
                    for_each(
                        "each",
                        "$.body.items",
                        steps=[
                            Step("before", before, inputs={"item": "$.state.each.item"}),
                            wait.for_("1s"),
                            Step("after", after),
                        ],
                    )
                ]
            },
        ),
        Step("finish", lambda ctx: ctx.state["route"]),
    )
    db = tmp_path / "blok.db"
    async with Engine(workflows=[wf], database=db) as engine:
        job = await engine.enqueue("batch", {"kind": "bulk", "items": ["a", "b"]})
        run_id = (await engine.get_job(job)).run_id
        await until_status(engine, run_id, "waiting")
        first = await engine.get_run(run_id)
    assert first.cursor == [1, 0, 0, 0, 1]  # route → case bulk → each → iteration 1 → wait
    assert calls == [("start", 0), ("before", 0)]

    async with Engine(workflows=[wf], database=db) as engine:
        run = await engine.wait_for_job(job, timeout=15)
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.output == ["A!", "B!"]
    # Nothing before the wait ran again, each iteration resumed where it stopped.
    assert calls == [
        ("start", 0),
        ("before", 0),
        ("after", 0),
        ("before", 1),
        ("after", 1),
    ]
    each = run.step("each")
    assert each.parent == run.step("route").index
    assert each.tags == ["case bulk"]
    assert [(n, t) for n, t, _ in nested(run, "each")] == [
        ("before", ["iteration 1"]),
        ("each_wait_2", ["iteration 1"]),
        ("after", ["iteration 1"]),
        ("before", ["iteration 2"]),
        ("each_wait_2", ["iteration 2"]),
        ("after", ["iteration 2"]),
    ]


async def test_wait_inside_parallel_for_each_resumes_unfinished_iterations(
    tmp_path: Path,
) -> None:
    calls: list[int] = []

    def mark(ctx, n: int) -> int:
        calls.append(n)
        return n

    wf = flow(
        "fan",
        for_each(
            "each",
            "$.body",
            steps=[
                Step("mark", mark, inputs={"n": "$.state.each.item"}),
                wait.for_("200ms"),
                Step("done", lambda ctx: ctx.state["mark"] * 10),
            ],
            parallel=2,
        ),
    )
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("fan", [1, 2, 3]), 10)
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.output == [10, 20, 30]
    assert sorted(calls) == [1, 2, 3]


async def test_subworkflow_waits_for_the_child_and_uses_its_output(tmp_path: Path) -> None:
    child = flow(
        "child", Step("price", lambda ctx, qty: {"total": qty * 3}, inputs={"qty": "$.body.qty"})
    )
    parent = flow(
        "parent",
        subworkflow("quote", workflow="child", input=lambda ctx: {"qty": ctx.body["n"]}),
        subworkflow("audit", workflow="child", input={"qty": 1}, wait=False),
        Step("use", lambda ctx: ctx.state["quote"]["total"]),
    )
    async with Engine(workflows=[child, parent], database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("parent", {"n": 4}), 10)
        assert run.status is RunStatus.COMPLETED, run.error
        assert run.output == 12
        quote = run.step("quote")
        assert quote.tags == ["sub"]
        child_run = await engine.get_run(quote.child_run_id or "")
        assert child_run.parent_run_id == run.id
        assert child_run.depth == 1
        assert child_run.output == {"total": 12}
        audit = run.step("audit")
        assert audit.tags == ["async"]
        assert audit.output["run_id"] == audit.child_run_id
        detached = await engine.wait_for_job(audit.output["job_id"], 10)
        assert detached.parent_run_id == run.id


async def test_failed_child_fails_the_parent_step(tmp_path: Path) -> None:
    def boom(ctx) -> None:
        raise RuntimeError("child broke")

    child = flow("child", Step("boom", boom))
    parent = flow("parent", subworkflow("call", workflow="child"))
    async with Engine(workflows=[child, parent], database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("parent", {}), 10)
    assert run.status is RunStatus.FAILED
    assert run.error_step == "call"
    assert "ended failed" in (run.error or "") and "child broke" in (run.error or "")


async def test_subworkflow_follows_the_childs_job_through_a_retry(tmp_path: Path) -> None:
    def flaky(ctx) -> str:
        if ctx.params["attempt"] == 1:
            raise ConnectionError("first delivery fails")
        return "second delivery"

    child = flow("child", Step("flaky", flaky), trigger={"retries": 1, "delay": "20ms"})
    parent = flow("parent", subworkflow("call", workflow="child"))
    async with Engine(workflows=[child, parent], database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("parent", {}), 10)
        final_child = await engine.get_run(run.step("call").child_run_id or "")
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.output == "second delivery"
    assert final_child.job_attempt == 2
    assert final_child.parent_run_id == run.id


async def test_cancelling_a_parent_cancels_its_waiting_child(tmp_path: Path) -> None:
    release = anyio.Event()

    async def slow(ctx) -> str:
        await release.wait()
        return "late"

    child = flow("child", Step("slow", slow))
    parent = flow("parent", subworkflow("call", workflow="child"))
    async with Engine(workflows=[child, parent], database=tmp_path / "blok.db") as engine:
        job = await engine.enqueue("parent", {})
        run_id = (await engine.get_job(job)).run_id
        await until_status(engine, run_id, "waiting")
        parent_run = await engine.get_run(run_id)
        child_id = parent_run.step("call").child_run_id or ""
        cancelled = await engine.cancel(run_id)
        assert cancelled.status is RunStatus.CANCELLED
        child_run = await engine.get_run(child_id)
        assert child_run.status is RunStatus.CANCELLED
        release.set()
    # The operator cancelled the parent only: the child said "cancelled by operator".
    assert cancelled.error == "cancelled by operator"
    assert (child_run.error or "").startswith(f"cancelled with its parent run {run_id} (stopped at")


async def test_a_child_not_started_is_cancelled_with_its_parent_and_a_detached_one_is_not(
    tmp_path: Path,
) -> None:
    child = flow("child", Step("work", lambda ctx: "done"))
    parent = flow(
        "parent",
        subworkflow("later", workflow="child", wait=False),
        subworkflow("call", workflow="child"),
    )
    async with Engine(workflows=[child, parent], database=tmp_path / "blok.db") as engine:
        await engine.pause("child")  # its children wait in their queue
        run_id = (await engine.get_job(await engine.enqueue("parent", {}))).run_id
        await until_status(engine, run_id, "waiting")
        waiting = await engine.get_run(run_id)
        waited, detached = waiting.step("call").child_run_id, waiting.step("later").child_run_id
        await engine.cancel(run_id)
        child_run = await engine.get_run(waited or "")
        assert child_run.status is RunStatus.CANCELLED
        assert child_run.error == f"cancelled with its parent run {run_id}"
        assert (await engine.get_run(detached or "")).status is RunStatus.QUEUED  # it goes on
        cancelled = await engine.cancel(detached or "")
    assert cancelled.error == "cancelled by operator before it ran"


async def test_a_stopped_child_whose_parent_cannot_be_read_is_recorded_cancelled_all_the_same(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its worker reads the parent for the error's words: the database out of reach then, the
    operator's words, in a warning's one line, and the cancel recorded as it would have been."""
    from pg import drop_under_its_users, fresh_database

    from engine.backends import open_backend
    from engine.parents import why_cancelled

    caplog.set_level("WARNING", logger="blok.worker")
    child = Run(
        id="run_child",
        workflow_name="child",
        workflow_version="v",
        queue="child",
        job_id="job_child",
        status=RunStatus.RUNNING,
        created_at=datetime.now(UTC),
        parent_run_id="run_parent",
    )
    async with fresh_database() as url, open_backend(url) as backend:
        await drop_under_its_users(url)
        assert await why_cancelled(backend, child) == "cancelled by operator"
    [said] = [r for r in caplog.records if r.name == "blok.worker"]
    assert said.exc_info is None
    assert said.getMessage().startswith("run run_child: its parent could not be read ("), said


async def test_middleware_chain_runs_in_order_on_the_same_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLOK_GLOBAL_MIDDLEWARE", "trace")

    def mw(name: str) -> Workflow:
        return Workflow(
            name=name,
            middleware=True,
            steps=[Step(f"{name}_step", lambda ctx: ctx.state.setdefault("seen", []).append(name))],
        )

    def deny(ctx) -> None:
        raise PermissionError("no token")

    main = flow(
        "main",
        Step("work", lambda ctx: list(ctx.state["seen"])),
        use=["auth"],
        trigger={"middleware": ["audit"]},
    )
    guarded = flow("guarded", Step("never", lambda ctx: "ran"), use=["deny"])
    denier = Workflow(name="deny", middleware=True, steps=[Step("check", deny)])
    workflows = [mw("trace"), mw("auth"), mw("audit"), denier, main, guarded]
    async with Engine(workflows=workflows, database=tmp_path / "blok.db") as engine:
        ok = await engine.wait_for_job(await engine.enqueue("main", {}), 10)
        denied = await engine.wait_for_job(await engine.enqueue("guarded", {}), 10)
    assert ok.status is RunStatus.COMPLETED, ok.error
    assert ok.output == ["trace", "auth", "audit"]
    tagged = [(s.name, s.tags) for s in ok.steps if s.tags]
    assert tagged == [
        ("trace_step", ["mw:trace"]),
        ("auth_step", ["mw:auth"]),
        ("audit_step", ["mw:audit"]),
    ]
    assert denied.status is RunStatus.FAILED
    assert "no token" in (denied.error or "")
    assert denied.step("check").tags == ["mw:deny"]
    assert denied.step("never").status is StepStatus.PENDING


def test_nested_names_and_expressions_are_checked_at_definition() -> None:
    with pytest.raises(WorkflowDefinitionError, match="'twice' is used twice"):
        flow(
            "dupes",
            Step("twice", lambda ctx: 1),
            for_each("each", [1], steps=[Step("twice", lambda ctx: 2)]),
        )
    with pytest.raises(WorkflowDefinitionError, match=r"refers to step 'later'"):
        flow(
            "order",
            switch("s", on="$.state.later", cases={"a": [Step("a", lambda ctx: 1)]}),
            Step("later", lambda ctx: 2),
        )
    with pytest.raises(WorkflowDefinitionError, match="exactly one of while_= or until="):
        loop("l", steps=[Step("x", lambda ctx: 1)])
    with pytest.raises(WorkflowDefinitionError, match="step 'each'"):
        for_each("each", "$.nowhere.items", steps=[Step("x", lambda ctx: 1)])


def test_a_flow_step_class_takes_its_name_first_as_step_does() -> None:
    # `ForEach("each", items=..., steps=[...])`, written as `Step("charge", charge)` is, failed
    # the workflow file with "TypeError: _Primitive.__init__() takes 1 positional argument but
    # 2 were given": the engine's insides, not the user's call.
    inner = [Step("x", lambda ctx: 1)]
    made = [
        ForEach("each", items="$.body.items", steps=inner),
        Loop("poll", steps=inner, until=lambda ctx: True),
        Switch("route", on="$.body.kind", cases={"a": inner}),
        TryCatch("safe", try_=inner),
        Subworkflow("kid", workflow="billing.refund"),
    ]
    assert [step.name for step in made] == ["each", "poll", "route", "safe", "kid"]
    assert made[0].fingerprint() == for_each("each", "$.body.items", steps=inner).fingerprint()
    with pytest.raises(WorkflowDefinitionError, match="step 'each': steps: Field required"):
        ForEach("each", items="$.body.items")


async def test_a_mistyped_sub_workflow_or_middleware_is_warned_of_at_load_and_in_the_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sub-workflow or middleware named with a typo was found only in a failed run's error,
    "workflow 'billing.refnd' is not loaded", with no word of the name meant."""
    refund = flow("billing.refund", Step("refund", lambda ctx: "refunded"))
    audit = Workflow(name="audit", middleware=True, steps=[Step("log", lambda ctx: "seen")])
    parent = flow("parent", subworkflow("kid", workflow="billing.refnd"))
    guarded = flow("guarded", Step("never", lambda ctx: "ran"), use=["audti"])
    right = flow("right", subworkflow("kid", workflow="billing.refund"), use=["audit"])
    plain = flow("plain", Step("never", lambda ctx: "ran"), use=["billing.refund"])
    caplog.set_level("WARNING", logger="blok.catalog")
    workflows = [refund, audit, parent, guarded, right, plain]
    async with Engine(workflows=workflows, database=tmp_path / "blok.db") as engine:
        ok = await engine.wait_for_job(await engine.enqueue("right", {}), 10)
        kid = await engine.wait_for_job(await engine.enqueue("parent", {}), 10)
        mw = await engine.wait_for_job(await engine.enqueue("guarded", {}), 10)
    warned = [r.getMessage() for r in caplog.records if r.name == "blok.catalog"]
    here = f"{Path(__file__).relative_to(Path.cwd())}:"
    assert [line.split(": ", 1)[1] for line in warned] == [
        "workflow 'parent': subworkflow step 'kid' names 'billing.refnd', which no loaded "
        "workflow is: its runs fail at that step; did you mean 'billing.refund'?",
        "workflow 'guarded': middleware names 'audti', which no loaded workflow is: its runs "
        "fail before their first step; did you mean 'audit'?",
        "workflow 'plain': middleware names 'billing.refund', not middleware=True: its runs "
        "fail before their first step",
    ], warned
    # Each where its step or workflow was written: this file, at a line.
    assert all(re.match(re.escape(here) + r"\d+: ", line) for line in warned), warned
    assert ok.status is RunStatus.COMPLETED, ok.error
    assert (kid.error or "").startswith(
        "[step 1/1] kid failed: workflow 'billing.refnd' is not loaded; did you mean "
        "'billing.refund'? (at "
    ), kid.error
    assert (mw.error or "").startswith(
        "[middleware audti] failed: workflow 'audti' is not loaded; did you mean 'audit'?"
    ), mw.error


async def test_waits_inside_loop_try_catch_and_middleware_resume(tmp_path: Path) -> None:
    calls: list[str] = []

    def probe(ctx) -> int:
        calls.append(f"probe {ctx.state['poll']['iteration']}")
        return ctx.state["poll"]["iteration"]

    def fail(ctx) -> None:
        raise TimeoutError("upstream slow")

    gate = Workflow(
        name="gate",
        middleware=True,
        steps=[
            Step("greet", lambda ctx: calls.append("greet")),
            wait.for_("50ms", name="gate_pause"),
            for_each(
                "gate_each", [1, 2], steps=[Step("gate_item", lambda ctx: calls.append("mw item"))]
            ),
        ],
    )
    wf = flow(
        "mixed",
        loop(
            "poll",
            steps=[Step("probe", probe), wait.for_("50ms")],
            until=lambda ctx: ctx.state["probe"] >= 2,
        ),
        try_catch(
            "guard",
            try_=[Step("call", fail)],
            catch=[wait.for_("50ms"), Step("fallback", lambda ctx: ctx.state["guard"]["step"])],
        ),
        use=["gate"],
    )
    async with Engine(workflows=[gate, wf], database=tmp_path / "blok.db") as engine:
        run = await engine.wait_for_job(await engine.enqueue("mixed", {}), 15)
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.output == "call"
    assert calls == ["greet", "mw item", "mw item", "probe 0", "probe 1", "probe 2"]
    assert [t for _, t, _ in nested(run, "poll")] == [
        [f"iteration {i}"] for i in (1, 1, 2, 2, 3, 3)
    ]
    assert run.step("gate_pause").tags == ["mw:gate"]
    assert nested(run, "guard")[-1] == ("fallback", ["catch"], "completed")
