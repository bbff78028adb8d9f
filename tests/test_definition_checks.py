"""Mistakes in a workflow's definition that used to be found only when a run reached them: a
`$.params` key no run has, a `wait.until` moment nothing can read, a `$.state` read of a step
that never keeps an output, a "$body.x" meant as "$.body.x", a Retry whose min_timeout is
above its max_timeout. Each is refused when the workflow is defined (its file loads), in
one line naming the step, and the file and line where it was written."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engine import (
    Debounce,
    Engine,
    RateLimit,
    Retry,
    RunStatus,
    Schedule,
    Step,
    Switch,
    WorkerTrigger,
    Workflow,
    WorkflowDefinitionError,
    wait,
)
from engine.durations import parse_duration
from engine.primitives import for_each, subworkflow, switch

pytestmark = pytest.mark.anyio

PARAMS_KEYS = "queue, job_id, attempt, priority"
UNTIL_FORMS = (
    "a datetime, an ISO 8601 string ('2026-12-02T15:00:00Z'), epoch milliseconds "
    "(1764687600000) or a $.expression ('$.body.ship_at')"
)

GOOD_FILE = """
from engine import Step, WorkerTrigger, Workflow


async def echo(ctx):
    return ctx.body


workflow = Workflow(name="good", trigger=WorkerTrigger(queue="good"), steps=[Step("echo", echo)])
"""


async def echo(ctx: Any, **inputs: Any) -> Any:
    return inputs or ctx.body


def flow(*steps: Any, **options: Any) -> Workflow:
    return Workflow(name="w", trigger=WorkerTrigger(queue="w"), steps=list(steps), **options)


async def load_errors(folder: Path, name: str, source: str) -> tuple[str, dict[str, str]]:
    """Write a workflow file next to a good one and start an engine on the folder: the file's
    key in reload_errors, and reload_errors once the good file is served."""
    path = folder / name
    path.write_text(textwrap.dedent(source).lstrip())
    (folder / "good.py").write_text(GOOD_FILE)
    async with Engine(workflows=folder, database=None) as engine:
        run = await engine.wait_for_job(await engine.enqueue("good", {}), timeout=10)
        assert run.status is RunStatus.COMPLETED, run.error
        return str(path.resolve()), dict(engine.reload_errors)


# ---- $.params --------------------------------------------------------------------------------
async def test_a_params_key_no_run_has_is_refused_and_the_four_it_has_are_read() -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        Step("a", echo, inputs={"x": "$.params.nope"})
    assert str(refused.value) == (
        f"step 'a': expression '$.params.nope': $.params has no key 'nope'; its keys are "
        f"{PARAMS_KEYS}"
    )
    with pytest.raises(WorkflowDefinitionError) as typo:
        Step("a", echo, inputs={"x": "$.params.atempt"})
    assert str(typo.value).endswith(f"its keys are {PARAMS_KEYS}; did you mean '$.params.attempt'?")

    reads = {key: f"$.params.{key}" for key in ("queue", "job_id", "attempt", "priority")}
    whole = flow(Step("read", echo, inputs={**reads, "all": "$.params"}))
    async with Engine(workflows=[whole], database=None) as engine:
        job_id = await engine.enqueue("w", {}, priority=3, job_id="J1")
        run = await engine.wait_for_job(job_id, timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    params = {"queue": "w", "job_id": "J1", "attempt": 1, "priority": 3}
    assert run.output == {**params, "all": params}


def _switched(on: str) -> Any:
    return switch("route", on=on, cases={"a": [Step("a", echo)]})


@pytest.mark.parametrize(
    ("define", "says"),
    [
        (lambda: for_each("each", "$.params.items", steps=[Step("a", echo)]), "step 'each': "),
        (lambda: _switched("$.params.kind"), "step 'route': "),
        (lambda: subworkflow("kid", workflow="other", input="$.params.x"), "step 'kid': "),
        (lambda: WorkerTrigger(queue="q", concurrency_key="$.params.x"), "WorkerTrigger."),
        (lambda: Debounce(key="$.params.x"), "Debounce: "),
        (lambda: RateLimit(limit=1, period="1s", key="$.params.x"), "RateLimit.key: "),
        (lambda: Step("a", echo, idempotency_key="$.params.x"), "step 'a': "),
    ],
    ids=["for_each", "switch", "subworkflow", "concurrency_key", "debounce", "rate_limit", "key"],
)
def test_a_params_key_no_run_has_is_refused_wherever_an_expression_goes(
    define: Any, says: str
) -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        define()
    assert says in str(refused.value)
    assert "$.params has no key" in str(refused.value)
    assert str(refused.value).endswith(f"its keys are {PARAMS_KEYS}")


def test_a_params_key_in_a_wait_until_is_refused_at_the_wait() -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        flow(Step("a", echo), wait.until("$.params.when", name="later"))
    assert str(refused.value) == (
        f"step 'later': expression '$.params.when': $.params has no key 'when'; its keys are "
        f"{PARAMS_KEYS}"
    )


@pytest.mark.parametrize(
    ("expr", "says"),
    [
        ("$.params.queue.name", "$.params.queue is a string, it has no field 'name'; use "),
        ("$.params.attempt.0", "$.params.attempt is a number, it has no field '0'; use "),
        ("$.run_id.short", "$.run_id is a string, it has no field 'short'; use $.run_id itself"),
        ("$.attempt.n", "$.attempt is a number, it has no field 'n'; use $.attempt itself"),
    ],
)
def test_a_field_below_a_str_or_an_int_is_refused(expr: str, says: str) -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        Step("a", echo, inputs={"x": expr})
    assert str(refused.value).startswith(f"step 'a': expression {expr!r}: {says}")


async def load_step_b(
    folder: Path, name: str, inputs: dict[str, str]
) -> tuple[str, dict[str, str]]:
    """`load_errors` of a file `name`.py whose workflow `name` has a step "a", then a step "b"
    with these `inputs`, on line 8."""
    return await load_errors(
        folder,
        f"{name}.py",
        f"""
        from engine import Step, WorkerTrigger, Workflow

        workflow = Workflow(
            name="{name}",
            trigger=WorkerTrigger(queue="{name}"),
            steps=[
                Step("a", print),
                Step("b", print, inputs={inputs!r}),
            ],
        )
        """,
    )


async def test_a_params_key_in_a_file_names_the_steps_line(tmp_path: Path) -> None:
    key, errors = await load_step_b(tmp_path, "params", {"x": "$.params.nope"})
    assert errors == {
        key: f"{key}:8: WorkflowDefinitionError: step 'b': expression '$.params.nope': $.params "
        f"has no key 'nope'; its keys are {PARAMS_KEYS}"
    }


# ---- wait.until ------------------------------------------------------------------------------
@pytest.mark.parametrize("moment", ["yesterday", "next tuesday", "2026-13-45", "$when", ""])
def test_a_wait_until_string_nothing_reads_is_refused_saying_what_is_read(moment: str) -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        wait.until(moment)
    assert str(refused.value) == f"wait.until: {moment!r} is not a moment; use {UNTIL_FORMS}"
    with pytest.raises(WorkflowDefinitionError) as named:
        wait.until(moment, name="later")
    assert str(named.value) == (
        f"step 'later': wait.until: {moment!r} is not a moment; use {UNTIL_FORMS}"
    )


@pytest.mark.parametrize("moment", [10**20, float("inf"), "99999999999999999999"])
def test_epoch_milliseconds_past_any_date_are_refused(moment: Any) -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        wait.until(moment)
    assert str(refused.value).startswith(f"wait.until: {moment!r} ")


def test_every_form_a_run_reads_is_kept() -> None:
    kept = [
        datetime(2026, 12, 2, 15, tzinfo=UTC),
        datetime(2026, 12, 2, 15),
        "2026-12-02T15:00:00Z",
        " 2026-12-02T15:00:00+01:00 ",
        "2026-12-02",
        1764687600000,
        1764687600000.5,
        "1764687600000",
        "$.body.ship_at",
    ]
    steps = [wait.until(moment) for moment in kept]
    assert [step.until for step in steps] == kept
    with pytest.raises(WorkflowDefinitionError) as refused:  # beside them, one nothing reads
        wait.until("tomorrow-ish")
    assert str(refused.value).startswith("wait.until: 'tomorrow-ish' is not a moment; use ")


async def test_a_bad_wait_until_in_a_file_names_the_waits_line(tmp_path: Path) -> None:
    key, errors = await load_errors(
        tmp_path,
        "until.py",
        """
        from engine import Step, WorkerTrigger, Workflow, wait

        workflow = Workflow(
            name="until",
            trigger=WorkerTrigger(queue="until"),
            steps=[
                Step("a", print),
                wait.until("yesterday"),
            ],
        )
        """,
    )
    assert errors == {
        key: f"{key}:8: WorkflowDefinitionError: wait.until: 'yesterday' is not a moment; use "
        f"{UNTIL_FORMS}"
    }


# ---- $.state of a step that never keeps an output ----------------------------------------------
WAITS_KEEP_NOTHING = "a wait.for_ or wait.until keeps no output; a wait.for_event keeps its payload"


@pytest.mark.parametrize(
    ("before", "read", "why"),
    [
        ([wait.for_("1s")], "$.state.wait_2", WAITS_KEEP_NOTHING),
        ([wait.for_("1s", name="nap")], "$.state.nap.waited_until", WAITS_KEEP_NOTHING),
        ([wait.until("$.body.when", name="nap")], "$.state.nap", WAITS_KEEP_NOTHING),
        ([Step("off", echo, active=False)], "$.state.off", "active=False: it never runs"),
    ],
    ids=["unnamed-wait", "named-wait", "wait-until", "switched-off"],
)
def test_a_state_read_of_a_step_that_keeps_nothing_is_refused(
    before: list[Any], read: str, why: str
) -> None:
    target = read.split(".")[2]
    with pytest.raises(WorkflowDefinitionError) as refused:
        flow(Step("a", echo), *before, Step("b", echo, inputs={"x": read}))
    assert str(refused.value) == (
        f"workflow 'w', step 'b': {read} reads step {target!r}, whose output is not kept in "
        f"ctx.state ({why})"
    )


async def test_a_state_read_of_a_switched_off_step_in_a_file_names_the_readers_line(
    tmp_path: Path,
) -> None:
    key, errors = await load_errors(
        tmp_path,
        "off.py",
        """
        from engine import Step, WorkerTrigger, Workflow

        workflow = Workflow(
            name="off",
            trigger=WorkerTrigger(queue="off"),
            steps=[
                Step("off", print, active=False),
                Step("b", print, inputs={"x": "$.state.off"}),
            ],
        )
        """,
    )
    assert errors == {
        key: f"{key}:8: WorkflowDefinitionError: workflow 'off', step 'b': $.state.off reads "
        "step 'off', whose output is not kept in ctx.state (active=False: it never runs)"
    }


async def test_state_reads_that_a_run_can_answer_are_kept() -> None:
    """Event waits, sub-workflows, a key another step puts there and middleware steps (run on
    the same context before the workflow's own) do land in ctx.state."""
    child = Workflow(name="child", steps=[Step("c", lambda ctx: "from child")])
    auth = Workflow(name="auth", middleware=True, steps=[Step("login", lambda ctx: "ann")])
    parent = flow(
        subworkflow("kid", workflow="child"),
        wait.for_event("approved", timeout="1ms", name="approval"),
        Step("off", echo, active=False),
        Step("other", lambda ctx: "on", as_="off"),  # puts what the switched-off one would
        Step(
            "read",
            echo,
            inputs={
                "kid": "$.state.kid",
                "approval": "$.state.approval",
                "off": "$.state.off",
                "user": "$.state.login",
            },
        ),
        use=["auth"],
    )
    async with Engine(workflows=[child, auth, parent], database=None) as engine:
        run = await engine.wait_for_job(await engine.enqueue("w", {}), timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.output == {"kid": "from child", "approval": None, "off": "on", "user": "ann"}


# ---- "$body.x": an expression without its dot ------------------------------------------------
def _literal(value: str) -> str:
    return (
        f"{value!r} looks like an expression; did you mean {'$.' + value[1:]!r}? (for the text "
        f"itself, give a callable: lambda ctx: {value!r})"
    )


IN_A_STEP = "workflow 'w', step "


@pytest.mark.parametrize(
    ("written", "define", "says"),
    [
        ("$body.x", lambda t: flow(Step("a", echo, inputs={"x": t})), f"{IN_A_STEP}'a': input 'x'"),
        ("$state", lambda t: flow(Step("a", echo, inputs={"x": t})), f"{IN_A_STEP}'a': input 'x'"),
        (
            "$headers.k",
            lambda t: flow(Step("a", echo, idempotency_key=t)),
            f"{IN_A_STEP}'a': idempotency_key",
        ),
        (
            "$body.items",
            lambda t: flow(for_each("each", t, steps=[Step("a", echo)])),
            f"{IN_A_STEP}'each': items",
        ),
        ("$params.queue", lambda t: flow(_switched(t)), f"{IN_A_STEP}'route': on"),
        (
            "$body",
            lambda t: flow(subworkflow("kid", workflow="o", input=t)),
            f"{IN_A_STEP}'kid': input",
        ),
        (
            "$body.user",
            lambda t: WorkerTrigger(queue="q", concurrency_key=t),
            "WorkerTrigger.concurrency_key",
        ),
        ("$run_id", lambda t: Debounce(key=t), "Debounce"),
    ],
    ids=[
        "input",
        "bare-root",
        "key",
        "for_each",
        "switch",
        "subworkflow",
        "concurrency_key",
        "debounce",
    ],
)
def test_a_dollar_root_without_its_dot_is_refused_not_passed_as_text(
    written: str, define: Any, says: str
) -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        define(written)
    assert str(refused.value) == f"{says}: {_literal(written)}"


def test_a_wait_until_without_the_dot_is_refused_with_the_expression_meant() -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        wait.until("$body.ship_at", name="later")
    assert str(refused.value) == (
        "step 'later': wait.until: '$body.ship_at' looks like an expression; did you mean "
        "'$.body.ship_at'?"
    )


async def test_a_dollar_root_in_a_file_names_the_steps_line(tmp_path: Path) -> None:
    key, errors = await load_step_b(tmp_path, "dollar", {"sep": "$body.x"})
    assert errors == {
        key: f"{key}:8: WorkflowDefinitionError: workflow 'dollar', step 'b': input 'sep': "
        + _literal("$body.x")
    }


async def test_dollar_texts_that_are_no_root_and_callables_stay_literal() -> None:
    texts = {"price": "$5.00", "home": "$HOME", "guard": "$bodyguard", "lone": "$"}
    wanted = flow(Step("a", echo, inputs={**texts, "meant": lambda ctx: "$body.x"}))
    async with Engine(workflows=[wanted], database=None) as engine:
        run = await engine.wait_for_job(await engine.enqueue("w", {}), timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.output == {**texts, "meant": "$body.x"}


# ---- durations: timedelta, and a Retry's two bounds ------------------------------------------
def test_a_timedelta_is_a_duration_in_whole_milliseconds() -> None:
    assert parse_duration(timedelta(seconds=5)) == 5000
    assert parse_duration(timedelta(milliseconds=1, microseconds=999)) == 1
    assert parse_duration(timedelta(0)) == 0
    with pytest.raises(ValueError, match=r"duration datetime.timedelta\(days=-1, .*is negative"):
        parse_duration(timedelta(seconds=-1))
    with pytest.raises(ValueError, match="longer than 100 years"):
        parse_duration(timedelta(days=40_000))
    retry = Retry(min_timeout=timedelta(milliseconds=100), max_timeout=timedelta(minutes=1))
    assert (retry.min_timeout, retry.max_timeout) == (100, 60_000)
    trigger = WorkerTrigger(queue="q", delay=timedelta(seconds=2), timeout=timedelta(hours=1))
    assert (trigger.delay, trigger.timeout) == (2000, 3_600_000)
    assert wait.for_(timedelta(minutes=2)).for_ms == 120_000
    assert wait.for_event("go", timeout=timedelta(seconds=3)).timeout_ms == 3000
    assert Schedule(every=timedelta(minutes=5)).every == 300_000
    step = Step("a", echo, max_duration=timedelta(seconds=10), idempotency_ttl=timedelta(days=1))
    assert (step.max_duration, step.idempotency_ttl) == (10_000, 86_400_000)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (
            {"min_timeout": "10s", "max_timeout": "1s"},
            "min_timeout '10s' (10000 ms) is longer than max_timeout '1s' (1000 ms)",
        ),
        (
            {"min_timeout": 5000, "max_timeout": timedelta(seconds=1)},
            "min_timeout 5000 ms is longer than max_timeout datetime.timedelta(seconds=1) (1000 ms)",
        ),
    ],
)
def test_a_retry_whose_min_timeout_is_above_its_max_timeout_is_refused(
    given: dict[str, Any], says: str
) -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        Retry(**given)
    assert str(refused.value) == (
        f"Retry: {says}; the first wait is min_timeout, the longest max_timeout"
    )
    assert Retry(min_timeout="2s", max_timeout="2s").backoff_ms(3) == 2000  # equal: a fixed wait


def test_a_retry_bound_left_to_its_default_gives_way_to_the_one_given() -> None:
    """Retry(min_timeout="1m") waited 30 s, the default max_timeout, without a word."""
    slow = Retry(min_timeout="1m")
    assert (slow.min_timeout, slow.max_timeout, slow.backoff_ms(1), slow.backoff_ms(2)) == (
        60_000,
        60_000,
        60_000,
        60_000,
    )
    quick = Retry(max_timeout="500ms")
    assert (quick.min_timeout, quick.max_timeout, quick.backoff_ms(1)) == (500, 500, 500)
    assert (Retry().min_timeout, Retry().max_timeout) == (1000, 30_000)


def test_a_version_given_by_hand_is_refused() -> None:
    # Workflow(version="v3") was taken, then replaced by the file's hash when loaded: the
    # deploy's label showed nowhere, and kept across an edit it would pass for the same code.
    from engine import Step, Workflow, WorkflowDefinitionError

    with pytest.raises(WorkflowDefinitionError, match=r"workflow 'orders': version is not given"):
        Workflow(name="orders", steps=[Step("go", lambda ctx: 1)], version="v3")
    assert Workflow(name="orders", steps=[Step("go", lambda ctx: 1)]).version  # the hash


# ---- an argument the class does not take -----------------------------------------------------


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (
            lambda: Step("a", print, retries=3),
            "step 'a': retries: Step takes no 'retries'; did you mean 'retry'? (it takes name, "
            "node, inputs, retry, max_duration,",
        ),
        (
            lambda: WorkerTrigger("q", concurency=3),
            "WorkerTrigger: concurency: WorkerTrigger takes no 'concurency'; did you mean "
            "'concurrency'? (it takes queue, concurrency,",
        ),
        (
            lambda: Retry(attempts=5),
            "Retry: attempts: Retry takes no 'attempts'; did you mean 'max_attempts'? (it takes "
            "max_attempts, min_timeout, max_timeout, factor)",
        ),
        (
            lambda: RateLimit(limit=1, per="1s"),
            "RateLimit: period: Field required; per: RateLimit takes no 'per'; did you mean "
            "'period'? (it takes limit, period, key)",
        ),
        (
            lambda: Schedule(every="1m", tz="UTC"),
            "Schedule: tz: Schedule takes no 'tz' (it takes cron, every, timezone, payload, "
            "catch_up)",
        ),
        (
            lambda: Switch("kind", value="$.body.kind", cases={}),
            "step 'kind': on: Field required; value: Switch takes no 'value' (it takes name, on, "
            "cases, default)",
        ),
        (
            lambda: Workflow(name="x", step=[Step("a", print)]),
            "workflow 'x': steps: Field required; step: Workflow takes no 'step'; did you mean "
            "'steps'?",
        ),
    ],
)
def test_an_argument_the_class_does_not_take_is_said_with_the_one_meant_and_those_it_takes(
    build: Any, says: str
) -> None:
    # It said "retries: Extra inputs are not permitted, not 3", pydantic's words, naming
    # neither the argument meant nor the ones there are.
    with pytest.raises(WorkflowDefinitionError) as raised:
        build()
    assert str(raised.value).startswith(says), str(raised.value)
