"""The RunStore contract (engine/backends/base.py), run against every backend.

A log line is on its run's record twice over: the caller puts it on the run (`run.logs`, or its
step's `logs`) and hands it to `add_log`, as the engine does; `get_run` shows each line once.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest

from engine.backends import Backend
from engine.backends.base import FeedCursor, Fence, RunStore
from engine.filters import RunFilter
from engine.models import Attempt, AttemptStatus, Run, RunStatus, StepRun, StepStatus, utcnow
from engine.records import copy_run

from .builders import QUEUE, WORKFLOW, a_run, after, finished_run, job_and_run, line
from .databases import MULTI_PROCESS

pytestmark = pytest.mark.anyio


def save_with_logs(store: RunStore, run: Run) -> None:
    """Save a run and hand the store the lines already on it, as the engine does."""
    store.save_run(run)
    for entry in run.logs:
        store.add_log(run.id, entry)
    for step in run.steps:
        for entry in step.logs:
            store.add_log(run.id, entry)


def ids(runs: list[Run]) -> list[str]:
    return [run.id for run in runs]


# ---- save and get ------------------------------------------------------------------------
async def test_a_saved_run_comes_back_with_its_steps_attempts_and_logs(backend: Backend) -> None:
    run = finished_run()
    expected = run.model_dump()
    save_with_logs(backend.runs, run)
    await backend.runs.flush()

    found = await backend.runs.get_run(run.id)

    assert found is not None
    assert found.model_dump() == expected
    assert [entry.message for entry in found.logs] == ["run started", "slow host"]
    assert [entry.message for entry in found.step("fetch").logs] == ["fetched 3 rows"]


async def test_an_unknown_run_is_none(backend: Backend) -> None:
    assert await backend.runs.get_run("run_nobody") is None


async def test_saving_a_run_again_replaces_its_record(backend: Backend) -> None:
    run = a_run(status=RunStatus.RUNNING, started_at=utcnow())
    backend.runs.save_run(run)
    await backend.runs.flush()
    later = run.model_copy(deep=True)
    later.status = RunStatus.COMPLETED
    later.output = {"done": True}
    later.finished_at = utcnow()
    later.steps.append(
        StepRun(
            index=0,
            name="work",
            status=StepStatus.COMPLETED,
            attempts=[Attempt(number=1, status=AttemptStatus.COMPLETED, started_at=utcnow())],
        )
    )
    backend.runs.save_run(later)

    found = await backend.runs.get_run(run.id)

    assert found is not None
    assert found.model_dump() == later.model_dump()
    assert await backend.runs.count_runs() == 1


async def test_get_run_hands_out_a_snapshot_that_later_writes_leave_alone(
    backend: Backend,
) -> None:
    run = a_run(status=RunStatus.RUNNING, started_at=utcnow())
    backend.runs.save_run(run)
    running = await backend.runs.get_run(run.id)
    assert running is not None
    seen_running = running.model_dump()
    # The writer goes on changing its own record (as a worker does) and saves it again.
    run.status = RunStatus.COMPLETED
    run.finished_at = utcnow()
    run.logs.append(line("done"))
    backend.runs.add_log(run.id, run.logs[-1])
    backend.runs.save_run(run)
    ended = await backend.runs.get_run(run.id)
    assert ended is not None
    seen_ended = ended.model_dump()

    # A copy to change (as the ledger makes) saved as the run's next record.
    later = copy_run(ended)
    later.status = RunStatus.CRASHED
    later.steps.append(StepRun(index=0, name="late", status=StepStatus.FAILED))
    backend.runs.save_run(later)
    await backend.runs.flush()

    assert running.model_dump() == seen_running
    assert ended.model_dump() == seen_ended
    again = await backend.runs.get_run(run.id)
    assert again is not None and again.model_dump() == later.model_dump()


# ---- listing -----------------------------------------------------------------------------
async def test_list_runs_is_newest_first_without_steps_and_logs(backend: Backend) -> None:
    now = utcnow()
    runs = [finished_run(created_at=now - timedelta(seconds=age)) for age in (3, 1, 2)]
    for run in runs:
        save_with_logs(backend.runs, run)

    listed = await backend.runs.list_runs()

    assert ids(listed) == [runs[1].id, runs[2].id, runs[0].id]
    assert all(run.steps == [] and run.logs == [] for run in listed)
    # Everything else is the run's own record.
    by_id = {run.id: run for run in runs}
    for run in listed:
        assert (
            run.model_dump()
            == by_id[run.id].model_copy(update={"steps": [], "logs": []}).model_dump()
        )


async def test_list_runs_pages_with_offset_and_limit(backend: Backend) -> None:
    now = utcnow()
    runs = [a_run(created_at=now - timedelta(seconds=age)) for age in range(7)]
    for run in runs:
        backend.runs.save_run(run)
    newest_first = ids(runs)

    assert ids(await backend.runs.list_runs(limit=3)) == newest_first[:3]
    assert ids(await backend.runs.list_runs(limit=3, offset=3)) == newest_first[3:6]
    assert ids(await backend.runs.list_runs(limit=3, offset=6)) == newest_first[6:]
    assert await backend.runs.list_runs(limit=3, offset=7) == []


# Each case: a filter and the runs (by name, from `filter_runs`) it keeps.
FILTER_CASES: list[tuple[str, RunFilter, set[str]]] = [
    ("no filter", RunFilter(), {"done", "broken", "busy", "retrying", "again", "other", "held"}),
    ("status", RunFilter(status=("failed", "running")), {"broken", "busy", "retrying"}),
    ("workflow", RunFilter(workflow="bill"), {"other"}),
    ("queue", RunFilter(queue="slow"), {"broken", "again"}),
    (
        "none of these queues",
        RunFilter(not_queues=("slow", "fast")),
        {"done", "busy", "retrying", "other", "held"},
    ),
    ("job id", RunFilter(job_id="job_busy_0001"), {"busy"}),
    ("job id prefix, any case", RunFilter(job_id_prefix="JOB_BUSY"), {"busy"}),
    ("text in the id, any case", RunFilter(text="ONE_DONE"), {"done"}),
    ("text in the version", RunFilter(text="7E5A1C"), {"other"}),
    ("id prefix", RunFilter(id_prefix="run_one_d"), {"done"}),
    ("id prefix, any case", RunFilter(id_prefix="RUN_ONE"), {"done"}),
    ("id prefix only at the start", RunFilter(id_prefix="one_done"), set()),
    ("id prefix: its _ is itself", RunFilter(id_prefix="run_o_e"), set()),
    ("id prefix: its % is itself", RunFilter(id_prefix="run_%"), set()),
    ("text in the job id", RunFilter(text="busy_00"), {"busy"}),
    ("text in the workflow", RunFilter(text="bil"), {"other"}),
    ("text in the queue", RunFilter(text="slo"), {"broken", "again"}),
    ("text in the status", RunFilter(text="throttl"), {"held"}),
    ("text in the error", RunFilter(text="disk full"), {"broken"}),
    ("text in the worker", RunFilter(text="HOST:2"), {"broken"}),
    ("workers", RunFilter(workers=("host:1", "host:3")), {"done", "busy"}),
    ("no workers", RunFilter(workers=()), set()),
    ("finished after", RunFilter(finished_after=1_000_000_100.0), {"broken"}),
    (
        "created after",
        RunFilter(created_after=1_500_000_000.0),
        {"broken", "busy", "retrying", "again", "other", "held"},
    ),
    ("retrying", RunFilter(retrying=True), {"retrying", "again", "held"}),
    ("replays", RunFilter(replays=True), {"other"}),
    ("replays of one run", RunFilter(replay_of="run_one_done"), {"other"}),
    ("status and queue", RunFilter(status=("failed", "queued"), queue="slow"), {"broken", "again"}),
]


def filter_runs() -> dict[str, Run]:
    """Runs that each filter field tells apart."""
    from engine.models import from_epoch

    def attempt(error: str | None, number: int = 1) -> Attempt:
        status = AttemptStatus.FAILED if error else AttemptStatus.COMPLETED
        return Attempt(number=number, status=status, started_at=utcnow(), error=error)

    def step(*attempts: Attempt) -> StepRun:
        return StepRun(index=0, name="work", attempts=list(attempts))

    return {
        "done": a_run(
            id="run_one_done",
            status=RunStatus.COMPLETED,
            worker="host:1",
            created_at=from_epoch(999_999_990.0),
            finished_at=from_epoch(1_000_000_000.0),
        ),
        "broken": a_run(
            queue="slow",
            status=RunStatus.FAILED,
            error="OSError: disk full",
            worker="host:2",
            finished_at=from_epoch(1_000_000_200.0),
            failed_attempts=1,
            steps=[step(attempt("OSError: disk full"))],
        ),
        "busy": a_run(job_id="job_busy_0001", status=RunStatus.RUNNING, worker="host:3"),
        # Still going, with a failed step attempt behind it.
        "retrying": a_run(
            status=RunStatus.RUNNING,
            failed_attempts=1,
            attempts=2,
            steps=[step(attempt("ValueError: nope"), attempt(None, number=2))],
        ),
        # The next delivery of a job whose first one failed (a job-level retry).
        "again": a_run(queue="slow", status=RunStatus.QUEUED, job_attempt=2),
        "other": a_run(
            workflow_name="bill",
            workflow_version="7e5a1c0b",
            status=RunStatus.CANCELLED,
            replay_of="run_one_done",  # a replay of "done"
        ),
        # Held back by a concurrency limit after a failed attempt: still going.
        "held": a_run(
            status=RunStatus.THROTTLED,
            failed_attempts=1,
            steps=[step(attempt("TimeoutError: slow"))],
        ),
    }


@pytest.mark.parametrize(
    ("where", "kept"), [case[1:] for case in FILTER_CASES], ids=[c[0] for c in FILTER_CASES]
)
async def test_each_filter_field_narrows_list_and_count(
    backend: Backend, where: RunFilter, kept: set[str]
) -> None:
    runs = filter_runs()
    for run in runs.values():
        backend.runs.save_run(run)
    names = {run.id: name for name, run in runs.items()}

    listed = await backend.runs.list_runs(where)

    assert {names[run.id] for run in listed} == kept
    assert await backend.runs.count_runs(where) == len(kept)


async def test_count_runs_counts_every_run(backend: Backend) -> None:
    assert await backend.runs.count_runs() == 0
    for _ in range(5):
        backend.runs.save_run(a_run())
    assert await backend.runs.count_runs() == 5
    assert await backend.runs.count_runs(RunFilter(status=("queued",))) == 5
    assert await backend.runs.count_runs(RunFilter(status=("running",))) == 0


async def test_runs_by_id_returns_those_that_exist_without_steps(backend: Backend) -> None:
    first, second = finished_run(), finished_run()
    save_with_logs(backend.runs, first)
    save_with_logs(backend.runs, second)

    found = await backend.runs.runs_by_id([second.id, "run_nobody", first.id])

    assert sorted(ids(found)) == sorted([first.id, second.id])
    assert all(run.steps == [] and run.logs == [] for run in found)
    assert await backend.runs.runs_by_id([]) == []


async def test_pending_runs_are_the_waiting_runs_of_these_queues(backend: Backend) -> None:
    pending = {
        status: a_run(status=status, steps=[StepRun(index=0, name="work")])
        for status in (RunStatus.QUEUED, RunStatus.DELAYED, RunStatus.WAITING, RunStatus.THROTTLED)
    }
    others = [
        a_run(status=RunStatus.RUNNING),
        a_run(status=RunStatus.COMPLETED),
        a_run(status=RunStatus.CANCELLED),
        a_run(status=RunStatus.QUEUED, queue="elsewhere"),
    ]
    for run in [*pending.values(), *others]:
        backend.runs.save_run(run)

    found = await backend.runs.pending_runs([QUEUE, "unused"])

    assert sorted(ids(found)) == sorted(run.id for run in pending.values())
    assert all(run.steps == [] for run in found)
    assert await backend.runs.pending_runs([]) == []


async def test_adopting_pending_runs_names_their_new_worker_once(backend: Backend) -> None:
    queued = a_run(status=RunStatus.QUEUED)
    waiting = a_run(status=RunStatus.WAITING, worker="w-gone", started_at=utcnow())
    running = a_run(status=RunStatus.RUNNING, worker="w-gone", started_at=utcnow())
    elsewhere = a_run(status=RunStatus.DELAYED, worker="w-gone")
    for run in (queued, waiting, running, elsewhere):
        backend.runs.save_run(run)
    cursor = await backend.runs.feed_cursor()

    adopted = await backend.runs.adopt_runs(
        [
            (queued.id, None),
            (waiting.id, "w-gone"),
            (running.id, "w-gone"),  # not pending
            (elsewhere.id, "w-else"),  # not whom it names
            ("run_nobody", None),
        ],
        "w-new",
    )

    assert adopted == {queued.id, waiting.id}
    assert await backend.runs.adopt_runs([(queued.id, None)], "w-other") == set()  # once
    assert await backend.runs.adopt_runs([], "w-other") == set()
    found = {run.id: run for run in await backend.runs.runs_by_id(ids([queued, waiting]))}
    assert {run.worker for run in found.values()} == {"w-new"}
    assert found[waiting.id].status is RunStatus.WAITING  # nothing else changed
    for untouched in (running, elsewhere):
        assert (await backend.runs.get_run(untouched.id)).worker == "w-gone"  # type: ignore[union-attr]
    # Followers see the change.
    assert {run.id for run in (await backend.runs.feed(cursor)).runs} == {queued.id, waiting.id}


@pytest.mark.parametrize("database_kind", MULTI_PROCESS, indirect=True)
async def test_of_two_processes_adopting_one_run_at_once_one_does(
    backend: Backend, other_backend: Backend
) -> None:
    runs = [a_run(status=RunStatus.QUEUED) for _ in range(20)]
    for run in runs:
        backend.runs.save_run(run)
    await backend.runs.flush()
    won: dict[str, set[str]] = {}

    async def adopt(store: RunStore, worker: str) -> None:
        # a few runs a write, as a restart takes them back a chunk a write
        won[worker] = set()
        for first in range(0, len(runs), 4):
            chunk = [(run.id, None) for run in runs[first : first + 4]]
            won[worker] |= await store.adopt_runs(chunk, worker)

    async with anyio.create_task_group() as group:
        group.start_soon(adopt, backend.runs, "w-one")
        group.start_soon(adopt, other_backend.runs, "w-two")

    assert won["w-one"].isdisjoint(won["w-two"])
    assert won["w-one"] | won["w-two"] == set(ids(runs))
    stored = {run.id: run.worker for run in await backend.runs.runs_by_id(ids(runs))}
    assert stored == {run.id: "w-one" if run.id in won["w-one"] else "w-two" for run in runs}


# ---- the idempotency cache ---------------------------------------------------------------
async def test_a_cached_output_comes_back_for_its_key_only(backend: Backend) -> None:
    output = {"rows": [1, 2], "note": "ok"}
    backend.runs.cache_put(WORKFLOW, "fetch", "k1", output, "run_a", ttl_ms=60_000)

    hit = await backend.runs.cache_get(WORKFLOW, "fetch", "k1")

    assert hit is not None
    assert (hit.output, hit.run_id) == (output, "run_a")
    assert await backend.runs.cache_get(WORKFLOW, "fetch", "k2") is None
    assert await backend.runs.cache_get(WORKFLOW, "store", "k1") is None
    assert await backend.runs.cache_get("bill", "fetch", "k1") is None


async def test_a_cache_entry_is_replaced_by_a_newer_one(backend: Backend) -> None:
    backend.runs.cache_put(WORKFLOW, "fetch", "k", 1, "run_a", ttl_ms=60_000)
    backend.runs.cache_put(WORKFLOW, "fetch", "k", 2, "run_b", ttl_ms=60_000)

    hit = await backend.runs.cache_get(WORKFLOW, "fetch", "k")

    assert hit is not None
    assert (hit.output, hit.run_id) == (2, "run_b")


async def test_a_cache_hit_is_a_copy(backend: Backend) -> None:
    backend.runs.cache_put(WORKFLOW, "fetch", "k", {"rows": [1]}, "run_a", ttl_ms=60_000)
    hit = await backend.runs.cache_get(WORKFLOW, "fetch", "k")
    assert hit is not None
    hit.output["rows"].append(2)

    again = await backend.runs.cache_get(WORKFLOW, "fetch", "k")

    assert again is not None
    assert again.output == {"rows": [1]}


async def test_a_cache_entry_past_its_ttl_is_gone(backend: Backend) -> None:
    # A ttl of 0 ends the entry when it is written: time has moved on by the time it is read.
    backend.runs.cache_put(WORKFLOW, "fetch", "k", 1, "run_a", ttl_ms=0)
    assert await backend.runs.cache_get(WORKFLOW, "fetch", "k") is None


# ---- purge -------------------------------------------------------------------------------
async def test_purge_deletes_terminal_runs_finished_before_the_cut_off(backend: Backend) -> None:
    old = after(-3600)
    doomed = [
        finished_run(status=status, finished_at=old)
        for status in (
            RunStatus.COMPLETED,
            RunStatus.FAILED,
            RunStatus.CANCELLED,
            RunStatus.TIMED_OUT,
            RunStatus.CRASHED,
            RunStatus.EXPIRED,
            RunStatus.DEBOUNCED,
        )
    ]
    kept = [
        finished_run(status=RunStatus.COMPLETED, finished_at=utcnow()),  # after the cut-off
        a_run(status=RunStatus.RUNNING, finished_at=old),  # not terminal, whatever it says
        a_run(status=RunStatus.WAITING),
        a_run(status=RunStatus.QUEUED),
    ]
    for run in [*doomed, *kept]:
        save_with_logs(backend.runs, run)

    assert await backend.runs.purge(after(-60)) == len(doomed)

    for run in doomed:
        assert await backend.runs.get_run(run.id) is None
    assert sorted(ids(await backend.runs.list_runs())) == sorted(ids(kept))
    assert await backend.runs.purge(after(-60)) == 0


async def test_purge_deletes_at_most_limit_runs(backend: Backend) -> None:
    for _ in range(5):
        backend.runs.save_run(finished_run(finished_at=after(-3600)))

    assert await backend.runs.purge(after(-60), limit=2) == 2
    assert await backend.runs.count_runs() == 3
    assert await backend.runs.purge(after(-60), limit=10) == 3
    assert await backend.runs.count_runs() == 0


async def test_purge_keeps_live_cache_entries(backend: Backend) -> None:
    backend.runs.cache_put(WORKFLOW, "fetch", "live", 1, "run_a", ttl_ms=60_000)
    backend.runs.cache_put(WORKFLOW, "fetch", "gone", 2, "run_b", ttl_ms=0)

    await backend.runs.purge(after(0))

    assert await backend.runs.cache_get(WORKFLOW, "fetch", "live") is not None
    assert await backend.runs.cache_get(WORKFLOW, "fetch", "gone") is None


# ---- the change feed ---------------------------------------------------------------------
async def test_the_feed_gives_runs_in_commit_order_since_a_cursor(backend: Backend) -> None:
    before = a_run()
    backend.runs.save_run(before)
    cursor = await backend.runs.feed_cursor()
    first, second = finished_run(), a_run()
    for run in (first, second):
        save_with_logs(backend.runs, run)
        await backend.runs.flush()
    again = first.model_copy(deep=True)
    again.status = RunStatus.FAILED
    backend.runs.save_run(again)
    await backend.runs.flush()

    page = await backend.runs.feed(cursor)

    # `before` was written before the cursor; `first` changed last, so it comes last.
    assert ids(page.runs) == [second.id, first.id]
    assert page.lagged == 0
    changed = page.runs[1]
    assert changed.status is RunStatus.FAILED
    # With its steps and attempts, without logs.
    assert [step.name for step in changed.steps] == ["fetch", "notify"]
    assert [a.number for a in changed.steps[0].attempts] == [1, 2]
    assert changed.logs == [] and all(step.logs == [] for step in changed.steps)
    assert page.cursor == await backend.runs.feed_cursor()
    rest = await backend.runs.feed(page.cursor)
    assert (rest.runs, rest.logs, rest.cursor) == ([], [], page.cursor)


async def test_the_feed_gives_log_lines_since_a_cursor(backend: Backend) -> None:
    run = a_run()
    backend.runs.save_run(run)
    backend.runs.add_log(run.id, line("before"))
    cursor = await backend.runs.feed_cursor()
    backend.runs.add_log(run.id, line("one"))
    backend.runs.add_log(run.id, line("two", step=3, level="warning"))
    await backend.runs.flush()

    page = await backend.runs.feed(cursor)

    assert [(e.run_id, e.step, e.level, e.message) for e in page.logs] == [
        (run.id, None, "info", "one"),
        (run.id, 3, "warning", "two"),
    ]
    assert page.logs[0].id < page.logs[1].id
    assert page.runs == []
    assert page.cursor == await backend.runs.feed_cursor()
    assert (await backend.runs.feed(page.cursor)).logs == []


async def test_a_new_reader_starts_at_the_feed_cursor(backend: Backend) -> None:
    old = a_run()
    backend.runs.save_run(old)
    backend.runs.add_log(old.id, line("old"))
    start = await backend.runs.feed_cursor()
    assert start != FeedCursor()

    page = await backend.runs.feed(start)

    assert (page.runs, page.logs) == ([], [])


async def test_a_reader_more_than_a_page_behind_is_told_it_lagged(backend: Backend) -> None:
    cursor = await backend.runs.feed_cursor()
    run = a_run()
    for n in range(5):
        backend.runs.save_run(a_run() if n else run)
        backend.runs.add_log(run.id, line(f"line {n}"))
        await backend.runs.flush()

    page = await backend.runs.feed(cursor, limit=2)

    assert page.lagged > 0
    # It skipped to the end: nothing more to read from there.
    assert page.cursor == await backend.runs.feed_cursor()
    rest = await backend.runs.feed(page.cursor, limit=2)
    assert (rest.runs, rest.logs, rest.lagged) == ([], [], 0)


async def test_a_page_that_holds_everything_has_not_lagged(backend: Backend) -> None:
    cursor = await backend.runs.feed_cursor()
    runs = [a_run() for _ in range(3)]
    for run in runs:
        backend.runs.save_run(run)
        backend.runs.add_log(run.id, line("hi"))
        await backend.runs.flush()

    page = await backend.runs.feed(cursor, limit=3)

    assert (ids(page.runs), len(page.logs), page.lagged) == (ids(runs), 3, 0)


# ---- fenced writes -----------------------------------------------------------------------
async def test_a_fenced_save_lands_only_while_the_job_is_at_its_epoch(backend: Backend) -> None:
    queue = backend.queue(None)
    job, run = job_and_run()
    await queue.add([job], [run])
    [claim] = await queue.claim(QUEUE, 1, "w1", 30.0)
    held = claim.fence
    progress = run.model_copy(update={"status": RunStatus.RUNNING})
    backend.runs.save_run(progress, held)
    backend.runs.add_log(run.id, line("held"), held)
    await backend.runs.flush()
    found = await backend.runs.get_run(run.id)
    assert found is not None and found.status is RunStatus.RUNNING

    stale = Fence(job.id, held.epoch - 1)
    late = run.model_copy(update={"status": RunStatus.FAILED, "error": "late"})
    cursor = await backend.runs.feed_cursor()
    backend.runs.save_run(late, stale)
    backend.runs.add_log(run.id, line("late"), stale)
    backend.runs.save_run(a_run(job_id=job.id), stale)
    await backend.runs.flush()

    found = await backend.runs.get_run(run.id)
    assert found is not None and (found.status, found.error) == (RunStatus.RUNNING, None)
    assert await backend.runs.count_runs() == 1
    page = await backend.runs.feed(cursor)
    assert (page.runs, page.logs) == ([], [])


# ---- flush -------------------------------------------------------------------------------
@pytest.mark.parametrize("database_kind", MULTI_PROCESS, indirect=True)
async def test_flush_returns_once_another_process_can_read_the_writes(
    backend: Backend, other_backend: Backend
) -> None:
    run = finished_run()
    save_with_logs(backend.runs, run)
    backend.runs.cache_put(WORKFLOW, "fetch", "k", 1, run.id, ttl_ms=60_000)

    await backend.runs.flush()

    found = await other_backend.runs.get_run(run.id)
    assert found is not None
    assert found.model_dump() == run.model_dump()
    assert await other_backend.runs.cache_get(WORKFLOW, "fetch", "k") is not None


@pytest.mark.parametrize("database_kind", MULTI_PROCESS, indirect=True)
async def test_the_feed_shows_another_processes_writes(
    backend: Backend, other_backend: Backend
) -> None:
    cursor = await other_backend.runs.feed_cursor()
    run = a_run()
    backend.runs.save_run(run)
    backend.runs.add_log(run.id, line("from afar"))
    await backend.runs.flush()

    with anyio.fail_after(5):
        page = await other_backend.runs.feed(cursor)

    assert ids(page.runs) == [run.id]
    assert [entry.message for entry in page.logs] == ["from afar"]
