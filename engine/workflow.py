"""How users define workflows: Workflow, Step, Retry, WorkerTrigger and `wait`.

Everything is validated when it is defined, so a mistake is reported with the workflow and the
step it is in, at import time, not half-way through a run.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import types
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator
from pydantic_core import ErrorDetails

from . import expressions
from .durations import Duration, parse_duration, parse_until
from .errors import UnstorableOutput
from .errors import WorkflowDefinitionError as WorkflowDefinitionError
from .explain import explain
from .origin import caller_source, shown_path
from .ratelimit import RateLimit
from .schedules import Schedule
from .validation import MAX_RETRIES, check_queue_name

Provider = Literal["memory", "sqlite", "postgres"]
Input = Any  # a literal, a "$.path" expression, or a callable taking the context

DEFAULT_IDEMPOTENCY_TTL_MS = 24 * 60 * 60 * 1000

# Upper bounds of the whole-number settings. Past them a value is a typo (or 10**19, which no
# database column holds); within them the engine's arithmetic stays exact and finite.
MAX_CONCURRENCY = 10_000  # runs at once per engine and queue (or per concurrency key)
# Step-level: with factor <= MAX_FACTOR, factor ** (attempts - 1) stays a finite float
# (10.0 ** 99), where 10.0 ** 1000 raises OverflowError in the backoff.
MAX_ATTEMPTS = 100
MAX_FACTOR = 10.0


def _retry_as_number(item: ErrorDetails) -> str | None:
    """`retry=3` on a step: what to write for three attempts."""
    given = item.get("input")
    if item["loc"] != ("retry",) or not isinstance(given, int) or isinstance(given, bool):
        return None
    return f"{item['msg']}, not {given!r} (for {given} attempts: retry=Retry(max_attempts={given}))"


def _placed(message: str, source: tuple[str, int] | None) -> WorkflowDefinitionError:
    """An error about one part of a workflow (a step) found only when the whole is checked:
    `source`, where that part was written, lets a workflow file's load error name the part's
    line rather than the `Workflow(...)` line the check ran on (engine/loader.py reads it)."""
    error = WorkflowDefinitionError(message)
    error.source = source
    return error


def _source_line(source: tuple[str, int] | None) -> str | None:
    return None if source is None else f"{shown_path(source[0])}:{source[1]}"


def _above_zero(owner: str, field: str, ms: int | None, given: Any) -> None:
    """A time limit of 0 would read as "no limit" (a falsy limit is none where limits are
    applied), so it is refused as enqueue(timeout=0) is."""
    if ms == 0:
        raise WorkflowDefinitionError(f"{owner}: {field} must be above zero, not {given!r}")


def _as_given(value: Any, ms: int) -> str:
    """A duration as the user wrote it: "'10s' (10000 ms)", "500 ms"."""
    return f"{value} ms" if isinstance(value, int | float) else f"{value!r} ({ms} ms)"


def _literal_problem(value: Any, callable_hint: bool = True) -> str | None:
    """Why a literal string input is refused: "$body.x" reads as an expression but would reach
    the node as its text (`expressions.missing_dot`)."""
    meant = expressions.missing_dot(value)
    if meant is None:
        return None
    hint = (
        f" (for the text itself, give a callable: lambda ctx: {value!r})" if callable_hint else ""
    )
    return f"{value!r} looks like an expression; did you mean {meant!r}?{hint}"


def _check_gate_expression(owner: str, value: Any) -> None:
    problem = _literal_problem(value)
    if problem is not None:
        raise WorkflowDefinitionError(f"{owner}: {problem}")
    root = value.split(".", 1)[0] if isinstance(value, str) and "." in value else None
    if root in expressions.ROOTS:
        # A constant is one key for every job (runs one at a time, a burst of other keys
        # coalesced into one run): "body.user" for "$.body.user" is a typo, not a choice.
        raise WorkflowDefinitionError(
            f"{owner}: {value!r} is one key for every job; did you mean '$.{value}'? (for "
            f"the text itself, give a callable: lambda ctx: {value!r})"
        )
    if expressions.is_expression(value):
        try:
            parts = expressions.parse(value)
        except expressions.ExpressionError as error:
            raise WorkflowDefinitionError(f"{owner}: {error}") from None
        if parts[0] == "state":
            raise WorkflowDefinitionError(
                f"{owner}: {value} reads $.state, which is empty before the run starts; "
                "use $.body, $.headers or $.params"
            )


class _Definition(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True, extra="forbid")


class _Written(_Definition):
    """A definition that knows where the user wrote it: a run that fails on a step's definition
    (an input expression with nothing at its path) names the step's line, as a node's error its
    own; a clash of two workflows names both."""

    _source: tuple[str, int] | None = PrivateAttr(default=None)
    _defined_at: str | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        self._source = caller_source()
        self._defined_at = _source_line(self._source)

    @property
    def source(self) -> tuple[str, int] | None:
        """(file name as its code object has it, line) where it was defined."""
        return self._source

    @property
    def defined_at(self) -> str | None:
        """Where it was defined, for a message: "workflows/shop.py:14", relative to the
        working directory then."""
        return self._defined_at


class Retry(_Definition):
    """Step-level retries: `min(max_timeout, min_timeout * factor ** (attempt - 1))`, no jitter."""

    max_attempts: int = Field(3, ge=1, le=MAX_ATTEMPTS)
    min_timeout: Duration = 1000
    max_timeout: Duration = 30_000
    factor: float = Field(2.0, ge=1.0, le=MAX_FACTOR, allow_inf_nan=False)

    def __init__(self, max_attempts: int = 3, **data: Any) -> None:
        try:
            super().__init__(**{"max_attempts": max_attempts, **data})
        except ValidationError as error:
            raise WorkflowDefinitionError(f"Retry: {explain(error, Retry)}") from None
        if self.min_timeout > self.max_timeout:
            # The bound not given gives way: Retry(min_timeout="1m") waits a minute, not the
            # default max_timeout's 30 s; Retry(max_timeout="500ms") at most 500 ms.
            if "max_timeout" not in data:
                object.__setattr__(self, "max_timeout", self.min_timeout)
            elif "min_timeout" not in data:
                object.__setattr__(self, "min_timeout", self.max_timeout)
            else:  # the backoff would be max_timeout from the first retry: min_timeout unused
                raise WorkflowDefinitionError(
                    f"Retry: min_timeout {_as_given(data['min_timeout'], self.min_timeout)} is "
                    f"longer than max_timeout {_as_given(data['max_timeout'], self.max_timeout)}"
                    "; the first wait is min_timeout, the longest max_timeout"
                )

    def backoff_ms(self, attempt: int) -> int:
        """The wait after failed attempt number `attempt` (1-based)."""
        raw = self.min_timeout * self.factor ** max(0, attempt - 1)
        return int(min(self.max_timeout, raw))


class Debounce(_Definition):
    """Coalesce a burst of jobs with the same `key`. trailing: one run, `delay` after the last
    job of the burst (at most `max_delay` after the first), with the latest payload. leading:
    the first job runs at once, the rest of the window is swallowed."""

    key: Input
    delay: Duration = 1000
    max_delay: Duration | None = None
    mode: Literal["leading", "trailing"] = "trailing"

    def __init__(self, key: Input = None, **data: Any) -> None:
        try:
            super().__init__(**{"key": key, **data})
        except ValidationError as error:
            raise WorkflowDefinitionError(f"Debounce: {explain(error, Debounce)}") from None
        _check_gate_expression("Debounce", self.key)
        if self.max_delay is not None and self.max_delay < self.delay:
            raise WorkflowDefinitionError(
                f"Debounce: max_delay {_as_given(data['max_delay'], self.max_delay)} is shorter "
                f"than delay {_as_given(data.get('delay', self.delay), self.delay)}; a burst "
                "runs at most max_delay after its first job, so delay would never be waited"
            )


class WorkerTrigger(_Definition):
    """Run the workflow for each job on `queue`, at most `concurrency` at a time.

    Scheduling gates, checked in this order when a job is claimed (engine/gates.py):
    `debounce`; `start_delay` + `ttl` (a run that cannot start within `ttl` of being enqueued
    ends expired); `concurrency_key` + `concurrency_limit` (at most that many runs per key at
    once; `on_limit="throw"` ends the delivery throttled and tries again later without using
    the retry budget, `"queue"` keeps it queued, until `queue_timeout` has passed);
    `rate_limit` (at most `limit` starts per sliding window of `period`, per key; the rest wait
    as throttled without using the retry budget).
    """

    queue: str
    concurrency: int = Field(1, ge=1, le=MAX_CONCURRENCY)
    retries: int = Field(0, ge=0, le=MAX_RETRIES)  # job-level: the whole run again
    delay: Duration = 1000
    timeout: Duration | None = None
    provider: Provider | None = None
    middleware: list[str] = Field(default_factory=list)  # trigger-level middleware chain
    concurrency_key: Input | None = None
    concurrency_limit: int = Field(1, ge=1, le=MAX_CONCURRENCY)
    on_limit: Literal["throw", "queue"] = "throw"
    queue_timeout: Duration | None = None
    limit_backoff: Duration = 1000  # first re-try of the gate; doubles, capped below
    limit_max_backoff: Duration = 30_000
    start_delay: Duration | None = None  # every job starts this long after it was enqueued
    ttl: Duration | None = None
    debounce: Debounce | None = None
    rate_limit: RateLimit | None = None

    @field_validator("queue")
    @classmethod
    def _check_queue(cls, name: str) -> str:
        return check_queue_name(name)

    def __init__(self, queue: str | None = None, **data: Any) -> None:
        if queue is not None:
            data["queue"] = queue
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise WorkflowDefinitionError(
                f"WorkerTrigger: {explain(error, WorkerTrigger)}"
            ) from None
        _above_zero("WorkerTrigger", "timeout", self.timeout, data.get("timeout"))
        _check_gate_expression("WorkerTrigger.concurrency_key", self.concurrency_key)
        if "concurrency_limit" in data and self.concurrency_key is None:
            raise WorkflowDefinitionError(
                "WorkerTrigger: concurrency_limit is a limit per concurrency_key, and no "
                "concurrency_key is given (concurrency caps the queue's runs at once)"
            )

    def limit_backoff_ms(self, attempt: int) -> int:
        """Wait before gate re-try number `attempt` (0-based): capped exponential, no jitter."""
        return int(min(self.limit_max_backoff, self.limit_backoff * 2 ** min(attempt, 30)))

    def backoff_ms(self, attempt: int, jitter: float) -> int:
        """The seed's calculateBackoff: min(delay * 2**attempt, 30 s) plus up to 10% jitter."""
        exponential = min(self.delay * 2**attempt, 30_000)
        return int(exponential + jitter * exponential * 0.1)


class StepDefinition(_Written):
    """What every kind of step shares: a name unique within its workflow."""

    kind: str = "node"
    name: str = Field(min_length=1)

    def expressions(self) -> list[str]:
        return []

    def children(self) -> list[Sequence[StepDefinition]]:
        """Nested step lists (for primitives such as for_each and switch)."""
        return []

    def waits_for(self) -> tuple[str, ...]:
        """What a run waiting at this step waits for, beside its name and kind: a reload that
        changes it changes the step for a run waiting there (`Catalog`)."""
        return ()

    @property
    def runs(self) -> bool:
        """False for a step switched off (`active=False`): recorded skipped, not run."""
        return True

    def state_keys(self) -> list[str] | None:
        """The ctx.state keys the step's output lands under ([]: none; None: any key, the
        output's own)."""
        return [self.name]

    def keep(self, state: dict[str, Any], output: Any) -> None:
        """Put the step's output in ctx.state."""
        state[self.name] = output

    @property
    def recorded(self) -> bool:
        """Whether the output is stored with the step's record."""
        return True

    def fingerprint(self) -> str:
        return f"{self.kind}:{self.name}"


class Step(StepDefinition):
    """Call `node(ctx, **inputs)`; its return value becomes `ctx.state[name]`. The Workflow
    checks the node's signature against that call (`_node_problem`), and refuses a literal
    input such as "$body.x" that was meant as "$.body.x".

    The seed's persistence options: `active=False` records the step skipped without running
    it; `ephemeral=True` keeps the output out of ctx.state and the stored record (later steps
    cannot read it); `as_="key"` puts it in `ctx.state["key"]` instead; `spread=True` merges a
    dict output into ctx.state, key by key. An idempotency cache entry keeps the output in
    every case: that is what it is for.
    """

    kind: Literal["node"] = "node"
    node: Callable[..., Any]
    inputs: dict[str, Input] = Field(default_factory=dict)
    retry: Retry | None = None
    max_duration: Duration | None = None
    idempotency_key: Input | None = None
    idempotency_ttl: Duration = DEFAULT_IDEMPOTENCY_TTL_MS
    active: bool = True
    ephemeral: bool = False
    as_: str | None = Field(None, min_length=1)
    spread: bool = False

    def __init__(self, name: str, node: Callable[..., Any], **data: Any) -> None:
        try:
            super().__init__(**{"name": name, "node": node, **data})
        except ValidationError as error:
            raise WorkflowDefinitionError(
                f"step {name!r}: {explain(error, Step, _retry_as_number)}"
            ) from None
        if not callable(node):
            raise WorkflowDefinitionError(f"step {name!r}: node {node!r} is not callable")
        _above_zero(f"step {name!r}", "max_duration", self.max_duration, data.get("max_duration"))
        chosen = [
            o
            for o, on in (
                ("ephemeral", self.ephemeral),
                ("as_", self.as_ is not None),
                ("spread", self.spread),
            )
            if on
        ]
        if len(chosen) > 1:
            raise WorkflowDefinitionError(
                f"step {name!r}: {' and '.join(chosen)} cannot be used together (each says "
                "where the output goes: nowhere, under another key, or spread into ctx.state)"
            )
        for expr in self.expressions():
            try:
                # Not only parsed: a bare `$.state` is refused here, at the Step's own line.
                expressions.referenced_step(expr)
            except expressions.ExpressionError as error:
                raise WorkflowDefinitionError(f"step {name!r}: {error}") from None

    @property
    def max_attempts(self) -> int:
        return self.retry.max_attempts if self.retry else 1

    @property
    def runs(self) -> bool:
        return self.active

    def state_keys(self) -> list[str] | None:
        if self.ephemeral:
            return []
        if self.spread:
            return None
        return [self.as_ or self.name]

    def keep(self, state: dict[str, Any], output: Any) -> None:
        if self.ephemeral:
            return
        if self.spread:
            if not isinstance(output, dict):
                raise UnstorableOutput(
                    f"step {self.name!r} has spread=True but returned "
                    f"{type(output).__name__}, not a dict to merge into ctx.state"
                )
            state.update(output)
            return
        state[self.as_ or self.name] = output

    @property
    def recorded(self) -> bool:
        return not self.ephemeral

    @property
    def is_async(self) -> bool:
        node = self.node
        return inspect.iscoroutinefunction(node) or (
            not inspect.isfunction(node)
            and inspect.iscoroutinefunction(type(node).__call__)  # an object with async __call__
        )

    def expressions(self) -> list[str]:
        found = [v for v in self.inputs.values() if expressions.is_expression(v)]
        if expressions.is_expression(self.idempotency_key):
            found.append(self.idempotency_key)
        return found

    def fingerprint(self) -> str:
        code = getattr(self.node, "__code__", None)
        body = hashlib.sha1(code.co_code).hexdigest()[:8] if code else repr(self.node)
        return f"node:{self.name}:{getattr(self.node, '__qualname__', '')}:{body}"


class WaitStep(StepDefinition):
    """Pause the run, freeing its worker slot, until a duration has passed or a moment came."""

    kind: Literal["wait"] = "wait"
    name: str = "wait"
    for_ms: int | None = None
    until: datetime | str | int | float | None = None

    def expressions(self) -> list[str]:
        return (
            [self.until]
            if isinstance(self.until, str) and expressions.is_expression(self.until)
            else []
        )

    def fingerprint(self) -> str:
        return f"wait:{self.name}:{self.for_ms}:{self.until}"


class EventWaitStep(StepDefinition):
    """Pause the run, freeing its worker slot, until an event is sent to it (`send_event`) or
    the timeout passes: the event's payload is the step's output, None on timeout. With
    `match` ("$.body.order_id"), an event sent by key (no run id) whose payload holds the same
    value at the same path ("order_id") reaches it too. The run runs in engine/runner.py; the
    mailbox is the backend's (engine/mailbox.py)."""

    kind: Literal["event"] = "event"
    event: str = Field(min_length=1, max_length=200)
    timeout_ms: int | None = None
    match: str | None = None

    def expressions(self) -> list[str]:
        return [self.match] if self.match is not None else []

    @property
    def match_path(self) -> tuple[str, ...]:
        """Where an event's payload carries the key: the match path below $.body."""
        return tuple(expressions.parse(self.match)[1:]) if self.match is not None else ()

    def fingerprint(self) -> str:
        return f"event:{self.name}:{self.event}:{self.timeout_ms}:{self.match}"

    def waits_for(self) -> tuple[str, ...]:
        return (self.event, self.match or "")


class _WaitFactory:
    """`wait.for_("5s")` and `wait.until(datetime | ISO string | epoch ms | "$.expr")`."""

    @staticmethod
    def for_(duration: int | float | str | timedelta, *, name: str | None = None) -> WaitStep:
        try:
            ms = parse_duration(duration)
        except ValueError as error:
            raise WorkflowDefinitionError(f"wait.for_: {error}") from None
        return WaitStep(name=name or "wait", for_ms=ms)

    @staticmethod
    def until(moment: datetime | str | int | float, *, name: str | None = None) -> WaitStep:
        label = f"step {name!r}: wait.until" if name else "wait.until"
        if not isinstance(moment, datetime | str | int | float) or isinstance(moment, bool):
            raise WorkflowDefinitionError(f"{label}: {moment!r} is not {UNTIL_FORMS}")
        problem = _literal_problem(moment, callable_hint=False)
        if problem is not None:
            raise WorkflowDefinitionError(f"{label}: {problem}")
        if not expressions.is_expression(moment):  # an expression is checked by the Workflow
            _check_moment(label, moment)
        return WaitStep(name=name or "wait", until=moment)

    @staticmethod
    def for_event(
        event: str,
        *,
        timeout: int | float | str | timedelta | None = None,
        name: str | None = None,
        match: str | None = None,
    ) -> EventWaitStep:
        """Wait for `engine.send_event(run_id, event, payload)`; the payload is the step's
        output (`ctx.state[name]`), None if `timeout` passes first (no timeout: wait until the
        event comes or the run is cancelled). `match="$.body.order_id"`: an event sent with no
        run id whose payload has the run's order_id at "order_id" reaches it too."""
        label = f"wait.for_event({event!r})"
        if not isinstance(event, str) or not event.strip():
            raise WorkflowDefinitionError(f"{label}: the event name must be a non-empty string")
        timeout_ms = None
        if timeout is not None:
            try:
                timeout_ms = parse_duration(timeout)
            except ValueError as error:
                raise WorkflowDefinitionError(f"{label}: timeout: {error}") from None
            _above_zero(label, "timeout", timeout_ms, timeout)
        if match is not None:
            try:
                parts = expressions.parse(match) if expressions.is_expression(match) else []
            except expressions.ExpressionError as error:
                raise WorkflowDefinitionError(f"{label}: match: {error}") from None
            if len(parts) < 2 or parts[0] != "body":
                raise WorkflowDefinitionError(
                    f"{label}: match must be a $.body.<field> path (the same field is read "
                    f"from the event's payload), not {match!r}"
                )
        try:
            return EventWaitStep(
                name=name or event, event=event, timeout_ms=timeout_ms, match=match
            )
        except ValidationError as error:
            raise WorkflowDefinitionError(f"{label}: {explain(error, EventWaitStep)}") from None


wait = _WaitFactory()

UNTIL_FORMS = (
    "a datetime, an ISO 8601 string ('2026-12-02T15:00:00Z'), epoch milliseconds "
    "(1764687600000) or a $.expression ('$.body.ship_at')"
)


def _check_moment(label: str, moment: datetime | str | int | float) -> None:
    """A fixed moment is read now, by the function the run reads it with: one it cannot read
    would fail every run that reaches the wait."""
    try:
        parse_until(moment)
    except (ValueError, OverflowError, OSError):
        if isinstance(moment, str):
            raise WorkflowDefinitionError(
                f"{label}: {moment!r} is not a moment; use {UNTIL_FORMS}"
            ) from None
        raise WorkflowDefinitionError(
            f"{label}: {moment!r} epoch milliseconds is not a date a datetime can hold "
            "(years 1 to 9999)"
        ) from None


class Workflow(_Written):
    name: str = Field(min_length=1)
    trigger: WorkerTrigger | None = None
    steps: list[StepDefinition]
    schedules: list[Schedule] = Field(default_factory=list)  # engine/schedules.py
    middleware: bool = False  # a middleware workflow, run by name before other workflows
    use: list[str] = Field(default_factory=list)  # workflow-level middleware chain
    description: str = ""
    version: str = ""  # a content hash; the loader sets it from the file, else from the steps
    path: str | None = None

    def __init__(self, **data: Any) -> None:
        name = data.get("name", "?")
        steps = data.get("steps")
        if isinstance(steps, list | tuple):
            data["steps"] = _name_waits(list(steps))
        if data.get("version"):
            # Taken, and then replaced by the file's hash when loaded from a file: a deploy saw
            # its "v3" nowhere. And a label kept across an edit would pass for the same code,
            # on which a run resumes by position without its steps compared.
            raise WorkflowDefinitionError(
                f"workflow {name!r}: version is not given: it is a hash of the workflow's code "
                "(its file, else its trigger and steps), so that a run resumes only on the code "
                "it ran; a release's name goes in description="
            )
        schedules = data.get("schedules")
        if schedules is not None and not isinstance(schedules, list | tuple):
            # pydantic would walk a lone Schedule's fields as if they were a list's items.
            raise WorkflowDefinitionError(
                f"workflow {name!r}: schedules must be a list of Schedule, not "
                f"{type(schedules).__name__} (schedules=[...])"
            )
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise WorkflowDefinitionError(
                f"workflow {name!r}: {explain(error, Workflow)}"
            ) from None
        self._check_steps(self.steps, seen={})
        self._check_schedules()
        if not self.version:
            digest = hashlib.sha1()
            digest.update(repr(self.trigger).encode())
            for step in self.steps:
                digest.update(step.fingerprint().encode())
            object.__setattr__(self, "version", digest.hexdigest()[:8])

    def _check_steps(
        self,
        steps: Sequence[StepDefinition],
        seen: dict[str, StepDefinition],
        keys: _Keys | None = None,
    ) -> None:
        """Step names are unique, and a `$.state.<key>` expression reads a key that a step
        before it puts in ctx.state (its name, its `as_`; anything after a `spread`). An error
        about a step is placed at the step's line (`_placed`)."""
        if not steps and not seen:
            raise WorkflowDefinitionError(f"workflow {self.name!r} has no steps")
        if keys is None:
            keys = _Keys()
            # Middleware runs its steps on the run's own context before these (primitives.
            # run_middleware), so their outputs are in ctx.state too, under names not known here.
            trigger_chain = self.trigger.middleware if self.trigger is not None else []
            keys.open = self.middleware or bool(self.use) or bool(trigger_chain)
        for step in steps:
            first = seen.get(step.name)
            if first is not None:
                earlier = f" (first at {first.defined_at})" if first.defined_at else ""
                raise _placed(
                    f"workflow {self.name!r}: step name {step.name!r} is used twice{earlier}",
                    step.source,
                )
            for expr in step.expressions():
                try:
                    target = expressions.referenced_step(expr)
                except expressions.ExpressionError as error:
                    raise _placed(f"step {step.name!r}: {error}", step.source) from None
                if target is None or target in keys.known or keys.open:
                    continue
                where = f"workflow {self.name!r}, step {step.name!r}: {expr}"
                if target in keys.hidden:
                    raise _placed(
                        f"{where} reads step {target!r}, whose output is not kept in ctx.state "
                        f"({keys.hidden[target]})",
                        step.source,
                    )
                known = ", ".join(keys.known) or "none yet"
                raise _placed(
                    f"{where} refers to step {target!r}, which does not run before it "
                    f"(earlier steps: {known})" + expressions.did_you_mean(target, keys.known),
                    step.source,
                )
            problem = _step_problem(step)
            if problem is not None:
                raise _placed(f"workflow {self.name!r}, step {step.name!r}: {problem}", step.source)
            seen[step.name] = step
            found = step.state_keys()
            nothing_kept = _keeps_nothing(step)
            if nothing_kept is not None:
                keys.hidden[step.name] = nothing_kept
            elif found is None:
                keys.open = True
            else:
                keys.known.update(dict.fromkeys(found))
                if step.name not in found:
                    reason = "ephemeral=True" if not found else f"as_={found[0]!r}"
                    keys.hidden[step.name] = reason
            for branch in step.children():
                self._check_steps(branch, seen, keys)

    def _check_schedules(self) -> None:
        ids: set[str] = set()
        for schedule in self.schedules:
            where = f"workflow {self.name!r}, schedule {schedule.id!r}"
            if self.trigger is None:
                raise WorkflowDefinitionError(
                    f"{where}: a schedule enqueues to the workflow's queue; give the workflow "
                    "a WorkerTrigger"
                )
            problem = schedule.problem()
            if problem is not None:
                raise WorkflowDefinitionError(f"{where}: {problem}")
            if schedule.id in ids:
                raise WorkflowDefinitionError(f"{where}: the same schedule is given twice")
            ids.add(schedule.id)

    @property
    def queue(self) -> str | None:
        return self.trigger.queue if self.trigger else None

    def with_version(self, version: str, path: str | None) -> Workflow:
        copy = self.model_copy(update={"version": version, "path": path})
        return copy


class _Keys:
    """The ctx.state keys earlier steps provide, while a workflow's steps are checked."""

    def __init__(self) -> None:
        self.known: dict[str, None] = {}  # in step order, as an error lists them
        self.hidden: dict[str, str] = {}  # step name -> why its output is not under its name
        self.open = False  # a spread step put keys that cannot be known before it runs


def _keeps_nothing(step: StepDefinition) -> str | None:
    """Why a step never puts its output in ctx.state, if it never does: the runner keeps no
    output of a timed wait nor of a step switched off (runner._step, run_steps, replay_seed),
    so a `$.state.<it>` read fails every run that reaches it."""
    if not step.runs:
        return "active=False: it never runs"
    if isinstance(step, WaitStep):
        return "a wait.for_ or wait.until keeps no output; a wait.for_event keeps its payload"
    return None


def _step_problem(step: StepDefinition) -> str | None:
    """What would fail every run that reaches the step, found in its definition: a node that
    cannot be called as the runner calls it, a literal input that was meant as an expression."""
    if isinstance(step, Step):
        given = [(f"input {key!r}", value) for key, value in step.inputs.items()]
        given.append(("idempotency_key", step.idempotency_key))
    else:  # for_each's items, switch's on, subworkflow's input (engine/primitives.py)
        given = [(field, getattr(step, field, None)) for field in ("items", "on", "input")]
    for where, value in given:
        literal = _literal_problem(value)
        if literal is not None:
            return f"{where}: {literal}"
    return _node_problem(step.node, list(step.inputs)) if isinstance(step, Step) else None


def _name_waits(steps: list[Any]) -> list[Any]:
    """Unnamed waits become wait_<position> so names stay unique and stable."""
    named = []
    for position, step in enumerate(steps, start=1):
        if isinstance(step, WaitStep) and step.name == "wait":
            step = step.model_copy(update={"name": f"wait_{position}"})
        named.append(step)
    return named


# ---- a node's signature, checked against how the runner calls it ---------------------------
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _node_problem(node: Callable[..., Any], keys: list[str]) -> str | None:
    """Why `node(ctx, **inputs)` (engine/node_calls.py) would fail on every call, whatever the
    values: a generator function, or a signature that cannot take the context first and these
    input keys. None when it can, and when the node has no signature to read (a builtin such
    as `print`, a C function): what is not known is not refused."""
    code, name = node_callee(node)
    if inspect.isgeneratorfunction(code):
        return f"node {name} is a generator function; return the value instead"
    if inspect.isasyncgenfunction(code):
        return f"node {name} is an async generator function; return the value instead"
    if not (inspect.isfunction(code) or inspect.isclass(code)):
        return None  # a C function, a builtin's method: its signature, if any, is not checked
    try:
        # Not through `__wrapped__`: a decorator may call what it wraps with other arguments.
        signature = inspect.signature(node, follow_wrapped=False)
    except (ValueError, TypeError):  # no signature to read
        return None
    try:
        signature.bind(object(), **dict.fromkeys(keys))
    except TypeError:  # the call would fail: say why, in the user's terms
        if inspect.isclass(code):
            header = "def __init__(self, "  # a class as a node: calling it makes one
        elif code is not node and not isinstance(node, functools.partial | types.MethodType):
            header = "def __call__(self, "  # an object with __call__
        else:
            header = "lambda " if name == "<lambda>" else f"def {name}("
        return _signature_problem(name, signature, keys, header)
    return None


def node_callee(node: Callable[..., Any]) -> tuple[Any, str]:
    """The code that runs when `node` is called (a partial's function, a method's, an object's
    `__call__`), and the name a message calls the node by."""
    inner: Any = node
    while True:
        if isinstance(inner, functools.partial):
            inner = inner.func
        elif inspect.ismethod(inner):
            inner = inner.__func__
        else:
            break
    if inspect.isfunction(inner) or inspect.isclass(inner) or inspect.isroutine(inner):
        named = str(getattr(inner, "__name__", None) or type(inner).__name__)
        return inner, named
    return type(inner).__call__, type(inner).__name__  # a callable object


def _signature_problem(
    name: str, signature: inspect.Signature, keys: list[str], header: str
) -> str:
    """What is wrong with a call `node(ctx, **inputs)` that `signature` cannot bind; `header`
    begins the signature the user should write ("def charge(")."""
    params = list(signature.parameters.values())
    plain = signature.replace(
        parameters=[p.replace(annotation=inspect.Parameter.empty) for p in params],
        return_annotation=inspect.Signature.empty,
    )
    shown = f"{name}{plain}"
    first = params[0] if params and params[0].kind in _POSITIONAL else None
    star = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    if (first is None and not star) or (
        first is not None and first.name in keys and first.kind in _BY_KEYWORD
    ):
        if first is not None and first.name in ("ctx", "context"):
            return (
                f"input {first.name!r} is the name of the first parameter of {shown}, which "
                "takes the context: rename the input"
            )
        ctx = "context" if "ctx" in signature.parameters else "ctx"
        inner = str(plain)[1:-1]
        fixed = header + (f"{ctx}, {inner}" if inner else ctx)
        fixed += ": ..." if header == "lambda " else ")"
        return f"node {shown} must take the context first: {fixed}"
    rest = params[1:] if first is not None else params
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        named = [p.name for p in rest if p.kind in _BY_KEYWORD]
        unknown = [key for key in keys if key not in named]
        only = {p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY}
        if unknown and unknown[0] in only:
            return (
                f"input {unknown[0]!r} is a positional-only parameter of {shown}; inputs are "
                "passed by keyword"
            )
        if len(unknown) == 1:
            return f"input {unknown[0]!r} is not a parameter of {shown}" + (
                expressions.did_you_mean(unknown[0], named)
            )
        if unknown:
            listed = ", ".join(repr(key) for key in unknown)
            return f"inputs {listed} are not parameters of {shown}"
    missing = [
        p.name
        for p in rest
        if p.kind in (*_POSITIONAL, inspect.Parameter.KEYWORD_ONLY)
        and p.default is inspect.Parameter.empty
        and p.name not in keys
    ]
    if missing:
        listed = " and ".join(repr(m) for m in missing)
        return f"{name} needs {listed}, which inputs does not give: {shown}"
    return f"node {shown} cannot be called with the context and inputs {', '.join(keys)}"
