"""A runner's node calls in progress: the frames of async nodes running now, for the watchdog
to name the step that blocks the event loop; the threads of sync nodes, which a retry waits for
and the worker asks about before it hands a job back; and so where a node was when its time ran
out, the line a timeout names and the stack its attempt keeps (`engine.origin.Stopped`)."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Coroutine
from functools import partial
from types import FrameType
from typing import Any

import anyio

from .context import Context
from .models import Run
from .origin import (
    WHERE_ANSWER,
    Stopped,
    stopped_by,
    stopped_in_thread,
    thread_stack,
    where_text,
)
from .threads import SyncCall
from .workflow import Step


class NodeCalls:
    def __init__(self, warn: Callable[[Run, str, str], None]) -> None:
        self._warn = warn  # a line on the run's log
        # Step.is_async asks `inspect` each time; a step's node never changes (steps are
        # frozen), so the answer is kept by step identity.
        self._async_nodes: dict[int, tuple[Step, bool]] = {}
        # Sync nodes' calls by run id, kept while their thread runs, with their step.
        self._sync: dict[str, dict[SyncCall, str]] = {}
        # The frames of async nodes running now (id of the coroutine's frame → run id,
        # workflow, step) and their coroutines, and what the watchdog noticed (frame id →
        # seconds blocked).
        self.async_frames: dict[int, tuple[str, str, str]] = {}
        self._coroutines: dict[int, Coroutine[Any, Any, Any]] = {}
        self.stalls: dict[int, float] = {}
        # Where each run's last stopped async node was, until a step's timeout takes it: a
        # stop of the whole run reads it here when the node ran in a branch of its own context.
        self._stops: dict[str, Stopped] = {}

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
        self._coroutines[key] = coro
        try:
            return await coro
        except anyio.get_cancelled_exc_class() as stop:
            ctx.stopped_at = self._stops[run.id] = stopped_by(stop)
            raise
        finally:
            del self.async_frames[key]
            del self._coroutines[key]
            stalled = self.stalls.pop(key, None)
            if stalled is not None:
                self._warn(
                    run,
                    f"{where} blocked the event loop for {stalled:.1f}s (an async node must not "
                    "call blocking code: make it a plain def, or await anyio.to_thread.run_sync)",
                    "warning",
                )

    def start_sync(
        self, run: Run, step: Step, where: str, ctx: Context, inputs: dict[str, Any]
    ) -> SyncCall:
        """The sync node called in its thread, kept while the thread runs."""
        call = SyncCall(partial(step.node, ctx, **inputs), step.name)
        self._sync.setdefault(run.id, {})[call] = where
        return call

    def ended(self, run: Run, call: SyncCall) -> None:
        """A sync call whose thread returned."""
        calls = self._sync.get(run.id)
        if calls is not None:
            calls.pop(call, None)

    async def threads_ended(self, run_id: str) -> None:
        """Once the run's sync nodes still running in their threads have returned."""
        for call in list(self._sync.get(run_id, ())):
            if call.running:
                await call.ended()

    def running_threads(self, run_id: str) -> list[str]:
        """Names of the steps of the run whose sync node still runs in its thread."""
        calls = self._sync.get(run_id)
        if not calls:
            return []
        return sorted({call.name for call in calls if call.running})

    def took(self, run_id: str, ctx: Context) -> Stopped | None:
        """Where the async node of a step whose time ran out was, taken: a stop of the run
        after it (in the backoff that follows) is not there."""
        self._stops.pop(run_id, None)
        stopped, ctx.stopped_at = ctx.stopped_at, None
        return stopped

    def stopped_at(self, run_id: str, ctx: Context | None) -> Stopped | None:
        """Where the run's code was when the whole run was stopped: an async node's last
        place (in the run's context, else in a branch's), else a sync node's thread, which
        goes on where it is."""
        if ctx is not None and ctx.stopped_at is not None:
            return ctx.stopped_at
        for call in self._sync.get(run_id, ()):
            if call.running:
                return stopped_in_thread(call.ident)
        return self._stops.get(run_id)

    def where_now(self, run_id: str) -> list[str]:
        """Where each node of the run that runs now is (`origin.where_text`): an async node at
        the await it is suspended in (this runs on the event loop, so every one is), a sync
        node where its thread is."""
        said = [
            where_text(where, traceback.StackSummary.extract(_awaiting(self._coroutines[key])))
            for key, (owner, _, where) in list(self.async_frames.items())
            if owner == run_id
        ]
        for call, where in list(self._sync.get(run_id, {}).items()):
            if not call.running:
                continue
            stack = thread_stack(call.ident)
            if stack is None:  # handed to a thread that has not taken it yet
                said.append(f"{WHERE_ANSWER}{where} is starting in its thread")
            else:
                said.append(where_text(where, stack))
        return said

    def forget(self, run_id: str) -> None:
        self._sync.pop(run_id, None)
        self._stops.pop(run_id, None)


def _awaiting(coroutine: Any) -> list[tuple[FrameType, int]]:
    """A suspended coroutine's frames and lines, outermost first, down the chain of what each
    awaits (to a future, which has no frame)."""
    frames: list[tuple[FrameType, int]] = []
    while coroutine is not None:
        frame = getattr(coroutine, "cr_frame", None) or getattr(coroutine, "gi_frame", None)
        if frame is None:
            break
        frames.append((frame, frame.f_lineno))
        coroutine = getattr(coroutine, "cr_await", None) or getattr(coroutine, "gi_yieldfrom", None)
    return frames
