"""SQLite has no NOTIFY: what another process commits to the file is heard from its
`data_version`, read by one task per engine (`SqliteBackend._hear_others`), which wakes the
claims asleep on the queues where the commit may have left something to claim
(`SqliteQueue.others_committed`): not every claim of the file, which next to a busy process
would have each idle queue look 20 times a second."""

from __future__ import annotations

import anyio
import pytest

from engine.backends import Backend
from engine.backends.base import Claim
from engine.backends.sqlite import queue as sqlite_queue
from engine.backends.sqlite.queue import SqliteQueue

from .builders import QUEUE, job_and_run

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("database_kind", ["sqlite"], indirect=True),
]

LONG = 30.0


@pytest.fixture
def queue(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> SqliteQueue:
    queue = backend.queue(None)
    assert isinstance(queue, SqliteQueue)
    monkeypatch.setattr(queue, "poll_s", LONG)  # it looks again only when woken
    return queue


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queues each claim transaction looked in."""
    looked: list[str] = []
    claim = sqlite_queue._claim

    def counted(conn: object, queue: str, *args: object, **kwargs: object) -> object:
        looked.append(queue)
        return claim(conn, queue, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite_queue, "_claim", counted)
    return looked


async def test_another_process_s_jobs_wake_only_the_claims_of_their_queue(
    queue: SqliteQueue, other_backend: Backend, looks: list[str]
) -> None:
    others = other_backend.queue(None)
    assert await queue.claim(QUEUE, 1, "w1", LONG, timeout=0.01) == []
    assert looks == [QUEUE]
    claimed: list[Claim] = []

    async def claim() -> None:
        claimed.extend(await queue.claim(QUEUE, 1, "w1", LONG, timeout=LONG))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(claim)
            await anyio.wait_all_tasks_blocked()
            elsewhere, run = job_and_run("elsewhere")
            await others.add([elsewhere], [run])
            queue.others_committed()  # as the watcher does when it sees the commit
            await anyio.wait_all_tasks_blocked()
            assert looks == [QUEUE] and claimed == []  # nothing of its queue: still asleep
            mine, run = job_and_run(QUEUE)
            await others.add([mine], [run])
            queue.others_committed()
    assert [c.job.id for c in claimed] == [mine.id]
    assert looks == [QUEUE, QUEUE]
