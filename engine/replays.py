"""What became of a run's replays: a dead letter fixed by a replay that completed is done, and
requeueing it would run its steps again (a charge twice); one whose replay has not ended yet
would run twice at once."""

from __future__ import annotations

from collections.abc import Sequence

from .backends.base import Backend, RunStore
from .errors import ReplayedAlready
from .filters import RunFilter
from .models import JobState, Run, RunStatus
from .operations import matching_runs

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


async def replayed_among(store: RunStore, targets: Sequence[Run | str]) -> set[str]:
    """Which of a bulk replay's runs (or ids) were replayed already, in one read of the
    replays made since the oldest of them (a replay comes after its run). "Replay every
    failed run" twice, or over a failed run and its failed replay, ran the same input twice
    (a charge twice): the run to replay is the newest of its line, which a run replayed
    already is not."""
    ids = [target for target in targets if isinstance(target, str)]
    runs = [target for target in targets if isinstance(target, Run)]
    if ids:  # the console's marked rows: their times, in one read (without it, every replay)
        runs += await store.runs_by_id(ids)
    if not runs:  # nothing to replay, or no such run: nothing to read
        return set()
    since = min(run.created_at for run in runs).timestamp()
    replays = await matching_runs(store, RunFilter(replays=True, created_after=since))
    return {run.replay_of for run in replays if run.replay_of}


def replayed_as(replay: Run) -> str:
    """ "replayed as run X, which completed" (or "which is queued and has not ended")."""
    if replay.status is RunStatus.COMPLETED:
        return f"replayed as run {replay.id}, which completed"
    return f"replayed as run {replay.id}, which is {replay.status} and has not ended"


async def refuse_if_replayed(store: RunStore, job_id: str, run_id: str) -> None:
    """Refuse to requeue a job whose run a replay completed, or is still running or about to
    (ReplayedAlready): a replay behind a rate limit waited 27 s, while the operator cleared
    the dead-letter queue, and both charged."""
    found = await replay_in_the_way(store, run_id)
    if found is None:
        return
    twice = (
        "runs the job again" if found.status is RunStatus.COMPLETED else "would run the job twice"
    )
    raise ReplayedAlready(
        f"job {job_id}: its run {run_id} was {replayed_as(found)}; a requeue {twice}"
    )


async def replay_warning(backend: Backend, run: Run) -> str | None:
    """Why a replay of `run` would do again what is done, or being done: its job completed
    on a later delivery, or a replay of it completed or has not ended. None if neither. A
    replay is never refused for it (the operator may mean it): the console and the command
    line ask first."""
    if run.status is not RunStatus.COMPLETED:
        found = await backend.find_job(run.job_id)
        job = found[1] if found is not None else None
        if job is not None and job.run_id != run.id and job.state is JobState.COMPLETED:
            return f"its job {job.id} completed on a later delivery (run {job.run_id})"
    replay = await replay_in_the_way(backend.runs, run.id)
    return f"it was {replayed_as(replay)}" if replay is not None else None
