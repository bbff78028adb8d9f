"""The step runner: one run's steps in order, with retries, timeouts, the cache and waits.

The runner changes the step records of a Run and tells its `Recorder` and the bus; the run's
own status and what happens to its job afterwards (ack, retry, dead letter, re-delivery after a
wait) are the ledger's business. What steps need from the engine around them (another
workflow, the idempotency cache, dispatching a child run) comes through `Services`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import traceback
import weakref
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

from . import expressions, telemetry
from .backends.base import key_text
from .backoffs import Backoffs
from .clock import Clock
from .context import Context
from .durations import exact_duration, parse_until
from .errors import NonRetryable, UnstorableOutput
from .events import AttemptFailed, EventBus, LogRecorded, StepFinished, StepStarted
from .input_models import InputModelError, typed_inputs
from .loader import user_names
from .models import (
    TERMINAL_RUN_STATUSES,
    Attempt,
    AttemptStatus,
    LogLine,
    Run,
    RunStatus,
    StepRun,
    StepStatus,
)
from .node_calls import NodeCalls
from .origin import (
    Stopped,
    error_said,
    failed_before_running,
    failed_for_good,
    stopped_in_thread,
)
from .records import assign, construct
from .services import UNRECORDED, Recorder, Services
from .step_values import KEY, bad_input, fixed_input, stored_output
from .threads import SyncCall
from .workflow import EventWaitStep, Step, StepDefinition, WaitStep, Workflow

DEFAULT_SNAPSHOT_CAP = 1_048_576
NO_TIMEOUT = timedelta(days=36_500)  # an event wait without a timeout: parked this long
# The key of a snapshot that was not saved, with why (the state stays in this process only).
SNAPSHOT_SKIPPED = "__blok_snapshot_skipped__"
KEPT_STATES = 256  # unsaved states a process keeps for its runs to resume with
# How long a sync node told to stop (ctx.cancelled) may take to return before its run is
# recorded stopped without it (it goes on in its thread; its slot stays taken until it returns).
SYNC_UNWIND_S = 0.5


class StepError(Exception):
    """A step that failed for good. `str()` says where: "[step 2/4] charge failed: …"."""

    def __init__(
        self, message: str, step: str, timed_out: bool = False, permanent: str | None = None
    ) -> None:
        super().__init__(message)
        self.step = step
        self.timed_out = timed_out
        # Why retrying the job cannot help (its body lacks what a step reads, the node raised
        # NonRetryable or returned what cannot be stored): dead-lettered without its retries.
        self.permanent = permanent


class SnapshotLost(Exception):
    """A run resumes where its ctx.state is neither saved nor kept: it cannot go on."""


class WaitRequested(Exception):
    """The run reached a wait whose deadline is in the future."""

    def __init__(self, until: datetime) -> None:
        super().__init__(until.isoformat())
        self.until = until


@dataclass
class Frame:
    """Where a primitive step runs: its record, the cursor level it owns (`run.cursor[depth]`)
    and, when the run resumes, the saved path from that level down."""

    runner: Runner
    workflow: Workflow
    run: Run
    ctx: Context
    record: StepRun
    depth: int
    resume: list[int] | None
    where: str
    track: bool = True  # False inside parallel branches and middleware: no cursor to keep

    def mark(self, position: int) -> None:
        """Record this primitive's position (iteration, arm) at its level of the cursor."""
        if self.track:
            del self.run.cursor[self.depth :]
            self.run.cursor.append(position)


@dataclass
class Outcome:
    status: RunStatus
    output: Any = None
    error: str | None = None
    error_step: str | None = None
    wait_until: datetime | None = None
    cause: BaseException | None = None
    # Not retried whatever the budget: the job's own time limit ran out (a step's timeout,
    # like any failure, goes through the trigger's retries, then the dead-letter queue).
    final: bool = False
    permanent: str | None = None  # StepError.permanent: dead-lettered without its retries


def _why_final(failure: BaseException | None) -> str:
    if isinstance(failure, UnstorableOutput):
        return "every attempt would return what cannot be stored"
    return "the node raised NonRetryable"


def user_error(error: BaseException) -> bool:
    """An error raised by a user's code (a node, an input, a condition) fails its step: any
    exception, SystemExit, KeyboardInterrupt and GeneratorExit included. Only the engine's own
    cancellation (an operator's cancel, a timeout, a stop) goes through: a `CancelledError`
    while this task is being cancelled. One a node raised itself, or let out of a task of its
    own that was cancelled, is its failure: taken for a stop, it would end the worker's task
    group, or send the job back to the queue to be taken again at once, for ever."""
    if not isinstance(error, anyio.get_cancelled_exc_class()):
        return True
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


def pending_step(
    index: int,
    name: str,
    kind: str,
    *,
    max_attempts: int = 1,
    tags: list[str] | None = None,
    parent: int | None = None,
) -> StepRun:
    """A pending step record, also for a step known only by name and kind (a replay made by a
    process that has not loaded the workflow)."""
    return construct(
        StepRun,
        dict(
            index=index,
            name=name,
            kind=kind,
            status=StepStatus.PENDING,
            started_at=None,
            finished_at=None,
            input=None,
            output=None,
            error=None,
            max_attempts=max_attempts,
            attempts=[],
            logs=[],
            cached_from=None,
            wait_until=None,
            timed_out=False,
            tags=tags if tags is not None else [],
            parent=parent,
            child_run_id=None,
        ),
    )


def running_attempt(number: int, now: datetime) -> Attempt:
    """The record of a step's attempt `number` as it begins, `now`."""
    return construct(
        Attempt,
        dict(
            number=number,
            status=AttemptStatus.RUNNING,
            started_at=now,
            finished_at=None,
            error=None,
            error_type=None,
            traceback=None,
            backoff_ms=None,
        ),
    )


class Runner:
    def __init__(
        self,
        services: Services,
        bus: EventBus,
        snapshot_cap: int = DEFAULT_SNAPSHOT_CAP,
        snapshots: bool = True,
        clock: Clock | None = None,
    ) -> None:
        self.services = services
        # Its backend's: a step's times, and the deadline of a wait, are on the clock that
        # decides when the run is due again.
        self.clock = clock if clock is not None else Clock()
        self.bus = bus
        self.snapshot_cap = snapshot_cap
        self.snapshots = snapshots  # False: BLOK_STATE_SNAPSHOT_DISABLED
        # States not saved with their runs (see _snapshot), by run id, oldest first.
        self.kept_states: dict[str, dict[str, Any]] = {}
        # The middleware chain (engine/primitives.py), run before a workflow's own steps.
        self.middleware: Callable[[Runner, Workflow, Run, Context], Awaitable[None]] | None = None
        self._recorders: dict[str, Recorder] = {}
        self._nested: dict[str, tuple[list[StepRun], dict[tuple[Any, ...], int]]] = {}
        self.backoffs = Backoffs(self.clock)  # runs sleeping before a step's next attempt
        self.calls = NodeCalls(self.engine_log)

    # ---- records ---------------------------------------------------------------------------
    @staticmethod
    def pending_record(
        step: StepDefinition, index: int, tags: list[str] | None = None, parent: int | None = None
    ) -> StepRun:
        """A step record before the step runs: what the step rail shows as pending."""
        return pending_step(
            index,
            step.name,
            step.kind,
            max_attempts=getattr(step, "max_attempts", 1),
            tags=tags,
            parent=parent,
        )

    @staticmethod
    def prepare(workflow: Workflow, run: Run) -> None:
        """Give a fresh run one pending step record per top-level step, for the step rail."""
        if not run.steps:
            steps = [Runner.pending_record(step, i) for i, step in enumerate(workflow.steps)]
            assign(run, steps=steps)

    def log_sink(self, run: Run, ctx: Context) -> Callable[[logging.LogRecord], None]:
        # The context holds its sink, so the sink holds the context weakly: a reference cycle
        # a run would leave the run's context, its job info and the sink to the garbage
        # collector instead of freeing them as the run ends.
        context = weakref.ref(ctx)

        def sink(record: logging.LogRecord) -> None:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + user_names("".join(traceback.format_exception(*record.exc_info)))
            current = context()
            index = current.step_index if current is not None else None
            ts, level = datetime.fromtimestamp(record.created, UTC), record.levelname.lower()
            line = LogLine.model_construct(ts=ts, level=level, message=message, step=index)
            # Which run and step wrote it, for the handlers it goes on to (a worker's stderr).
            steps = run.steps
            record.run_id = run.id
            record.step = steps[index].name if index is not None and index < len(steps) else None
            self.add_log(run, line)

        return sink

    def save(self, run: Run) -> None:
        """Record the run's progress (fire and forget)."""
        self._recorders.get(run.id, UNRECORDED).save(run)

    def add_log(self, run: Run, line: LogLine) -> None:
        if run.status in TERMINAL_RUN_STATUSES:
            # A node a timeout abandoned in its thread may still log: the run's record is
            # final (and may be in readers' hands), the line goes nowhere.
            return
        if line.step is not None and line.step < len(run.steps):
            run.steps[line.step].logs.append(line)
        else:
            run.logs.append(line)
        self._recorders.get(run.id, UNRECORDED).log(run.id, line)
        if self.bus.active:
            self.bus.publish(LogRecorded(run.id, line.step, line.level, line.message))

    def engine_log(self, run: Run, message: str, level: str = "info") -> None:
        self.add_log(
            run,
            LogLine.model_construct(ts=self.clock.now(), level=level, message=message, step=None),
        )

    # ---- running ---------------------------------------------------------------------------
    async def run(
        self, workflow: Workflow, run: Run, ctx: Context, recorder: Recorder = UNRECORDED
    ) -> Outcome:
        """Run from the run's cursor to the end, a wait, or a failure. Cancellation (the
        engine cancelling the surrounding scope) propagates."""
        self._recorders[run.id] = recorder
        try:
            return await self._run(workflow, run, ctx)
        except BaseException:
            # Stopped (a cancel, a timeout, a stop): a plain def told so (ctx.cancelled) has a
            # moment to return, as async code has to unwind, and what it logs meanwhile ("rolled
            # back") is recorded with the run; its recorder was gone, and the line went nowhere.
            if self.calls.running_threads(run.id):
                with anyio.CancelScope(shield=True), anyio.move_on_after(SYNC_UNWIND_S):
                    await self.calls.threads_ended(run.id)
            raise
        finally:
            self._recorders.pop(run.id, None)

    async def _run(self, workflow: Workflow, run: Run, ctx: Context) -> Outcome:
        self.prepare(workflow, run)
        steps = workflow.steps
        resume = list(run.cursor)
        output: Any = None
        try:
            if self.middleware is not None:
                await self.middleware(self, workflow, run, ctx)
            output = await self.run_steps(workflow, run, ctx, steps, resume=resume)
        except WaitRequested as wait:
            return Outcome(RunStatus.WAITING, wait_until=wait.until)
        except StepError as error:
            status = RunStatus.TIMED_OUT if error.timed_out else RunStatus.FAILED
            return Outcome(
                status,
                error=str(error),
                error_step=error.step,
                cause=error,
                permanent=error.permanent,
            )
        finally:
            self._nested.pop(run.id, None)
        assign(run, cursor=[])
        return Outcome(RunStatus.COMPLETED, output=ctx.redact_value(output))

    async def _step(
        self,
        workflow: Workflow,
        run: Run,
        ctx: Context,
        step: StepDefinition,
        index: int,
        total: int,
        previous: Any,
        *,
        where: str | None = None,
        depth: int = 0,
        resume: list[int] | None = None,
        track: bool = True,
    ) -> Any:
        record = run.steps[index]
        ctx.step_index = index
        where = where or f"[step {index + 1}/{total}] {step.name}"
        # Node steps first: asking a node step (a pydantic model) for an `execute` it does not
        # have goes through pydantic's __getattr__ and an AttributeError, a few µs a step.
        if isinstance(step, Step):
            if not step.runs:
                self._skip(run, record)
                return previous
            return await self._node(workflow, run, ctx, step, record, where)
        if isinstance(step, WaitStep):
            # A wait passes on the output before it, whether it paused or not.
            await self._wait(run, ctx, step, record, where)
            return previous
        if isinstance(step, EventWaitStep):
            return await self._event_wait(run, ctx, step, record, where)
        execute = getattr(step, "execute", None)
        if execute is not None:  # a primitive (engine/primitives.py) runs its own inner steps
            frame = Frame(self, workflow, run, ctx, record, depth + 1, resume, where, track)
            with telemetry.OBSERVE.flow_step(run, ctx, step.name, step.kind, WaitRequested):
                return await execute(frame)
        raise StepError(f"{where} failed: step kind {step.kind!r} is not supported", step.name)

    async def run_steps(
        self,
        workflow: Workflow,
        run: Run,
        ctx: Context,
        steps: Sequence[StepDefinition],
        *,
        depth: int = 0,
        resume: list[int] | None = None,
        parent: int | None = None,
        tags: tuple[str, ...] = (),
        where: str | None = None,
        track: bool = True,
    ) -> Any:
        """Run a list of steps from `resume` (this level's index, then the levels below it).

        The top level (no parent, no tags) uses the records `prepare` made; nested levels get a
        record each, found again by (parent, name, tags) when a run resumes, and a record that
        already completed is not run again. `run.cursor[depth]` is this level's position, so a
        wait anywhere below leaves the whole path in the cursor; parallel branches pass
        `track=False` (one cursor cannot hold several positions) and resume from records alone.
        """
        top = parent is None and not tags
        start = resume[0] if resume else 0
        # Resuming part-way (after a wait): the output that flowed to `start` on the first pass.
        output = self._flowed(run, ctx, steps, start, parent, tags) if start else None
        for i in range(start, len(steps)):
            step = steps[i]
            if track:
                del run.cursor[depth:]
                run.cursor.append(i)
            inner = resume[1:] if resume and i == start else None
            if top:
                output = await self._step(
                    workflow, run, ctx, step, i, len(steps), output, depth=depth, resume=inner
                )
                continue
            record = self.nested_record(run, step, parent, tags)
            if record.status in (StepStatus.COMPLETED, StepStatus.CACHED):
                if step.kind != "wait":  # a wait passes on what came before it
                    output = record.output
                    if step.recorded:
                        step.keep(ctx.state, output)
                continue
            if record.status is StepStatus.SKIPPED:
                continue
            label = f"{where} › {step.name}" if where else f"{' '.join(tags)} › {step.name}"
            output = await self._step(
                workflow,
                run,
                ctx,
                step,
                record.index,
                len(steps),
                output,
                where=label,
                depth=depth,
                resume=inner,
                track=track,
            )
        return output

    def _flowed(
        self,
        run: Run,
        ctx: Context,
        steps: Sequence[StepDefinition],
        start: int,
        parent: int | None,
        tags: tuple[str, ...],
    ) -> Any:
        """The output that reached step `start` on an earlier pass of this list: the last
        one of a step before it that ran (waits and skipped steps pass theirs on), as the
        context holds it (real values), else as its record does."""
        top = parent is None and not tags
        for j in range(start - 1, -1, -1):
            step = steps[j]
            if step.kind == "wait":
                continue
            record = run.steps[j] if top else self._find_nested(run, step, parent, tags)
            if record is None or record.status is StepStatus.SKIPPED:
                continue
            keys = step.state_keys()
            if keys and keys[0] in ctx.state:
                return ctx.state[keys[0]]
            return record.output
        return None

    def _find_nested(
        self, run: Run, step: StepDefinition, parent: int | None, tags: tuple[str, ...]
    ) -> StepRun | None:
        key = (parent, step.name, tuple(tags[:1]))
        for record in run.steps:
            if (record.parent, record.name, tuple(record.tags[:1])) == key:
                return record
        return None

    def _skip(self, run: Run, record: StepRun) -> None:
        """A step switched off (`active=False`): recorded skipped, its node not called."""
        record.status = StepStatus.SKIPPED
        record.started_at = record.finished_at = self.clock.now()
        self._finished(run, record)

    def nested_record(
        self, run: Run, step: StepDefinition, parent: int | None, tags: tuple[str, ...]
    ) -> StepRun:
        """The record of a nested (or middleware) step: the one made on an earlier pass of
        this run, else a new one at the end of `run.steps`."""
        # The first tag says where the step sits (iteration, case, mw:<name>); more tags are
        # badges a step adds to itself (sub, async) and do not take part in finding it.
        wanted = list(tags)
        key = (parent, step.name, tuple(tags[:1]))
        index = self._nested.get(run.id)
        if index is None or index[0] is not run.steps:
            # Built once per run object (a resumed run is a fresh one from the store), so a
            # for_each over many items does not scan all records for each inner step.
            found = {
                (r.parent, r.name, tuple(r.tags[:1])): r.index
                for r in run.steps
                if r.parent is not None or r.tags
            }
            index = self._nested[run.id] = (run.steps, found)
        known = index[1].get(key)
        if known is not None:
            return run.steps[known]
        record = self.pending_record(step, len(run.steps), wanted, parent)
        run.steps.append(record)
        index[1][key] = record.index
        return record

    def _resolve(self, value: Any, ctx: Context) -> Any:
        if expressions.is_expression(value):
            return expressions.resolve(value, ctx)
        if callable(value):
            return value(ctx)
        return value

    async def _node(
        self, workflow: Workflow, run: Run, ctx: Context, step: Step, record: StepRun, where: str
    ) -> Any:
        inputs: dict[str, Any] = {}
        resolving = ""  # the input being made: a failure names it
        try:
            for resolving, value in step.inputs.items():
                inputs[resolving] = self._resolve(value, ctx)
            key = None
            if step.idempotency_key is not None:
                resolving = KEY
                resolved = self._resolve(step.idempotency_key, ctx)
                key = None if resolved is None else str(resolved)  # None: nothing to cache
            given = typed_inputs(step.node, inputs)  # a parameter annotated with a model: one
        except BaseException as error:
            if not user_error(error):
                raise
            if isinstance(error, InputModelError):  # made, and refused by its model: shown
                resolving, record.input = error.input, ctx.redact_value(inputs)
            record.status = StepStatus.FAILED
            record.error = bad_input(resolving, error)
            record.finished_at = self.clock.now()
            self._finished(run, record)
            message = failed_before_running(where, record.error, error, step.defined_at)
            made = step.idempotency_key if resolving == KEY else step.inputs.get(resolving)
            raise StepError(message, step.name, permanent=fixed_input(made)) from error
        assign(record, input=ctx.redact_value(inputs) if inputs else None)
        if key is not None:
            hit = await self.services.cache_get(workflow.name, step.name, key)
            if hit is not None:
                now = self.clock.now()
                record.status = StepStatus.CACHED
                record.started_at = record.finished_at = now
                record.output = hit.output if step.recorded else None
                record.cached_from = hit.run_id
                try:
                    step.keep(ctx.state, hit.output)
                except TypeError as error:
                    record.status = StepStatus.FAILED
                    record.error = str(error)
                    self._finished(run, record)
                    raise StepError(f"{where} failed: {error}", step.name) from error
                self._finished(run, record)
                return hit.output
        retry = step.retry
        max_attempts = step.max_attempts
        # A run a stop sent back resumes here with the attempts it made: those that failed
        # count against the budget, the one the stop interrupted does not. The record may
        # then hold more attempts than the budget: its max_attempts says how many it may
        # hold in all, so that "attempt 2/2" reads right where the budget is 1.
        spent, made = record.counted_attempts, len(record.attempts)
        spent = min(spent, max_attempts - 1)  # one attempt at least (a reload cut the budget)
        assign(record, max_attempts=made + max_attempts - spent)
        for attempt_no in range(spent + 1, max_attempts + 1):
            attempt = running_attempt(len(record.attempts) + 1, self.clock.now())
            record.attempts.append(attempt)
            assign(
                record,
                status=StepStatus.RUNNING,
                started_at=record.started_at or attempt.started_at,
            )
            assign(run, attempts=run.attempts + 1)
            ctx.attempt = attempt_no
            self.save(run)
            if self.bus.active:
                self.bus.publish(StepStarted(run.id, record.index, step.name, attempt_no))
            timed_out = False
            failure: BaseException | None = None
            result: Any = None
            call: SyncCall | None = None
            stopped: Stopped | None = None
            ctx.attempt_stopped = False
            limit_s = step.max_duration / 1000 if step.max_duration else None
            began = time.monotonic()
            try:
                scope = anyio.move_on_after(limit_s) if limit_s else None
                with telemetry.OBSERVE.step(run, ctx, step.name, scope), scope or nullcontext():
                    if self.calls.is_async(step):
                        result = await self.calls.run_async(run, step, where, ctx, given)
                    else:
                        call = self.calls.start_sync(run, step, where, ctx, given)
                        result = await call.outcome()
                if (scope is not None and scope.cancelled_caught) or (
                    limit_s is not None and time.monotonic() - began > limit_s
                ):
                    # Cancelled at its deadline, or it returned past it without giving the
                    # event loop a chance to cancel it (it blocked the loop): timed out both.
                    timed_out = True
                    ctx.attempt_stopped = True
                else:
                    result = stored_output(result, f"the return value of {step.name}")
                    step.keep(ctx.state, result)  # a spread of a non-dict fails the attempt
            except BaseException as error:
                if not user_error(error):
                    ctx.cancelled = True  # the run is being stopped: a sync node sees it
                    raise
                failure = error
            finally:
                if call is not None and not call.running:
                    self.calls.ended(run, call)
            finished_at = self.clock.now()
            if failure is None and not timed_out:
                assign(attempt, finished_at=finished_at, status=AttemptStatus.COMPLETED)
                recorded = ctx.redact_value(result)  # later steps see the real value
                assign(
                    record,
                    status=StepStatus.COMPLETED,
                    output=recorded if step.recorded else None,
                    finished_at=finished_at,
                )
                if key is not None:
                    # Cached as recorded: a secret is stored nowhere, the cache included.
                    self.services.cache_put(
                        workflow.name, step.name, key, recorded, run.id, step.idempotency_ttl
                    )
                self._finished(run, record)
                return result
            attempt.finished_at = finished_at
            run.failed_attempts += 1
            if timed_out:
                attempt.status = AttemptStatus.TIMED_OUT
                attempt.error = (
                    f"timed out after {exact_duration(step.max_duration)} (max_duration)"
                )
                attempt.error_type = "TimeoutError"
                # Where it was: an async node left it; a sync node's thread is still there.
                stopped = self.calls.took(run.id, ctx)
                if call is not None and call.running:
                    stopped = stopped_in_thread(call.ident)
                if stopped is not None:
                    attempt.traceback = ctx.redact(user_names(stopped.stack))
            else:
                assert failure is not None
                attempt.status = AttemptStatus.FAILED
                # A node's error may quote a secret header (an API refusing a key): hidden.
                attempt.error = ctx.redact(str(failure) or type(failure).__name__)
                attempt.error_type = type(failure).__name__
                attempt.traceback = ctx.redact(
                    user_names("".join(traceback.format_exception(failure)))
                )
            last_word = isinstance(failure, NonRetryable | UnstorableOutput)
            given_up = last_word and attempt_no < max_attempts
            last = attempt_no >= max_attempts or last_word
            if not last and retry is not None:
                attempt.backoff_ms = retry.backoff_ms(attempt_no)
            if call is not None and call.running:
                # A thread cannot be stopped: it was told (ctx.cancelled), and nothing more
                # of this step starts until it returned, so attempts never overlap.
                self.engine_log(
                    run,
                    f"{where}: attempt {attempt_no} timed out but its sync node still runs in "
                    f"its thread{stopped.note if stopped else ''}; "
                    f"{'the step ends' if last else 'the next attempt starts'} once it returns "
                    "(a sync node should return when ctx.cancelled is set)",
                    "warning",
                )
                self.save(run)
                await call.ended()
                self.calls.ended(run, call)
            if self.bus.active:
                self.bus.publish(
                    AttemptFailed(
                        run.id,
                        record.index,
                        step.name,
                        attempt_no,
                        max_attempts,
                        f"{attempt.error_type}: {attempt.error}",
                        attempt.backoff_ms,
                    )
                )
            if last:
                record.status = StepStatus.FAILED
                record.timed_out = timed_out
                record.error = f"{attempt.error_type}: {attempt.error}"
                record.finished_at = attempt.finished_at
                self._finished(run, record)
                said = error_said(attempt.error_type, attempt.error or "")
                message = failed_for_good(
                    where, said, failure, attempt_no, stopped, step.defined_at, given_up
                )
                permanent = _why_final(failure) if last_word else None
                try:
                    raise StepError(message, step.name, timed_out, permanent) from failure
                finally:
                    failure = None  # it holds the frame (its traceback), the frame it: a cycle
            self.save(run)
            top = record.parent is None and not record.tags
            seconds = (attempt.backoff_ms or 0) / 1000
            newer = await self.backoffs.sleep(run.id, workflow, seconds, handover=top)
            if newer is not None:  # reloaded with the same steps: on with the new code
                self.engine_log(
                    run,
                    f"{where}: version {newer[0].version} of its workflow was loaded during "
                    f"the backoff; attempt {attempt_no + 1} runs it",
                )
                self._snapshot(run, ctx)
                raise WaitRequested(newer[1])
        raise AssertionError("unreachable: the attempt loop returns or raises")

    def stopped(self, run: Run, ctx: Context) -> str:
        """Where a run stopped from outside (its job's timeout) was: kept as the traceback of
        the attempts it left running; returned as the note its error ends with."""
        stopped = self.calls.stopped_at(run.id, ctx)
        if stopped is None:
            return ""
        stack = ctx.redact(user_names(stopped.stack))
        for step in run.steps:
            for attempt in step.attempts:
                if attempt.status is AttemptStatus.RUNNING:
                    attempt.traceback = stack
        return stopped.note

    async def _wait(
        self, run: Run, ctx: Context, step: WaitStep, record: StepRun, where: str
    ) -> None:
        now = self.clock.now()
        if record.status is StepStatus.WAITING and record.wait_until is not None:
            deadline = record.wait_until  # resuming: the deadline was fixed on the first pass
        else:
            try:
                if step.for_ms is not None:
                    deadline = now + timedelta(milliseconds=step.for_ms)
                else:
                    deadline = parse_until(self._resolve(step.until, ctx))
            except BaseException as error:
                if not user_error(error):
                    raise
                record.status = StepStatus.FAILED
                record.error = str(error)
                record.started_at = record.finished_at = now
                self._finished(run, record)
                message = failed_before_running(where, str(error), error, step.defined_at)
                raise StepError(message, step.name) from error
            record.started_at = now
            record.wait_until = deadline
        if deadline <= now:
            record.status = StepStatus.COMPLETED
            record.finished_at = now
            record.output = {"waited_until": deadline.isoformat()}
            telemetry.OBSERVE.wait_ended(run, record, "time_reached")
            self._finished(run, record)
            return
        record.status = StepStatus.WAITING
        self._snapshot(run, ctx)
        raise WaitRequested(deadline)

    async def _event_wait(
        self, run: Run, ctx: Context, step: EventWaitStep, record: StepRun, where: str
    ) -> Any:
        """Take the event from the run's mailbox, or park the run (no worker slot) until one
        is sent or the timeout passes; the payload is the output, None on timeout."""
        now = self.clock.now()
        if record.status is StepStatus.WAITING:  # resuming: fixed on the first pass
            key = (record.input or {}).get("key")
            deadline = record.wait_until
        else:
            key = None
            if step.match is not None:
                try:
                    key = key_text(self._resolve(step.match, ctx))
                    if key is None:
                        raise ValueError(f"match {step.match} has no value for this run")
                except Exception as error:
                    record.status = StepStatus.FAILED
                    record.error = str(error)
                    record.started_at = record.finished_at = now
                    self._finished(run, record)
                    failed = failed_before_running(where, str(error), error, step.defined_at)
                    raise StepError(failed, step.name) from error
            deadline = now + timedelta(milliseconds=step.timeout_ms) if step.timeout_ms else None
            record.started_at = now
            record.wait_until = deadline
            record.input = {"event": step.event, **({"key": key} if key is not None else {})}
        expired = deadline is not None and deadline <= now
        message = await self.services.take_event(
            run.id,
            f"{record.index}:{step.name}",
            step.event,
            key=key,
            path=step.match_path,
            register=not expired,
        )
        if message is None and not expired:
            record.status = StepStatus.WAITING
            self._snapshot(run, ctx)
            raise WaitRequested(deadline or now + NO_TIMEOUT)
        output = message.payload if message is not None else None
        if message is None:
            self.engine_log(run, f"{where}: no {step.event!r} event before the timeout")
        record.status = StepStatus.COMPLETED
        record.finished_at = self.clock.now()
        record.output = ctx.redact_value(output)
        ctx.state[step.name] = output
        telemetry.OBSERVE.wait_ended(
            run, record, "timed_out" if message is None else "event_received"
        )
        self._finished(run, record)
        return output

    def _snapshot(self, run: Run, ctx: Context) -> None:
        """Save ctx.state with the run, for it to resume after a wait, also in another process
        or after a restart. A state that cannot be saved (snapshots off, above the cap, not
        JSON) stays in this process's memory: the run resumes with it here; elsewhere it
        resumes with an empty state (snapshots off, as the seed) or fails naming the cause."""
        reason: dict[str, Any] | None = None
        if not self.snapshots:
            reason = {"reason": "disabled"}
        else:
            try:
                blob = json.dumps(ctx.state)
            except (TypeError, ValueError) as error:
                reason = {"reason": "unserializable", "error": str(error)}
            else:
                if len(blob) > self.snapshot_cap:
                    reason = {"reason": "cap", "bytes": len(blob), "cap": self.snapshot_cap}
        if reason is None:
            # Secret header values are not kept: a step after the wait reads ctx.headers.
            run.state = ctx.redact_value(dict(ctx.state))
            return
        run.state = {SNAPSHOT_SKIPPED: reason}
        self._keep_state(run.id, ctx.state)
        if reason["reason"] == "cap":
            self.engine_log(
                run,
                f"ctx.state is {reason['bytes']:,} bytes, above the {self.snapshot_cap:,}-byte "
                "snapshot cap (BLOK_STATE_SNAPSHOT_MAX_BYTES): it is kept in this process only; "
                "resumed anywhere else (another worker, after a restart) the run fails. Keep "
                "large data out of step outputs.",
                "warning",
            )
        elif reason["reason"] == "unserializable":
            self.engine_log(
                run,
                f"ctx.state cannot be saved ({reason['error']}): it is kept in this process "
                "only; resumed anywhere else (another worker, after a restart) the run fails",
                "warning",
            )

    def _keep_state(self, run_id: str, state: dict[str, Any]) -> None:
        kept = self.kept_states
        kept.pop(run_id, None)
        kept[run_id] = state
        while len(kept) > KEPT_STATES:  # the oldest go: those runs fail as after a restart
            del kept[next(iter(kept))]

    def resume_state(
        self, run: Run, note: Callable[[Run, str, str], None] | None = None
    ) -> dict[str, Any]:
        """The ctx.state a resuming run starts with: the one kept in this process, else its
        snapshot. Raises SnapshotLost when the state was neither saved nor kept here. `note`
        writes an engine line on the run (default: the runner's log)."""
        kept = self.kept_states.pop(run.id, None)
        if kept is not None:
            return kept
        skipped = run.state.get(SNAPSHOT_SKIPPED)
        if skipped is None:
            return dict(run.state)
        why = skipped.get("reason")
        if why == "disabled":
            (note or self.engine_log)(
                run,
                "resumed with an empty ctx.state: state snapshots are off "
                "(BLOK_STATE_SNAPSHOT_DISABLED) and the run began in another process",
                "warning",
            )
            return {}
        if why == "cap":
            raise SnapshotLost(
                f"ctx.state ({skipped.get('bytes', 0):,} bytes) was above the "
                f"{skipped.get('cap', self.snapshot_cap):,}-byte snapshot cap "
                "(BLOK_STATE_SNAPSHOT_MAX_BYTES), so it was not saved, and this process does "
                "not hold it (the run began in another process, or before a restart)"
            )
        raise SnapshotLost(
            f"ctx.state could not be saved ({skipped.get('error', why)}) and this process does "
            "not hold it (the run began in another process, or before a restart)"
        )

    def _finished(self, run: Run, record: StepRun) -> None:
        self.save(run)
        if self.bus.active:
            self.bus.publish(
                StepFinished(run.id, record.index, record.name, str(record.status), record.error)
            )
