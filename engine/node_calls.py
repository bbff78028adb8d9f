"""A runner's node calls in progress: the frames of async nodes running now, for the watchdog
to name the step that blocks the event loop; the threads of sync nodes, which a retry waits for
and the worker asks about before it hands a job back; and so where a node was when its time ran
out, the line a timeout names and the stack its attempt keeps (`engine.origin.Stopped`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import anyio

from .context import Context
from .models import Run
from .origin import Stopped, stopped_by, stopped_in_thread
from .threads import SyncCall
from .workflow import Step


class NodeCalls:
    def __init__(self, warn: Callable[[Run, str, str], None]) -> None:
        self._warn = warn  # a line on the run's log
        # Step.is_async asks `inspect` each time; a step's node never changes (steps are
        # frozen), so the answer is kept by step identity.
        self._async_nodes: dict[int, tuple[Step, bool]] = {}
        # Sync nodes' calls by run id, kept while their thread runs.
        self._sync: dict[str, set[SyncCall]] = {}
        # The frames of async nodes running now (id of the coroutine's frame → run id,
        # workflow, step), and what the watchdog noticed (frame id → seconds blocked).
        self.async_frames: dict[int, tuple[str, str, str]] = {}
        self.stalls: dict[int, float] = {}

    def is_async(self, step: Step) -> bool:
        known = self._async_nodes.get(id(step))
        if known is None or known[0] is not step:
            if len(self._async_nodes) > 10_000:  # many reloads: start again
                self._async_nodes.clear()
            known = self._async_nodes[id(step)] = (step, step.is_async)
        return known[1]

    async def run_async(
        self, run: Run, step: Step, where: str, ctx: Context, inputs: dict[str, Any]
    ) -> Any:
        """The async node's result. Stopped (its time ran out, its run's, a cancel), it leaves
        where it was in `ctx.stopped_at`."""
        coro = step.node(ctx, **inputs)
        frame = getattr(coro, "cr_frame", None)
        if frame is None:
            return await coro
        key = id(frame)
        self.stalls.pop(key, None)  # left by an earlier frame at the same address
        self.async_frames[key] = (run.id, run.workflow_name, where)
        try:
            return await coro
        except anyio.get_cancelled_exc_class() as stop:
            ctx.stopped_at = stopped_by(stop)
            raise
        finally:
            del self.async_frames[key]
            stalled = self.stalls.pop(key, None)
            if stalled is not None:
                self._warn(
                    run,
                    f"{where} blocked the event loop for {stalled:.1f}s (an async node must not "
                    "call blocking code: make it a plain def, or await anyio.to_thread.run_sync)",
                    "warning",
                )

    def start_sync(self, run: Run, step: Step, ctx: Context, inputs: dict[str, Any]) -> SyncCall:
        """The sync node called in its thread, kept while the thread runs."""
        call = SyncCall(partial(step.node, ctx, **inputs), step.name)
        self._sync.setdefault(run.id, set()).add(call)
        return call

    def ended(self, run: Run, call: SyncCall) -> None:
        """A sync call whose thread returned."""
        calls = self._sync.get(run.id)
        if calls is not None:
            calls.discard(call)

    def running_threads(self, run_id: str) -> list[str]:
        """Names of the steps of the run whose sync node still runs in its thread."""
        calls = self._sync.get(run_id)
        if not calls:
            return []
        return sorted({call.name for call in calls if call.running})

    def stopped_at(self, run_id: str, ctx: Context | None) -> Stopped | None:
        """Where the run's code was when it was stopped: an async node's last place, else a
        sync node's thread, which goes on where it is."""
        if ctx is not None and ctx.stopped_at is not None:
            return ctx.stopped_at
        for call in self._sync.get(run_id, ()):
            if call.running:
                return stopped_in_thread(call.ident)
        return None

    def forget(self, run_id: str) -> None:
        self._sync.pop(run_id, None)
