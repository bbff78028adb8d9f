"""What the step runner needs from around it: where a run's records go (`Recorder`), and what
steps need from the engine (`Services`: another workflow, the idempotency cache, a run's mailbox,
dispatching a child run). Protocols, so the runner never imports the engine that implements them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .models import Job, LogLine, Run
from .workflow import Workflow

if TYPE_CHECKING:
    from .backends.base import Fence, JobQueue


class Recorder(Protocol):
    """Where one run's records go while it runs (the worker fences them with its claim)."""

    def save(self, run: Run) -> None: ...

    def log(self, run_id: str, line: LogLine) -> None: ...


class FencedRecorder:
    """A running job's progress writes, at its claim's epoch."""

    __slots__ = ("fence", "queue")

    def __init__(self, queue: JobQueue, fence: Fence) -> None:
        self.queue = queue
        self.fence = fence

    def save(self, run: Run) -> None:
        self.queue.record(run, self.fence)

    def log(self, run_id: str, line: LogLine) -> None:
        self.queue.record_log(run_id, line, self.fence)


class CacheHitLike(Protocol):
    output: Any
    run_id: str


class EventLike(Protocol):
    @property
    def payload(self) -> Any: ...


class Services(Protocol):
    """What steps need from the engine around them."""

    def workflow(self, name: str) -> Workflow | None:
        """A loaded workflow by name (middleware, sub-workflows)."""

    def workflow_names(self) -> list[str]:
        """The loaded workflows' names (a mistyped one's "did you mean")."""

    async def cache_get(self, workflow: str, step: str, key: str) -> CacheHitLike | None: ...

    def cache_put(
        self, workflow: str, step: str, key: str, output: Any, run_id: str, ttl_ms: int
    ) -> None: ...

    async def find_job(self, job_id: str) -> Job | None: ...

    async def get_run(self, run_id: str) -> Run | None: ...

    async def take_event(
        self,
        run_id: str,
        step: str,
        event: str,
        *,
        key: str | None,
        path: tuple[str, ...],
        register: bool,
    ) -> EventLike | None:
        """The event a wait step takes from the run's mailbox (see RunStore.take_event)."""

    async def dispatch(
        self, workflow: Workflow, payload: Any, job_id: str, meta: dict[str, Any], queue: str
    ) -> str:
        """Enqueue a child run of `workflow` under a fixed job id (known ids are not added
        twice), on its own queue, or on `queue` (the parent's) for a workflow with no
        trigger; the id of the job's run."""


class _Unrecorded:
    def save(self, run: Run) -> None:
        pass

    def log(self, run_id: str, line: LogLine) -> None:
        pass


UNRECORDED = _Unrecorded()
