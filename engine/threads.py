"""Sync nodes (plain `def`) run in threads of their own, which the engine keeps watching.

Python cannot interrupt a thread: a timeout or a cancel can only tell a sync node (it sets
`ctx.cancelled`) and stop waiting for it. So each call gets its own daemon thread — one that
never returns does not keep the process alive at exit — and `SyncCall.running` tells whether
the code still runs, which the runner asks before it starts a retry and the worker before it
hands a job back to the queue.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel


class SyncCall:
    """One call of a sync function in a daemon thread, started at once."""

    __slots__ = ("_done", "_token", "error", "finished", "name", "result")

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self.name = name
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished = threading.Event()
        self._done = anyio.Event()
        self._token = anyio.lowlevel.current_token()
        context = contextvars.copy_context()  # the caller's context variables, as to_thread
        thread = threading.Thread(
            target=self._run, args=(context, fn), name=f"blok node {name}", daemon=True
        )
        thread.start()

    def _run(self, context: contextvars.Context, fn: Callable[[], Any]) -> None:
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
