"""How users define workflows: Workflow, Step, Retry, WorkerTrigger and `wait`.

Everything is validated when it is defined, so a mistake is reported with the workflow and the
step it is in, at import time, not half-way through a run.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import expressions
from .durations import Duration
from .validation import check_queue_name

Provider = Literal["memory", "sqlite", "postgres"]
Input = Any  # a literal, a "$.path" expression, or a callable taking the context

DEFAULT_IDEMPOTENCY_TTL_MS = 24 * 60 * 60 * 1000

# Upper bounds of the whole-number settings. Past them a value is a typo (or 10**19, which no
# database column holds); within them the engine's arithmetic stays exact and finite.
MAX_CONCURRENCY = 10_000  # runs at once per engine and queue (or per concurrency key)
MAX_RETRIES = 1_000  # job-level: whole-run retries, each waiting at most 30 s
# Step-level: with factor <= MAX_FACTOR, factor ** (attempts - 1) stays a finite float
# (10.0 ** 99), where 10.0 ** 1000 raises OverflowError in the backoff.
MAX_ATTEMPTS = 100
MAX_FACTOR = 10.0


class WorkflowDefinitionError(ValueError):
    """A workflow, step or trigger that cannot work as written."""


def _explain(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(loc) for loc in item["loc"]) or "value"
        message = item["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def _check_gate_expression(owner: str, value: Any) -> None:
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
            raise WorkflowDefinitionError(f"Retry: {_explain(error)}") from None

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
            raise WorkflowDefinitionError(f"Debounce: {_explain(error)}") from None
        _check_gate_expression("Debounce", self.key)


class WorkerTrigger(_Definition):
    """Run the workflow for each job on `queue`, at most `concurrency` at a time.

    Scheduling gates, checked in this order when a job is claimed (engine/gates.py):
    `debounce`; `start_delay` + `ttl` (a run that cannot start within `ttl` of being enqueued
    ends expired); `concurrency_key` + `concurrency_limit` (at most that many runs per key at
    once; `on_limit="throw"` ends the delivery throttled and tries again later without using
    the retry budget, `"queue"` keeps it queued, until `queue_timeout` has passed).
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
            raise WorkflowDefinitionError(f"WorkerTrigger: {_explain(error)}") from None
        _check_gate_expression("WorkerTrigger.concurrency_key", self.concurrency_key)

    def limit_backoff_ms(self, attempt: int) -> int:
        """Wait before gate re-try number `attempt` (0-based): capped exponential, no jitter."""
        return int(min(self.limit_max_backoff, self.limit_backoff * 2 ** min(attempt, 30)))

    def backoff_ms(self, attempt: int, jitter: float) -> int:
        """The seed's calculateBackoff: min(delay * 2**attempt, 30 s) plus up to 10% jitter."""
        exponential = min(self.delay * 2**attempt, 30_000)
        return int(exponential + jitter * exponential * 0.1)


class StepDefinition(_Definition):
    """What every kind of step shares: a name unique within its workflow."""

    kind: str = "node"
    name: str = Field(min_length=1)

    def expressions(self) -> list[str]:
        return []

    def children(self) -> list[Sequence[StepDefinition]]:
        """Nested step lists (for primitives such as for_each and switch)."""
        return []

    def fingerprint(self) -> str:
        return f"{self.kind}:{self.name}"


class Step(StepDefinition):
    """Call `node(ctx, **inputs)`; its return value becomes `ctx.state[name]`."""

    kind: Literal["node"] = "node"
    node: Callable[..., Any]
    inputs: dict[str, Input] = Field(default_factory=dict)
    retry: Retry | None = None
    max_duration: Duration | None = None
    idempotency_key: Input | None = None
    idempotency_ttl: Duration = DEFAULT_IDEMPOTENCY_TTL_MS

    def __init__(self, name: str, node: Callable[..., Any], **data: Any) -> None:
        try:
            super().__init__(**{"name": name, "node": node, **data})
        except ValidationError as error:
            raise WorkflowDefinitionError(f"step {name!r}: {_explain(error)}") from None
        if not callable(node):
            raise WorkflowDefinitionError(f"step {name!r}: node {node!r} is not callable")
        for expr in self.expressions():
            try:
                expressions.parse(expr)
            except expressions.ExpressionError as error:
                raise WorkflowDefinitionError(f"step {name!r}: {error}") from None

    @property
    def max_attempts(self) -> int:
        return self.retry.max_attempts if self.retry else 1

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


class _WaitFactory:
    """`wait.for_("5s")` and `wait.until(datetime | ISO string | epoch ms | "$.expr")`."""

    @staticmethod
    def for_(duration: int | float | str, *, name: str | None = None) -> WaitStep:
        from .durations import parse_duration

        try:
            ms = parse_duration(duration)
        except ValueError as error:
            raise WorkflowDefinitionError(f"wait.for_: {error}") from None
        return WaitStep(name=name or "wait", for_ms=ms)

    @staticmethod
    def until(moment: datetime | str | int | float, *, name: str | None = None) -> WaitStep:
        if not isinstance(moment, datetime | str | int | float) or isinstance(moment, bool):
            raise WorkflowDefinitionError(
                f"wait.until: {moment!r} is not a datetime, ISO string, epoch ms or $.expression"
            )
        return WaitStep(name=name or "wait", until=moment)


wait = _WaitFactory()


class Workflow(_Definition):
    name: str = Field(min_length=1)
    trigger: WorkerTrigger | None = None
    steps: list[StepDefinition]
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
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise WorkflowDefinitionError(f"workflow {name!r}: {_explain(error)}") from None
        self._check_steps(self.steps, seen=set())
        if not self.version:
            digest = hashlib.sha1()
            digest.update(repr(self.trigger).encode())
            for step in self.steps:
                digest.update(step.fingerprint().encode())
            object.__setattr__(self, "version", digest.hexdigest()[:8])

    def _check_steps(self, steps: Sequence[StepDefinition], seen: set[str]) -> None:
        if not steps and not seen:
            raise WorkflowDefinitionError(f"workflow {self.name!r} has no steps")
        for step in steps:
            if step.name in seen:
                raise WorkflowDefinitionError(
                    f"workflow {self.name!r}: step name {step.name!r} is used twice"
                )
            for expr in step.expressions():
                target = expressions.referenced_step(expr)
                if target is not None and target not in seen:
                    known = ", ".join(sorted(seen)) or "none yet"
                    raise WorkflowDefinitionError(
                        f"workflow {self.name!r}, step {step.name!r}: {expr} refers to step "
                        f"{target!r}, which does not run before it (earlier steps: {known})"
                    )
            seen.add(step.name)
            for branch in step.children():
                self._check_steps(branch, seen)

    @property
    def queue(self) -> str | None:
        return self.trigger.queue if self.trigger else None

    def with_version(self, version: str, path: str | None) -> Workflow:
        copy = self.model_copy(update={"version": version, "path": path})
        return copy


def _name_waits(steps: list[Any]) -> list[Any]:
    """Unnamed waits become wait_<position> so names stay unique and stable."""
    named = []
    for position, step in enumerate(steps, start=1):
        if isinstance(step, WaitStep) and step.name == "wait":
            step = step.model_copy(update={"name": f"wait_{position}"})
        named.append(step)
    return named
