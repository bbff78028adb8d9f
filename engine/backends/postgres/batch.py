"""What one transaction of the PostgreSQL writer holds (`Batch`, its functions
`InTransaction`), and the rows and parameters of its statements."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio
import asyncpg
from asyncpg.pool import PoolConnectionProxy

from ...models import Run
from ..base import Fence
from ..rows import (
    attempt_row,
    run_row,
    step_row,
)
from . import sql

T = TypeVar("T")

Params = tuple[Any, ...]
# A connection of the writer, the listener or the pool (a proxy of one).
Conn = asyncpg.Connection | PoolConnectionProxy
Fn = Callable[[Conn], Awaitable[T]]


def clean(row: Params) -> Params:
    """PostgreSQL's text cannot hold NUL: a NUL in a string (an exception's message, a log line)
    is written as the four characters \\x00, which is how the console shows it anyway."""
    for value in row:
        if value.__class__ is str and "\x00" in value:
            return tuple(v.replace("\x00", "\\x00") if isinstance(v, str) else v for v in row)
    return row


def latest(rows: list[Params], key: int) -> list[Params]:
    """Rows of several batches, the last of each key (its first `key` columns) kept: one
    statement may not write a row twice."""
    return list({row[:key]: row for row in rows}.values())


def fence_of(fence: Fence | None) -> tuple[str | None, int | None]:
    return (fence.job_id, fence.epoch) if fence is not None else (None, None)


def run_rows(
    runs: Iterable[tuple[Run, Fence | None]],
) -> tuple[list[Params], list[Params], list[Params]]:
    """Run, step and attempt rows of these runs, each with its fence (job id, epoch) after it."""
    rows: list[Params] = []
    steps: list[Params] = []
    attempts: list[Params] = []
    for run, fence in runs:
        tail = fence_of(fence)
        rows.append(clean((*run_row(run), *tail)))
        for step in run.steps:
            steps.append(clean((*step_row(run.id, step), *tail)))
            for attempt in step.attempts:
                attempts.append(clean((*attempt_row(run.id, step.index, attempt), *tail)))
    return rows, steps, attempts


def once_each(updates: list[Params]) -> list[Params]:
    """UPDATE_JOB parameters for one statement: a job twice among them at the same epoch, the
    first moves the epoch on, so the second would have found nothing."""
    first: dict[tuple[Any, Any], Params] = {}
    for params in updates:
        first.setdefault((params[9], params[10]), params)
    return list(first.values())


def settled(ids: list[str] | None, epochs: list[int] | None) -> set[tuple[str, int]]:
    """SETTLED's arrays as (job id, epoch fenced at) pairs (NULL arrays: none moved on)."""
    return set(zip(ids or (), epochs or (), strict=True))


async def update_jobs(conn: Conn, updates: list[Params]) -> set[tuple[str, int]]:
    """Consecutive UPDATE_JOB parameters in one statement; the jobs it moved on (SETTLED)."""
    row = await conn.fetchrow(sql.UPDATE_JOBS, once_each(updates))
    assert row is not None  # one row (an aggregate), whatever was updated
    return settled(row["ids"], row["epochs"])


def folds(batch: Batch) -> tuple[list[Params], list[Params]] | None:
    """The job and run rows of the batch's functions (`folded`) if they can ride in one
    WRITE_BATCH_ENQUEUE: all are enqueues, no job is in two of them, and they touch none of the
    rows the batch writes (one statement reads one snapshot: an enqueue would not see those
    rows, nor they it, nor one enqueue the job another added); else None."""
    if not batch.calls or any(call.enqueue is None for call in batch.calls):
        return None
    job_rows, run_rows_ = folded(batch.calls)
    jobs = {row[0] for row in job_rows}
    runs = {row[0] for row in run_rows_}
    written = {row[0] for row in batch.runs}
    fenced = {row[-2] for rows in (batch.runs, batch.steps, batch.attempts) for row in rows}
    fenced |= {params[5] for statement, params in batch.ops if statement is sql.INSERT_LOG}
    fenced |= {params[9] for statement, params in batch.ops if statement is sql.UPDATE_JOB}
    if len(jobs) != len(job_rows) or runs & written or jobs & fenced:
        return None
    return job_rows, run_rows_


def folded(calls: list[InTransaction[Any]]) -> tuple[list[Params], list[Params]]:
    """The job and run rows of enqueues, in their order (a job's `seq` follows it)."""
    job_rows: list[Params] = []
    run_rows_: list[Params] = []
    for call in calls:
        assert call.enqueue is not None
        job_rows += call.enqueue[0]
        run_rows_ += call.enqueue[1]
    return job_rows, run_rows_


def run_params(batch: Batch, logs: Sequence[Params] = ()) -> list[Any]:
    """WRITE_RUNS' parameters: the fenced jobs (in id order), then the run, step and attempt
    rows (each with its fence after it: the schema's `fenced_*` types)."""
    fenced = {row[-2] for rows in (batch.runs, batch.steps, batch.attempts, logs) for row in rows}
    fenced.discard(None)
    return [sorted(fenced), batch.runs, batch.steps, batch.attempts]


def write_batch_params(batch: Batch) -> list[Any]:
    """WRITE_BATCH's parameters: WRITE_RUNS', then its log lines and its settles (INSERT_LOG's
    and UPDATE_JOB's parameters, as rows of `fenced_log` and `job_settle`)."""
    logs = [params for statement, params in batch.ops if statement is sql.INSERT_LOG]
    jobs = once_each([params for statement, params in batch.ops if statement is sql.UPDATE_JOB])
    return [*run_params(batch, logs), logs, jobs]


async def write_runs(conn: Conn, runs: Iterable[tuple[Run, Fence | None]]) -> None:
    """The runs' rows, inside the caller's transaction."""
    rows, steps, attempts = run_rows(runs)
    if rows:
        await conn.executemany(sql.UPSERT_RUN, rows)
    if steps:
        await conn.executemany(sql.UPSERT_STEP, steps)
    if attempts:
        await conn.executemany(sql.UPSERT_ATTEMPT, attempts)


@dataclass
class InTransaction(Generic[T]):
    """A function riding in the writer's next transaction; `done` once it committed (or
    failed: `error`). `feed`: it writes runs or log lines (the change feed moves)."""

    fn: Fn[T]
    feed: bool = False
    # What `fn` writes when it is an enqueue of bare jobs (ENQUEUE's job and run rows): the
    # writer may then fold it into its batch's statement instead of calling `fn`.
    enqueue: tuple[list[Params], list[Params]] | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    result: T | None = None
    error: BaseException | None = None


@dataclass
class Batch:
    runs: list[Params]
    steps: list[Params]
    attempts: list[Params]
    ops: list[tuple[str, Params]]
    calls: list[InTransaction[Any]]
    after: list[Callable[[], None]]  # run once committed (local wake-ups)
    feed: bool
    # Job settles (UPDATE_JOB in `ops`, by index) whose submitter is told whether they landed,
    # and what this try of the batch moved on, as (job id, epoch fenced at): `tell_landed`.
    settles: list[tuple[int, Callable[[bool], None]]] = field(default_factory=list)
    landed: set[tuple[str, int]] = field(default_factory=set)
    xid: int | None = None
    # The batch's number, which its one-statement form leaves as the writer's mark (sql._mark).
    mark: int = 0
    # Its COMMIT went out, or its one statement did, which commits by itself (xid then None):
    # if the connection drops now, whether it happened has to be looked up.
    commit_sent: bool = False
    committed: bool = False

    def __bool__(self) -> bool:
        return bool(self.runs or self.ops or self.calls)

    def answer_lost(self) -> None:
        """It committed, its connection lost before the answer came (`_committed_before`). A
        folded enqueue's result came with that answer (a function's was made before the
        COMMIT): each reports every job it carried as added. Their jobs are in the database;
        an id known before, which the statement did not add again, cannot be told apart."""
        self.committed = True
        for call in self.calls:
            if call.enqueue is not None and call.result is None and call.error is None:
                call.result = [row[0] for row in call.enqueue[0]]

    def tell_landed(self) -> None:
        """Once committed: tell each settle's submitter whether it landed. One statement moves
        a job on once; of two settles at the same epoch only the first can land (`once_each`),
        as when they run one after the other."""
        if not self.settles:
            return
        told = dict(self.settles)
        seen: set[tuple[str, int]] = set()
        for i, (statement, params) in enumerate(self.ops):
            if statement is not sql.UPDATE_JOB:
                continue
            key = (params[9], params[10])
            if i in told:
                told[i](key in self.landed and key not in seen)
            seen.add(key)
