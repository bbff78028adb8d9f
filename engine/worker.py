"""The worker: claims jobs from the queues the catalog serves and runs them.

A claim loop per queue hands jobs to worker slots; a slot runs its job (gates, then the runner)
and takes the next one the queue can hand over at once, in the same task. Every write for a job
goes through the ledger (state) or a fenced recorder (progress), both at the claim's epoch.

Leases: every `renew_s` the worker renews the leases of all the jobs it holds. A job that the
renewal no longer finds held (another worker took it over after the lease ran out, while this
process was frozen) is dropped: its code is cancelled and nothing of it is written. Operator
requests (cancel, retry now) are signals on the job, picked up when the backend reports a change
(or at once, when the operator is in this process).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from . import telemetry
from .backends.base import Backend, Claim, JobQueue, Pace
from .catalog import Catalog
from .context import Context
from .durations import exact_duration
from .errors import DatabaseError
from .events import EventBus, QueueChanged
from .gates import Gates
from .ledger import Ledger, make_run
from .memory_runs import requeue_memory_runs
from .models import Job, Run, RunStatus, WorkerInfo
from .parents import wake_parent, why_cancelled
from .queue_runtime import QueueRuntime
from .replay_seed import resume_after_crash
from .run_handle import RunHandle
from .runner import Outcome, Runner, SnapshotLost
from .services import FencedRecorder
from .turns import LoopTurn
from .versions import left_to_its_workflow, not_resumable_here, say_other_declarations
from .watchdog import WATCHDOG_S, LoopWatchdog
from .whereabouts import NOTHING_RUNS, STARTING, WHERE
from .workflow import Workflow

log = logging.getLogger("blok.worker")

PAUSE_SYNC_S = 1.0  # pauses made by other processes are followed at least this often
SIGNAL_POLL_S = 1.0  # signals are looked for at least this often, and on every change
# How long one claim of the claim loop waits for jobs. A stop, a pause or a change of
# concurrency ends it at once (`QueueRuntime.poke`), so this only sets how often an idle
# queue's loop goes round: 4 times a second each, before, cost an engine serving 200 idle
# memory queues 8 % of a core.
CLAIM_TIMEOUT_S = 1.0
UNWIND_S = 1.0  # how long stopped code may take to unwind before it counts as not stopping
# Job meta that only carries the job's own settings: its first run is as the job says.
JOB_SETTINGS = frozenset({"delay_ms", "timeout_ms"})


THREAD_RUNS_ON = (
    "cancelled, but step {} still runs in its thread (a plain def node must return when "
    "ctx.cancelled is set); this worker's slot stays taken until it returns"
)


class Worker:
    def __init__(
        self,
        *,
        backend: Backend,
        ledger: Ledger,
        catalog: Catalog,
        runner: Runner,
        bus: EventBus,
        info: WorkerInfo,
        lease_s: float,
        renew_s: float,
        provider: Callable[[Workflow], str | None],
        guard: Callable[[Callable[..., Awaitable[None]]], Callable[..., Coroutine[Any, Any, None]]],
        scheduling: bool = True,
        concurrency: bool = True,
        watchdog_s: float | None = WATCHDOG_S,
        memory_runs_s: float = 60.0,
    ) -> None:
        self.backend = backend
        self.ledger = ledger
        self.catalog = catalog
        self.runner = runner
        self.bus = bus
        self.info = info
        self.lease_s = lease_s
        self.renew_s = renew_s
        self.provider = provider
        self.guard = guard  # wraps the worker's own tasks: an error in one is the engine's
        self.gates = Gates(
            backend, ledger, info.id, lease_s, scheduling=scheduling, concurrency=concurrency
        )
        self.runtimes: dict[str, QueueRuntime] = {}
        self.handles: dict[str, RunHandle] = {}  # by run id
        self.by_job: dict[str, RunHandle] = {}
        # Claims left to others, their outcomes not recorded: job id → (epoch, when). Not renewed.
        self.left: dict[str, tuple[int, float]] = {}
        self.paused: set[str] = set()
        self.stopping = False
        # Set once a drain stops the runs in flight: a run that registers later (its job was
        # in the gates or a read then) is stopped as it registers, before any of its code.
        self._interrupting = False
        self._slot_freed: anyio.Event | None = None  # set as a slot lets go of its job
        self._tg: TaskGroup | None = None
        self._jobs_tg: TaskGroup | None = None
        self._jobs_scope: anyio.CancelScope | None = None
        self._started = False
        self._forced = anyio.Event()
        self._cut_by_force: set[anyio.CancelScope] = set()  # a stop's waits on the database
        self._watchdog: LoopWatchdog | None = None
        # Set once a drain unregistered the worker: a renewal still due before the engine's
        # tasks end must not register it again with its heartbeat.
        self._unregistered = False
        self.watchdog_s = watchdog_s
        self.memory_runs_s = memory_runs_s  # how often memory runs of gone processes are sought
        self._early: dict[str, dict[str, float]] = {}  # signals of jobs claimed ahead here
        catalog.on_change.append(self.sync)
        ledger.on_run_ended.append(self._run_ended)

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self, tg: TaskGroup) -> None:
        """Start claiming, in `tg`: the queues of the catalog as it is now, and those it gets."""
        self._tg = tg
        self._jobs_tg = await self._host_jobs(tg)
        self.paused = await self.backend.shared.paused_queues()
        self.backend.shared.heartbeat(self.info)
        self._started = True
        self.sync()
        if self.backend.durable:  # a warning: not worth a start's wait
            tg.start_soon(say_other_declarations, self.backend, self.info.id, self.catalog.served())
        await self._take_back_memory_runs(start=True)
        tg.start_soon(self.guard(self._lease_loop))
        if self.backend.durable:
            tg.start_soon(self.guard(self._memory_runs_loop))
        tg.start_soon(self.guard(self._follow_loop))
        if self.watchdog_s:
            self._watchdog = LoopWatchdog(self.runner.calls, self.watchdog_s)
            tg.start_soon(self._watchdog.beat)

    async def _host_jobs(self, tg: TaskGroup) -> TaskGroup:
        """Job tasks live in their own group so that a drain can wait for them, then cancel."""
        ready = anyio.Event()
        holder: dict[str, TaskGroup] = {}

        async def host() -> None:
            with anyio.CancelScope() as scope:
                self._jobs_scope = scope
                async with anyio.create_task_group() as jobs:
                    holder["tg"] = jobs
                    ready.set()
                    await anyio.sleep_forever()

        tg.start_soon(host)
        await ready.wait()
        return holder["tg"]

    async def drain(self, grace: float, until: float | None = None) -> list[str]:
        """Stop claiming, let running jobs finish within `grace` seconds (less if `force()` is
        called), then stop the rest: each run is recorded where it stopped and its job goes
        back to the queue, to go on from there on its next delivery — a stop is not a crash.

        A job whose code did not stop (a sync node in its thread, async code that ignores the
        cancel) is recorded the same but not handed back: it stays this worker's until the
        process is gone (its lease runs out, or recovery finds the process dead). Returns those
        jobs' runs: the caller must end the process. `until` (anyio's clock): when it gives up
        on a database out of reach (by default a lease past the grace)."""
        self.stopping = True
        if not self._unregistered:  # said at once: an operator took it for one that serves
            self.info.stopping_since = self.backend.clock.now()
            self.backend.shared.heartbeat(self.info)
        if until is None:
            until = anyio.current_time() + grace + self.lease_s
        for runtime in self.runtimes.values():
            runtime.stop()
        with self._database_waits("its claims", until):  # a claim waits out an outage
            for runtime in list(self.runtimes.values()):
                await runtime.loop_done.wait()
        with anyio.move_on_after(grace):
            async with anyio.create_task_group() as tg:

                async def forced() -> None:
                    await self._forced.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(forced)
                try:
                    # A job a slot holds but has not opened (reading its run, in the gates)
                    # was claimed before the stop: it has its grace too. Waiting on the runs
                    # alone, such a job opened after the wait, and its code began as the
                    # drain stopped everything (a scheduled tick's plain def: the process
                    # exited, its thread still running).
                    while self.handles or any(r.active for r in self.runtimes.values()):
                        await self._any_job_done()
                finally:
                    # With no await since the wait ended: a run that opens from now on is
                    # stopped as it opens, before any of its code.
                    self._interrupting = True
                tg.cancel_scope.cancel()
        interrupted = list(self.handles.values())
        for handle in interrupted:
            handle.interrupt()
        for handle in interrupted:
            with anyio.move_on_after(UNWIND_S):
                await handle.wait_ended()
            if not handle.ended:  # async code that does not stop when cancelled
                self._hold(handle, "its code did not stop when cancelled")
        held = [h.run.id for h in interrupted if h.held]
        if self._jobs_scope is not None:
            self._jobs_scope.cancel()
        with self._database_waits("its last writes", until):
            await self._release_held({h.claim.job.id for h in interrupted if h.held})
            if not held:
                self._unregistered = True
                await self.backend.shared.forget_worker(self.info.id)
            await self.backend.runs.flush()
        _say_handed_back([h for h in interrupted if not h.held], grace)
        if self._watchdog is not None:
            self._watchdog.stop()
        return held

    def force(self) -> None:
        """Cut a drain's grace period short (a second stop signal), and a wait on a database
        out of reach."""
        self._forced.set()
        for scope in self._cut_by_force:
            scope.cancel()

    @contextmanager
    def _database_waits(self, what: str, until: float) -> Iterator[None]:
        """A stop's wait on the database: shielded, but not past `until` (a lease past the
        grace: this worker's jobs are others' to take by then anyway) and cut by a second stop
        signal. A database out of reach held a stop until it came back, whatever the
        signals."""
        with anyio.CancelScope(deadline=until, shield=True) as scope:
            if self._forced.is_set():  # a second signal before this wait: cut it too
                scope.cancel()
            self._cut_by_force.add(scope)
            try:
                yield
            finally:
                self._cut_by_force.discard(scope)
        if scope.cancelled_caught:  # a second signal cuts it too: it had said "did not answer"
            why = "the database did not answer"
            if self._forced.is_set():
                why = "a second stop signal cut the wait for the database short"
            said = "worker %s stopped without %s: %s (its jobs go to other workers as their"
            log.error(f"{said} leases run out)", self.info.id, what, why)

    async def _release_held(self, keep: set[str]) -> None:
        """Jobs this worker still holds (claimed, never started) go back to their queues,
        except those whose code still runs."""
        for queue in self.backend.queues:
            for job in await queue.held_by([self.info.id]):
                if job.id not in keep:
                    await self.ledger.release(queue, job, None, "")

    async def _any_job_done(self) -> None:
        """Until a run in flight ends, or a slot lets go of a job (one not opened yet has no
        handle to wait on)."""
        freed = self._slot_freed = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def wait_one(handle: RunHandle) -> None:
                await handle.wait_ended()
                tg.cancel_scope.cancel()

            async def wait_slot() -> None:
                await freed.wait()
                tg.cancel_scope.cancel()

            for handle in list(self.handles.values()):
                tg.start_soon(wait_one, handle)
            tg.start_soon(wait_slot)

    def crash_in_flight(self, error: BaseException) -> None:
        """The process is going down with an error: say so on every run it holds and hand
        their jobs back for redelivery."""
        # Recorded crashed (`Ledger.interrupt`): the status says it, the reason says why.
        reason = (
            f"the engine stopped: {error}"  # its database's own words, already one line
            if isinstance(error, DatabaseError)
            else f"the engine stopped on an unhandled error: {type(error).__name__}: {error}"
        )
        for handle in list(self.handles.values()):
            if not handle.lost:
                self.ledger.interrupt(handle.claim, handle.queue, handle.run, reason)

    # ---- queues ----------------------------------------------------------------------------
    def sync(self) -> None:
        """Make the served queues match the catalog, without touching runs in flight."""
        if not self._started:
            return
        wanted = {name: wf for name, wf in self.catalog.served().items() if wf.trigger is not None}
        for name in list(self.runtimes):
            runtime = self.runtimes[name]
            wf = wanted.get(name)
            if wf is None or self._queue_of(wf) is not runtime.queue:
                # Stop claiming; jobs stay in the queue and runs in flight finish. The claim
                # loop is told, not cancelled (see _claim_loop): a claim under way when the
                # file went away hands its jobs back to the queue.
                del self.runtimes[name]
                runtime.stop()
                self._publish(QueueChanged(name))
        for name, wf in wanted.items():
            assert wf.trigger is not None
            current = self.runtimes.get(name)
            if current is None:
                fresh = QueueRuntime(name, wf, self._queue_of(wf), wf.trigger.concurrency)
                if self.backend.durable:
                    fresh.queue.serve_as(self.info.id)
                fresh.paused = name in self.paused
                self.runtimes[name] = fresh
                if self._tg is not None and not self.stopping:
                    self._tg.start_soon(self.guard(self._claim_loop), fresh)
                self._publish(QueueChanged(name))
            else:
                if current.concurrency != wf.trigger.concurrency:
                    self._publish(QueueChanged(name))
                current.workflow = wf
                current.concurrency = wf.trigger.concurrency
                current.poke()
        self.publish_catalog()

    def _queue_of(self, wf: Workflow) -> JobQueue:
        return self.backend.queue(self.provider(wf))

    def publish_catalog(self) -> None:
        providers = {name: r.queue.provider for name, r in self.runtimes.items()}
        widths = {name: r.concurrency for name, r in self.runtimes.items()}
        self.backend.shared.publish_catalog(self.catalog.entry(self.info.id, providers, widths))

    def _publish(self, event: Any) -> None:
        if self.bus.active:
            self.bus.publish(event)

    def set_paused(self, queue: str, paused: bool) -> None:
        """Follow a pause made here or by another process."""
        if paused:
            self.paused.add(queue)
        else:
            self.paused.discard(queue)
        runtime = self.runtimes.get(queue)
        if runtime is not None and runtime.paused != paused:
            runtime.paused = paused
            runtime.poke()
            self._publish(QueueChanged(queue))

    def throughput(self, queue: str, window: float) -> float:
        runtime = self.runtimes.get(queue)
        if runtime is None:
            return 0.0
        cutoff = time.monotonic() - window
        times = runtime.completed_times
        return (len(times) - bisect.bisect_left(times, cutoff)) / window

    # ---- claiming --------------------------------------------------------------------------
    async def _claim_loop(self, runtime: QueueRuntime) -> None:
        # Stopped by a flag, never by cancellation: a claim cancelled half-way would leave jobs
        # leased to this worker that nobody runs.
        queue = runtime.queue
        try:
            while not runtime.stopped:
                if runtime.active >= runtime.concurrency:
                    changed = runtime.changed  # a stop or a freed slot while topping up counts
                    if runtime.short_of_ahead() and await queue.claim_ahead(
                        runtime.name, runtime.concurrency, self.info.id, self.lease_s
                    ):
                        if runtime.paused:  # paused meanwhile: back for other workers
                            queue.return_ahead(runtime.name)
                        continue
                    ahead = queue.ahead(runtime.name)
                    with anyio.move_on_after(runtime.full_for() if ahead else math.inf):
                        await changed.wait()
                    if ahead and not runtime.full_for():  # behind long jobs: for other workers
                        queue.return_ahead(runtime.name)
                    continue
                runtime.full_since = None
                if runtime.paused:
                    queue.return_ahead(runtime.name)  # claimed ahead: back for other workers
                forced_only = runtime.paused
                claims = await queue.claim(
                    runtime.name,
                    runtime.concurrency - runtime.active,
                    self.info.id,
                    self.lease_s,
                    forced_only=forced_only,
                    timeout=CLAIM_TIMEOUT_S,
                    interrupted=runtime.poked_since(runtime.pokes),
                )
                if runtime.stopped or (runtime.paused and not forced_only):
                    # Stopped or paused while the claim was under way: the jobs go back,
                    # except those an operator asked to run now (a pause does not hold them).
                    kept = [c for c in claims if c.job.force and not runtime.stopped]
                    for claim in claims:
                        if claim not in kept:
                            await self.ledger.release(queue, claim.job, None, "")
                    queue.return_ahead(runtime.name)
                    claims = kept
                assert self._jobs_tg is not None
                for claim in claims:
                    runtime.active += 1
                    if not runtime.hand(claim):
                        self._jobs_tg.start_soon(self._work, runtime, claim)
        finally:
            queue.return_ahead(runtime.name)
            runtime.loop_done.set()

    async def _work(self, runtime: QueueRuntime, claim: Claim | None) -> None:
        """One worker slot (counted in `runtime.active` while it has a job): run the job, then
        the next one the queue hands over at once, in this same task, until it has none; then
        park for the claim loop's next claim (see `QueueRuntime.park`). It ends when the queue
        is paused, stopped or narrowed. A task and a claim round trip per job would cost more
        than a short job itself."""
        while claim is not None:
            try:
                while claim is not None:
                    turn = LoopTurn()
                    await self._execute(runtime, claim)
                    if turn.came:
                        # The job waited (a sleep, a read): the engine has had the loop since,
                        # so on to the next job at once; a slot that went round the loop again
                        # would queue behind every other slot ready then, at every job.
                        await anyio.lowlevel.checkpoint_if_cancelled()
                    else:
                        # The rest of the engine runs now (asyncio's: anyio's costs 3 calls more).
                        await asyncio.sleep(0)
                    if self._slot_ends(runtime):
                        return
                    claim = runtime.queue.claim_nowait(runtime.name, self.info.id, self.lease_s)
                    if claim is not None:
                        runtime.full_since = None  # a slot moved on: what is kept ahead moves
                        if runtime.short_of_ahead():
                            runtime.nudge()  # the claim loop tops up what is kept ahead
            finally:
                runtime.active -= 1
                if self._slot_freed is not None:  # a drain waits for the slots to let go
                    self._slot_freed.set()
                # A slot is free: news for a claim loop waiting for one, none for a claim
                # waiting for jobs (waking that would only make it look again for nothing).
                runtime.nudge()
            if runtime.active >= runtime.concurrency:
                return  # narrowed meanwhile: a slot too many
            claim = await runtime.park()

    def _slot_ends(self, runtime: QueueRuntime) -> bool:
        return (
            runtime.stopped
            or runtime.paused
            or self.stopping
            or runtime.active > runtime.concurrency
            or self.runtimes.get(runtime.name) is not runtime
        )

    # ---- running one job -------------------------------------------------------------------
    def _current(self, runtime: QueueRuntime, job: Job) -> Workflow:
        """The workflow a job of the queue runs: the queue's, or a helper workflow (one with no
        trigger) that a sub-workflow step dispatched on its parent's queue."""
        if job.workflow_name != runtime.workflow.name:
            helper = self.catalog.workflow(job.workflow_name)
            if helper is not None and helper.trigger is None:
                return helper
        return runtime.workflow

    async def _run_for(
        self, claim: Claim, runtime: QueueRuntime, current: Workflow
    ) -> tuple[Run, bool] | None:
        """The run a claimed job executes, and whether it resumes one that already began; None
        if it has none (its last crash made it a dead letter)."""
        job = claim.job
        version = current.version
        fresh = (
            claim.taken_from is None
            and job.attempts == 1
            and not job.resume
            and not (job.meta.keys() - JOB_SETTINGS)
        )
        run: Run | None = None
        if not fresh:
            # A redelivery, a retry, a resume, a run the gates held back: its record has more
            # than the job says (logs, the attempt number, steps done), so it is read.
            run = await self.backend.runs.get_run(job.run_id)
        if run is None:
            failures = int(job.meta.get("failures", 0))
            return make_run(job, workflow_version=version, job_attempt=failures + 1), False
        if claim.taken_from is not None and (
            claim.taken_handed or run.status is RunStatus.RUNNING or run.terminal
        ):
            # The worker that lost the lease had started it, or had been handed it and may
            # have begun it before its start was committed: it crashed there.
            workers = await self.backend.shared.workers()  # its last heartbeat: the run's end
            seen = next((w.heartbeat_at for w in workers if w.id == claim.taken_from), None)
            mine = None
            if claim.taken_from == self.info.id:  # its own lease, run out while it stalled
                why = self.stalled_since(time.monotonic() - 2 * self.lease_s, run.id)
                why = why or "its database out of reach"
                mine = (
                    f"this worker ({self.info.id}) did not renew its lease in time (lease "
                    f"expired), {why}; it took the job over from itself"
                )
            run = self.ledger.take_over(claim, runtime.queue, run, seen, reason=mine)
            if run is None:
                return None
        elif job.resume or run.cursor:
            # A wait's redelivery, a replay from a step, a run a stop or a gate handed back
            # after it began: on from the run's cursor and state.
            return run, True
        # The next run of one that crashed its worker goes on from the steps that one completed.
        return run, await resume_after_crash(self.backend.runs, self.ledger.log, current, job, run)

    async def _execute(self, runtime: QueueRuntime, claim: Claim) -> None:
        queue = runtime.queue
        job = claim.job = claim.job.woken()  # the claim that woke its run: not a delivery
        if claim.lease_lost():
            # Claimed ahead, then this process stalled past the lease: another worker may
            # hold the job now. Its code must not run here.
            log.warning("job %s: the lease ran out before it started; left to others", job.id)
            self.ledger.leave(claim, queue)
            return
        handle: RunHandle | None = None
        try:
            current = self._current(runtime, job)
            found = await self._run_for(claim, runtime, current)
            if found is None:
                return  # its last crash: a dead letter
            run, resuming = found
            if current.name != job.workflow_name and await left_to_its_workflow(
                self.backend, self.ledger, claim, queue, run, self.info.id, current
            ):
                return  # another deployment's workflow, served by a worker of that one
            workflow, note = self.catalog.resumed_on(current, run, resuming)
            if workflow is None:  # its version is not here, and the one here changed its steps
                parts = (self.backend, self.ledger, claim, queue, run, self.info.id, current)
                workflow = await not_resumable_here(*parts)
                if workflow is None:
                    return  # left to a worker that has its version, or a dead letter
            if note is not None:
                self.ledger.log(run, *note)
            if not await self.gates.admit(claim, queue, run, workflow, resuming):
                return  # debounced, delayed, throttled, queued or expired: the job went back
            handle = RunHandle(claim, queue, run)
            self.handles[run.id] = handle
            self.by_job[job.id] = handle
            if self._interrupting:
                handle.interrupt()
            signals = {**job.signals, **self._early.pop(job.id, {})}
            if "cancel" in signals:
                handle.cancel_requested = True
            handle.seen.update(signals)
            lost: SnapshotLost | None = None
            try:
                state = self.runner.resume_state(run, self.ledger.log) if resuming else None
            except SnapshotLost as error:
                lost, state = error, None
            if WHERE in signals:  # asked while the job waited here for a free slot
                self.ledger.log(run, STARTING)  # written with the start
            telemetry.OBSERVE.run_started(run, job, workflow.version)
            self.ledger.start(claim, queue, run, self.info.id, workflow.version)
            if lost is not None:
                # It cannot go on where it stopped: a failure, retried from the start.
                failed = Outcome(RunStatus.FAILED, error=f"cannot resume: {lost}")
                self._settle(runtime, claim, run, workflow, failed)
                return
            if queue.durable and not job.handed:
                # The record says `running` before any of the run's code runs: a start still
                # in the writer when this process died or froze past its lease would be found
                # `queued`, and the next delivery would run that same run again, a side effect
                # done twice with no crashed run to show. A job its claim handed to this slot
                # (or a top-up kept ahead) needs no wait: the claim's commit says it may have
                # begun (`Job.handed`). A stop, a cancel or a lost lease cuts the wait (a
                # database out of reach held it, and a stop took it for code that would not
                # stop): no code has run, and the run is stopped as it opens below.
                with anyio.CancelScope() as starting:
                    if handle.open_scope(starting):
                        await self.backend.runs.flush()
                if claim.lease_lost():
                    handle.lost = True
                    log.warning("job %s: the lease ran out as it started; left to others", job.id)
                    self.left[job.id] = (job.epoch, time.monotonic())
                    return
            timeout: int | None = job.meta.get("timeout_ms")  # enqueue(timeout=...)
            if timeout is None and workflow.trigger is not None:
                timeout = workflow.trigger.timeout
            ctx = Context.for_job(run, job, state, timeout)
            ctx._sink = self.runner.log_sink(run, ctx)
            handle.ctx = ctx
            outcome: Outcome | None = None
            # One scope serves the operator's cancel, a lost lease and the trigger's timeout:
            # the first two set their flag first, so a scope caught without one is the timeout.
            deadline = anyio.current_time() + timeout / 1000 if timeout else math.inf
            with anyio.CancelScope(deadline=deadline) as scope:
                if handle.open_scope(scope):
                    outcome = await self.runner.run(
                        workflow, run, ctx, FencedRecorder(queue, claim.fence)
                    )
            if handle.lost or claim.lease_lost():
                # Lost to another worker (the renewal said so), or no renewal confirmed the
                # lease for longer than it lasts (this process was frozen): not ours to record.
                handle.lost = True
                log.warning(
                    "run %s: worker %s lost the lease on job %s (not renewed in time: %s); its "
                    "outcome here is not recorded: the worker that claims the job next records "
                    "the run crashed and runs the job again",
                    run.id,
                    self.info.id,
                    job.id,
                    self.stalled_since(claim.held_since, run.id)
                    or "this process was frozen, or its database out of reach",
                )
                self.left[job.id] = (job.epoch, time.monotonic())
                return
            if handle.stopping and not handle.cancel_requested:
                self._stopped(handle, workflow)
                return
            if scope.cancelled_caught and not handle.cancel_requested:
                # The job's own time limit is final (the seed's WorkerTimeoutError): no retry.
                whose = "the job's timeout" if "timeout_ms" in job.meta else "the trigger's timeout"
                outcome = Outcome(
                    RunStatus.TIMED_OUT,
                    error=f"run timed out after {exact_duration(timeout)} ({whose})"
                    + self.runner.stopped(run, ctx),
                    final=True,
                )
            if handle.cancel_requested or outcome is None:
                # Where it was is what an operator who cancels a stuck run wants to know.
                threads = self.runner.calls.running_threads(run.id)
                if threads:
                    self.ledger.log(run, THREAD_RUNS_ON.format(", ".join(threads)), "warning")
                why = await why_cancelled(self.backend, run)
                self.ledger.cancelled(claim, queue, run, why + self.runner.stopped(run, ctx))
                # Its slot stays taken until the thread returns: a queue of concurrency 1 must
                # not start its next job beside it.
                await self.runner.calls.threads_ended(run.id)
            else:
                self._settle(runtime, claim, run, workflow, outcome)
        except anyio.get_cancelled_exc_class():
            # The engine's own tasks are torn down (an engine error): hand the job back.
            if handle is not None and not handle.lost and not handle.stopping:
                self.ledger.interrupt(
                    claim,
                    queue,
                    handle.run,
                    "interrupted: the worker shut down before the run finished; "
                    "the job went back to the queue",
                )
            raise
        except Exception as error:
            # An engine bug, not the workflow's: fail the run loudly rather than lose it.
            log.exception("internal error while running job %s", job.id)
            if handle is not None and not handle.lost:
                # Not retried (its steps done would run again), but where an operator looks.
                bug = f"internal engine error: {type(error).__name__}: {error}"
                self.ledger.give_up(claim, queue, handle.run, bug, None)
        finally:
            if handle is not None:
                telemetry.OBSERVE.run_ended(handle.run)
                freed = self.gates.release(handle.run.id)
                if freed is not None and self._jobs_tg is not None:
                    self._jobs_tg.start_soon(self.gates.wake_next, *freed)
                self.handles.pop(handle.run.id, None)
                self.by_job.pop(job.id, None)
                self.runner.calls.forget(handle.run.id)
                handle.end()

    def stalled_since(self, since: float, run_id: str) -> str | None:
        """Why leases ran out, if the loop stalled (or the process was suspended) after
        `since` (time.monotonic): "its event loop was blocked for 5.0s by [step 1/1] …"."""
        stall = self._watchdog.last if self._watchdog is not None else None
        return stall.said(run_id) if stall is not None and stall.seen >= since else None

    def _stopped(self, handle: RunHandle, workflow: Workflow) -> None:
        """A run the worker stopped (past a drain's grace): recorded where it stopped, with
        its state, and its job handed back to go on from there — unless its code still runs
        (a sync node's thread): then the job stays this worker's until the process is gone."""
        threads = self.runner.calls.running_threads(handle.run.id)
        if threads:
            self._hold(handle, f"step {', '.join(threads)} still runs in its thread")
            return
        if handle.ctx is not None:
            self.runner._snapshot(handle.run, handle.ctx)
        self.ledger.suspend(
            handle.claim,
            handle.queue,
            handle.run,
            f"interrupted by a stop: worker {self.info.id} shut down before the run finished; "
            "it goes on from where it stopped on its next delivery",
        )

    def _hold(self, handle: RunHandle, why: str) -> None:
        """A stopped run whose code still runs: recorded, its job not handed back (another
        worker must not run it while it runs here); the process has to end."""
        if handle.held or handle.lost:
            return
        handle.held = True
        if handle.ctx is not None:
            self.runner._snapshot(handle.run, handle.ctx)
        log.error(
            "run %s: %s; its job %s is not handed back while its code runs: this process "
            "must exit (its lease then runs out, or recovery finds it gone)",
            handle.run.id,
            why,
            handle.claim.job.id,
        )
        self.ledger.suspend(
            handle.claim,
            handle.queue,
            handle.run,
            f"interrupted by a stop: worker {self.info.id} shut down while {why}; the process "
            "exits so that it stops, and the run goes on from where it stopped once another "
            "worker takes the job over",
            hand_back=False,
        )

    def _settle(
        self, runtime: QueueRuntime, claim: Claim, run: Run, workflow: Workflow, outcome: Outcome
    ) -> None:
        queue = runtime.queue
        trigger = workflow.trigger
        if outcome.status is RunStatus.WAITING:
            assert outcome.wait_until is not None
            self.ledger.wait(claim, queue, run, outcome.wait_until)
        elif outcome.status is RunStatus.COMPLETED:
            self.ledger.complete(claim, queue, run, outcome.output)
            runtime.completed_times.append(time.monotonic())
            if len(runtime.completed_times) > 50_000:
                del runtime.completed_times[:25_000]
        elif outcome.status is RunStatus.CANCELLED:
            self.ledger.cancelled(claim, queue, run)
        else:

            def backoff(failures: int) -> int:
                return trigger.backoff_ms(failures, random.random()) if trigger else 0

            self.ledger.fail(
                claim,
                queue,
                run,
                outcome.status,
                outcome.error,
                outcome.error_step,
                backoff,
                retry=not outcome.final,
                permanent=outcome.permanent,
            )

    # ---- parents waiting on children --------------------------------------------------------
    def _run_ended(self, run: Run) -> None:
        self.runner.kept_states.pop(run.id, None)
        if run.parent_run_id is not None and self._jobs_tg is not None:
            self._jobs_tg.start_soon(wake_parent, self.backend, self.ledger, run)

    # ---- leases, signals, pauses -----------------------------------------------------------
    async def _take_back_memory_runs(self, *, start: bool = False) -> None:
        memory = [runtime for runtime in self.runtimes.values() if not runtime.queue.durable]
        if memory and not self.stopping:
            await requeue_memory_runs(self.backend, self.info.id, memory, start=start)

    async def _memory_runs_loop(self) -> None:
        """Not only at a start: a process serving a memory queue may die while this one runs,
        leaving runs (a wait, a backoff) that no restart of its own may come to take back."""
        while True:
            await anyio.sleep(self.memory_runs_s)
            await self._take_back_memory_runs()

    async def _lease_loop(self) -> None:
        while True:
            await anyio.sleep(self.renew_s)
            await self.renew()

    async def renew(self) -> None:
        """Renew every lease this worker holds; drop the jobs it no longer holds."""
        if not self._unregistered:
            self.info.heartbeat_at = self.backend.clock.now()
            self.backend.shared.heartbeat(self.info)
        # A job left to others is not renewed: its lease runs out and the next claimer records
        # its run crashed. Renewed, it stayed this worker's for ever, and nothing ran it.
        gone = time.monotonic() - 2 * self.lease_s  # its lease has run out by then
        leave = {job: epoch for job, (epoch, at) in list(self.left.items()) if at > gone}
        self.left = {job: self.left[job] for job in leave}
        for queue in self.backend.queues:
            asked = time.monotonic()
            renewal = await queue.renew(self.info.id, self.lease_s, leave)
            for handle in list(self.handles.values()):
                if handle.queue is not queue or handle.lost:
                    continue
                job = handle.claim.job
                if renewal.held.get(job.id) == job.epoch:
                    handle.claim.held_since = asked
                else:
                    handle.lose()
            self._deliver(renewal.signals)
        self.gates.renew()

    async def _follow_loop(self) -> None:
        """Follow what other processes write: signals for the jobs held here, and pauses.
        (An operator in this process delivers its signals and pauses directly.)"""
        if not self.backend.multi_process:
            return
        token = await self.backend.change_token()
        pace = Pace()
        while True:
            moved = await self.backend.wait_for_change(
                token, min(SIGNAL_POLL_S, PAUSE_SYNC_S), pace
            )
            token = moved
            for queue in self.backend.queues:
                self._deliver(await queue.signals_for(self.info.id))
            paused = await self.backend.shared.paused_queues()
            for name in paused ^ self.paused:
                self.set_paused(name, name in paused)

    def _deliver(self, signals: dict[str, dict[str, float]]) -> None:
        for job_id, named in signals.items():
            for name, at in named.items():
                self.deliver(job_id, name, at)

    def deliver(self, job_id: str, name: str, at: float) -> None:
        """An operator's request for a job this worker holds: carried out now if the job runs,
        when it starts if it was claimed ahead."""
        handle = self.by_job.get(job_id)
        if handle is None:
            if name == "cancel" and self._cancel_ahead(job_id):
                return
            if len(self._early) > 10_000:
                self._early.clear()
            self._early.setdefault(job_id, {})[name] = at
            return
        if handle.seen.get(name) == at:
            return
        handle.seen[name] = at
        self.act(handle, name)

    def _cancel_ahead(self, job_id: str) -> bool:
        """Cancel a job claimed ahead here, if it is: nothing runs it yet, and it would wait
        for a free slot (a whole job's length) before its cancel took."""
        for runtime in self.runtimes.values():
            claim = runtime.queue.drop_ahead(runtime.name, job_id)
            if claim is not None:
                assert self._tg is not None
                self._tg.start_soon(self._cancel_held, runtime, claim)
                return True
        return False

    async def _cancel_held(self, runtime: QueueRuntime, claim: Claim) -> None:
        run = await self.backend.runs.get_run(claim.job.run_id)
        if run is None:  # nothing to record it on: back to the queue, as a stop gives it
            await self.ledger.release(runtime.queue, claim.job, None, "")
        elif not await self.ledger.cancel_pending(runtime.queue, claim.job, run):
            log.warning("job %s: moved on before its cancel took", claim.job.id)
        runtime.nudge()  # one fewer kept ahead: the claim loop may top up

    def in_backoff(self, run_id: str) -> bool:
        """The run sleeps between two attempts of a step (retry now can cut it short)."""
        return run_id in self.runner.backoffs

    def act(self, handle: RunHandle, signal: str) -> None:
        """Carry out an operator's request on a run held here."""
        if signal == "cancel":
            handle.cancel()
        elif signal == WHERE:
            for answer in self.runner.calls.where_now(handle.run.id) or [NOTHING_RUNS]:
                self.runner.engine_log(handle.run, answer)
        elif signal == "retry_now" and handle.run.id in self.runner.backoffs:
            self.runner.engine_log(handle.run, "retry now: the operator cut the backoff short")
            self.runner.backoffs.cut(handle.run.id)


def _say_handed_back(handles: list[RunHandle], grace: float) -> None:
    """The log names the jobs a drain handed back: "draining", then "stopped", said nothing
    of which jobs another worker goes on with."""
    if not handles:
        return
    named = [f"{h.claim.job.id} ({h.run.workflow_name}, run {h.run.id})" for h in handles[:5]]
    more = f" and {len(handles) - 5} more" if len(handles) > 5 else ""
    said = "%d running job(s) did not finish within the grace of %gs: stopped, recorded where"
    said += " they stopped and handed back to the queue, to go on from there: %s%s"
    log.info(said, len(handles), grace, ", ".join(named), more)
