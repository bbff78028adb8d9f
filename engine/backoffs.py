"""Runs sleeping before their step's next attempt. An operator's retry-now cuts the sleep short.
A hot reload that brings a new version of the run's workflow, with the same steps, ends it too:
the run hands itself back to its queue until the backoff's end and goes on with the new code
(`Catalog.resumed_on`). A developer who fixes the step that keeps failing sees its next attempt
run the fix, where it ran the old code until the run failed for good."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import anyio

from .clock import Clock
from .workflow import Workflow


@dataclass
class _Sleep:
    workflow: Workflow
    wake: anyio.Event = field(default_factory=anyio.Event)
    cut: bool = False  # by an operator: the next attempt is due at once


def _no_newer(workflow: Workflow) -> Workflow | None:
    return None


class Backoffs:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._sleeping: dict[str, _Sleep] = {}
        # The loaded version a run of this workflow may go on with, when it is another with
        # the same steps (`Catalog.takes_over`); none for an engine that does not reload.
        self.takes_over: Callable[[Workflow], Workflow | None] = _no_newer

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._sleeping

    def cut(self, run_id: str) -> None:
        """End a run's backoff now (`Engine.retry_now`)."""
        sleep = self._sleeping.get(run_id)
        if sleep is not None:
            sleep.cut = True
            sleep.wake.set()

    def reloaded(self) -> None:
        """The catalog changed: wake the runs that a new version of their workflow takes."""
        for sleep in self._sleeping.values():
            if self.takes_over(sleep.workflow) is not None:
                sleep.wake.set()

    async def sleep(
        self, run_id: str, workflow: Workflow, seconds: float, *, handover: bool
    ) -> tuple[Workflow, datetime] | None:
        """Sleep `seconds` before the next attempt of a step of `workflow`. None: make that
        attempt here. Else the version that takes the run over and when its attempt is due:
        the run is to go back to its queue until then. Only where the run can hand itself
        back (`handover`: a step of the workflow's own, whose position the run's cursor holds)."""
        until = self.clock.now() + timedelta(seconds=seconds)
        sleep = self._sleeping[run_id] = _Sleep(workflow)
        try:
            with anyio.move_on_after(seconds):
                await sleep.wake.wait()
        finally:
            if self._sleeping.get(run_id) is sleep:
                del self._sleeping[run_id]
        newer = self.takes_over(workflow) if handover else None
        if newer is None:
            return None
        now = self.clock.now()
        return newer, now if sleep.cut else max(until, now)
