"""What processes share (workers, catalogs, pauses, slots, windows, leaders, schedules, rate
windows), kept in this process's memory: the memory backend has one process to share with."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from ..models import WorkerInfo
from .base import (
    ScheduleSpec,
    ScheduleState,
    SharedState,
    Window,
    WorkerCatalog,
)
from .places import RateDecision, decide_start, place_for

T = TypeVar("T")


class MemoryShared(SharedState):
    def __init__(self) -> None:
        self._workers: dict[str, WorkerInfo] = {}
        self._catalogs: dict[str, WorkerCatalog] = {}
        self._paused: set[str] = set()
        self._slots: dict[tuple[str, str], dict[str, tuple[str, float]]] = {}
        self._slot_of: dict[str, tuple[str, str]] = {}
        self._windows: dict[tuple[str, str, str], Window] = {}
        self._leaders: dict[str, tuple[str, float]] = {}
        self._schedules: dict[tuple[str, str], ScheduleState] = {}
        # (scope, key) → [(run id, started at, counts until)]
        self._starts: dict[tuple[str, str], list[tuple[str, float, float]]] = {}

    def heartbeat(self, worker: WorkerInfo) -> None:
        self._workers[worker.id] = worker.model_copy()

    async def workers(self, *, own_writes: bool = True) -> list[WorkerInfo]:
        return sorted(self._workers.values(), key=lambda w: w.started_at)

    async def forget_worker(self, worker_id: str, *, listed: bool = False) -> list[tuple[str, str]]:
        if not listed:
            self._workers.pop(worker_id, None)
        freed = []
        for (_, key), holders in self._slots.items():
            for run_id in [r for r, (w, _) in holders.items() if w == worker_id]:
                del holders[run_id]
                self._slot_of.pop(run_id, None)
                freed.append((run_id, key))
        return freed

    def publish_catalog(self, catalog: WorkerCatalog) -> None:
        self._catalogs[catalog.worker] = catalog
        for gone in [
            worker
            for worker, old in self._catalogs.items()
            if worker not in self._workers and worker != catalog.worker and old.overlaps(catalog)
        ]:
            del self._catalogs[gone]

    async def catalogs(self) -> list[WorkerCatalog]:
        return sorted(self._catalogs.values(), key=lambda c: c.updated_at)

    async def paused_queues(self) -> set[str]:
        return set(self._paused)

    async def set_paused(self, queue: str, paused: bool) -> None:
        if paused:
            self._paused.add(queue)
        else:
            self._paused.discard(queue)

    async def acquire_slot(
        self, workflow: str, key: str, limit: int, run_id: str, worker: str, lease_s: float
    ) -> tuple[bool, int]:
        now = time.time()
        holders = self._slots.setdefault((workflow, key), {})
        for gone in [r for r, (w, until) in holders.items() if until < now]:
            del holders[gone]
            self._slot_of.pop(gone, None)
        verdict = place_for(holders, run_id, limit)
        if verdict is not None:
            return verdict, len(holders)
        holders[run_id] = (worker, now + lease_s)
        self._slot_of[run_id] = (workflow, key)
        return True, len(holders)

    def release_slot(self, run_id: str) -> None:
        slot = self._slot_of.pop(run_id, None)
        if slot is not None:
            self._slots.get(slot, {}).pop(run_id, None)

    def renew_slots(self, worker: str, lease_s: float) -> None:
        until = time.time() + lease_s
        for holders in self._slots.values():
            for run_id, (holder, _) in list(holders.items()):
                if holder == worker:
                    holders[run_id] = (holder, until)

    async def slot_holders(self, workflow: str, key: str) -> list[str]:
        now = time.time()
        holders = self._slots.get((workflow, key), {})
        return [run_id for run_id, (_, until) in holders.items() if until >= now]

    async def update_window(
        self,
        workflow: str,
        key: str,
        mode: str,
        decide: Callable[[Window | None, float], tuple[T, Window | None, bool]],
    ) -> T:
        result, window, write = decide(self._windows.get((workflow, key, mode)), time.time())
        if write:
            if window is None:
                self._windows.pop((workflow, key, mode), None)
            else:
                self._windows[(workflow, key, mode)] = window
        return result

    async def close_windows(self, before: float) -> None:
        for gone in [k for k, w in self._windows.items() if k[2] == "leading" and w.until < before]:
            del self._windows[gone]

    async def try_lead(self, chore: str, worker: str, ttl_s: float) -> bool:
        now = time.time()
        holder = self._leaders.get(chore)
        if holder is not None and holder[0] != worker and holder[1] >= now:
            return False
        self._leaders[chore] = (worker, now + ttl_s)
        return True

    async def resign(self, chore: str, worker: str) -> None:
        holder = self._leaders.get(chore)
        if holder is not None and holder[0] == worker:
            del self._leaders[chore]

    # ---- schedules -------------------------------------------------------------------------
    async def declare_schedules(
        self, workflow: str, specs: list[tuple[ScheduleSpec, float]]
    ) -> None:
        wanted = {spec.schedule for spec, _ in specs}
        for key in [k for k in self._schedules if k[0] == workflow and k[1] not in wanted]:
            del self._schedules[key]
        for spec, first in specs:
            key = (workflow, spec.schedule)
            known = self._schedules.get(key)
            self._schedules[key] = (
                ScheduleState(spec, first) if known is None else replace(known, spec=spec)
            )

    async def schedules(self) -> list[ScheduleState]:
        return [self._schedules[key] for key in sorted(self._schedules)]

    async def claim_tick(
        self,
        workflow: str,
        schedule: str,
        tick: float,
        job_id: str | None = None,
        run_id: str | None = None,
    ) -> bool:
        known = self._schedules.get((workflow, schedule))
        if known is None or known.paused or known.last_tick >= tick:
            return False
        if job_id is None:  # skipped (catch_up="none"): no job, the last one stays
            self._schedules[(workflow, schedule)] = replace(known, last_tick=tick)
        else:
            self._schedules[(workflow, schedule)] = replace(
                known,
                last_tick=tick,
                last_job_id=job_id,
                last_run_id=run_id,
                last_fired_at=time.time(),
            )
        return True

    async def note_fired(
        self, workflow: str, schedule: str, job_id: str, run_id: str, at: float
    ) -> bool:
        known = self._schedules.get((workflow, schedule))
        if known is None:
            return False
        self._schedules[(workflow, schedule)] = replace(
            known, last_job_id=job_id, last_run_id=run_id, last_fired_at=at
        )
        return True

    async def set_schedule_paused(
        self, workflow: str, schedule: str, paused: bool, resume_from: float | None = None
    ) -> bool:
        known = self._schedules.get((workflow, schedule))
        if known is None:
            return False
        last = known.last_tick
        if not paused and resume_from is not None:
            last = max(last, resume_from)
        self._schedules[(workflow, schedule)] = replace(known, paused=paused, last_tick=last)
        return True

    # ---- rate limits -----------------------------------------------------------------------
    async def acquire_start(
        self,
        scope: str,
        key: str,
        limit: int,
        period_s: float,
        run_id: str,
        now: float | None = None,
    ) -> RateDecision:
        if now is None:
            now = time.time()
        starts = self._starts.setdefault((scope, key), [])
        starts[:] = [(r, at, until) for r, at, until in starts if until > now]
        decided = decide_start({r: until for r, _, until in starts}, run_id, limit, now)
        if decided is not None:
            return decided
        starts.append((run_id, now, now + period_s))
        return RateDecision(True, len(starts), decided_at=now)

    async def recent_starts(self, scope: str, key: str, since: float) -> list[tuple[str, float]]:
        starts = self._starts.get((scope, key), [])
        return sorted(((r, at) for r, at, _ in starts if at > since), key=lambda s: s[1])

    async def forget_starts(self, before: float) -> None:
        for key in list(self._starts):
            kept = [s for s in self._starts[key] if s[2] >= before]
            if kept:
                self._starts[key] = kept
            else:
                del self._starts[key]
