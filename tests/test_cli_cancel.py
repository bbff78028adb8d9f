"""`blok-tui cancel` on a run whose worker does not stop it within the cancel's wait: it
printed the run's status and exited 0 as if that were the end of it. It says the cancel is
asked and what ends the run."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from blok_tui.cli import main
from engine import Engine, RunStatus, Step, WorkerTrigger, Workflow

pytestmark = pytest.mark.anyio


async def test_a_cancel_the_worker_has_not_carried_out_yet_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The worker's event loop is held by a node that blocks it (the worker's own engine, in
    this process: the command runs in a thread of its own)."""
    monkeypatch.setattr("engine.cancelling.CANCEL_WAIT_S", 0.3)
    release = threading.Event()
    started = threading.Event()

    async def blocks_the_loop(ctx: Any) -> str:
        started.set()
        release.wait(30)  # the point: nothing else of the worker runs meanwhile
        return "done"

    database = tmp_path / "blok.db"
    flow = Workflow(
        name="blocks", trigger=WorkerTrigger(queue="blocks"), steps=[Step("s", blocks_the_loop)]
    )
    codes: list[int] = []

    def cancel(job_id: str) -> None:
        try:
            started.wait(10)
            codes.append(main(["cancel", job_id, "--db", str(database)]))
        finally:
            release.set()

    async with Engine(workflows=[flow], database=database) as engine:
        job_id = await engine.enqueue("blocks", {})
        canceller = threading.Thread(target=cancel, args=(job_id,))
        canceller.start()
        await anyio.to_thread.run_sync(canceller.join)
        ended = await engine.wait_for_job(job_id, timeout=10)
    out, err = capsys.readouterr()
    assert codes == [0]
    # Running, or queued if the loop stopped before the start was written.
    [printed_id, status] = out.split()
    assert printed_id == ended.id and status in ("running", "queued"), out
    assert err == (
        f"blok-tui: warning: cancel asked, but run {ended.id} is still {status} after 0.3s: "
        "the worker holding it has not stopped it (its code may hold the worker's event loop, "
        "or the worker is frozen); that worker stops it once it reads the cancel, unless "
        "it ends first\n"
    )
    # The node let go of the loop by returning: the run ended before the worker read it.
    assert ended.status is RunStatus.COMPLETED


async def test_a_bulk_cancel_its_worker_has_not_carried_out_yet_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same, through `cancel --queue`: the run was counted as one that "ended as running
    before the cancel took", which it had not (it had not ended at all)."""
    monkeypatch.setattr("engine.cancelling.CANCEL_WAIT_S", 0.3)
    release = threading.Event()
    started = threading.Event()

    async def blocks_the_loop(ctx: Any) -> str:
        started.set()
        release.wait(30)
        return "done"

    database = tmp_path / "blok.db"
    flow = Workflow(
        name="blocks", trigger=WorkerTrigger(queue="blocks"), steps=[Step("s", blocks_the_loop)]
    )
    codes: list[int] = []

    def cancel() -> None:
        try:
            started.wait(10)
            codes.append(main(["cancel", "--queue", "blocks", "--yes", "--db", str(database)]))
        finally:
            release.set()

    async with Engine(workflows=[flow], database=database) as engine:
        job_id = await engine.enqueue("blocks", {})
        canceller = threading.Thread(target=cancel)
        canceller.start()
        await anyio.to_thread.run_sync(canceller.join)
        ended = await engine.wait_for_job(job_id, timeout=10)
    out, err = capsys.readouterr()
    assert (codes, out) == ([0], "")
    status = "running" if "still running" in err else "queued"
    assert err == (
        f"blok-tui: run {ended.id} left as it is: cancel asked, still {status}: its worker "
        "stops it on reading it\n"
        f"blok-tui: 0 of 1 run(s) cancelled; 1 left as they were (cancel asked, still {status}: "
        "its worker stops it on reading it: 1)\n"
    )
