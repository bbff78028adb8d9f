"""What the console and the CLI ask the run store for: `RunFilter`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime

from .durations import parse_duration
from .models import Run, RunStatus

# "Stuck", where the console, `runs --stuck` and `show` say it without a factor: running longer
# than this × the median duration of its workflow's completed runs.
STUCK_FACTOR = 3.0
# A workflow none of whose runs completed has no median to go by: its runs are stuck once they
# have run this long. Left out, the workflow that hangs every time was the one never found.
NO_BASELINE_S = 600.0
# And never before this long, whatever the median: with one of 50 ms, a run of 2.5 s was stuck,
# and the stuck filter's bulk cancel took payments a slow gateway was about to answer. The
# environment's BLOK_STUCK_MIN (a duration: "5s", "2m") sets another.
MIN_STUCK_S = 30.0
MIN_STUCK_ENV = "BLOK_STUCK_MIN"


def min_stuck_s() -> float:
    """The least a run runs before it is "stuck": BLOK_STUCK_MIN, else MIN_STUCK_S."""
    given = os.environ.get(MIN_STUCK_ENV)
    if not given:
        return MIN_STUCK_S
    try:
        return parse_duration(given) / 1000
    except ValueError as error:
        raise ValueError(f"{MIN_STUCK_ENV}: {error}") from None


def is_stuck(took_s: float, usual_s: float | None, factor: float = STUCK_FACTOR) -> bool:
    """A running run that has run `took_s` seconds, whose workflow's completed runs take
    `usual_s` (None: none completed), is stuck: what `runs --stuck`, `show` and the console's
    run header go by."""
    if took_s < min_stuck_s():
        return False
    return took_s > (factor * usual_s if usual_s else NO_BASELINE_S)


@dataclass(frozen=True, slots=True)
class RunFilter:
    """What the console and the CLI ask for; every field narrows the set."""

    status: tuple[str, ...] | None = None
    workflow: str | None = None
    queue: str | None = None
    # In the id, job id, workflow, version, queue, status, error, worker, input.
    text: str | None = None
    job_id: str | None = None
    retrying: bool = False  # still going, with a failed attempt behind it
    # Running longer than `stuck` × the median duration of its workflow's completed runs (with
    # none completed, longer than NO_BASELINE_S). The engine turns the factor into
    # `stuck_cutoffs` (workflow, epoch seconds a run must have started before) before it asks a
    # store.
    stuck: float | None = None
    stuck_cutoffs: tuple[tuple[str, float], ...] | None = None
    finished_after: float | None = None  # epoch seconds: ended after this moment
    created_after: float | None = None  # epoch seconds: created at or after this moment
    workers: tuple[str, ...] | None = None  # run by one of these workers
    replay_of: str | None = None  # replays of this run
    replays: bool = False  # replays only (of any run)
    # Runs whose id starts with this (case-blind, no wildcard): a short id as the console
    # shows it finds its run.
    id_prefix: str | None = None
    # Of none of these queues: the pending runs of queues no worker declares (`queues()`).
    not_queues: tuple[str, ...] | None = None
    # Runs whose job's id starts with this (as `id_prefix`): a job by the start of its id.
    job_id_prefix: str | None = None

    @classmethod
    def of(
        cls,
        status: str | list[str] | tuple[str, ...] | None = None,
        workflow: str | None = None,
        queue: str | None = None,
        text: str | None = None,
        job_id: str | None = None,
        retrying: bool = False,
        stuck: float | None = None,
        replay_of: str | None = None,
        since: datetime | None = None,
    ) -> RunFilter:
        if isinstance(status, str):
            status = (status,)
        statuses = tuple(str(RunStatus(s)) for s in status) if status else None
        if stuck is not None and not stuck > 0:
            raise ValueError(f"stuck must be a factor above 0, not {stuck!r}")
        return cls(
            statuses,
            workflow,
            queue,
            text or None,
            job_id,
            retrying,
            stuck,
            replay_of=replay_of or None,
            created_after=since.timestamp() if since is not None else None,
        )

    def stuck_before(self) -> dict[str, float] | None:
        if self.stuck is None:
            return None
        if self.stuck_cutoffs is None:
            raise ValueError(
                "RunFilter(stuck=...) needs the medians the engine computes: ask through "
                "Engine.runs / count_runs, not the store directly"
            )
        return dict(self.stuck_cutoffs)

    def matches(self, run: Run) -> bool:
        """Whether the run passes the filter: for the memory store, what
        `engine.backends.rows.where_clause` asks of the SQL stores."""
        if self.status and run.status not in self.status:
            return False
        if self.workflow and run.workflow_name != self.workflow:
            return False
        if self.queue and run.queue != self.queue:
            return False
        if self.not_queues and run.queue in self.not_queues:
            return False
        if self.job_id and run.job_id != self.job_id:
            return False
        if self.replay_of and run.replay_of != self.replay_of:
            return False
        if self.replays and run.replay_of is None:
            return False
        if self.job_id_prefix is not None and not run.job_id.lower().startswith(
            self.job_id_prefix.lower()
        ):
            return False
        if self.id_prefix is not None and not run.id.lower().startswith(self.id_prefix.lower()):
            return False
        if self.workers is not None and run.worker not in self.workers:
            return False
        if self.finished_after is not None and (
            run.finished_at is None or run.finished_at.timestamp() < self.finished_after
        ):
            return False
        if self.created_after is not None and run.created_at.timestamp() < self.created_after:
            return False
        # Still going, with a failed step attempt or an earlier failed delivery behind it.
        if self.retrying and (run.terminal or (run.failed_attempts == 0 and run.job_attempt <= 1)):
            return False
        cutoffs = self.stuck_before()
        if cutoffs is not None:
            cutoff = cutoffs.get(run.workflow_name)
            if (
                run.status is not RunStatus.RUNNING
                or run.started_at is None
                or cutoff is None
                or run.started_at.timestamp() >= cutoff
            ):
                return False
        if self.text:
            needle = self.text.lower()
            fields = (
                run.id,
                run.job_id,
                run.workflow_name,
                run.workflow_version,
                run.queue,
                run.status,
                run.error or "",
                run.worker or "",
            )
            haystack = " ".join(fields).lower()
            if needle in haystack:
                return True
            if run.input is None:
                return False
            # The input as the SQL stores hold it, JSON text with non-ASCII characters and
            # quotes escaped; the text is looked for as written and as escaped there, so that
            # every store matches alike (rows.where_clause).
            stored = json.dumps(run.input, default=str).lower()
            return needle in stored or json.dumps(needle)[1:-1] in stored
        return True
