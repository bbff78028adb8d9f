"""What became of a run's replays: a dead letter fixed by a replay that completed is done, and
requeueing it would run its steps again (a charge twice)."""

from __future__ import annotations

from .backends.base import RunStore
from .errors import ReplayedAlready
from .filters import RunFilter
from .models import Run, RunStatus

MAX_REPLAYS = 50  # of one run, its replays' replays included, looked at


async def completed_replay(store: RunStore, run_id: str) -> Run | None:
    """A completed replay of `run_id`, or of one of its replays (a replay that failed, fixed
    and replayed in turn); None if none completed."""
    seen = {run_id}
    sources = [run_id]
    while sources and len(seen) < MAX_REPLAYS:
        source = sources.pop()
        for replay in await store.list_runs(RunFilter.of(replay_of=source), limit=MAX_REPLAYS):
            if replay.status is RunStatus.COMPLETED:
                return replay
            if replay.id not in seen:
                seen.add(replay.id)
                sources.append(replay.id)
    return None


async def refuse_if_replayed(store: RunStore, job_id: str, run_id: str) -> None:
    """Refuse to requeue a job whose run a replay completed (ReplayedAlready)."""
    done = await completed_replay(store, run_id)
    if done is not None:
        raise ReplayedAlready(
            f"job {job_id}: its run {run_id} was replayed as run {done.id}, which completed; "
            "a requeue runs the job again"
        )
