"""Two workers on one database serving one workflow at different versions (a rolling deploy,
or a worker left with old files): its runs split between the versions. Each worker says so
in its log; nothing did."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from support import until

from engine import Engine, Step, WorkerTrigger, Workflow

pytestmark = pytest.mark.anyio


def charge(version: str) -> Workflow:
    def node(ctx: Any) -> str:
        return version

    return Workflow(
        name="orders.charge",
        trigger=WorkerTrigger(queue="orders"),
        steps=[Step(f"charge_{version}", node)],  # another step: another version
    )


async def test_a_workflow_served_at_two_versions_is_said_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="blok.versions")
    database = tmp_path / "blok.db"
    old, new = charge("v1"), charge("v2")
    assert old.version != new.version
    async with Engine(workflows=[old], database=database) as first:
        assert not caplog.records  # one version so far
        async with Engine(workflows=[new], database=database) as second:
            await until(lambda: caplog.records)  # said as its chores begin
            [said] = [r.getMessage() for r in caplog.records]
            workers = {old.version: first.worker.id, new.version: second.worker.id}
            by = "; ".join(f"{v} by {workers[v]}" for v in sorted(workers))
            assert said == (
                f"workflow 'orders.charge' is served at 2 versions ({by}): its jobs run on "
                "whichever worker claims them"
            )
            # Once: the next look finds the same split and says nothing more.
            assert await second._chores.versions.check(second.backend) == [said]  # type: ignore[union-attr]
            assert len(caplog.records) == 1
