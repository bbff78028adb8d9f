"""The PostgreSQL backend: many workers on many machines share one database.

`db.py` holds the connections (the batching writer, a pool, the listener), `store.py` the runs
and the change feed, `queue.py` the jobs, `shared.py` what workers share, `sql.py` the
statements and `schema.py` the tables. Each process opens five connections at most.

Waiting for other processes (`wait_for_change`: the worker's follow loop, an attached console's
feed) listens instead of polling: every batch of a writer, every claim that took jobs, every
signal and every enqueue notifies, and the change token moves when another process's
notification arrives: at once for a waiter that is waiting; for a reader with a `Pace` that keeps
coming back to find more changes already, at most every COALESCE_S (a busy cluster's hundreds
of batches a second are read as a few changes), but at once for a signal. Lease renewals do not
notify. While the listener is reconnecting, the token moves every half second, so the waiters
look for themselves.

At close, the writer commits what is still queued. It is waited for up to CLOSE_FLUSH_S while
the server answers (a big batch, a slow server), but not longer than it takes to find the server
gone: a fresh connection (at once if this process lost one already, else after LOOK_AFTER_S) that
the server refuses ends the wait there, one it does not answer within ANSWER_S then. One line
says what was not written (`flush_now`), and the connections are dropped without a goodbye.
"""

from __future__ import annotations

import errno
import time
from typing import Any, ClassVar

import anyio
import asyncpg
from anyio.abc import TaskGroup

from ...errors import DatabaseError
from ...models import Job, JobState, Run
from ..base import JobQueue, Pace
from ..database_backend import DatabaseBackend
from ..rows import job_from_row
from . import sql
from .connect import REFUSED_AT_CONNECT, connect
from .db import ANSWER_S, PostgresDatabase
from .queue import PostgresQueue
from .schema import SCHEMA, SCHEMA_VERSION
from .shared import PostgresShared
from .store import PostgresRunStore, whole_run

UNHEARD_POLL_S = 0.5  # the token moves this often while the listener is down
STRAGGLER_WAIT_S = (0.01, 0.5)  # a feed held back by an older transaction is read again after
COALESCE_S = 0.05  # changes are told at most this often (SQLite's backend polls as often)
ENDED_STATES = [str(state) for state in JobState if state.terminal]
CLOSE_FLUSH_S = 10.0  # a close waits this long for the writer's last batch, the server answering
LOOK_AFTER_S = 0.5  # and looks at the server if the batch takes longer than this
# What a connection refused says of each address it tried: nothing listens there (a Unix
# socket's file is gone with its server). Several addresses (localhost) are said in one error.
NOBODY_THERE = (f"[Errno {errno.ECONNREFUSED}]", f"[Errno {errno.ENOENT}]")


def unreachable(error: BaseException) -> str | None:
    """Why the server cannot take a close's last writes, from what a fresh connection to it
    raised; None: it answered (starting up, or full: the writer may yet get through)."""
    text = str(error)
    if sum(text.count(said) for said in NOBODY_THERE) == text.count("[Errno") > 0:
        return "the server refused the connection (is it stopped?)"
    if isinstance(error, TimeoutError):
        return f"the server did not answer a connection within {ANSWER_S:g}s"
    if isinstance(error, asyncpg.PostgresError) and not isinstance(error, REFUSED_AT_CONNECT):
        return None
    return f"cannot connect: {text or type(error).__name__}"


class PostgresBackend(DatabaseBackend):
    kind: ClassVar[str] = "postgres"
    name: ClassVar[str] = "PostgreSQL"
    multi_process: ClassVar[bool] = True

    def __init__(
        self, url: str, *, create: bool = True, lease_s: float = 30.0, worker: bool = False
    ) -> None:
        from .. import describe

        self.location = describe(url)
        self.db = PostgresDatabase(
            url,
            self.location,
            create=create,
            lease_s=lease_s,
            kind="worker" if worker else "producer",
        )
        self.clock = self.db.clock  # the server's: every machine on the database reads it
        self.runs: PostgresRunStore = PostgresRunStore(self.db)
        self.shared = PostgresShared(self.db)
        self._durable: PostgresQueue = PostgresQueue(self.db)
        self._memory = None
        self._tg: TaskGroup | None = None
        self._token = 0
        self._changed = anyio.Event()
        self._straggler_wait = STRAGGLER_WAIT_S[0]
        self._unheard_at = 0.0
        self._urgent = 0  # signals heard: each is told without waiting out a pace's window
        self._feed_wanted = 0  # the newest transaction another process said wrote runs
        self.db.listener.on_notify = self._notified
        self.db.listener.on_listening = self._heard_again

    async def __aenter__(self) -> PostgresBackend:
        await self.db.open()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self.db.writer_loop)
        tg.start_soon(self.db.clock_loop)
        try:
            await tg.start(self.db.listener.run)
        except BaseException:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
            await self.db.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self._tg is not None:
                try:
                    # While the writer still runs: afterwards nothing would commit.
                    with anyio.CancelScope(shield=True):
                        await self._last_writes()
                finally:
                    self._tg.cancel_scope.cancel()
                    await self._tg.__aexit__(None, None, None)
        finally:
            await self.db.close()

    async def _last_writes(self) -> None:
        """The writer's last batch, waited for while the server may take it (see the module's
        note); then `flush_now`: with the server gone, it only says what was not written;
        answering, it ends the writer's session (stuck on a connection that never answers)
        and commits on a fresh one."""
        flushed = False
        with anyio.move_on_after(CLOSE_FLUSH_S):
            async with anyio.create_task_group() as tg:

                async def flush() -> None:
                    nonlocal flushed
                    await self.db.flush()
                    flushed = True
                    tg.cancel_scope.cancel()

                async def look() -> None:
                    # Lost already (a connection dropped and none made since): looked at now.
                    if self.db.listener.listening and self.db.down_since is None:
                        await anyio.sleep(LOOK_AFTER_S)
                    self.db.gone = await self._look()
                    if self.db.gone is not None:
                        tg.cancel_scope.cancel()

                tg.start_soon(flush)
                tg.start_soon(look)
        if not flushed:
            self.db.flush_now(self.db.gone)

    async def _look(self) -> str | None:
        """Why the server cannot take the last writes, by a fresh connection; None: it answers."""
        try:
            with anyio.fail_after(ANSWER_S):
                conn = await connect(self.db.url, "close", kind=self.db.kind)
                await conn.close()
        except Exception as error:
            return unreachable(error)
        return None

    # ---- following other processes ---------------------------------------------------------
    def _move(self) -> None:
        self._token += 1
        self._changed.set()
        self._changed = anyio.Event()

    def _notified(self, channel: str, payload: str) -> None:
        """Another process committed: its batch, a claim, a signal, new jobs of a queue."""
        if channel == sql.JOBS_CHANNEL:
            self._durable.wake(payload)
        elif channel == sql.SIGNALS_CHANNEL:
            self._urgent += 1
        elif channel == sql.RUNS_CHANNEL and payload.isdigit():
            self._feed_wanted = max(self._feed_wanted, int(payload))
        self._move()

    def _heard_again(self) -> None:
        """The listener (re)connected: what was notified while it was away is unknown."""
        self._durable.wake_all()
        self._move()

    async def change_token(self) -> int:
        return self._token

    async def _job_and_run(self, queue: JobQueue, job_id: str) -> tuple[Job, Run | None] | None:
        if queue is not self._durable:
            return await super()._job_and_run(queue, job_id)
        await self.db.flush()
        row = await self.db.fetchrow(sql.SELECT_JOB_AND_RUN, job_id, ENDED_STATES)
        if row is None:
            return None
        run = whole_run(row["run_row"], row) if row["run_row"] is not None else None
        return job_from_row(row), run  # type: ignore[arg-type]

    async def wait_for_change(self, token: int, timeout: float, pace: Pace | None = None) -> int:
        deadline = time.monotonic() + timeout
        if pace is not None:
            # A burst of changes (every batch of every worker notifies) is read once, not once
            # per batch: a reader that finds the token moved already when it asks, twice
            # running (the changes keep coming while it reads the last ones: the cluster is
            # busy), is told at most every COALESCE_S. One that had to wait is told at once,
            # and so is a signal (an operator waits for it).
            busy = self._token != token
            if busy and pace.was_busy and pace.urgent_seen == self._urgent:
                gap = pace.last_return + COALESCE_S - time.monotonic()
                if gap > 0:
                    await anyio.sleep(min(gap, max(0.0, deadline - time.monotonic())))
            pace.was_busy = busy
        while self._token == token:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return token
            if self.runs.followed and self._feed_wanted >= max(self.runs.horizon, 1):
                # Runs another process committed are not readable yet: a transaction older
                # than theirs still runs. Look again shortly, then less and less often.
                with anyio.move_on_after(min(remaining, self._straggler_wait)):
                    await self._changed.wait()
                self._straggler_wait = min(2 * self._straggler_wait, STRAGGLER_WAIT_S[1])
                self._move()
                break
            self._straggler_wait = STRAGGLER_WAIT_S[0]
            if not self.db.listener.listening:
                # Nothing is heard: the waiters look for themselves every UNHEARD_POLL_S.
                due = self._unheard_at + UNHEARD_POLL_S - time.monotonic()
                if due <= 0:
                    self._unheard_at = time.monotonic()
                    self._move()
                    break
                with anyio.move_on_after(min(remaining, due)):
                    await self._changed.wait()
                continue
            with anyio.move_on_after(min(remaining, 1.0)):
                await self._changed.wait()
        if pace is not None:
            pace.urgent_seen, pace.last_return = self._urgent, time.monotonic()
        return self._token

    def out_of_reach_since(self) -> float | None:
        # The writer or the pool lost their connections, or the listener did (found within
        # its probe's 5 s even while nothing is written: an attached console's case).
        lost = [at for at in (self.db.down_since, self.db.listener.lost_at) if at is not None]
        return time.time() - (time.monotonic() - min(lost)) if lost else None

    async def health(self) -> dict[str, Any]:
        try:
            version = await self.db.fetchval(f"SELECT max(version) FROM {SCHEMA}.schema_version")
            server = await self.db.fetchval("SHOW server_version")
        except Exception as error:
            return {
                "ok": False,
                "backend": "postgres",
                "url": self.location,
                "error": f"{type(error).__name__}: {error}",
            }
        return {
            "ok": version == SCHEMA_VERSION,
            "backend": "postgres",
            "url": self.location,
            "schema": version,
            "server": str(server).split()[0],
            "listening": self.db.listener.listening,
        }

    def flush_now(self) -> None:
        self.db.flush_now()


__all__ = ["DatabaseError", "PostgresBackend"]
