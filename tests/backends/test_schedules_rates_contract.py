"""The contract of schedules (declare, claim_tick, pause) and rate-limit windows (acquire_start)
in SharedState, on every backend."""

from __future__ import annotations

import anyio
import pytest

from engine.backends.base import Backend, ScheduleSpec

from .databases import MULTI_PROCESS

pytestmark = pytest.mark.anyio


def spec(name: str = "every 1s", workflow: str = "wf", payload: object = None) -> ScheduleSpec:
    return ScheduleSpec(workflow, name, "q", None, 1000, "UTC", "latest", payload)


async def test_declare_adds_updates_and_removes(backend: Backend) -> None:
    await backend.shared.declare_schedules("wf", [(spec(), 100.0), (spec("every 2s"), 100.0)])
    assert await backend.shared.claim_tick("wf", "every 1s", 101.0, "job_1", "run_1")
    await backend.shared.declare_schedules("wf", [(spec(payload={"v": 2}), 500.0)])
    states = await backend.shared.schedules()
    assert [(s.spec.schedule, s.spec.payload, s.last_tick, s.last_run_id) for s in states] == [
        ("every 1s", {"v": 2}, 101.0, "run_1")  # state kept, spec updated, the other removed
    ]
    await backend.shared.declare_schedules("wf", [])
    assert await backend.shared.schedules() == []


async def test_each_tick_is_claimed_once_and_in_order(backend: Backend) -> None:
    await backend.shared.declare_schedules("wf", [(spec(), 100.0)])
    wins: list[bool] = []

    async def claim() -> None:
        wins.append(await backend.shared.claim_tick("wf", "every 1s", 101.0, "j", "r"))

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(claim)
    assert wins.count(True) == 1
    assert not await backend.shared.claim_tick("wf", "every 1s", 100.5)  # earlier: never
    assert await backend.shared.claim_tick("wf", "every 1s", 102.0)  # skipped: no job
    state = (await backend.shared.schedules())[0]
    assert (state.last_tick, state.last_job_id) == (102.0, "j")
    assert not await backend.shared.claim_tick("other", "every 1s", 200.0)


async def test_a_paused_schedule_claims_nothing_and_resumes_from_a_tick(backend: Backend) -> None:
    await backend.shared.declare_schedules("wf", [(spec(), 100.0)])
    assert await backend.shared.set_schedule_paused("wf", "every 1s", True)
    assert not await backend.shared.claim_tick("wf", "every 1s", 101.0)
    assert await backend.shared.set_schedule_paused("wf", "every 1s", False, resume_from=150.0)
    assert not await backend.shared.claim_tick("wf", "every 1s", 140.0)
    assert await backend.shared.claim_tick("wf", "every 1s", 151.0)
    assert not await backend.shared.set_schedule_paused("wf", "nope", True)
    assert await backend.shared.note_fired("wf", "every 1s", "job_x", "run_x", 160.0)
    state = (await backend.shared.schedules())[0]
    assert (state.last_run_id, state.last_fired_at, state.last_tick) == ("run_x", 160.0, 151.0)


async def test_a_sliding_window_counts_starts_per_key(backend: Backend) -> None:
    shared = backend.shared
    for i in range(3):
        decision = await shared.acquire_start("wf", "k", 3, 10.0, f"r{i}", 100.0 + i)
        assert decision.allowed and decision.in_window == i + 1
    denied = await shared.acquire_start("wf", "k", 3, 10.0, "r3", 105.0)
    assert not denied.allowed and denied.in_window == 3 and denied.free_at == 110.0
    assert (await shared.acquire_start("wf", "k", 3, 10.0, "r1", 105.0)).allowed  # already in
    assert (await shared.acquire_start("wf", "other", 3, 10.0, "r3", 105.0)).allowed
    assert [r for r, _ in await shared.recent_starts("wf", "k", 0.0)] == ["r0", "r1", "r2"]
    # The window slides: at 110 the first start has left it, not the others.
    later = await shared.acquire_start("wf", "k", 3, 10.0, "r3", 110.0)
    assert later.allowed and later.in_window == 3
    assert not (await shared.acquire_start("wf", "k", 3, 10.0, "r4", 110.5)).allowed
    await shared.forget_starts(10_000.0)
    assert await shared.recent_starts("wf", "k", 0.0) == []


async def test_concurrent_starts_never_exceed_the_limit(backend: Backend) -> None:
    allowed: list[bool] = []

    async def start(i: int) -> None:
        decision = await backend.shared.acquire_start("wf", "*", 5, 60.0, f"r{i}", 100.0)
        allowed.append(decision.allowed)

    async with anyio.create_task_group() as tg:
        for i in range(30):
            tg.start_soon(start, i)
    assert allowed.count(True) == 5


# ---- two processes ---------------------------------------------------------------------------
# One backend serializes its own calls (a SQL backend's writer commits one batch at a time):
# what must hold between processes is tested from two backends on one database.
@pytest.mark.parametrize("database_kind", MULTI_PROCESS, indirect=True)
async def test_each_tick_is_claimed_once_across_processes(
    backend: Backend, other_backend: Backend
) -> None:
    names = [f"every {n}s" for n in range(1, 11)]
    await backend.shared.declare_schedules("wf", [(spec(name), 100.0) for name in names])
    wins: dict[str, list[str]] = {name: [] for name in names}

    async def claim(shared: Backend, who: str, name: str, tick: float) -> None:
        if await shared.shared.claim_tick("wf", name, tick, f"job-{who}", f"run-{who}"):
            wins[name].append(who)

    for tick in (101.0, 102.0, 103.0):
        async with anyio.create_task_group() as tg:
            for name in names:
                for i in range(3):
                    tg.start_soon(claim, backend, f"a{i}-{tick}", name, tick)
                    tg.start_soon(claim, other_backend, f"b{i}-{tick}", name, tick)
    assert {name: len(won) for name, won in wins.items()} == dict.fromkeys(names, 3)
    states = {s.spec.schedule: s for s in await other_backend.shared.schedules()}
    assert {name: (states[name].last_tick, states[name].last_job_id) for name in names} == {
        name: (103.0, f"job-{wins[name][-1]}") for name in names
    }


@pytest.mark.parametrize("database_kind", MULTI_PROCESS, indirect=True)
async def test_concurrent_starts_from_two_processes_never_exceed_the_limit(
    backend: Backend, other_backend: Backend
) -> None:
    keys = [f"k{n}" for n in range(10)]
    allowed: dict[str, list[str]] = {key: [] for key in keys}

    async def start(target: Backend, key: str, run_id: str) -> None:
        decision = await target.shared.acquire_start("wf", key, 3, 60.0, run_id, 100.0)
        if decision.allowed:
            allowed[key].append(run_id)

    async with anyio.create_task_group() as tg:
        for key in keys:
            for i in range(4):
                tg.start_soon(start, backend, key, f"a{i}")
                tg.start_soon(start, other_backend, key, f"b{i}")
    assert {key: len(runs) for key, runs in allowed.items()} == dict.fromkeys(keys, 3)
    for key in keys:
        held = [run for run, _ in await other_backend.shared.recent_starts("wf", key, 0.0)]
        assert sorted(held) == sorted(allowed[key])
