"""Bulk actions from the console: what a confirmation promises (how many, chosen how, what is
left out and why) and carrying it out with progress.

Bulk actions act once per job: a job retried three times is three failed runs, and "replay
every failed run" must replay it once, not three times. So the plan takes the runs chosen (the
marked rows, or every run the filter matches), keeps the newest run of each job, leaves out the
jobs the action would wrong (a job that completed on a later delivery is not replayed, nor a run
replayed already), and hands the engine's bulk API the ids that remain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from engine import JobState, Run, RunFilter
from engine.api import EngineAPI
from engine.operations import BulkProgress, BulkResult

from .jobs import JobBook, budget_words, one_per_job

Progress = Callable[[BulkProgress], Awaitable[None] | None]

VERBS = {"cancel": "Cancel", "replay": "Replay", "requeue": "Requeue", "discard": "Discard"}
REQUEUED = (JobState.DEAD, JobState.FAILED)  # what the engine's requeue takes back


@dataclass(frozen=True, slots=True)
class BulkPlan:
    """One bulk action, as the confirmation states it."""

    action: str  # cancel | replay | requeue | discard
    # A filter, or ids (run ids; job ids for requeue and discard).
    target: RunFilter | tuple[str, ...]
    count: int  # runs (or jobs) it touches at most (what the confirmation says)
    chosen: str  # how the runs were chosen, in words: "the 3 marked runs", "every failed run"
    item: str = "run"  # what the ids are, in words: "run", "dead job", "dead letter"
    # Requeue (or discard) every dead letter of this queue (the engine's requeue_dead or
    # discard_dead, not a list of ids).
    dead_of: str | None = None
    given: int = 0  # runs chosen before keeping one per job (0: not counted)
    jobs: int = 0  # the jobs of those runs
    # (why, how many jobs) the action leaves alone; "why" reads after the count of jobs:
    # "3 completed on a later delivery".
    left_out: tuple[tuple[str, int], ...] = ()
    budget: str = ""  # the retry budget a requeue gives, in words
    note: str = ""  # what the action does not do that the operator may expect, in a sentence
    # All the view's filter (or queue) holds, not rows picked from it: the button says "all".
    everything: bool = False

    @property
    def question(self) -> str:
        noun = self.item if self.count == 1 else f"{self.item}s"
        return f"{VERBS[self.action]} {self.count:,} {noun}?"

    @property
    def per_job(self) -> str:
        """How the runs chosen became what is acted on, in words (empty when nothing merged
        or was left out)."""
        parts = []
        if self.given > self.jobs:
            runs = f"{self.given:,} runs" if self.given != 1 else "1 run"
            jobs = f"{self.jobs:,} jobs" if self.jobs != 1 else "1 job"
            parts.append(f"{runs} of {jobs}, each job once (its newest run).")
        if self.left_out:
            jobs = ", ".join(f"{n:,} {why}" for why, n in self.left_out)
            parts.append(f"Left out, by job: {jobs}.")
        if self.note:
            parts.append(self.note)
        return " ".join(parts)


async def plan_for_runs(
    engine: EngineAPI,
    book: JobBook,
    action: str,
    runs: Sequence[Run],
    chosen: str,
    *,
    everything: bool = False,
) -> BulkPlan:
    """The plan for `action` over the runs chosen, once per job (`everything`: every run the
    view's filter matches, not the rows marked)."""
    per_job = one_per_job(runs)
    newest = per_job.runs
    left_out: Counter[str] = Counter()
    if action == "cancel":
        ids = tuple(run.id for run in newest)
        return BulkPlan(
            action,
            ids,
            len(ids),
            chosen,
            given=per_job.given,
            jobs=len(newest),
            everything=everything,
        )
    jobs = await book.read(engine, (run.job_id for run in newest))
    if action == "replay":
        kept = []
        dead_letters = 0
        # Its newest replay is the one to replay: "replay every failed run" twice, or over a
        # failed run and its failed replay, would run the same input twice.
        replayed = await engine.replayed_among(newest)
        for run in newest:
            if run.id in replayed:
                left_out["replayed already"] += 1
                continue
            job = jobs.get(run.job_id)
            if job is not None and job.state is JobState.CANCELLED and job.meta.get("discarded"):
                left_out["discarded"] += 1  # taken out of the dead letters: "never runs again"
                continue
            dead_letters += job is not None and job.state is JobState.DEAD
            if job is not None and job.run_id != run.id:
                if job.state is JobState.COMPLETED:
                    left_out["completed on a later delivery"] += 1
                    continue
                if not job.state.terminal:
                    left_out["still retrying"] += 1
                    continue
            kept.append(run.id)
        note = ""
        if dead_letters:
            # Replayed, a dead letter stays one: a requeue of it later runs it once more.
            note = (
                "1 is a dead letter, and stays in the dead-letter queue once replayed."
                if dead_letters == 1
                else f"{dead_letters:,} are dead letters, and stay in the dead-letter queue "
                "once replayed."
            )
        return BulkPlan(
            action,
            tuple(kept),
            len(kept),
            chosen,
            given=per_job.given,
            jobs=len(newest),
            left_out=tuple(left_out.most_common()),
            note=note,
            everything=everything,
        )
    # requeue: the dead (or failed) jobs of the runs chosen, each once.
    dead = []
    for run in newest:
        job = jobs.get(run.job_id)
        if job is None:
            left_out["no longer in any queue"] += 1  # removed by the janitor
        elif job.state not in REQUEUED:
            left_out[str(job.state)] += 1
        else:
            dead.append(job)
    return BulkPlan(
        action,
        tuple(job.id for job in dead),
        len(dead),
        chosen,
        item="dead job",
        given=per_job.given,
        jobs=len(newest),
        left_out=tuple(left_out.most_common()),
        everything=everything,
        budget=budget_words(dead),
    )


async def execute(
    engine: EngineAPI, plan: BulkPlan, progress: Progress | None = None
) -> BulkResult:
    """Carry out the plan through the engine's bulk API (the same for a local engine and an
    attached one)."""
    if plan.dead_of is not None and plan.action == "discard":
        return await engine.discard_dead(plan.dead_of, progress=progress)
    if plan.dead_of is not None:
        return await engine.requeue_dead(plan.dead_of, progress=progress)
    target: RunFilter | list[str] = (
        plan.target if isinstance(plan.target, RunFilter) else list(plan.target)
    )
    if plan.action == "discard":
        return await engine.discard_many(target, progress=progress)
    if plan.action == "cancel":
        return await engine.cancel_many(target, progress=progress)
    if plan.action == "replay":
        return await engine.replay_many(target, progress=progress)
    return await engine.requeue_many(target, progress=progress)
