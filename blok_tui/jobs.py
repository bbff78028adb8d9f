"""Failures per job, not per run: a job that retries is several runs (one per delivery), so a
failed run may be followed by a delivery that completed, and "every failed run" may name one
dead job three times. This module says what became of a run's job, and keeps one run per job
for the bulk actions.

Jobs are read by id, all a view needs in one read (`get_jobs`), and kept a little while, so a
view that redraws ten times a second does not read them ten times a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import tzinfo

from rich.text import Text

from engine import Job, JobState, Orphan, Run, RunStatus
from engine.api import EngineAPI

from .console import local_times

# A job that has ended changes again only when it is requeued (the console forgets it when it
# requeues; another process's requeue shows within this many seconds); one still going changes
# with each delivery.
KEEP_ENDED = 30.0
KEEP_GOING = 2.0
# Statuses of a run that its job may outlive: the job is retried with a new run after these.
RETRIED_AFTER = frozenset({"failed", "timed_out", "crashed"})

ORPHANED = Text("⚠ orphaned", style="bold dark_orange")  # a running run nobody runs (`orphans`)


def orphaned_text(orphan: Orphan, tz: tzinfo | None) -> Text:
    """The sentence for a running run nobody runs (`JobBook.orphans`), its moments in `tz`."""
    return Text(f"⚠ nobody runs it now: {local_times(str(orphan), tz)}", style="dark_orange")


# What became of a job after one of its runs: (words, style).
THEN: dict[JobState, tuple[str, str]] = {
    JobState.COMPLETED: ("completed", "green3"),
    JobState.DEAD: ("dead", "bold magenta"),
    JobState.FAILED: ("failed", "red1"),
    JobState.CANCELLED: ("cancelled", "grey58"),
    JobState.WAITING: ("retrying", "khaki1"),
    JobState.DELAYED: ("retrying", "khaki1"),
    JobState.ACTIVE: ("retrying", "deep_sky_blue1"),
}


class JobBook:
    """The jobs the console has read lately, by id."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._jobs: dict[str, tuple[float, Job]] = {}
        self._clock = clock
        self.reads = 0  # reads made (tests check that redraws do not read again)

    def _fresh(self, job_id: str, now: float) -> Job | None:
        kept = self._jobs.get(job_id)
        if kept is None:
            return None
        read_at, job = kept
        keep = KEEP_ENDED if job.state.terminal else KEEP_GOING
        return job if now - read_at < keep else None

    async def read(self, engine: EngineAPI, job_ids: Iterable[str]) -> dict[str, Job]:
        """The jobs by id, from what was read lately or read now; a job the engine does not
        know (deleted by the janitor) is left out."""
        now = self._clock()
        found: dict[str, Job] = {}
        missing: list[str] = []
        for job_id in dict.fromkeys(job_ids):
            job = self._fresh(job_id, now)
            if job is None:
                missing.append(job_id)
            else:
                found[job_id] = job
        if missing:
            self.reads += 1
            read = await engine.get_jobs(missing)
            read_at = self._clock()
            for job_id, job in read.items():
                self._jobs[job_id] = (read_at, job)
            found.update(read)
        return found

    async def outlook(
        self, engine: EngineAPI, runs: Sequence[Run]
    ) -> tuple[dict[str, Job], dict[str, Orphan]]:
        """`fates` and `orphans` of a page of runs, the jobs of both read at once."""
        await self.read(
            engine,
            (
                run.job_id
                for run in runs
                if str(run.status) in RETRIED_AFTER or run.status is RunStatus.RUNNING
            ),
        )
        return await self.fates(engine, runs), await self.orphans(engine, runs)

    async def fates(self, engine: EngineAPI, runs: Iterable[Run]) -> dict[str, Job]:
        """Run id → its job, for the runs a job may have outlived (failed, timed out, crashed)
        whose job has since gone on with another run."""
        candidates = [run for run in runs if str(run.status) in RETRIED_AFTER]
        jobs = await self.read(engine, (run.job_id for run in candidates))
        return {
            run.id: jobs[run.job_id]
            for run in candidates
            if run.job_id in jobs and jobs[run.job_id].run_id != run.id
        }

    async def orphans(self, engine: EngineAPI, runs: Iterable[Run]) -> dict[str, Orphan]:
        """Run id → why nobody runs it and what comes next (`Engine.orphaned`), for the runs
        that say `running` whose worker is gone or let its lease run out: nothing moves them
        on until a live worker takes their jobs over. The workers are read only when a
        running run is still its job's, or its job is in no queue here (a memory queue's)."""
        running = [run for run in runs if run.status is RunStatus.RUNNING]
        jobs = await self.read(engine, (run.job_id for run in running))
        # Runs still their jobs', or whose job is in no queue here; the rest moved on.
        asked = [
            (run, job)
            for run in running
            if (job := jobs.get(run.job_id)) is None or job.run_id == run.id
        ]
        if not asked:
            return {}
        workers = await engine.workers()
        found = {run.id: engine.orphaned(run, job, workers) for run, job in asked}
        return {run_id: orphan for run_id, orphan in found.items() if orphan is not None}

    def forget(self, job_ids: Iterable[str] | None = None) -> None:
        """Read these jobs (or all) afresh next time: the console just changed them, or a run
        of theirs changed (queued, started, ended). Else a job's later run could complete
        within the two seconds a going job is kept, and its failed run said "↻ retrying" until
        something else moved."""
        if job_ids is None:
            self._jobs.clear()
            return
        for job_id in job_ids:
            self._jobs.pop(job_id, None)


def then_text(
    job: Job, *, long: bool = False, shown_id: str | None = None, delivery: int | None = None
) -> Text:
    """What the job did after the run: "↻ completed" (a table cell), or in a sentence for the
    run view: "↻ then completed: its job went on to delivery 2 of 3 (1a2b3c4d)", naming the
    job's run by `shown_id` (its short id) if given, and its delivery by `delivery` (that
    run's `job_attempt`) if read: a retry's run in its backoff is not claimed yet, and the
    job's claims still count the run before (it read "went on to delivery 1 of 2")."""
    words, style = THEN.get(job.state, (str(job.state), "grey70"))
    if job.state is JobState.CANCELLED and job.meta.get("discarded"):
        words = "discarded"  # taken out of the dead-letter queue, its last run failed
    if not long:
        return Text(f"↻ {words}", style=style)
    text = Text()
    text.append(f"↻ then {words}", style=f"bold {style}")
    deliveries = f"delivery {delivery or job.deliveries} of {job.delivery_budget}"
    if job.meta.get("requeued"):  # the count starts again at a requeue
        deliveries += " after a requeue"
    text.append(f": its job went on to {deliveries} ({shown_id or job.run_id})", style=style)
    return text


@dataclass(frozen=True, slots=True)
class PerJob:
    """The runs a bulk action was given, one per job: the newest run of each job."""

    runs: list[Run]  # newest first
    given: int  # runs given, before keeping one per job


def one_per_job(runs: Iterable[Run]) -> PerJob:
    """The newest run of each job among `runs` (a job retried three times is one job)."""
    given = list({run.id: run for run in runs}.values())
    newest: dict[str, Run] = {}
    for run in sorted(given, key=lambda r: (r.created_at, r.job_attempt), reverse=True):
        newest.setdefault(run.job_id, run)
    return PerJob(list(newest.values()), len(given))


def budget_words(jobs: Iterable[Job]) -> str:
    """The retry budget a requeue gives these jobs: "2 retries (up to 3 deliveries)"."""
    budgets = sorted({job.max_retries for job in jobs})
    if not budgets:
        return ""
    if len(budgets) == 1:
        (n,) = budgets
        retries = "no retry" if n == 0 else "1 retry" if n == 1 else f"{n} retries"
        deliveries = "1 delivery" if n == 0 else f"up to {n + 1} deliveries"
        return f"{retries} ({deliveries})"
    return f"{budgets[0]}–{budgets[-1]} retries, each its own"
