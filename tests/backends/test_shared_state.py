"""The SharedState contract (engine/backends/base.py), run against every backend: the worker
registry and catalogs, pauses, concurrency slots, debounce windows and leader leases. Workers
heartbeat before they publish or take slots, as the engine's do. Leases and ttls that must run
out are 50 ms long."""

from __future__ import annotations

import time
from dataclasses import replace

import anyio
import pytest

from engine.backends import Backend
from engine.backends.base import ServedQueue, SharedState, Window, WorkerCatalog
from engine.models import WorkerInfo, WorkflowInfo, utcnow

from .builders import worker
from .databases import MULTI_PROCESS

pytestmark = pytest.mark.anyio

LONG = 30.0
SHORT = 0.05


async def outlive(seconds: float = SHORT) -> None:
    await anyio.sleep(seconds + 0.02)


def catalog(
    worker_id: str, *, queue: str = "orders", updated_at: float | None = None
) -> WorkerCatalog:
    """What a worker serves: two queues, two workflows with their steps' kinds."""
    return WorkerCatalog(
        worker=worker_id,
        queues=(
            ServedQueue(
                name=queue,
                workflow_name="ship",
                workflow_version="v3",
                provider="sqlite",
                concurrency=4,
                retries=2,
                start_delay_ms=1500,
                timeout_ms=60_000,
            ),
            ServedQueue(
                name="bills",
                workflow_name="bill",
                workflow_version="v1",
                provider="memory",
                concurrency=1,
                retries=0,
            ),
        ),
        workflows=(
            WorkflowInfo(
                name="ship",
                version="v3",
                queue=queue,
                path="flows/ship.py",
                steps=["fetch", "pack"],
            ),
            WorkflowInfo(name="bill", version="v1", queue="bills", path=None, steps=["charge"]),
        ),
        step_kinds={
            "ship": (("fetch", "node"), ("pack", "for_each")),
            "bill": (("charge", "subworkflow"),),
        },
        reload_errors={"flows/broken.py": "SyntaxError: invalid syntax (line 3)"},
        updated_at=time.time() if updated_at is None else updated_at,
    )


@pytest.fixture
def shared(backend: Backend) -> SharedState:
    return backend.shared


# ---- workers and their catalogs ----------------------------------------------------------
def as_seen(worker: WorkerInfo) -> dict[str, object]:
    """A worker's row but its heartbeat's moment, which each backend reads on its own clock."""
    return worker.model_dump(exclude={"heartbeat_at"})


def beat_just_now(worker: WorkerInfo) -> bool:
    """Its heartbeat, as read here, is now: a heartbeat is a moment on the clock every process
    sharing the backend reads (the server's, on PostgreSQL), told on the reader's."""
    return abs((worker.heartbeat_at - utcnow()).total_seconds()) < 5.0


async def test_a_heartbeat_registers_a_worker_and_a_later_one_replaces_it(
    shared: SharedState,
) -> None:
    one, two = worker("w1"), worker("w2")
    shared.heartbeat(one)
    shared.heartbeat(two)
    found = sorted(await shared.workers(), key=lambda w: w.id)
    assert [as_seen(w) for w in found] == [as_seen(one), as_seen(two)]
    assert all(beat_just_now(w) for w in found)

    later = one.model_copy(update={"pid": 4343, "heartbeat_at": utcnow()})
    shared.heartbeat(later)

    found = sorted(await shared.workers(), key=lambda w: w.id)
    assert [as_seen(w) for w in found] == [as_seen(later), as_seen(two)]
    assert all(beat_just_now(w) for w in found)


async def test_forget_worker_drops_it_and_its_slots_but_not_its_catalog(
    shared: SharedState,
) -> None:
    shared.heartbeat(worker("w1"))
    shared.heartbeat(worker("w2"))
    served = catalog("w1")
    shared.publish_catalog(served)
    assert await shared.acquire_slot("ship", "k", 1, "run_a", "w1", LONG) == (True, 1)
    assert await shared.acquire_slot("ship", "j", 2, "run_c", "w2", LONG) == (True, 1)

    # The slots freed, for recovery to start the jobs held behind their keys.
    assert await shared.forget_worker("w1") == [("run_a", "k")]

    assert [w.id for w in await shared.workers()] == ["w2"]
    assert await shared.slot_holders("ship", "k") == []
    assert await shared.acquire_slot("ship", "k", 1, "run_b", "w2", LONG) == (True, 1)
    # What it served stays known: a producer can still enqueue to its queues...
    assert await shared.catalogs() == [served]
    # ...also once a worker of another pool, which serves other workflows, declares its own...
    refunds = catalog("w2", queue="returns")
    other_pool = replace(
        refunds,
        queues=(replace(refunds.queues[0], workflow_name="refund"),),
        workflows=(
            WorkflowInfo(name="refund", version="v1", queue="returns", path=None, steps=["pay"]),
        ),
        step_kinds={"refund": (("pay", "node"),)},
    )
    shared.publish_catalog(other_pool)
    assert await shared.catalogs() == [served, other_pool]
    # ...until a worker that runs now declares one of its workflows or queues.
    theirs = catalog("w2", queue="returns")
    shared.publish_catalog(theirs)
    assert await shared.catalogs() == [theirs]


async def test_a_catalog_comes_back_as_it_was_published(shared: SharedState) -> None:
    shared.heartbeat(worker("w1"))
    served = catalog("w1")

    shared.publish_catalog(served)

    [found] = await shared.catalogs()
    assert found == served
    assert found.step_kinds["ship"] == (("fetch", "node"), ("pack", "for_each"))
    assert found.queues[0].start_delay_ms == 1500
    assert found.queues[1].start_delay_ms is None


async def test_catalogs_are_oldest_first_and_a_republished_one_replaces_its_own(
    shared: SharedState,
) -> None:
    now = time.time()
    for name in ("w1", "w2", "w3"):
        shared.heartbeat(worker(name))
    shared.publish_catalog(catalog("w2", updated_at=now - 20))
    shared.publish_catalog(catalog("w1", updated_at=now - 10))
    shared.publish_catalog(catalog("w3", updated_at=now - 30))
    assert [c.worker for c in await shared.catalogs()] == ["w3", "w2", "w1"]

    newer = catalog("w3", queue="returns", updated_at=now)
    shared.publish_catalog(newer)

    found = await shared.catalogs()
    assert [c.worker for c in found] == ["w2", "w1", "w3"]
    assert found[-1] == newer


# ---- pauses ------------------------------------------------------------------------------
async def test_pauses(shared: SharedState) -> None:
    assert await shared.paused_queues() == set()

    await shared.set_paused("orders", True)
    await shared.set_paused("orders", True)
    await shared.set_paused("bills", True)
    assert await shared.paused_queues() == {"orders", "bills"}

    await shared.set_paused("orders", False)
    await shared.set_paused("never", False)
    assert await shared.paused_queues() == {"bills"}


# ---- concurrency slots -------------------------------------------------------------------
async def test_slots_up_to_the_limit(shared: SharedState) -> None:
    shared.heartbeat(worker("w1"))
    shared.heartbeat(worker("w2"))

    assert await shared.acquire_slot("ship", "k", 2, "run_a", "w1", LONG) == (True, 1)
    assert await shared.acquire_slot("ship", "k", 2, "run_b", "w2", LONG) == (True, 2)
    assert await shared.acquire_slot("ship", "k", 2, "run_c", "w1", LONG) == (False, 2)
    # Another key, another workflow: slots of their own.
    assert await shared.acquire_slot("ship", "other", 1, "run_c", "w1", LONG) == (True, 1)
    assert await shared.acquire_slot("bill", "k", 1, "run_d", "w1", LONG) == (True, 1)

    assert sorted(await shared.slot_holders("ship", "k")) == ["run_a", "run_b"]
    assert await shared.slot_holders("ship", "nobody") == []


async def test_a_holder_acquiring_again_keeps_its_slot(shared: SharedState) -> None:
    shared.heartbeat(worker("w1"))
    assert await shared.acquire_slot("ship", "k", 1, "run_a", "w1", LONG) == (True, 1)

    assert await shared.acquire_slot("ship", "k", 1, "run_a", "w1", LONG) == (True, 1)
    assert await shared.slot_holders("ship", "k") == ["run_a"]


async def test_a_released_slot_is_free_again(shared: SharedState) -> None:
    shared.heartbeat(worker("w1"))
    assert await shared.acquire_slot("ship", "k", 1, "run_a", "w1", LONG) == (True, 1)
    assert await shared.acquire_slot("ship", "k", 1, "run_b", "w1", LONG) == (False, 1)

    shared.release_slot("run_a")
    shared.release_slot("run_never")

    assert await shared.acquire_slot("ship", "k", 1, "run_b", "w1", LONG) == (True, 1)
    assert await shared.slot_holders("ship", "k") == ["run_b"]


async def test_a_slot_whose_lease_ran_out_is_free_again(shared: SharedState) -> None:
    shared.heartbeat(worker("w1"))
    shared.heartbeat(worker("w2"))
    assert await shared.acquire_slot("ship", "k", 1, "run_a", "w1", SHORT) == (True, 1)

    await outlive()

    assert await shared.slot_holders("ship", "k") == []
    assert await shared.acquire_slot("ship", "k", 1, "run_b", "w2", LONG) == (True, 1)
    assert await shared.slot_holders("ship", "k") == ["run_b"]


async def test_renewing_slots_extends_their_lease(shared: SharedState) -> None:
    shared.heartbeat(worker("w1"))
    shared.heartbeat(worker("w2"))
    assert (await shared.acquire_slot("ship", "k", 2, "run_b", "w2", SHORT))[0] is True
    assert (await shared.acquire_slot("ship", "k", 2, "run_a", "w1", SHORT))[0] is True

    shared.renew_slots("w1", LONG)  # before anything else may look at the slots
    await outlive()

    assert await shared.slot_holders("ship", "k") == ["run_a"]
    assert await shared.acquire_slot("ship", "k", 1, "run_c", "w2", LONG) == (False, 1)


# ---- debounce windows --------------------------------------------------------------------
def a_window(run_id: str = "run_a", until: float = 0.0) -> Window:
    now = time.time()
    return Window(run_id, f"job_of_{run_id}", now - 1, now, until or now + 60)


async def test_update_window_reads_writes_and_deletes(shared: SharedState) -> None:
    seen: list[Window | None] = []
    moments: list[float] = []
    first = a_window("run_a")
    asked = time.time()

    def open_it(window: Window | None, now: float) -> tuple[str, Window | None, bool]:
        seen.append(window)
        moments.append(now)
        return "opened", first, True

    assert await shared.update_window("ship", "k", "trailing", open_it) == "opened"

    def look(window: Window | None, now: float) -> tuple[Window | None, Window | None, bool]:
        seen.append(window)
        return window, a_window("run_ignored"), False  # write=False: nothing changes

    assert await shared.update_window("ship", "k", "trailing", look) == first
    assert await shared.update_window("ship", "k", "trailing", look) == first

    def close_it(window: Window | None, now: float) -> tuple[bool, Window | None, bool]:
        return window is not None, None, True

    assert await shared.update_window("ship", "k", "trailing", close_it) is True
    assert await shared.update_window("ship", "k", "trailing", look) is None
    assert seen == [None, first, first, None]
    # `decide` is told the moment on the windows' clock (the server's, on PostgreSQL: on this
    # machine, this machine's).
    assert abs(moments[0] - asked) < 5.0


async def test_windows_are_kept_apart_by_workflow_key_and_mode(shared: SharedState) -> None:
    def put(window: Window) -> object:
        return lambda _, __: (None, window, True)

    def read(window: Window | None, now: float) -> tuple[Window | None, Window | None, bool]:
        return window, None, False

    places = [("ship", "k", "trailing"), ("ship", "k", "leading"), ("ship", "j", "trailing")]
    places.append(("bill", "k", "trailing"))
    windows = {place: a_window(f"run_{n}") for n, place in enumerate(places)}
    for (workflow, key, mode), window in windows.items():
        await shared.update_window(workflow, key, mode, put(window))  # type: ignore[arg-type]

    for (workflow, key, mode), window in windows.items():
        assert await shared.update_window(workflow, key, mode, read) == window


async def test_close_windows_forgets_leading_windows_that_closed(shared: SharedState) -> None:
    now = time.time()

    def put(window: Window) -> object:
        return lambda _, __: (None, window, True)

    def read(window: Window | None, now: float) -> tuple[Window | None, Window | None, bool]:
        return window, None, False

    closed = a_window("run_closed", until=now - 10)
    still_open = a_window("run_open", until=now + 60)
    trailing = a_window("run_trailing", until=now - 10)
    await shared.update_window("ship", "a", "leading", put(closed))  # type: ignore[arg-type]
    await shared.update_window("ship", "b", "leading", put(still_open))  # type: ignore[arg-type]
    await shared.update_window("ship", "c", "trailing", put(trailing))  # type: ignore[arg-type]

    await shared.close_windows(now)

    assert await shared.update_window("ship", "a", "leading", read) is None
    assert await shared.update_window("ship", "b", "leading", read) == still_open
    assert await shared.update_window("ship", "c", "trailing", read) == trailing


def count_up(window: Window | None, now: float) -> tuple[int, Window | None, bool]:
    """Read-modify-write: the window's `until` counts the updates made to it."""
    count = int(window.until) + 1 if window is not None else 1
    return count, Window("run_n", "job_n", 0.0, 0.0, float(count)), True


async def test_update_window_is_atomic_between_tasks(shared: SharedState) -> None:
    async def bump(times: int) -> None:
        for _ in range(times):
            await shared.update_window("ship", "k", "trailing", count_up)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(bump, 10)

    assert await shared.update_window("ship", "k", "trailing", count_up) == 41


@pytest.mark.parametrize("database_kind", MULTI_PROCESS, indirect=True)
async def test_update_window_is_atomic_between_processes(
    backend: Backend, other_backend: Backend
) -> None:
    async def bump(shared: SharedState, times: int) -> None:
        for _ in range(times):
            await shared.update_window("ship", "k", "trailing", count_up)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(bump, backend.shared, 15)
            tg.start_soon(bump, other_backend.shared, 15)

    assert await backend.shared.update_window("ship", "k", "trailing", count_up) == 31


# ---- leader leases -----------------------------------------------------------------------
async def test_one_worker_at_a_time_leads_a_chore(shared: SharedState) -> None:
    assert await shared.try_lead("purge", "w1", LONG) is True
    assert await shared.try_lead("purge", "w2", LONG) is False
    assert await shared.try_lead("purge", "w1", LONG) is True  # the holder renews
    assert await shared.try_lead("purge", "w2", LONG) is False
    assert await shared.try_lead("recover", "w2", LONG) is True  # another chore


async def test_a_lead_not_renewed_within_its_ttl_is_taken(shared: SharedState) -> None:
    assert await shared.try_lead("purge", "w1", SHORT) is True

    await outlive()

    assert await shared.try_lead("purge", "w2", LONG) is True
    assert await shared.try_lead("purge", "w1", LONG) is False


async def test_renewing_a_lead_extends_it(shared: SharedState) -> None:
    assert await shared.try_lead("purge", "w1", SHORT) is True
    assert await shared.try_lead("purge", "w1", LONG) is True

    await outlive()

    assert await shared.try_lead("purge", "w2", LONG) is False


async def test_resign_lets_another_lead_at_once(shared: SharedState) -> None:
    assert await shared.try_lead("purge", "w1", LONG) is True

    await shared.resign("purge", "w2")  # not the holder: nothing happens
    assert await shared.try_lead("purge", "w2", LONG) is False

    await shared.resign("purge", "w1")
    assert await shared.try_lead("purge", "w2", LONG) is True


@pytest.mark.parametrize("database_kind", MULTI_PROCESS, indirect=True)
async def test_shared_state_is_shared_between_processes(
    backend: Backend, other_backend: Backend
) -> None:
    here, there = backend.shared, other_backend.shared
    here.heartbeat(worker("w1"))
    here.publish_catalog(catalog("w1"))
    await here.set_paused("orders", True)
    assert await here.acquire_slot("ship", "k", 1, "run_a", "w1", LONG) == (True, 1)
    assert await here.try_lead("purge", "w1", LONG) is True
    await backend.runs.flush()

    assert [w.id for w in await there.workers()] == ["w1"]
    assert [c.worker for c in await there.catalogs()] == ["w1"]
    assert await there.paused_queues() == {"orders"}
    there.heartbeat(worker("w2"))
    assert await there.acquire_slot("ship", "k", 1, "run_b", "w2", LONG) == (False, 1)
    assert await there.slot_holders("ship", "k") == ["run_a"]
    assert await there.try_lead("purge", "w2", LONG) is False
