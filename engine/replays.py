"""What became of a run's replays: a dead letter fixed by a replay that completed is done, and
requeueing it would run its steps again (a charge twice); one whose replay has not ended yet
would run twice at once."""

from __future__ import annotations

from .backends.base import RunStore
from .errors import ReplayedAlready
from .filters import RunFilter
from .models import Run, RunStatus

MAX_REPLAYS = 50  # of one run, its replays' replays included, looked at


async def replay_in_the_way(store: RunStore, run_id: str) -> Run | None:
    """A replay of `run_id`, or of one of its replays (a replay that failed, fixed and
    replayed in turn), that completed or has not ended yet (queued, held by a gate, running):
    a requeue beside it runs the job twice. None if every replay ended otherwise."""
    seen = {run_id}
    sources = [run_id]
    while sources and len(seen) < MAX_REPLAYS:
        source = sources.pop()
        for replay in await store.list_runs(RunFilter.of(replay_of=source), limit=MAX_REPLAYS):
            if replay.status is RunStatus.COMPLETED or not replay.terminal:
                return replay
            if replay.id not in seen:
                seen.add(replay.id)
                sources.append(replay.id)
    return None


async def refuse_if_replayed(store: RunStore, job_id: str, run_id: str) -> None:
    """Refuse to requeue a job whose run a replay completed, or is still running or about to
    (ReplayedAlready): a replay behind a rate limit waited 27 s, while the operator cleared
    the dead-letter queue, and both charged."""
    found = await replay_in_the_way(store, run_id)
    if found is None:
        return
    if found.status is RunStatus.COMPLETED:
        raise ReplayedAlready(
            f"job {job_id}: its run {run_id} was replayed as run {found.id}, which completed; "
            "a requeue runs the job again"
        )
    raise ReplayedAlready(
        f"job {job_id}: its run {run_id} was replayed as run {found.id}, which is {found.status}"
        " and has not ended; a requeue would run the job twice"
    )
