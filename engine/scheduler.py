"""The scheduler: fires the ticks of the workflows' schedules, in every worker, exactly once each.

Every worker that serves a scheduled workflow runs this loop; none of them is special. A tick
is enqueued by whichever worker claims it first in the backend (`SharedState.claim_tick`, a
unique key per (workflow, schedule, tick): the schedule's last tick moves past it once), so
ten workers on one database enqueue one job per tick, and a worker that dies leaves nothing
to take over. Missed ticks (no worker ran) follow the schedule's `catch_up`.

Also here: what the operator API does with schedules (list, pause, resume, run now), for an
engine with workflows or a client with none (it reads what the workers declared).
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import anyio

from .backends.base import Backend, ScheduleSpec, ScheduleState
from .catalog import Catalog
from .errors import AmbiguousSchedule, DatabaseError, EngineError
from .ledger import Ledger, make_job, make_run
from .liveness import LiveWorkers
from .models import Job, Run, RunStatus, from_epoch
from .schedules import (
    declared_settings,
    kept_settings,
    latest_tick,
    next_tick,
    overruled_workers,
    ticks_between,
)

if TYPE_CHECKING:
    from .operator import Operator, QueueTarget

log = logging.getLogger("blok.scheduler")

POLL_S = 1.0  # pauses and schedules declared by other processes are seen within this
LATE_S = 2.0  # a tick older than this when it is claimed was missed (catch_up applies)
MAX_CATCH_UP = 1000  # catch_up="all" enqueues at most this many missed ticks at once
RETRY_S = 5.0  # after an error (the database unreachable), the loop tries again this late
# A tick claimed this long ago whose job is not in the queue: its claimer died between the claim
# and the enqueue, and another worker enqueues it (the same ids: never twice). Well inside the
# janitor's retention, so that a tick's finished and purged job is never mistaken for one.
REPAIR_AFTER_S = 2.0
REPAIR_WITHIN_S = 300.0
DISABLED_ENV = "BLOK_SCHEDULING_DISABLED"


def scheduling_disabled() -> bool:
    """BLOK_SCHEDULING_DISABLED=1 (true, yes, on): this process fires no schedules."""
    return os.environ.get(DISABLED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def tick_job_id(workflow: str, schedule: str, tick: float) -> str:
    """The same job id for a tick in every process (and its run's: `tick_run_id`), so that
    enqueueing a tick twice adds it once."""
    digest = hashlib.sha1(f"{workflow}\x00{schedule}\x00{tick:.3f}".encode()).hexdigest()
    return f"job_tick_{digest[:20]}"


def tick_run_id(job_id: str) -> str:
    return "run_" + job_id.removeprefix("job_")


def due_ticks(spec: ScheduleSpec, last: float, now: float) -> tuple[list[float], list[float]]:
    """(ticks to fire, ticks to skip) after `last`, by the schedule's catch_up policy."""
    cron, every, zone = spec.cron, spec.every_ms, spec.timezone
    if next_tick(cron, every, zone, last) > now:
        return [], []
    newest = latest_tick(cron, every, zone, now)
    if spec.catch_up == "all":
        return ticks_between(cron, every, zone, last, now, MAX_CATCH_UP), []
    if spec.catch_up == "none" and now - newest > LATE_S:
        return [], [newest]  # missed: skipped, the next tick fires
    return [newest], []  # latest: one run for the whole missed span


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule as `engine.schedules()` lists it."""

    workflow: str
    schedule: str  # its id within the workflow: "every 30s", "cron 0 * * * * UTC"
    queue: str
    cron: str | None
    every_ms: int | None
    timezone: str
    catch_up: str
    paused: bool
    next_at: datetime | None  # None while paused
    last_tick_at: datetime | None
    last_fired_at: datetime | None
    last_run_id: str | None
    last_status: RunStatus | None  # of the last run it enqueued, as it is now
    # Whether a live worker serves its workflow now: a schedule whose file failed to load on
    # every worker stays declared, and its ticks come and go unfired.
    served: bool = True
    # The live workers serving its workflow that declare other schedules for it (another
    # version of its file): those kept here, declared last, fire, not theirs.
    overruled: tuple[str, ...] = ()


def _replaced_paused(
    workflow: str, specs: tuple[ScheduleSpec, ...], states: list[ScheduleState]
) -> tuple[str, str] | None:
    """(new, old): the paused schedule of the workflow (in `states`, as declared before) that
    a new one replaces, where the file changed one schedule (one gone, one new, the others as
    they were): an operator paused it, and a change of its interval in the file (a new id)
    must not start it again behind their back. Where more changed, which is which is not
    known."""
    old = {s.spec.schedule: s for s in states if s.spec.workflow == workflow}
    new = [spec.schedule for spec in specs]
    gone = [schedule for schedule in old if schedule not in new]
    added = [schedule for schedule in new if schedule not in old]
    if len(gone) == 1 and len(added) == 1 and old[gone[0]].paused:
        return added[0], gone[0]
    return None


class Scheduler:
    """The loop a worker runs to fire its workflows' schedules."""

    def __init__(
        self, backend: Backend, ledger: Ledger, operator: Operator, catalog: Catalog
    ) -> None:
        self.backend = backend
        self.shared = backend.shared
        self.ledger = ledger
        self.operator = operator
        self.catalog = catalog
        self._declared: dict[str, tuple[ScheduleSpec, ...]] = {}
        self._verified: set[str] = set()  # tick jobs seen in the queue
        # Per workflow, the schedules another worker declared over this one's, as last said.
        self._overruled: dict[str, dict[str, str]] = {}
        self._changed = anyio.Event()
        catalog.on_change.append(self._catalog_changed)
        # What this worker declares goes in its catalog entry (a process that fires no
        # schedules declares none): `schedules` lists the live workers another version's
        # declaration overruled.
        catalog.declares_schedules = True

    def _catalog_changed(self) -> None:
        self._changed.set()  # the current event: the loop replaces it after each change

    async def declare(self) -> None:
        """Make the backend's schedules those of the workflows served here now (hot reload
        adds, changes and removes them)."""
        current = self.catalog.schedule_specs()
        now = self.backend.clock.time()
        states: list[ScheduleState] | None = None  # read once, when a schedule is replaced
        for name in set(current) | set(self._declared):
            specs = current.get(name, ())
            if name in self._declared and self._declared[name] == specs:
                continue  # declared already, "none" included: a write at every turn otherwise
            if specs and states is None:
                states = await self.shared.schedules()
            paused = _replaced_paused(name, specs, states or [])
            await self.shared.declare_schedules(
                name,
                [(s, latest_tick(s.cron, s.every_ms, s.timezone, now)) for s in specs],
            )
            if paused is not None:
                new, old = paused
                await self.shared.set_schedule_paused(name, new, True)
                log.warning(
                    "schedule %s of %s replaces %s, which was paused: it stays paused "
                    "(blok-tui schedules resume %s%s)",
                    new,
                    name,
                    old,
                    name,
                    f' "{new}"' if len(specs) > 1 else "",
                )
            if name in current:
                self._declared[name] = specs
            else:
                self._declared.pop(name, None)

    async def fire_due(self) -> float:
        """Enqueue the due ticks this worker can claim; seconds until the next tick."""
        now = self.backend.clock.time()
        wait = POLL_S
        states = await self.shared.schedules()
        self._say_overruled(states)
        queues = {wf.name: wf.queue or "" for wf in self.catalog.served().values() if wf.trigger}
        for state in states:
            # The schedule as the database holds it: the one declared last, by this worker or
            # by another with another version of the file, fires, whichever worker serving its
            # workflow on its queue is alive (the other gone, what it declared still fires).
            spec = state.spec
            if queues.get(spec.workflow) != spec.queue:  # not served here, or on another queue
                continue
            await self._repair(spec, state, now)
            if state.paused:
                continue
            fire, skip = due_ticks(spec, state.last_tick, now)
            for tick in skip:
                if await self.shared.claim_tick(spec.workflow, spec.schedule, tick):
                    log.info("schedule %s of %s: missed tick skipped", spec.schedule, spec.workflow)
            for tick in fire:
                if not await self._fire(spec, tick):
                    break  # another worker claimed it: it fires the rest as well
            following = next_tick(
                spec.cron, spec.every_ms, spec.timezone, max(now, state.last_tick)
            )
            wait = min(wait, following - self.backend.clock.time())
        return max(wait, 0.01)

    def _say_overruled(self, states: list[ScheduleState]) -> None:
        """Say it when a workflow's schedules in the database are not those declared here:
        another worker, with another version of its file, declared its own since, and those
        are what fire (a deploy under way, or a machine left with old files). Without this,
        one version's schedules won and nothing said which. Once per difference."""
        held = kept_settings(states)
        for name, specs in self._declared.items():
            ours = declared_settings(specs)
            theirs = held.get(name, {})
            if theirs == ours:
                self._overruled.pop(name, None)
                continue
            if self._overruled.get(name) == theirs:
                continue
            self._overruled[name] = theirs
            if set(theirs) == set(ours):
                differ = f"the same schedules ({_named(theirs)}) with other settings"
            else:
                differ = _named(theirs)
            log.warning(
                "schedules of %s: this worker declares %s, but another worker declared %s "
                "since (another version of the workflow's file), %s; deploy the same file to "
                "every worker (blok-tui schedules lists what fires)",
                name,
                _named(ours),
                differ,
                "and those fire" if theirs else "so none fire",
            )

    def _tick_job(self, spec: ScheduleSpec, tick: float, target: QueueTarget) -> tuple[Job, Run]:
        job_id = tick_job_id(spec.workflow, spec.schedule, tick)
        job = make_job(
            queue=spec.queue,
            workflow_name=spec.workflow,
            payload=spec.payload,
            headers=None,
            priority=0,
            run_at=None,
            max_retries=target.retries,
            job_id=job_id,
            meta={"schedule": spec.schedule, "tick": tick},
            now=self.backend.clock.now(),
        )
        job.run_id = tick_run_id(job_id)
        return job, make_run(job, workflow_version=target.version)

    async def _fire(self, spec: ScheduleSpec, tick: float) -> bool:
        target = await self.operator.target(spec.queue)
        job, run = self._tick_job(spec, tick, target)
        if not await self.shared.claim_tick(spec.workflow, spec.schedule, tick, job.id, run.id):
            return False
        await self.ledger.add(target.queue, [job], [run])
        self._verified.add(job.id)
        return True

    async def _repair(self, spec: ScheduleSpec, state: ScheduleState, now: float) -> None:
        """Enqueue the last claimed tick if its claimer died before it enqueued it."""
        job_id = state.last_job_id
        fired = state.last_fired_at
        if job_id is None or fired is None or job_id in self._verified:
            return
        if job_id != tick_job_id(spec.workflow, spec.schedule, state.last_tick):
            return  # an operator's "run now": enqueued before it was noted
        if not REPAIR_AFTER_S <= now - fired <= REPAIR_WITHIN_S:
            return
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified.add(job_id)
        if await self.backend.find_job(job_id) is not None:
            return
        target = await self.operator.target(spec.queue)
        job, run = self._tick_job(spec, state.last_tick, target)
        if await self.ledger.add(target.queue, [job], [run]):
            log.warning(
                "schedule %s of %s: the tick at %s was claimed but never enqueued (its worker "
                "died); enqueued now",
                spec.schedule,
                spec.workflow,
                from_epoch(state.last_tick),
            )

    async def loop(self) -> None:
        while True:
            try:
                if self._changed.is_set():
                    self._changed = anyio.Event()
                await self.declare()
                wait = await self.fire_due()
            except DatabaseError as error:  # its own words say it: no traceback of ours
                log.error("the scheduler failed: %s; trying again in %.0fs", error, RETRY_S)
                wait = RETRY_S
            except Exception:
                # A schedule must not take the worker down: the database may be back soon.
                log.exception("the scheduler failed; trying again in %.0fs", RETRY_S)
                wait = RETRY_S
            with anyio.move_on_after(wait):
                await self._changed.wait()


def _named(specs: dict[str, str]) -> str:
    return ", ".join(f"'{name}'" for name in sorted(specs)) or "none"


# ---- the operator's side -----------------------------------------------------------------
class Schedules:
    """List, pause, resume and run schedules, from any process on the database."""

    def __init__(self, backend: Backend, operator: Operator) -> None:
        self.backend = backend
        self.shared = backend.shared
        self.operator = operator

    async def list(self) -> list[ScheduleInfo]:
        states = await self.shared.schedules()
        live = await LiveWorkers.read(self.backend)
        served = {w.name for catalog in live.catalogs for w in catalog.workflows}
        overruled = overruled_workers(live.catalogs, states)
        last_runs = [s.last_run_id for s in states if s.last_run_id]
        status = {r.id: r.status for r in await self.backend.runs.runs_by_id(last_runs)}
        now = self.backend.clock.time()
        infos = []
        for state in states:
            spec = state.spec
            upcoming = next_tick(spec.cron, spec.every_ms, spec.timezone, max(now, state.last_tick))
            infos.append(
                ScheduleInfo(
                    workflow=spec.workflow,
                    schedule=spec.schedule,
                    queue=spec.queue,
                    cron=spec.cron,
                    every_ms=spec.every_ms,
                    timezone=spec.timezone,
                    catch_up=spec.catch_up,
                    paused=state.paused,
                    next_at=None if state.paused else from_epoch(upcoming),
                    last_tick_at=from_epoch(state.last_tick),
                    last_fired_at=from_epoch(state.last_fired_at),
                    last_run_id=state.last_run_id,
                    last_status=status.get(state.last_run_id or ""),
                    served=spec.workflow in served,
                    overruled=overruled.get(spec.workflow, ()),
                )
            )
        return infos

    async def overruled(self) -> dict[str, tuple[str, ...]]:
        """`schedules.overruled_workers` of the live workers: the workflows with none kept
        too, which `list` has no row for."""
        live = await LiveWorkers.read(self.backend)
        return overruled_workers(live.catalogs, await self.shared.schedules())

    async def find(self, workflow: str, schedule: str | None) -> ScheduleState:
        """The schedule of `workflow` with this id (or its only one)."""
        states = [s for s in await self.shared.schedules() if s.spec.workflow == workflow]
        if not states:
            known = sorted({s.spec.workflow for s in await self.shared.schedules()})
            raise EngineError(
                f"workflow {workflow!r} has no schedules (scheduled workflows: "
                f"{', '.join(known) or 'none'})"
            )
        if schedule is None:
            if len(states) == 1:
                return states[0]
            ids = [s.spec.schedule for s in states]
            raise AmbiguousSchedule(
                f"workflow {workflow!r} has {len(states)} schedules; name one: "
                + ", ".join(map(repr, ids)),
                workflow,
                ids,
            )
        for state in states:
            if state.spec.schedule == schedule:
                return state
        raise EngineError(
            f"workflow {workflow!r} has no schedule {schedule!r} (its schedules: "
            + ", ".join(repr(s.spec.schedule) for s in states)
            + ")"
        )

    async def set_paused(self, workflow: str, schedule: str | None, paused: bool) -> str:
        state = await self.find(workflow, schedule)
        spec = state.spec
        resume_from = None
        if not paused:
            # The ticks of the pause are not caught up: it goes on from the next one.
            resume_from = latest_tick(
                spec.cron, spec.every_ms, spec.timezone, self.backend.clock.time()
            )
        if not await self.shared.set_schedule_paused(
            spec.workflow, spec.schedule, paused, resume_from
        ):
            raise EngineError(f"schedule {spec.schedule!r} of {workflow!r} was removed meanwhile")
        return spec.schedule

    async def run_now(self, workflow: str, schedule: str | None) -> str:
        """Enqueue one run of the schedule now (its ticks are untouched); the run's id."""
        state = await self.find(workflow, schedule)
        spec = state.spec
        job_id = await self.operator.enqueue(spec.queue, spec.payload)
        job = await self.operator.get_job(job_id)
        await self.shared.note_fired(
            spec.workflow, spec.schedule, job_id, job.run_id, self.backend.clock.time()
        )
        return job.run_id
