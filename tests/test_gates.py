"""Scheduling gates on the SQLite store: concurrency keys (queue and throw), delay + TTL and
debounce (trailing and leading), including restarts and a crashed worker's slots."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import any_database, run_when, until

from engine import (
    Debounce,
    Engine,
    RunStatus,
    RunStatusChanged,
    Step,
    WorkerTrigger,
    Workflow,
    WorkflowDefinitionError,
)
from engine.models import Run

pytestmark = pytest.mark.anyio


def flow(name: str, node: Any, **trigger: Any) -> Workflow:
    return Workflow(
        name=name, trigger=WorkerTrigger(queue=name, **trigger), steps=[Step("work", node)]
    )


@asynccontextmanager
async def status_changes(engine: Engine) -> AsyncIterator[list[RunStatusChanged]]:
    """Every RunStatusChanged published while the block runs."""
    seen: list[RunStatusChanged] = []
    subscription = engine.bus.subscribe()

    async def pump() -> None:
        async for event in subscription:
            if isinstance(event, RunStatusChanged):
                seen.append(event)

    async with anyio.create_task_group() as tg:
        tg.start_soon(pump)
        try:
            yield seen
        finally:
            await subscription.aclose()


async def follow(engine: Engine, run: Run) -> Run:
    """The run a debounced run was coalesced into, at the end of the chain."""
    while run.status is RunStatus.DEBOUNCED:
        run = await engine.get_run(run.output["debounced_into"])
    return run


async def test_concurrency_key_limit_holds_under_50_jobs(tmp_path: Path) -> None:
    running: dict[str, int] = {}
    peak: dict[str, int] = {}

    async def work(ctx) -> str:
        key = ctx.body["tenant"]
        running[key] = running.get(key, 0) + 1
        peak[key] = max(peak.get(key, 0), running[key])
        await anyio.sleep(0.01)
        running[key] -= 1
        return key

    wf = flow(
        "tenants",
        work,
        concurrency=12,
        concurrency_key="$.body.tenant",
        concurrency_limit=3,
        on_limit="queue",
        limit_backoff="5ms",
        limit_max_backoff="40ms",
    )
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        async with status_changes(engine) as changes:
            jobs = await engine.enqueue_many("tenants", [{"tenant": "acme"}] * 50)
            other = await engine.enqueue_many("tenants", [{"tenant": "globex"}] * 5)
            runs = [await engine.wait_for_job(job, timeout=30) for job in jobs + other]
        statuses = {change.status for change in changes}
        assert await engine.backend.shared.slot_holders("tenants", "acme") == []
    assert all(run.status is RunStatus.COMPLETED for run in runs)
    assert peak["acme"] == 3  # reached, never exceeded
    assert peak["globex"] <= 3
    assert "queued" in statuses


async def test_throw_marks_throttled_and_keeps_the_retry_budget(tmp_path: Path) -> None:
    async def work(ctx) -> str:
        await anyio.sleep(0.03)
        return "done"

    wf = flow(
        "exports",
        work,
        concurrency=4,
        retries=0,  # a throttled delivery must not count as a failed attempt
        concurrency_key=lambda ctx: ctx.body["user"],
        concurrency_limit=1,
        on_limit="throw",
        limit_backoff="10ms",
        limit_max_backoff="50ms",
    )
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        async with status_changes(engine) as changes:
            jobs = await engine.enqueue_many("exports", [{"user": "u1"}] * 4)
            runs = [await engine.wait_for_job(job, timeout=20) for job in jobs]
        throttled = {change.run_id for change in changes if change.status == "throttled"}
        job_states = [await engine.get_job(job) for job in jobs]
    assert all(run.status is RunStatus.COMPLETED for run in runs)
    assert throttled  # some deliveries met the limit
    for run in runs:
        if run.id in throttled:
            assert any("throttled: 1/1 runs" in line.message for line in run.logs)
    assert all("failures" not in job.meta for job in job_states)


async def test_queue_timeout_expires_a_run_stuck_behind_the_limit(tmp_path: Path) -> None:
    release = anyio.Event()

    async def work(ctx) -> str:
        if ctx.body["first"]:
            await release.wait()
        return "ok"

    wf = flow(
        "reports",
        work,
        concurrency=2,
        concurrency_key="$.body.team",
        on_limit="queue",
        queue_timeout="250ms",
        limit_backoff="20ms",
        limit_max_backoff="50ms",
    )
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        first = await engine.enqueue("reports", {"team": "t", "first": True})
        second = await engine.enqueue("reports", {"team": "t", "first": False})
        expired = await engine.wait_for_job(second, timeout=10)
        release.set()
        done = await engine.wait_for_job(first, timeout=10)
    assert expired.status is RunStatus.EXPIRED
    assert "queue_timeout" in (expired.error or "")
    assert done.status is RunStatus.COMPLETED


async def test_slots_are_released_on_failure_and_cancel(tmp_path: Path) -> None:
    started = anyio.Event()

    async def work(ctx) -> str:
        if ctx.body["mode"] == "fail":
            raise RuntimeError("broken")
        if ctx.body["mode"] == "hang":
            started.set()
            await anyio.sleep(60)
        return "ok"

    wf = flow("single", work, concurrency=3, concurrency_key="$.body.k", limit_backoff="10ms")
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        failed = await engine.wait_for_job(
            await engine.enqueue("single", {"k": "x", "mode": "fail"}), 10
        )
        hang = await engine.enqueue("single", {"k": "x", "mode": "hang"})
        await started.wait()
        await engine.cancel((await engine.get_job(hang)).run_id)
        after = await engine.wait_for_job(
            await engine.enqueue("single", {"k": "x", "mode": "ok"}), 10
        )
        holders = len(await engine.backend.shared.slot_holders("single", "x"))
    assert failed.status is RunStatus.FAILED
    assert after.status is RunStatus.COMPLETED
    assert holders == 0


WORKFLOW_FILE = """
import os
import anyio
from engine import Step, WorkerTrigger, Workflow

async def work(ctx):
    if os.environ.get("BLOK_TEST_HANG"):
        await anyio.sleep(3600)
    return "ok"

workflow = Workflow(
    name="locked",
    trigger=WorkerTrigger(queue="locked", concurrency_key="$.body.k", concurrency_limit=1,
                          limit_backoff="20ms", limit_max_backoff="100ms"),
    steps=[Step("work", work)],
)
"""

HOLDER = """
import anyio, sys
from engine import Engine

async def main():
    async with Engine(workflows=sys.argv[1], database=sys.argv[2]) as engine:
        await engine.enqueue("locked", {"k": "x"})
        await anyio.sleep_forever()

anyio.run(main)
"""


async def kill_when(
    script: str, wf_file: Path, db: Path, reached: Callable[[sqlite3.Connection], bool], what: str
) -> None:
    """Run `script` in a process of its own (its workflow's node hangs) until `reached` holds
    of its database file, then kill it -9."""
    env = {**os.environ, "BLOK_TEST_HANG": "1"}
    holder = await anyio.open_process(
        [sys.executable, "-c", textwrap.dedent(script), str(wf_file), str(db)], env=env
    )
    try:
        deadline = time.monotonic() + 20
        while True:  # another process writes it: nothing to await, so look at the file
            if db.exists():
                # No table yet while the holder makes the schema: looked at again.
                with sqlite3.connect(db) as conn, suppress(sqlite3.OperationalError):
                    if reached(conn):
                        break
            assert time.monotonic() < deadline, f"the holder never {what}"
            assert holder.returncode is None, "the holder process died"
            await anyio.sleep(0.05)
    finally:
        holder.send_signal(signal.SIGKILL)
        await holder.wait()


async def test_a_killed_workers_slot_is_freed(tmp_path: Path) -> None:
    wf_file = tmp_path / "locked.py"
    wf_file.write_text(WORKFLOW_FILE)
    db = tmp_path / "blok.db"

    def holds_a_slot(conn: sqlite3.Connection) -> bool:
        return bool(conn.execute("SELECT count(*) FROM concurrency_slots").fetchone()[0] == 1)

    await kill_when(HOLDER, wf_file, db, holds_a_slot, "took its slot")
    async with Engine(workflows=wf_file, database=db) as engine:
        job = await engine.enqueue("locked", {"k": "x"})
        run = await engine.wait_for_job(job, timeout=15)
        crashed = await engine.runs(status="crashed")
    assert run.status is RunStatus.COMPLETED
    assert len(crashed) == 1


async def test_start_delay_and_ttl(tmp_path: Path) -> None:
    calls: list[str] = []
    late = flow("late", lambda ctx: calls.append("late"), start_delay="300ms", ttl="100ms")
    ok = flow("ok", lambda ctx: calls.append("ok"), start_delay="150ms", ttl="5s")
    async with Engine(workflows=[late, ok], database=tmp_path / "blok.db") as engine:
        late_job = await engine.enqueue("late", {})
        ok_job = await engine.enqueue("ok", {})
        assert (await engine.get_run((await engine.get_job(ok_job)).run_id)).status == "delayed"
        expired = await engine.wait_for_job(late_job, timeout=10)
        ran = await engine.wait_for_job(ok_job, timeout=10)
    assert expired.status is RunStatus.EXPIRED
    assert "ttl of 100ms" in (expired.error or "")
    assert ran.status is RunStatus.COMPLETED
    assert (ran.started_at - ran.created_at).total_seconds() >= 0.15
    assert calls == ["ok"]


async def test_trailing_debounce_runs_once_with_the_latest_payload(tmp_path: Path) -> None:
    seen: list[int] = []
    wf = flow(
        "search",
        lambda ctx: seen.append(ctx.body["n"]) or ctx.body["n"],
        concurrency=4,
        debounce=Debounce("$.body.user", delay="300ms", mode="trailing"),
    )
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        jobs = [await engine.enqueue("search", {"user": "ann", "n": n}) for n in range(5)]
        other = await engine.enqueue("search", {"user": "bob", "n": 99})
        runs = [await engine.wait_for_job(job, timeout=10) for job in jobs]
        finals = {(await follow(engine, run)).id for run in runs}
        bob = await engine.wait_for_job(other, timeout=10)
    assert sorted(seen) == [4, 99]
    assert [r.status for r in runs[:4]] == [RunStatus.DEBOUNCED] * 4
    assert runs[4].status is RunStatus.COMPLETED and runs[4].output == 4
    assert finals == {runs[4].id}
    assert bob.output == 99


async def test_leading_debounce_runs_the_first_and_swallows_the_window(tmp_path: Path) -> None:
    seen: list[int] = []
    wf = flow(
        "clicks",
        lambda ctx: seen.append(ctx.body["n"]),
        debounce=Debounce("$.body.button", delay="400ms", mode="leading"),
    )
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        jobs = [await engine.enqueue("clicks", {"button": "buy", "n": n}) for n in range(4)]
        runs = [await engine.wait_for_job(job, timeout=10) for job in jobs]
        await anyio.sleep(0.5)  # the window itself is what is measured: let it pass
        again = await engine.wait_for_job(
            await engine.enqueue("clicks", {"button": "buy", "n": 9}), 10
        )
    assert runs[0].status is RunStatus.COMPLETED
    assert all(r.status is RunStatus.DEBOUNCED for r in runs[1:])
    assert {r.output["debounced_into"] for r in runs[1:]} == {runs[0].id}
    assert again.status is RunStatus.COMPLETED
    assert seen == [0, 9]


@pytest.mark.parametrize("mode", ["trailing", "leading"])
@pytest.mark.parametrize("on_limit", ["throw", "queue"])
async def test_a_debounced_run_held_by_its_concurrency_key_is_not_debounced_again(
    database: Path | str | None, mode: str, on_limit: str
) -> None:
    """Let through by its debounce, then held by a concurrency key its tenant's other run
    took: claimed again once that slot was free, a trailing run opened a new window and
    waited its delay once more; a leading one found its own window open and was recorded
    debounced into itself, and never ran."""
    release = anyio.Event()
    seen: list[str] = []

    async def work(ctx) -> str:
        if ctx.body["doc"] == "a":
            await release.wait()
        seen.append(ctx.body["doc"])
        return ctx.body["doc"]

    wf = flow(
        "index",
        work,
        concurrency=4,
        debounce=Debounce("$.body.doc", delay="5s" if mode == "leading" else "200ms", mode=mode),
        concurrency_key="$.body.tenant",
        concurrency_limit=1,
        on_limit=on_limit,
        limit_backoff="50ms",
    )
    async with Engine(workflows=[wf], database=database) as engine:
        first = await engine.enqueue("index", {"doc": "a", "tenant": "t1"})
        await run_when(engine, first, RunStatus.RUNNING)
        held = await engine.enqueue("index", {"doc": "b", "tenant": "t1"})

        async def held_by_the_key() -> bool:  # once let through by its debounce
            return (await engine.get_job(held)).meta.get("gate", {}).get("gate") == "concurrency"

        await until(held_by_the_key)
        release.set()
        run = await engine.wait_for_job(held, timeout=10)
        await engine.wait_for_job(first, timeout=10)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "b"), run.error
    debounced = [line.message for line in run.logs if line.message.startswith("debounced")]
    assert len(debounced) == (1 if mode == "trailing" else 0), debounced
    assert sorted(seen) == ["a", "b"]


async def test_debounce_and_delay_survive_a_restart(tmp_path: Path) -> None:
    seen: list[Any] = []
    debounced = flow(
        "typing",
        lambda ctx: seen.append(ctx.body["text"]),
        debounce=Debounce("$.body.doc", delay="1s", max_delay="5s"),
    )
    delayed = flow("later", lambda ctx: seen.append("later"), start_delay="1s", ttl="30s")
    db = tmp_path / "blok.db"
    async with Engine(workflows=[debounced, delayed], database=db) as engine:
        async with engine.bus.subscribe() as events:
            jobs = [await engine.enqueue("typing", {"doc": 1, "text": t}) for t in ("h", "he")]
            later = await engine.enqueue("later", {})
            with anyio.fail_after(5):
                async for event in events:  # the second ping replaced the first: it is held
                    if isinstance(event, RunStatusChanged) and event.status == "delayed":
                        run_id = (await engine.get_job(jobs[1])).run_id
                        if event.run_id == run_id:
                            break
        first = await engine.wait_for_job(jobs[0], timeout=5)
    assert first.status is RunStatus.DEBOUNCED
    assert seen == []
    async with Engine(workflows=[debounced, delayed], database=db) as engine:
        run = await engine.wait_for_job(jobs[1], timeout=10)
        done = await engine.wait_for_job(later, timeout=10)
    assert run.status is RunStatus.COMPLETED
    assert done.status is RunStatus.COMPLETED
    assert sorted(seen) == ["he", "later"]


def test_gate_expressions_are_checked_at_definition() -> None:
    with pytest.raises(WorkflowDefinitionError, match="concurrency_key"):
        WorkerTrigger(queue="q", concurrency_key="$.state.x")
    with pytest.raises(WorkflowDefinitionError, match="Debounce"):
        Debounce("$.nowhere")
    with pytest.raises(WorkflowDefinitionError, match="on_limit"):
        WorkerTrigger(queue="q", on_limit="drop")


def test_a_gate_key_written_as_a_path_without_its_dollar_is_refused() -> None:
    # Accepted, "body.user" was one key for every job: per-user concurrency ran every user's
    # jobs one at a time, and a debounce coalesced other indexes' jobs into one run (they
    # never ran), without a word. RateLimit refused it already.
    with pytest.raises(
        WorkflowDefinitionError,
        match=r"^WorkerTrigger.concurrency_key: 'body.user' is one key for every job; did you "
        r"mean '\$.body.user'\?",
    ):
        WorkerTrigger(queue="q", concurrency_key="body.user")
    with pytest.raises(WorkflowDefinitionError, match=r"^Debounce: 'body.index' is one key"):
        Debounce("body.index")
    # A constant that is no path is a choice: one key for all, as documented.
    assert WorkerTrigger(queue="q", concurrency_key="shared-api").concurrency_key == "shared-api"
    assert Debounce("reindex").key == "reindex"
    # Two more settings that did nothing, without a word.
    with pytest.raises(WorkflowDefinitionError, match="no concurrency_key is given"):
        WorkerTrigger(queue="q", concurrency_limit=3)
    with pytest.raises(
        WorkflowDefinitionError, match=r"max_delay '1s' \(1000 ms\) is shorter than delay '10s'"
    ):
        Debounce("$.body.k", delay="10s", max_delay="1s")


async def test_max_delay_caps_a_trailing_window_under_steady_pings(tmp_path: Path) -> None:
    fired: list[int] = []
    wf = flow(
        "steady",
        lambda ctx: fired.append(ctx.body["n"]),
        debounce=Debounce("$.body.k", delay="300ms", max_delay="450ms"),
    )
    async with Engine(workflows=[wf], database=tmp_path / "blok.db") as engine:
        jobs = []
        for n in range(10):  # a ping every 100 ms: without max_delay the window never closes
            jobs.append(await engine.enqueue("steady", {"k": "x", "n": n}))
            await anyio.sleep(0.1)
        runs = [await engine.wait_for_job(job, timeout=10) for job in jobs]
    assert len(fired) >= 2
    assert fired[-1] == 9  # the last ping still fires, with its own payload
    completed = [r for r in runs if r.status is RunStatus.COMPLETED]
    assert len(completed) == len(fired)
    assert all(r.status is RunStatus.DEBOUNCED for r in runs if r not in completed)


async def test_two_engines_on_one_file_share_the_limit(tmp_path: Path) -> None:
    running = 0
    peak = 0

    async def work(ctx) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.01)
        running -= 1

    wf = flow(
        "shared",
        work,
        concurrency=8,
        concurrency_key="$.body.k",
        concurrency_limit=2,
        on_limit="queue",
        limit_backoff="5ms",
        limit_max_backoff="30ms",
    )
    db = tmp_path / "blok.db"
    async with (
        Engine(workflows=[wf], database=db) as one,
        Engine(workflows=[wf], database=db) as two,
    ):
        jobs = await one.enqueue_many("shared", [{"k": "same"}] * 50)
        runs = [await two.wait_for_job(job, timeout=30) for job in jobs]
        workers = {run.worker for run in runs}
    assert all(run.status is RunStatus.COMPLETED for run in runs)
    assert len(workers) == 2  # both engines took part
    assert peak == 2


HELD_BEHIND = """
import anyio, sys
from engine import Engine

async def main():
    async with Engine(workflows=sys.argv[1], database=sys.argv[2]) as engine:
        await engine.enqueue("locked", {"k": "x"}, job_id="first")
        await engine.enqueue("locked", {"k": "x"}, job_id="second")
        await anyio.sleep_forever()

anyio.run(main)
"""


async def test_a_dead_workers_freed_slot_starts_the_job_held_behind_it(tmp_path: Path) -> None:
    """Recovery freed a dead worker's concurrency slots, but the job held behind its key
    waited out its backoff (up to 30 s; a minute here) before anything looked at it. Its run
    is cancelled, so no rerun of it takes the slot and hands it on when it ends."""
    wf_file = tmp_path / "locked.py"
    wf_file.write_text(
        WORKFLOW_FILE.replace(  # two at a time, so that the second is claimed and held
            'limit_backoff="20ms", limit_max_backoff="100ms"',
            'concurrency=2, limit_backoff="60s", limit_max_backoff="60s"',
        )
    )
    db = tmp_path / "blok.db"

    def second_held(conn: sqlite3.Connection) -> bool:
        held = conn.execute("SELECT state, meta FROM jobs WHERE id = 'second'").fetchone()
        return held is not None and held[0] == "delayed" and '"gate"' in held[1]

    await kill_when(HELD_BEHIND, wf_file, db, second_held, "held the second job")
    async with Engine(database=db, create=False) as client:
        first = (await client.get_job("first")).run_id
        await client.cancel(first)
    async with Engine(workflows=wf_file, database=db) as engine:
        run = await engine.wait_for_job("second", timeout=15)
        cancelled = await engine.get_run(first)
    assert cancelled.status is RunStatus.CANCELLED
    assert run.status is RunStatus.COMPLETED


database = any_database  # the fixture: each of DATABASES in turn (tests/support.py)


@pytest.mark.parametrize("on_limit", ["queue", "throw"])
async def test_a_freed_slot_starts_the_next_held_job_without_waiting_out_its_backoff(
    database: Path | str | None, on_limit: str
) -> None:
    """Each job held behind a busy key waited out its own backoff (1 s, 2 s, 4 s … 30 s): eight
    runs of one key at a limit of 1 took 91 s where they ran for 0.8. A slot given back now
    starts the job held longest behind it, whichever process held it (a backoff of a minute
    here: a job left to it would not end within the test's time)."""

    async def work(ctx) -> None:
        await anyio.sleep(0.05)

    wf = flow(
        "keyed",
        work,
        concurrency=4,
        concurrency_key="$.body.k",
        on_limit=on_limit,
        limit_backoff="60s",
        limit_max_backoff="60s",
    )
    async with AsyncExitStack() as stack:
        one = await stack.enter_async_context(Engine(workflows=[wf], database=database))
        # On a shared database a second process takes part: its slots wake the first's jobs.
        two = one
        if database is not None:
            two = await stack.enter_async_context(Engine(workflows=[wf], database=database))
        jobs = [await one.enqueue("keyed", {"k": "same"}) for _ in range(6)]
        with anyio.fail_after(20):
            runs = [await two.wait_for_job(job) for job in jobs]
        held = [
            run
            for run in runs
            if any(" runs of concurrency key 'same' in flight" in line.message for line in run.logs)
        ]
    assert [run.status for run in runs] == [RunStatus.COMPLETED] * 6
    assert held, "no job was held behind the key: the test did not reach the gate"
    starts = sorted(run.started_at for run in runs if run.started_at is not None)
    ends = sorted(run.finished_at for run in runs if run.finished_at is not None)
    assert all(start >= end for start, end in zip(starts[1:], ends[:-1], strict=True)), "overlap"
