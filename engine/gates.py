"""Scheduling gates a claimed job passes before its run starts: debounce, then delay + TTL, then
the concurrency key.

A job the gates hold back is handed back to its queue here (delayed for later, or finished as
debounced / expired), so the engine's worker simply moves on. What the gates remember (slots
taken per concurrency key, open debounce windows) lives in SQLite when the engine has a
database, so it survives a restart and is shared by every process on the file; a slot is held
under its worker's lease, so a crashed worker's slots free themselves.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import expressions
from .context import Context
from .events import RunFinished, RunStatusChanged
from .models import Job, JobState, Run, RunStatus, from_epoch, utcnow
from .sqlite_db import SqliteDatabase

if TYPE_CHECKING:
    from .engine import Engine, QueueRuntime
    from .workflow import Workflow

log = logging.getLogger("blok.gates")

NO_CAP_S = 10 * 365 * 24 * 3600.0  # a debounce without max_delay
PURGE_EVERY_S = 60.0


# ---- concurrency slots -------------------------------------------------------------------
class SlotStore(ABC):
    """At most `limit` holders per (workflow, key)."""

    @abstractmethod
    async def acquire(
        self, workflow: str, key: str, limit: int, run_id: str, worker: str, lease_s: float
    ) -> tuple[bool, int]:
        """(taken, holders now). A run that already holds a slot keeps it."""

    @abstractmethod
    def release(self, run_id: str) -> None: ...

    def renew(self, worker: str, lease_s: float) -> None:  # noqa: B027 - leases are optional
        pass

    @abstractmethod
    async def holders(self, workflow: str, key: str) -> int: ...


class MemorySlots(SlotStore):
    def __init__(self) -> None:
        self._held: dict[tuple[str, str], set[str]] = {}
        self._by_run: dict[str, tuple[str, str]] = {}

    async def acquire(
        self, workflow: str, key: str, limit: int, run_id: str, worker: str, lease_s: float
    ) -> tuple[bool, int]:
        held = self._held.setdefault((workflow, key), set())
        if run_id in held:
            return True, len(held)
        if len(held) >= limit:
            return False, len(held)
        held.add(run_id)
        self._by_run[run_id] = (workflow, key)
        return True, len(held)

    def release(self, run_id: str) -> None:
        slot = self._by_run.pop(run_id, None)
        if slot is not None:
            self._held.get(slot, set()).discard(run_id)

    async def holders(self, workflow: str, key: str) -> int:
        return len(self._held.get((workflow, key), ()))


class SqliteSlots(SlotStore):
    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db

    async def acquire(
        self, workflow: str, key: str, limit: int, run_id: str, worker: str, lease_s: float
    ) -> tuple[bool, int]:
        now = time.time()

        def acquire(conn: sqlite3.Connection) -> tuple[bool, int]:
            # Slots of workers whose lease ran out, or that boot recovery found dead and
            # forgot, are free again: a crash never keeps a key blocked.
            conn.execute(
                "DELETE FROM concurrency_slots WHERE workflow = ? AND key = ? AND"
                " (lease_until < ? OR worker NOT IN (SELECT id FROM workers))",
                (workflow, key, now),
            )
            rows = conn.execute(
                "SELECT run_id FROM concurrency_slots WHERE workflow = ? AND key = ?",
                (workflow, key),
            ).fetchall()
            if any(row[0] == run_id for row in rows):
                return True, len(rows)
            if len(rows) >= limit:
                return False, len(rows)
            conn.execute(
                "INSERT INTO concurrency_slots (workflow, key, run_id, worker, lease_until)"
                " VALUES (?, ?, ?, ?, ?)",
                (workflow, key, run_id, worker, now + lease_s),
            )
            return True, len(rows) + 1

        return await self.db.run_claim(acquire)

    def release(self, run_id: str) -> None:
        self.db.write("DELETE FROM concurrency_slots WHERE run_id = ?", (run_id,))

    def renew(self, worker: str, lease_s: float) -> None:
        self.db.write(
            "UPDATE concurrency_slots SET lease_until = ? WHERE worker = ?",
            (time.time() + lease_s, worker),
        )

    async def holders(self, workflow: str, key: str) -> int:
        await self.db.flush()
        row = await self.db.fetchone(
            "SELECT count(*) FROM concurrency_slots WHERE workflow = ? AND key = ?"
            " AND lease_until >= ?",
            (workflow, key, time.time()),
        )
        return int(row[0]) if row else 0


# ---- debounce windows --------------------------------------------------------------------
@dataclass
class Window:
    run_id: str
    job_id: str
    created_at: float  # of the job that holds the window: the newest of the burst
    opened_at: float
    until: float  # trailing: when the held run fires; leading: when the window closes


@dataclass
class Verdict:
    """What the debounce gate decided for one delivery."""

    action: str  # "run" | "hold" (trailing: wait until `until`) | "join" (end debounced)
    until: float = 0.0
    into: str | None = None  # the run this one joined
    superseded: Window | None = None  # trailing: the run this one replaced


def _decide(
    window: Window | None,
    mode: str,
    run_id: str,
    job_id: str,
    created_at: float,
    now: float,
    delay_s: float,
    max_delay_s: float,
) -> tuple[Verdict, Window | None]:
    """The debounce rule, shared by both stores: (the verdict, the window to keep)."""
    if mode == "leading":
        if window is None or window.until <= now:
            return Verdict("run"), Window(run_id, job_id, created_at, now, now + delay_s)
        until = min(now + delay_s, window.opened_at + max_delay_s)
        kept = Window(window.run_id, window.job_id, window.created_at, window.opened_at, until)
        return Verdict("join", into=window.run_id), kept
    if window is None:
        until = now + min(delay_s, max_delay_s)
        return Verdict("hold", until=until), Window(run_id, job_id, created_at, now, until)
    if window.run_id == run_id:
        return Verdict("hold", until=window.until), window
    if window.until < now - delay_s:
        # The held run should have fired long ago (cancelled by an operator, or its worker was
        # busy): a new window opens; if the old run is still pending it joins this one.
        until = now + min(delay_s, max_delay_s)
        return Verdict("hold", until=until, superseded=window), Window(
            run_id, job_id, created_at, now, until
        )
    until = min(now + delay_s, window.opened_at + max_delay_s)
    if created_at < window.created_at:
        # Claimed out of order: an older job of the burst joins the newer one that holds the
        # window, so the run that fires carries the latest payload.
        kept = Window(window.run_id, window.job_id, window.created_at, window.opened_at, until)
        return Verdict("join", into=window.run_id), kept
    kept = Window(run_id, job_id, created_at, window.opened_at, until)
    return Verdict("hold", until=until, superseded=window), kept


class WindowStore(ABC):
    @abstractmethod
    async def ping(
        self,
        workflow: str,
        key: str,
        mode: str,
        run_id: str,
        job_id: str,
        created_at: float,
        delay_s: float,
        max_delay_s: float,
    ) -> Verdict: ...

    @abstractmethod
    async def fire(self, workflow: str, key: str, run_id: str) -> str | None:
        """A held trailing run is due: close its window. Returns the run id that holds the
        window instead, when this one was replaced meanwhile."""


class MemoryWindows(WindowStore):
    def __init__(self) -> None:
        self._windows: dict[tuple[str, str, str], Window] = {}
        self._purged_at = 0.0

    async def ping(
        self,
        workflow: str,
        key: str,
        mode: str,
        run_id: str,
        job_id: str,
        created_at: float,
        delay_s: float,
        max_delay_s: float,
    ) -> Verdict:
        now = time.time()
        if now - self._purged_at > PURGE_EVERY_S:
            self._purged_at = now
            closed = [k for k, w in self._windows.items() if k[2] == "leading" and w.until < now]
            for gone in closed:
                del self._windows[gone]
        verdict, kept = _decide(
            self._windows.get((workflow, key, mode)),
            mode,
            run_id,
            job_id,
            created_at,
            now,
            delay_s,
            max_delay_s,
        )
        if kept is not None:
            self._windows[(workflow, key, mode)] = kept
        return verdict

    async def fire(self, workflow: str, key: str, run_id: str) -> str | None:
        window = self._windows.get((workflow, key, "trailing"))
        if window is None or window.run_id == run_id:
            self._windows.pop((workflow, key, "trailing"), None)
            return None
        return window.run_id


class SqliteWindows(WindowStore):
    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        self._purged_at = 0.0

    async def ping(
        self,
        workflow: str,
        key: str,
        mode: str,
        run_id: str,
        job_id: str,
        created_at: float,
        delay_s: float,
        max_delay_s: float,
    ) -> Verdict:
        now = time.time()
        purge = now - self._purged_at > PURGE_EVERY_S
        if purge:
            self._purged_at = now

        def ping(conn: sqlite3.Connection) -> Verdict:
            if purge:
                # Closed leading windows are only history; one row per key would pile up.
                conn.execute(
                    "DELETE FROM debounce_windows WHERE mode = 'leading' AND until < ?", (now,)
                )
            row = conn.execute(
                "SELECT run_id, job_id, created_at, opened_at, until FROM debounce_windows"
                " WHERE workflow = ? AND key = ? AND mode = ?",
                (workflow, key, mode),
            ).fetchone()
            window = Window(*row) if row else None
            verdict, kept = _decide(
                window, mode, run_id, job_id, created_at, now, delay_s, max_delay_s
            )
            if kept is not None:
                conn.execute(
                    "INSERT OR REPLACE INTO debounce_windows (workflow, key, mode, run_id,"
                    " job_id, created_at, opened_at, until) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        workflow,
                        key,
                        mode,
                        kept.run_id,
                        kept.job_id,
                        kept.created_at,
                        kept.opened_at,
                        kept.until,
                    ),
                )
            return verdict

        return await self.db.run_claim(ping)

    async def fire(self, workflow: str, key: str, run_id: str) -> str | None:
        def fire(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT run_id FROM debounce_windows WHERE workflow = ? AND key = ?"
                " AND mode = 'trailing'",
                (workflow, key),
            ).fetchone()
            if row is None or row[0] == run_id:
                conn.execute(
                    "DELETE FROM debounce_windows WHERE workflow = ? AND key = ?"
                    " AND mode = 'trailing'",
                    (workflow, key),
                )
                return None
            return str(row[0])

        return await self.db.run_claim(fire)


# ---- the gates ---------------------------------------------------------------------------
class Gates:
    """The engine's scheduling gates; `admit` is asked for every claimed job."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._slots: SlotStore | None = None
        self._windows: WindowStore | None = None
        self._holding: set[str] = set()  # runs of this engine that hold a slot

    @property
    def slots(self) -> SlotStore:
        if self._slots is None:
            db = self.engine.db
            self._slots = SqliteSlots(db) if db is not None else MemorySlots()
        return self._slots

    @property
    def windows(self) -> WindowStore:
        if self._windows is None:
            db = self.engine.db
            self._windows = SqliteWindows(db) if db is not None else MemoryWindows()
        return self._windows

    async def admit(
        self, runtime: QueueRuntime, job: Job, run: Run, workflow: Workflow, resuming: bool
    ) -> bool:
        """True: the run may start. False: the gates handed the job back to its queue."""
        trigger = workflow.trigger
        if trigger is None:
            return True
        if not resuming and ("gate_tries" in job.meta or "debounce" in job.meta):
            # The engine makes a fresh record for this delivery of a run the gates held back;
            # keep what the earlier deliveries logged (why it was throttled or held).
            prior = await self.engine.store.get_run(run.id)
            if prior is not None and prior is not run:
                run.logs[:0] = prior.logs
        if not resuming:
            if trigger.debounce is not None and not await self._debounce(
                runtime, job, run, workflow
            ):
                return False
            if trigger.ttl is not None:
                deadline = run.created_at + timedelta(milliseconds=trigger.ttl)
                if utcnow() > deadline:
                    self._expire(
                        runtime,
                        job,
                        run,
                        f"expired: it could not start within its ttl of {trigger.ttl}ms "
                        f"(enqueued {run.created_at.isoformat()}, deadline {deadline.isoformat()})",
                    )
                    return False
        if trigger.concurrency_key is None:
            return True
        key = self._key(trigger.concurrency_key, job, run, "concurrency_key")
        if key is None:
            return True  # no key for this job: the gate lets it through, as an unset key would
        taken, holders = await self.slots.acquire(
            workflow.name,
            key,
            trigger.concurrency_limit,
            run.id,
            self.engine.worker.id,
            self.engine.lease,
        )
        if taken:
            self._holding.add(run.id)
            job.meta.pop("gate_tries", None)
            job.meta.pop("queue_expires_at", None)
            return True
        self._deny(runtime, job, run, workflow, key, holders)
        return False

    def release(self, run_id: str) -> None:
        """Give back the run's concurrency slot, if it has one (every exit path calls this;
        a run without one costs a set lookup, no write)."""
        if run_id in self._holding:
            self._holding.discard(run_id)
            self.slots.release(run_id)

    def renew(self) -> None:
        if self._slots is not None:
            self._slots.renew(self.engine.worker.id, self.engine.lease)

    # ---- helpers ---------------------------------------------------------------------------
    def _key(self, expr: Any, job: Job, run: Run, what: str) -> str | None:
        ctx = Context.for_job(run, job)
        try:
            if expressions.is_expression(expr):
                value = expressions.resolve(expr, ctx)
            elif callable(expr):
                value = expr(ctx)
            else:
                value = expr
        except Exception as error:
            # A key that cannot be read is the job's problem, not a reason to block the queue.
            self.engine.runner.engine_log(
                run,
                f"{what} {expr!r} could not be resolved ({error}); the gate is skipped",
                "warning",
            )
            return None
        return None if value is None else str(value)

    def _retry_later(
        self, runtime: QueueRuntime, job: Job, run: Run, status: RunStatus, when: float
    ) -> None:
        run.status = status
        run.run_at = from_epoch(when)
        self.engine.store.save_run(run)
        runtime.queue.settle(job, JobState.DELAYED, run_at=run.run_at)
        bus = self.engine.bus
        if bus.active:
            bus.publish(RunStatusChanged(run.id, run.queue, str(run.status)))

    def _end(
        self, runtime: QueueRuntime, job: Job, run: Run, status: RunStatus, job_state: JobState
    ) -> None:
        engine = self.engine
        run.status = status
        run.finished_at = utcnow()
        engine.store.save_run(run)
        runtime.queue.settle(job, job_state)
        if engine.bus.active:
            engine.bus.publish(
                RunFinished(run.id, run.queue, run.workflow_name, str(run.status), run.error)
            )
        engine._job_finished(job)

    def _expire(self, runtime: QueueRuntime, job: Job, run: Run, reason: str) -> None:
        run.error = reason
        job.error = reason
        self.engine.runner.engine_log(run, reason, "warning")
        self._end(runtime, job, run, RunStatus.EXPIRED, JobState.FAILED)

    def _debounced(self, runtime: QueueRuntime, job: Job, run: Run, into: str) -> None:
        run.output = {"debounced_into": into}
        self.engine.runner.engine_log(run, f"debounced: coalesced into run {into}")
        self._end(runtime, job, run, RunStatus.DEBOUNCED, JobState.CANCELLED)

    def _deny(
        self,
        runtime: QueueRuntime,
        job: Job,
        run: Run,
        workflow: Workflow,
        key: str,
        holders: int,
    ) -> None:
        trigger = workflow.trigger
        assert trigger is not None
        now = time.time()
        tries = int(job.meta.get("gate_tries", 0))
        job.meta["gate_tries"] = tries + 1
        when = now + trigger.limit_backoff_ms(tries) / 1000
        busy = f"{holders}/{trigger.concurrency_limit} runs of concurrency key {key!r} in flight"
        if trigger.on_limit == "queue":
            if trigger.queue_timeout is not None:
                expires = float(
                    job.meta.setdefault("queue_expires_at", now + trigger.queue_timeout / 1000)
                )
                if now > expires:
                    self._expire(
                        runtime,
                        job,
                        run,
                        f"expired: queued {trigger.queue_timeout}ms behind {busy} "
                        "(the trigger's queue_timeout)",
                    )
                    return
                when = min(when, max(expires, now))
            run.error = None
            if tries == 0:
                self.engine.runner.engine_log(
                    run, f"queued: {busy}; the gate is tried again with backoff"
                )
            self._retry_later(runtime, job, run, RunStatus.QUEUED, when)
            return
        # throw: this delivery ends throttled and the job comes back later; the retry budget
        # (job.meta["failures"]) is not touched.
        run.error = f"throttled: {busy}"
        self.engine.runner.engine_log(
            run, f"throttled: {busy}; trying again in {when - now:.2f}s", "warning"
        )
        self._retry_later(runtime, job, run, RunStatus.THROTTLED, when)

    async def _debounce(
        self, runtime: QueueRuntime, job: Job, run: Run, workflow: Workflow
    ) -> bool:
        trigger = workflow.trigger
        assert trigger is not None and trigger.debounce is not None
        debounce = trigger.debounce
        key = self._key(debounce.key, job, run, "debounce key")
        if key is None:
            return True
        if job.meta.get("debounce") == "fire":
            joined = await self.windows.fire(workflow.name, key, run.id)
            if joined is not None:
                self._debounced(runtime, job, run, joined)
                return False
            job.meta.pop("debounce", None)
            return True
        max_delay = debounce.max_delay if debounce.max_delay is not None else None
        verdict = await self.windows.ping(
            workflow.name,
            key,
            debounce.mode,
            run.id,
            job.id,
            job.created_at.timestamp(),
            debounce.delay / 1000,
            max_delay / 1000 if max_delay is not None else NO_CAP_S,
        )
        if verdict.action == "run":
            return True
        if verdict.action == "join":
            assert verdict.into is not None
            self._debounced(runtime, job, run, verdict.into)
            return False
        if verdict.superseded is not None:
            await self._supersede(verdict.superseded, run.id)
        job.meta["debounce"] = "fire"
        until = from_epoch(verdict.until)
        self.engine.runner.engine_log(
            run,
            f"debounced (trailing, key {key!r}): held until {until.isoformat() if until else '?'}"
            " unless a newer job with the same key replaces it",
        )
        self._retry_later(runtime, job, run, RunStatus.DELAYED, verdict.until)
        return False

    async def _supersede(self, old: Window, into: str) -> None:
        """A newer job of the burst took the window: the one it replaced ends debounced."""
        engine = self.engine
        found = await engine._find_job(old.job_id)
        if found is None or found[1].run_id != old.run_id:
            return
        queue, job = found
        run = await engine.store.get_run(old.run_id)
        if run is None:
            return
        # Nothing awaited between the cancel and the save: whoever sees the job ended and
        # reads the run (reads flush first) finds it debounced.
        if not await queue.cancel_pending(job.id):
            return  # it is being claimed right now; its own fire() sees the newer window
        run.status = RunStatus.DEBOUNCED
        run.output = {"debounced_into": into}
        run.finished_at = utcnow()
        engine.runner.engine_log(run, f"debounced: coalesced into run {into}")
        engine.store.save_run(run)
        if engine.bus.active:
            engine.bus.publish(
                RunFinished(run.id, run.queue, run.workflow_name, str(run.status), None)
            )
        engine._job_finished(job)
