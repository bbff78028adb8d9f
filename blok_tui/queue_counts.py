"""A queue's jobs counted in the run statuses' words, as the console's queues view and
`blok-tui queues` both show them.

`QueueStats` counts jobs by their state, in the contract's words: a job ready to be claimed is
`waiting`, and every job due later is `delayed`, whatever holds it. An operator reads runs: a
job ready to be claimed is a "queued" run, a claimed one "running", and the delayed ones are
three things that want different answers: "waiting" (a durable wait in the workflow: nothing
is wrong), "throttled" (held by a rate limit or a concurrency key) and "delayed" (a start delay
or a retry's backoff). The console said "2 waiting" where `blok-tui queues` said `WAITING 0
DELAYED 2` for the same two runs in a wait; both read these counts now. Likewise a job a later
one debounced ends `cancelled`: counted "debounced" here, not cancelled (a burst of 100 events
read as 99 runs an operator had cancelled). And a job a concurrency key holds (`on_limit=
"queue"`) is delayed while its run is "queued": counted queued, as the runs view lists it (the
queues view said "0 queued, 107 delayed" of 107 runs its `3 queued` filter listed).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine import QueueInfo, QueueStats
    from engine.api import EngineAPI


@dataclass(frozen=True)
class QueueCounts:
    queued: int = 0
    running: int = 0
    waiting: int = 0  # runs in a durable wait (of the queue's delayed jobs)
    delayed: int = 0  # a start delay or a retry's backoff (the rest of them)
    throttled: int = 0  # held by a rate limit or a concurrency key (of them too)
    completed: int = 0
    failed: int = 0
    cancelled: int = 0  # by an operator (or a trigger's ttl)
    debounced: int = 0  # left for a later job of the same key (of the cancelled; if read)
    dead: int = 0

    @classmethod
    def of(
        cls, stats: QueueStats, waiting: int, throttled: int, debounced: int, queued: int
    ) -> QueueCounts:
        """From the job counts and the runs a wait, a limit or a debounce holds or ended, and
        the runs `queued` (those ready, and those a concurrency key holds). The run counts are
        read after the stats, so a run can have moved on between them: the jobs' rest is never
        counted below nought."""
        held = max(0, min(queued - stats.waiting, stats.delayed - waiting - throttled))
        return cls(
            queued=stats.waiting + held,
            running=stats.active,
            waiting=waiting,
            delayed=max(0, stats.delayed - waiting - throttled - held),
            throttled=throttled,
            completed=stats.completed,
            failed=stats.failed,
            cancelled=max(0, stats.cancelled - debounced),
            debounced=debounced,
            dead=stats.dead,
        )

    def __add__(self, other: QueueCounts) -> QueueCounts:
        return QueueCounts(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )


async def read_queue_counts(
    engine: EngineAPI, queue: str, *, debounced: bool = False
) -> tuple[QueueStats, QueueCounts]:
    """The queue's job stats and its counts in the runs' words: an EngineError when the queue
    is unknown (a reload may remove it between two reads). `debounced`: the debounced runs
    counted apart from the cancelled, a count over the queue's history (every debounced run
    kept), which a one-shot command can afford and a view read again every few hundred
    milliseconds cannot (the console shows neither count); else they stay among the cancelled."""
    from engine import RunFilter  # the command line's start-up imports no engine

    stats = await engine.queue_stats(queue)
    waiting = await engine.count_runs(RunFilter.of("waiting", queue=queue))
    throttled = await engine.count_runs(RunFilter.of("throttled", queue=queue))
    ended = await engine.count_runs(RunFilter.of("debounced", queue=queue)) if debounced else 0
    queued = await engine.count_runs(RunFilter.of("queued", queue=queue))
    return stats, QueueCounts.of(stats, waiting, throttled, ended, queued)


# The columns' order, as the console's queues view has them.
COUNTED = tuple(f.name for f in fields(QueueCounts))


def served_with(info: QueueInfo, none: str = "-") -> str:
    """The queue's workflow; every one where the live workers serve it with several (each
    worker runs only the jobs enqueued for its own: the operator has to see both)."""
    return " + ".join(info.workflow_names) or info.workflow_name or none
