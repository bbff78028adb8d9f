"""The LISTEN connection: what other processes notify (a job enqueued, a run changed).

It is held for the backend's life and made again when it drops; until then the waiters poll
(`listening` says which). An outage is logged once when it begins and once when it ends, not
at every try to reconnect.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio
import asyncpg
from anyio import TASK_STATUS_IGNORED
from anyio.abc import TaskStatus

from . import sql
from .batch import Conn
from .connect import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    REFUSED_AT_CONNECT,
    connect,
    connection_lost,
    explain,
)

log = logging.getLogger("blok.postgres")

KEEPALIVE_S = 5.0  # the probe: a dead connection is found within this


class Listener:
    def __init__(self, url: str, location: str, own_pids: set[int], kind: str) -> None:
        self.url = url
        self.kind = kind
        self.location = location
        self.own_pids = own_pids  # this backend's sessions: their notifications are not news
        self.listening = False
        self.on_notify: Callable[[str, str], None] = lambda channel, payload: None
        self.on_listening: Callable[[], None] = lambda: None
        self._conn: asyncpg.Connection | None = None
        self.lost_at: float | None = None  # time.monotonic: when its outage began, if in one
        self._lock = anyio.Lock()  # the probe and the connection's setup take turns

    def _notified(self, conn: Conn, pid: int, channel: str, payload: object) -> None:
        if pid not in self.own_pids:
            self.on_notify(channel, str(payload))

    async def run(self, *, task_status: TaskStatus[None] = TASK_STATUS_IGNORED) -> None:
        """Hold the connection: reconnect when it drops. Started once it listens (or failed
        to, the first time)."""
        delay = BACKOFF_MIN_S
        started = False
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await connect(self.url, "listener", kind=self.kind)
                async with self._lock:
                    for channel in sorted(sql.CHANNELS):
                        await conn.add_listener(channel, self._notified)
                    self._conn = conn
                self.listening = True
                if self.lost_at is not None:
                    back_after = time.monotonic() - self.lost_at
                    log.info("%s: the listener is back after %.1fs", self.location, back_after)
                    self.lost_at = None
                delay = BACKOFF_MIN_S
                self.on_listening()  # what was notified while it was down is unknown
                if not started:
                    started = True
                    task_status.started()
                while True:
                    await anyio.sleep(KEEPALIVE_S)
                    async with self._lock:
                        with anyio.fail_after(KEEPALIVE_S):
                            await conn.fetchval("SELECT 1")
            except Exception as error:
                if isinstance(error, REFUSED_AT_CONNECT):
                    raise explain(self.location, error) from None  # one line, as pooled's
                if not (connection_lost(error) or isinstance(error, TimeoutError)):
                    raise
                if self.lost_at is None:  # once an outage, not once a try
                    self.lost_at = time.monotonic()
                    log.info("%s: the listener lost its connection (%s)", self.location, error)
            finally:
                self.listening = False
                self._conn = None
                if conn is not None:
                    conn.terminate()
            if not started:
                started = True
                task_status.started()
            await anyio.sleep(delay)
            delay = min(2 * delay, BACKOFF_MAX_S)

    async def close(self, *, gone: bool) -> None:
        """End the connection: at once if the server is `gone` (a goodbye would wait)."""
        conn, self._conn = self._conn, None
        if conn is None or conn.is_closed():
            return
        if gone:
            conn.terminate()
            return
        try:
            with anyio.fail_after(2):
                await conn.close()
        except Exception:
            conn.terminate()
