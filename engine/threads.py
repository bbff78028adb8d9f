"""Sync nodes (plain `def`) run in daemon threads, which the engine keeps watching.

Python cannot interrupt a thread: a timeout or a cancel can only tell a sync node (it sets
`ctx.cancelled`) and stop waiting for it. So the threads are daemon threads — one that never
returns does not keep the process alive at exit (anyio's worker threads would) — and
`SyncCall.running` tells whether the code still runs, which the runner asks before it starts a
retry and the worker before it hands a job back to the queue. Idle threads are reused, as a
thread pool's, and end after a while without work.
"""

from __future__ import annotations

import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel


class SyncCall:
    """One call of a sync function in a daemon thread, started at once."""

    __slots__ = ("_done", "_token", "error", "finished", "ident", "name", "result")

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self.name = name
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished = threading.Event()
        self.ident: int | None = None  # its thread's, once it runs (where it is: origin)
        self._done = anyio.Event()
        self._token = anyio.lowlevel.current_token()
        context = contextvars.copy_context()  # the caller's context variables, as to_thread
        _POOL.submit(lambda: self._run(context, fn))

    def _run(self, context: contextvars.Context, fn: Callable[[], Any]) -> None:
        self.ident = threading.get_ident()
        try:
            self.result = context.run(fn)
        except BaseException as error:  # SystemExit too: it is the node's failure
            self.error = error
        finally:
            self.finished.set()
            # The event loop may be gone (RuntimeError): then nobody waits any more.
            with contextlib.suppress(RuntimeError):
                anyio.from_thread.run_sync(self._done.set, token=self._token)

    @property
    def running(self) -> bool:
        return not self.finished.is_set()

    async def ended(self) -> None:
        """Wait until the function returned or raised (cancellable: the thread goes on)."""
        await self._done.wait()

    async def outcome(self) -> Any:
        """The function's result, or its error raised here."""
        await self._done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class _DaemonPool:
    """Daemon threads that take calls one at a time and wait `idle_s` for the next."""

    def __init__(self, idle_s: float = 10.0) -> None:
        self.idle_s = idle_s
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, call: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._calls.put(call)
                return
        threading.Thread(target=self._serve, args=(call,), name="blok node", daemon=True).start()

    def _serve(self, call: Callable[[], None]) -> None:
        while True:
            call()
            with self._lock:
                self._idle += 1
            try:
                call = self._calls.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    # A call may have been handed to this thread as it gave up waiting.
                    try:
                        call = self._calls.get_nowait()
                    except queue.Empty:
                        self._idle -= 1
                        return


_POOL = _DaemonPool()
