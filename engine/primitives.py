"""Flow-control steps: for_each, loop, switch, try_catch, subworkflow, and the middleware chain.

Each is a step definition with an `execute(frame)` method that the runner calls instead of a
node. Inner steps run through `Runner.run_steps`, get their own records (with `parent` and a tag
such as "iteration 2") and own one level of `run.cursor` each, so a wait anywhere inside
resumes at the right iteration, case and inner step after a restart.

Cursor slots each primitive owns (at `frame.depth`, the levels below belong to its inner steps):
for_each (sequential) and loop: the iteration; switch: the arm (position among the cases, the
default last); try_catch: 0 for the try arm, 1 for the catch arm. Parallel for_each iterations
and middleware resume from their records alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Literal

import anyio
from pydantic import Field, ValidationError

from . import expressions
from .context import Context
from .events import StepFinished, StepStarted
from .explain import explain
from .models import RunStatus, StepRun, StepStatus
from .origin import failed_before_running
from .runner import Frame, Runner, StepError, WaitRequested, user_error
from .validation import shown_value
from .workflow import (
    StepDefinition,
    WaitStep,
    Workflow,
    WorkflowDefinitionError,
)

log = logging.getLogger("blok.engine")

MAX_SUBWORKFLOW_DEPTH = 10
GLOBAL_MIDDLEWARE_ENV = "BLOK_GLOBAL_MIDDLEWARE"
_DONE = (StepStatus.COMPLETED, StepStatus.CACHED, StepStatus.SKIPPED)


def _name_nested_waits(owner: str, steps: Sequence[StepDefinition]) -> list[StepDefinition]:
    """Unnamed waits inside a primitive become <owner>_wait_<position>: names stay unique
    across the whole workflow and stable between versions."""
    named = []
    for position, step in enumerate(steps, start=1):
        if isinstance(step, WaitStep) and step.name == "wait":
            step = step.model_copy(update={"name": f"{owner}_wait_{position}"})
        named.append(step)
    return named


def _check_expression(owner: str, value: Any) -> None:
    if expressions.is_expression(value):
        try:
            expressions.parse(value)
        except expressions.ExpressionError as error:
            raise WorkflowDefinitionError(f"step {owner!r}: {error}") from None


def _fingerprint(kind: str, name: str, *branches: Sequence[StepDefinition]) -> str:
    inner = "|".join(",".join(s.fingerprint() for s in branch) for branch in branches)
    return f"{kind}:{name}[{inner}]"


class _Primitive(StepDefinition):
    def __init__(self, name: str | None = None, /, **data: Any) -> None:
        # `ForEach("each", items=...)` as `Step("charge", charge)`: the name may come first.
        if name is not None:
            data["name"] = name
        name = data.get("name", "?")
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise WorkflowDefinitionError(f"step {name!r}: {explain(error, type(self))}") from None
        for expr in self.expressions():
            _check_expression(self.name, expr)

    # ---- shared execution helpers ----------------------------------------------------------
    @staticmethod
    def _start(frame: Frame) -> StepRun:
        record = frame.record
        runner, run = frame.runner, frame.run
        if record.started_at is None:
            record.started_at = runner.clock.now()
        record.status = StepStatus.RUNNING
        record.wait_until = None
        runner.save(run)
        if runner.bus.active:
            runner.bus.publish(StepStarted(run.id, record.index, record.name, 1))
        return record

    @staticmethod
    def _finish(
        frame: Frame, status: StepStatus, output: Any = None, error: str | None = None
    ) -> None:
        record, runner, run = frame.record, frame.runner, frame.run
        record.status = status
        record.finished_at = runner.clock.now()
        if status is StepStatus.COMPLETED:
            record.output = frame.ctx.redact_value(output)
            frame.ctx.state[record.name] = output
        if error is not None:
            record.error = error
        runner.save(run)
        if runner.bus.active:
            runner.bus.publish(
                StepFinished(run.id, record.index, record.name, str(record.status), record.error)
            )

    async def _guard(self, frame: Frame, body: Callable[[], Any]) -> Any:
        """Run `body`, keeping this step's record in step with what happens inside it."""
        self._start(frame)
        try:
            output = await body()
        except WaitRequested as wait:
            frame.record.status = StepStatus.WAITING
            frame.record.wait_until = wait.until
            frame.runner.save(frame.run)
            raise
        except StepError as error:
            self._finish(frame, StepStatus.FAILED, error=str(error))
            raise
        self._finish(frame, StepStatus.COMPLETED, output)
        return output

    def _failure(self, frame: Frame, message: str, error: BaseException | None = None) -> StepError:
        """This step failing on `message`, said as a node's failure is: with where it came
        from, the user's line when a callable of theirs raised `error`, else the step's
        definition (a for_each's items that are no list said no file or line)."""
        return StepError(
            failed_before_running(frame.where, message, error, self.defined_at), self.name
        )

    def _resolve(self, frame: Frame, value: Any, what: str) -> Any:
        try:
            return frame.runner._resolve(value, frame.ctx)
        except BaseException as error:
            if not user_error(error):
                raise
            self._finish(frame, StepStatus.FAILED, error=f"bad {what}: {error}")
            raise self._failure(frame, f"bad {what}: {error}", error) from error


class ForEach(_Primitive):
    """Run `steps` once per item; `ctx.state[name]` is {"item", "index"} inside an iteration
    and the list of iteration results (each iteration's last output) afterwards."""

    kind: Literal["for_each"] = "for_each"
    items: Any
    steps: list[StepDefinition] = Field(min_length=1)
    parallel: int = Field(1, ge=1)

    def children(self) -> list[Sequence[StepDefinition]]:
        return [self.steps]

    def expressions(self) -> list[str]:
        return [self.items] if expressions.is_expression(self.items) else []

    def fingerprint(self) -> str:
        return _fingerprint(f"for_each/{self.parallel}", self.name, self.steps)

    async def execute(self, frame: Frame) -> Any:
        record = frame.record
        if record.input is None or "items" not in record.input:
            items = self._resolve(frame, self.items, "items")
            if not isinstance(items, list | tuple):
                message = f"items must be a list, not {type(items).__name__}"
                self._finish(frame, StepStatus.FAILED, error=message)
                raise self._failure(frame, message)
            record.input = {"items": list(items)}  # fixed on the first pass, as the cursor is
        items = record.input["items"]

        async def body() -> Any:
            done: dict[str, Any] = dict((record.output or {}).get("done", {}))
            if self.parallel > 1:
                await self._parallel(frame, items, done)
            else:
                await self._sequential(frame, items, done)
            return [done[str(i)] for i in range(len(items))]

        return await self._guard(frame, body)

    async def _iteration(
        self,
        frame: Frame,
        ctx: Context,
        items: list[Any],
        i: int,
        done: dict[str, Any],
        resume: list[int] | None,
        track: bool,
    ) -> None:
        ctx.state[self.name] = {"item": items[i], "index": i}
        result = await frame.runner.run_steps(
            frame.workflow,
            frame.run,
            ctx,
            self.steps,
            depth=frame.depth + 1,
            resume=resume,
            parent=frame.record.index,
            tags=(f"iteration {i + 1}",),
            where=f"{frame.where}[{i + 1}/{len(items)}]",
            track=track,
        )
        done[str(i)] = result
        frame.record.output = {"done": done}

    async def _sequential(self, frame: Frame, items: list[Any], done: dict[str, Any]) -> None:
        resume = frame.resume
        start = resume[0] if resume else len(done)
        for i in range(start, len(items)):
            frame.mark(i)
            inner = resume[1:] if resume and i == start else None
            await self._iteration(frame, frame.ctx, items, i, done, inner, track=frame.track)

    async def _parallel(self, frame: Frame, items: list[Any], done: dict[str, Any]) -> None:
        runner, run, ctx = frame.runner, frame.run, frame.ctx
        limiter = anyio.CapacityLimiter(self.parallel)
        waits: list[WaitRequested] = []
        failures: list[StepError] = []

        async def one(i: int) -> None:
            async with limiter:
                if failures:
                    return
                # Each iteration its own context: parallel inner steps must not see each
                # other's item or outputs, and their logs go to their own records.
                child = ctx.branch(dict(ctx.state))
                child._sink = runner.log_sink(run, child)
                try:
                    await self._iteration(frame, child, items, i, done, None, track=False)
                except WaitRequested as wait:
                    waits.append(wait)
                except StepError as error:
                    failures.append(error)

        async with anyio.create_task_group() as tg:
            for i in range(len(items)):
                if str(i) not in done:
                    tg.start_soon(one, i)
        if failures:
            raise failures[0]
        if waits:
            # The iterations that finished are kept in the record; the run sleeps until the
            # earliest wait is due and then re-runs only the unfinished iterations.
            runner._snapshot(run, ctx)
            raise WaitRequested(min(w.until for w in waits))


class Loop(_Primitive):
    """Run `steps` again and again: while `while_(ctx)` holds (checked before each pass) or
    until `until(ctx)` holds (checked after each pass), at most `max_iterations` times."""

    kind: Literal["loop"] = "loop"
    steps: list[StepDefinition] = Field(min_length=1)
    while_: Callable[[Any], Any] | None = None
    until: Callable[[Any], Any] | None = None
    max_iterations: int = Field(100, ge=1)
    on_max: Literal["fail", "stop"] = "fail"

    def __init__(self, name: str | None = None, /, **data: Any) -> None:
        super().__init__(name, **data)
        if (self.while_ is None) == (self.until is None):
            raise WorkflowDefinitionError(
                f"step {self.name!r}: loop needs exactly one of while_= or until="
            )

    def children(self) -> list[Sequence[StepDefinition]]:
        return [self.steps]

    def fingerprint(self) -> str:
        return _fingerprint(f"loop/{self.max_iterations}", self.name, self.steps)

    def _check(self, frame: Frame, condition: Callable[[Any], Any], which: str) -> bool:
        try:
            return bool(condition(frame.ctx))
        except BaseException as error:
            if not user_error(error):
                raise
            message = f"{which} condition raised {type(error).__name__}: {error}"
            raise self._failure(frame, message, error) from error

    async def execute(self, frame: Frame) -> Any:
        record = frame.record

        async def body() -> Any:
            resume = frame.resume
            progress = record.output or {}
            i = resume[0] if resume else int(progress.get("iterations", 0))
            result = progress.get("last")
            # An iteration that began before a wait is finished first, without asking while_
            # again (the cursor says which; a parallel branch has only the record).
            current = resume[0] if resume else progress.get("current")
            while True:
                resuming = i == current
                if (
                    not resuming
                    and self.while_ is not None
                    and not self._check(frame, self.while_, "while_")
                ):
                    return result
                if i >= self.max_iterations:
                    if self.on_max == "stop":
                        return result
                    message = f"did not finish within max_iterations={self.max_iterations}"
                    raise self._failure(frame, message)
                frame.mark(i)
                frame.ctx.state[self.name] = {"iteration": i, "last": result}
                record.output = {"iterations": i, "last": result, "current": i}
                result = await frame.runner.run_steps(
                    frame.workflow,
                    frame.run,
                    frame.ctx,
                    self.steps,
                    depth=frame.depth + 1,
                    resume=resume[1:] if resuming and resume else None,
                    parent=record.index,
                    tags=(f"iteration {i + 1}",),
                    where=f"{frame.where}[{i + 1}]",
                    track=frame.track,
                )
                resume = None
                current = None
                i += 1
                record.output = {"iterations": i, "last": result}
                if self.until is not None and self._check(frame, self.until, "until"):
                    return result

        return await self._guard(frame, body)


class Switch(_Primitive):
    """Run the steps of the case whose key equals `on` (resolved against the context), else
    `default` (nothing when there is none; with none given, a value no case has is warned of
    in the run's log, where `default=[]` says that nothing is to run)."""

    kind: Literal["switch"] = "switch"
    on: Any
    cases: dict[Any, list[StepDefinition]]
    default: list[StepDefinition] | None = None

    def children(self) -> list[Sequence[StepDefinition]]:
        return [*self.cases.values(), self.default or []]

    def expressions(self) -> list[str]:
        return [self.on] if expressions.is_expression(self.on) else []

    def fingerprint(self) -> str:
        return _fingerprint("switch", self.name, *self.children())

    async def execute(self, frame: Frame) -> Any:
        record = frame.record
        keys = list(self.cases)
        resume = frame.resume
        if resume:
            arm = resume[0]
        elif record.input is not None and "arm" in record.input:
            arm = record.input["arm"]  # chosen on an earlier pass (inside a parallel branch)
        else:
            value = self._resolve(frame, self.on, "switch value")
            arm = next((n for n, key in enumerate(keys) if key == value), len(keys))
            case = keys[arm] if arm < len(keys) else "default"
            record.input = {"value": value, "case": case, "arm": arm}
            if arm == len(keys) and self.default is None:
                # Said where it is read: a typo in a kind ("refnd") otherwise ran nothing and
                # the run completed without a word.
                named = ", ".join(shown_value(key) for key in keys[:5])
                more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
                frame.runner.engine_log(
                    frame.run,
                    f"{frame.where}: {shown_value(value)} matched no case ({named}{more}) "
                    "and there is no default: nothing ran (default=[] says nothing is to)",
                    "warning",
                )
        steps = self.cases[keys[arm]] if arm < len(keys) else self.default or []
        label = f"case {keys[arm]}" if arm < len(keys) else "default"

        async def body() -> Any:
            frame.mark(arm)
            if not steps:
                return None
            return await frame.runner.run_steps(
                frame.workflow,
                frame.run,
                frame.ctx,
                steps,
                depth=frame.depth + 1,
                resume=resume[1:] if resume else None,
                parent=record.index,
                tags=(label,),
                where=f"{frame.where}[{label}]",
                track=frame.track,
            )

        return await self._guard(frame, body)


class TryCatch(_Primitive):
    """Run `try_`; if one of its steps fails, run `catch` with `ctx.state[name]` holding
    {"error", "step", "type"} of the failure. The output is the last output of the arm that
    ran to the end; a failure in `catch` fails the step."""

    kind: Literal["try_catch"] = "try_catch"
    try_: list[StepDefinition] = Field(min_length=1)
    catch: list[StepDefinition] = Field(default_factory=list)

    def children(self) -> list[Sequence[StepDefinition]]:
        return [self.try_, self.catch]

    def fingerprint(self) -> str:
        return _fingerprint("try_catch", self.name, self.try_, self.catch)

    async def _arm(self, frame: Frame, arm: int, resume: list[int] | None) -> Any:
        frame.mark(arm)
        label = "try" if arm == 0 else "catch"
        return await frame.runner.run_steps(
            frame.workflow,
            frame.run,
            frame.ctx,
            self.try_ if arm == 0 else self.catch,
            depth=frame.depth + 1,
            resume=resume,
            parent=frame.record.index,
            tags=(label,),
            where=f"{frame.where}[{label}]",
            track=frame.track,
        )

    async def execute(self, frame: Frame) -> Any:
        record = frame.record
        resume = frame.resume

        async def body() -> Any:
            caught_before = record.input is not None and "caught" in record.input
            if (resume and resume[0] == 1) or (not resume and caught_before):
                frame.ctx.state.setdefault(self.name, record.input["caught"])
                return await self._arm(frame, 1, resume[1:] if resume else None)
            try:
                return await self._arm(frame, 0, resume[1:] if resume else None)
            except StepError as error:
                cause = error.__cause__
                caught = {
                    "error": str(cause) if cause is not None else str(error),
                    "step": error.step,
                    "type": type(cause).__name__ if cause is not None else "StepError",
                    "message": str(error),
                }
                record.input = {"caught": caught}
                frame.ctx.state[self.name] = caught
                frame.runner.engine_log(
                    frame.run, f"{frame.where}: caught the failure of step {error.step!r}"
                )
                if not self.catch:
                    return caught
                return await self._arm(frame, 1, None)

        return await self._guard(frame, body)


class Subworkflow(_Primitive):
    """Run another workflow (by name, on its own queue; one with no trigger of its own on the
    parent's queue) as a child run. `wait=True` waits for
    it, without holding a worker slot, and uses its output; `wait=False` dispatches it and goes
    on with {"run_id", "job_id"}."""

    kind: Literal["subworkflow"] = "subworkflow"
    workflow: str = Field(min_length=1)
    input: Any = None
    wait: bool = True

    def expressions(self) -> list[str]:
        return [self.input] if expressions.is_expression(self.input) else []

    def fingerprint(self) -> str:
        return f"subworkflow:{self.name}:{self.workflow}:{self.wait}"

    async def execute(self, frame: Frame) -> Any:
        runner, run, record = frame.runner, frame.run, frame.record
        badge = "sub" if self.wait else "async"
        if badge not in record.tags:
            record.tags = [*record.tags, badge]
        self._start(frame)
        if record.child_run_id is None:
            await self._dispatch(frame)
        if not self.wait:
            output = {"run_id": record.child_run_id, "job_id": record.input["job_id"]}
            self._finish(frame, StepStatus.COMPLETED, output)
            return output
        # Follow the child's job, not its first run: a job-level retry or a redelivery after a
        # crash gives the job a new run, and the job is over only when its last run is.
        job_over = True
        job = await runner.services.find_job(record.input["job_id"])
        if job is not None:
            job_over = job.state.terminal
            if job.run_id != record.child_run_id:
                record.child_run_id = job.run_id
                runner.save(run)
        assert record.child_run_id is not None
        child = await runner.services.get_run(record.child_run_id)
        if child is None:
            message = f"child run {record.child_run_id} is not in the store"
            self._finish(frame, StepStatus.FAILED, error=message)
            raise StepError(f"{frame.where} failed: {message}", self.name)
        if child.status is RunStatus.COMPLETED:
            self._finish(frame, StepStatus.COMPLETED, child.output)
            return child.output
        if child.terminal and job_over:
            detail = f": {child.error}" if child.error else ""
            message = f"child run {child.id} ({self.workflow}) ended {child.status}{detail}"
            self._finish(frame, StepStatus.FAILED, error=message)
            raise StepError(f"{frame.where} failed: {message}", self.name)
        # Not done yet: sleep like a wait (the worker slot is freed) and look again; the gap
        # grows with the time already waited, from 50 ms to 2 s.
        now = runner.clock.now()
        waited = (now - (record.started_at or now)).total_seconds()
        until = now + timedelta(seconds=min(2.0, max(0.05, waited / 5)))
        record.status = StepStatus.WAITING
        record.wait_until = until
        runner._snapshot(run, frame.ctx)
        runner.save(run)
        raise WaitRequested(until)

    async def _dispatch(self, frame: Frame) -> None:
        runner, run, record = frame.runner, frame.run, frame.record

        def fail(message: str) -> StepError:
            self._finish(frame, StepStatus.FAILED, error=message)
            return self._failure(frame, message)

        target = runner.services.workflow(self.workflow)
        if target is None:
            known = runner.services.workflow_names()
            raise fail(
                f"workflow {self.workflow!r} is not loaded"
                + expressions.did_you_mean(self.workflow, known)
            )
        if target.middleware:
            raise fail(f"workflow {self.workflow!r} is middleware, not a sub-workflow")
        if run.depth + 1 > MAX_SUBWORKFLOW_DEPTH:
            raise fail(f"sub-workflow depth {run.depth + 1} is above {MAX_SUBWORKFLOW_DEPTH}")
        payload = (
            frame.ctx.body if self.input is None else self._resolve(frame, self.input, "input")
        )
        # A job id fixed by the parent's step: dispatching again after a crash finds the child
        # instead of starting a second one.
        job_id = f"{run.id}.{record.index}"
        meta = {"parent_run_id": run.id, "depth": run.depth + 1, "parent_step": self.name}
        try:
            # A helper workflow (no trigger) runs on the parent's queue.
            child_run_id = await runner.services.dispatch(target, payload, job_id, meta, run.queue)
        except Exception as error:
            raise fail(f"cannot start {self.workflow!r}: {error}") from error
        record.child_run_id = child_run_id
        record.input = {"workflow": self.workflow, "job_id": job_id, "input": payload}
        runner.save(run)


# ---- middleware --------------------------------------------------------------------------
def global_middleware() -> tuple[str, ...]:
    """The process-global middleware (BLOK_GLOBAL_MIDDLEWARE, comma-separated), read when an
    engine starts serving: once, not at every run (a missing variable costs an exception)."""
    setting = os.environ.get(GLOBAL_MIDDLEWARE_ENV, "")
    return tuple(n.strip() for n in setting.split(",") if n.strip())


def middleware_chain(workflow: Workflow, global_names: Sequence[str] = ()) -> list[str]:
    """Process-global (`global_middleware()`) → workflow-level (`use`) → trigger-level
    (`WorkerTrigger.middleware`), each name once, in that order."""
    names = list(global_names)
    names += list(getattr(workflow, "use", []) or [])
    if workflow.trigger is not None:
        names += list(getattr(workflow.trigger, "middleware", []) or [])
    chain: list[str] = []
    for name in names:
        if name not in chain and name != workflow.name:
            chain.append(name)
    return chain


async def run_middleware(
    runner: Runner,
    workflow: Workflow,
    run: Any,
    ctx: Context,
    *,
    global_names: Sequence[str] = (),
) -> None:
    """Run the middleware chain on the run's own context before its steps. Middleware steps'
    records carry a `mw:<name>` tag; a finished one is not run again when the run resumes."""
    if workflow.middleware:
        return
    chain = middleware_chain(workflow, global_names)
    if not chain:
        return
    for name in chain:
        mw = runner.services.workflow(name)
        if mw is None or not mw.middleware:
            why = "is not marked middleware=True"
            if mw is None:
                known = runner.services.workflow_names()
                why = "is not loaded" + expressions.did_you_mean(name, known)
            raise StepError(f"[middleware {name}] failed: workflow {name!r} {why}", f"mw:{name}")
        tag = f"mw:{name}"
        records = [r for r in run.steps if r.parent is None and r.tags[:1] == [tag]]
        if len(records) == len(mw.steps) and all(r.status in _DONE for r in records):
            continue
        await runner.run_steps(
            workflow,
            run,
            ctx,
            mw.steps,
            tags=(tag,),
            where=f"[middleware {name}]",
            track=False,
        )


# ---- the Pythonic constructors -----------------------------------------------------------
def for_each(
    name: str, items: Any, *, steps: Sequence[StepDefinition], parallel: int = 1
) -> ForEach:
    """`for_each("items", "$.body.items", steps=[...], parallel=4)`."""
    return ForEach(name=name, items=items, steps=_name_nested_waits(name, steps), parallel=parallel)


def loop(
    name: str,
    *,
    steps: Sequence[StepDefinition],
    while_: Callable[[Any], Any] | None = None,
    until: Callable[[Any], Any] | None = None,
    max_iterations: int = 100,
    on_max: Literal["fail", "stop"] = "fail",
) -> Loop:
    """`loop("poll", steps=[...], until=lambda ctx: ctx.state["check"]["ready"], max_iterations=10)`."""
    return Loop(
        name=name,
        steps=_name_nested_waits(name, steps),
        while_=while_,
        until=until,
        max_iterations=max_iterations,
        on_max=on_max,
    )


def switch(
    name: str,
    *,
    on: Any,
    cases: dict[Any, Sequence[StepDefinition]],
    default: Sequence[StepDefinition] | None = None,
) -> Switch:
    """`switch("route", on="$.body.kind", cases={"a": [...]}, default=[...])`."""
    return Switch(
        name=name,
        on=on,
        cases={key: _name_nested_waits(f"{name}_{key}", steps) for key, steps in cases.items()},
        default=None if default is None else _name_nested_waits(f"{name}_default", default),
    )


def try_catch(
    name: str, *, try_: Sequence[StepDefinition], catch: Sequence[StepDefinition] = ()
) -> TryCatch:
    """`try_catch("safe", try_=[...], catch=[...])`; the catch arm reads `$.state.<name>.error`
    and `$.state.<name>.step`."""
    return TryCatch(
        name=name,
        try_=_name_nested_waits(f"{name}_try", try_),
        catch=_name_nested_waits(f"{name}_catch", catch),
    )


def subworkflow(name: str, *, workflow: str, input: Any = None, wait: bool = True) -> Subworkflow:
    """`subworkflow("child", workflow="billing.refund", input="$.body.order", wait=True)`."""
    return Subworkflow(name=name, workflow=workflow, input=input, wait=wait)
