"""The loop watchdog: notices an event loop that stops turning and says which step blocks it.

An `async def` node that calls blocking code (`time.sleep`, a sync HTTP client, heavy CPU work)
holds the event loop: no other run advances, leases are not renewed, the operator's requests
wait. Nothing inside the loop can see it happen, so a thread watches a heartbeat the loop
keeps; when the heartbeat stops, the thread looks at the loop thread's stack for the frame of
an async node the runner registered (`NodeCalls.async_frames`) and logs which step of which run
blocks it. The runner adds the time blocked to the step's record when the node returns, and
an attempt that overran its `max_duration` this way is recorded timed out (engine/runner.py).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

import anyio

from .origin import running_line

if TYPE_CHECKING:
    from .node_calls import NodeCalls

log = logging.getLogger("blok.watchdog")

WATCHDOG_S = 1.0  # a loop that has not turned for this long is reported


# The node that blocks the loop: its step ("[step 1/1] call"), its run's id, its workflow, and
# " at file:line" (or "" where no line of the user's code is on the stack).
Culprit = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class Stall:
    """The loop's latest stall, as far as it is seen: how long it lasted, when the watchdog
    last saw it (time.monotonic), what held the loop (None: not a step's node), or whether the
    whole process was suspended instead. A worker whose leases ran out says so with it."""

    seconds: float
    seen: float
    by: Culprit | None
    suspended: bool = False

    def said(self, run_id: str | None = None) -> str:
        """In a phrase; the run left out where it is `run_id` (said in that run's error)."""
        if self.suspended:
            return f"this process was suspended for {self.seconds:.1f}s (SIGSTOP, a paused machine)"
        if self.by is None:
            return f"its event loop was blocked for {self.seconds:.1f}s, not by a step's node"
        step, run, workflow, line = self.by
        of = "" if run == run_id else f" of run {run} ({workflow})"
        return (
            f"its event loop was blocked for {self.seconds:.1f}s by {step}{of}{line} (an async "
            "node must not call blocking code: make it a plain def, or await "
            "anyio.to_thread.run_sync)"
        )


class LoopWatchdog:
    def __init__(self, calls: NodeCalls, threshold_s: float = WATCHDOG_S) -> None:
        self.calls = calls
        self.threshold_s = threshold_s
        # Set from the watching thread while a stall lasts (an attribute set whole: the loop
        # reads it once it turns again, before this thread has seen it turn).
        self.last: Stall | None = None
        self._beat = time.monotonic()
        self._loop_thread: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    async def beat(self) -> None:
        """The heartbeat, in the event loop; starts the watching thread."""
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._thread = threading.Thread(target=self._watch, name="blok loop watchdog", daemon=True)
        self._thread.start()
        try:
            while True:
                self._beat = time.monotonic()
                await anyio.sleep(self.threshold_s / 4)
        finally:
            self.stop()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        stalled_since: float | None = None
        culprit: tuple[int, tuple[str, str, str]] | None = None
        by: Culprit | None = None
        woke, cpu = time.monotonic(), time.process_time()
        while not self._stop.wait(self.threshold_s / 4):
            now = time.monotonic()
            if self._suspended(now - woke, time.process_time() - cpu):
                self.last = Stall(now - woke, now, None, suspended=True)
                self._beat = now  # the loop turns again as the process does: no stall
                stalled_since, culprit = None, None
            woke, cpu = now, time.process_time()
            blocked = now - self._beat
            if blocked < self.threshold_s:
                if stalled_since is not None:
                    log.warning(
                        "the event loop runs again after %.1fs blocked", self._beat - stalled_since
                    )
                stalled_since, culprit = None, None
                continue
            starts = stalled_since is None
            if stalled_since is None:
                stalled_since = self._beat
            if culprit is None:
                # Looked for at the stall's start and again while none is found: what blocked
                # the loop first (a garbage collection, engine code) may hand it to a node in
                # the same turn of the loop, and the stall is then the node's.
                culprit = self._culprit()
                if culprit is not None:
                    by = self._name(culprit, blocked, self._blocking_line())
                elif starts:
                    log.warning(
                        "the event loop has been blocked for %.1fs, not by a step's node "
                        "(engine code or another task of this process)",
                        blocked,
                    )
            if culprit is not None and culprit[0] in self.calls.async_frames:
                self.calls.stalls[culprit[0]] = now - stalled_since
            self.last = Stall(now - stalled_since, now, by if culprit is not None else None)

    def _suspended(self, slept: float, cpu: float) -> bool:
        """Whether this whole process was stopped (SIGSTOP, a paused VM, a suspended laptop)
        rather than its loop blocked: this thread, which no loop blocks, woke far later than
        it asked to, and the process used hardly any CPU meanwhile. Said so, once."""
        if slept < self.threshold_s or cpu > slept / 10:
            return False
        log.warning(
            "this process was suspended for %.1fs (SIGSTOP, a paused machine): its event loop "
            "was not blocked, but its leases were not renewed meanwhile",
            slept,
        )
        return True

    @staticmethod
    def _name(
        culprit: tuple[int, tuple[str, str, str]], blocked: float, line: str | None
    ) -> Culprit:
        """Log which step blocks the loop; that step, its run, its workflow and its line."""
        run_id, workflow, where = culprit[1]
        by = (where, run_id, workflow, f" at {line}" if line else "")
        log.warning(
            "the event loop has been blocked for %.1fs by %s of run %s (%s)%s: an async node "
            "must not call blocking code (time.sleep, sync I/O); make it a plain def, or await "
            "anyio.to_thread.run_sync",
            blocked,
            *by,
        )
        return by

    def _blocking_line(self) -> str | None:
        """The line of the user's code the loop thread is at (the node's, or a helper's it
        called): where the blocking call is."""
        if self._loop_thread is None:
            return None
        return running_line(sys._current_frames().get(self._loop_thread))

    def _culprit(self) -> tuple[int, tuple[str, str, str]] | None:
        """The async node whose frame is on the loop thread's stack (innermost first)."""
        if self._loop_thread is None:
            return None
        frame: FrameType | None = sys._current_frames().get(self._loop_thread)
        frames = self.calls.async_frames
        while frame is not None:
            found = frames.get(id(frame))
            if found is not None:
                return id(frame), found
            frame = frame.f_back
        return None
