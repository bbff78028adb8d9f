"""`EngineAPI`: what a user interface (the console, the command line) may use of an engine.

`Engine` implements it, whether it runs workflows here or is a client of workers sharing its
database; `capabilities` says which, so a UI adapts to it instead of probing for methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from .backends.base import EventMessage
from .engine import Capabilities
from .events import Subscription
from .filters import RunFilter
from .health import Health
from .liveness import Orphan
from .models import EventSent, Job, QueueInfo, QueueStats, Run, WorkerInfo, WorkflowInfo
from .operations import BulkResult, ProgressCallback
from .scheduler import ScheduleInfo
from .waiting import WaitReason


class EngineAPI(Protocol):
    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def reload_errors(self) -> dict[str, str]: ...

    database: Path | str | None

    @property
    def in_flight(self) -> int: ...

    def now(self) -> datetime: ...

    def out_of_reach_since(self) -> datetime | None: ...

    def events(self) -> Subscription: ...

    # reads
    async def queues(self) -> list[QueueInfo]: ...

    async def queue_stats(self, queue: str) -> QueueStats: ...

    async def throughput(self, queue: str, window: float = 10.0) -> float: ...

    async def workflows(self) -> list[WorkflowInfo]: ...

    async def workers(self) -> list[WorkerInfo]: ...

    async def live_workers(self) -> list[WorkerInfo]: ...

    def worker_alive(self, worker: WorkerInfo) -> bool: ...

    def worker_state(self, worker: WorkerInfo) -> str: ...

    def orphaned(
        self, run: Run, job: Job | None, workers: Sequence[WorkerInfo]
    ) -> Orphan | None: ...

    async def health(self, max_age: str | int | float | timedelta = "5m") -> Health: ...

    async def get_run(self, run_id: str) -> Run: ...

    async def find_run(self, word: str, *, going: bool = False) -> Run: ...

    async def get_job(self, job_id: str) -> Job: ...

    async def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]: ...

    async def runs(
        self,
        status: str | list[str] | None = None,
        workflow: str | None = None,
        queue: str | None = None,
        limit: int | None = 100,
        *,
        text: str | None = None,
        offset: int = 0,
        retrying: bool = False,
        stuck: float | None = None,
        replay_of: str | None = None,
        since: datetime | None = None,
    ) -> list[Run]: ...

    async def count_runs(self, where: RunFilter | None = None) -> int: ...

    async def dead_letters(self, queue: str, *, limit: int | None = 1000) -> list[Job]: ...

    async def wait_for_job(self, job_id: str, timeout: float | None = None) -> Run: ...

    # actions
    async def enqueue(
        self,
        queue: str,
        payload: Any = None,
        *,
        priority: int = 0,
        delay: Any = None,
        job_id: str | None = None,
        headers: dict[str, str] | None = None,
        force: bool = False,
        retries: int | None = None,
        timeout: Any = None,
    ) -> str: ...

    async def cancel(self, run_id: str) -> Run: ...

    async def replay_warning(self, run_id: str) -> str | None: ...

    async def replayed_among(self, runs: Sequence[Run]) -> set[str]: ...

    async def replay(
        self,
        run_id: str,
        *,
        from_step: str | None = None,
        input: Any = None,
        force: bool = False,
    ) -> str: ...

    async def requeue(self, job_id: str, *, force: bool = False) -> str: ...

    async def discard(self, job_id: str) -> str: ...

    async def find_dead_letter(self, word: str) -> Job: ...

    async def retry_now(self, run_id: str) -> str: ...

    async def pause(self, queue: str) -> None: ...

    async def resume(self, queue: str) -> None: ...

    # bulk
    async def cancel_many(
        self, runs: RunFilter | Sequence[str], *, progress: ProgressCallback | None = None
    ) -> BulkResult: ...

    async def replay_many(
        self,
        runs: RunFilter | Sequence[str],
        *,
        from_step: str | None = None,
        progress: ProgressCallback | None = None,
    ) -> BulkResult: ...

    async def requeue_many(
        self,
        jobs: RunFilter | Sequence[str],
        *,
        force: bool = False,
        progress: ProgressCallback | None = None,
    ) -> BulkResult: ...

    async def requeue_dead(
        self, queue: str, *, force: bool = False, progress: ProgressCallback | None = None
    ) -> BulkResult: ...

    async def discard_many(
        self, jobs: RunFilter | Sequence[str], *, progress: ProgressCallback | None = None
    ) -> BulkResult: ...

    async def discard_dead(
        self, queue: str, *, progress: ProgressCallback | None = None
    ) -> BulkResult: ...

    # events, schedules, why a run waits
    async def send_event(
        self, run_id: str | None, event: str, payload: Any = None
    ) -> EventSent: ...

    async def events_of(self, run_id: str) -> list[EventMessage]: ...

    async def schedules(self) -> list[ScheduleInfo]: ...

    async def pause_schedule(self, workflow: str, schedule: str | None = None) -> str: ...

    async def resume_schedule(self, workflow: str, schedule: str | None = None) -> str: ...

    async def run_schedule(self, workflow: str, schedule: str | None = None) -> str: ...

    async def why_waiting(self, run_id: str) -> WaitReason: ...

    async def where(self, run_id: str, timeout: float = 10.0) -> str: ...

    async def usual_duration(self, workflow: str) -> float | None: ...

    async def overruled_schedules(self) -> dict[str, tuple[str, ...]]: ...

    async def version_splits(self) -> dict[str, dict[str, list[str]]]: ...


__all__ = ["Capabilities", "EngineAPI"]
