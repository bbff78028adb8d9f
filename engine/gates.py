"""Scheduling gates a claimed job passes before its run starts: debounce, then delay + TTL, then
the concurrency key, then the rate limit.

A job the gates hold back goes back to its queue through the ledger (delayed for later, or
finished as debounced / expired), so the worker simply moves on. What the gates remember (slots
taken per concurrency key, open debounce windows) is the backend's shared state: it survives a
restart and is shared by every process on the database; a slot is held under its worker's
lease, so a crashed worker's slots free themselves. A gate that holds a run notes on its job
(`meta["gate"]`) which gate, which key and until when: what the console's "why is it waiting"
shows (engine/waiting.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from . import expressions
from .backends.base import Backend, Claim, JobQueue, Window
from .context import Context
from .durations import exact_duration
from .ledger import Ledger
from .models import Job, JobState, Run, RunStatus, from_epoch
from .origin import shown_path
from .workflow import Workflow

log = logging.getLogger("blok.gates")

NO_CAP_S = 10 * 365 * 24 * 3600.0  # a debounce without max_delay
PURGE_EVERY_S = 60.0
# The window shared by the runs whose rate limit key cannot be read (a key's value could read
# the same only on purpose).
UNRESOLVED_KEY = "(key unresolved)"
UNRESOLVED_THEN = f"the run counts in the window of key {UNRESOLVED_KEY!r}, shared by all such runs"


def _shown_key(expr: Any) -> str:
    """A key as the user wrote it: an expression as itself, a callable by where it is
    defined (its repr says only `<function <lambda> at 0x…>`)."""
    code = getattr(expr, "__code__", None)
    if code is None:
        return repr(expr)
    name = getattr(expr, "__qualname__", "callable")
    return f"{name} (at {shown_path(code.co_filename)}:{code.co_firstlineno})"


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


async def wake_next(ledger: Ledger, queue: JobQueue, name: str, key: str) -> None:
    """A slot of `key` came free (a run of this worker ended, or recovery freed a dead
    worker's): the job held longest behind it goes now. Each held job waited out its own
    backoff (1 s, 2 s, 4 s, … 30 s), and eight runs of one key at a limit of 1 took 91 s where
    they ran for 0.8. One job a slot: should another worker take the slot first, the woken job
    is held again and the next slot freed wakes it. (A shortcut: a job not woken goes at the
    end of its backoff, so a failure is logged.)"""
    try:
        for job in await queue.gated(name, key, 1):
            # Its run is left as the gate wrote it (queued or throttled) until it starts.
            await ledger.make_due(queue, job, None, force=False)
    except Exception:
        log.warning("could not start the next job of concurrency key %r", key, exc_info=True)


# ---- the gates ---------------------------------------------------------------------------
class Gates:
    """The scheduling gates of one worker; `admit` is asked for every claimed job."""

    def __init__(
        self,
        backend: Backend,
        ledger: Ledger,
        worker: str,
        lease_s: float,
        *,
        scheduling: bool = True,
        concurrency: bool = True,
    ) -> None:
        """`scheduling=False` (BLOK_SCHEDULING_DISABLED) turns debounce and ttl off;
        `concurrency=False` (BLOK_CONCURRENCY_DISABLED) the concurrency keys."""
        self.backend = backend
        self.shared = backend.shared
        self.ledger = ledger
        self.worker = worker
        self.lease_s = lease_s
        self.scheduling = scheduling
        self.concurrency = concurrency
        # Runs of this worker that hold a slot: the queue and key whose next job goes when
        # it is given back.
        self._holding: dict[str, tuple[JobQueue, str, str]] = {}
        self._purged_at = 0.0
        self._starts_purged_at = 0.0

    async def admit(
        self, claim: Claim, queue: JobQueue, run: Run, workflow: Workflow, resuming: bool
    ) -> bool:
        """True: the run may start. False: the gates handed the job back to its queue."""
        trigger = workflow.trigger
        if trigger is None:
            return True
        job = claim.job
        if not resuming and self.scheduling:
            if trigger.debounce is not None and not await self._debounce(
                claim, queue, run, workflow
            ):
                return False
            if trigger.ttl is not None:
                deadline = run.created_at + timedelta(milliseconds=trigger.ttl)
                if self.backend.clock.now() > deadline:
                    self._expire(
                        claim,
                        queue,
                        run,
                        f"expired: it could not start within its ttl of {exact_duration(trigger.ttl)} "
                        f"(enqueued {run.created_at.isoformat()}, deadline {deadline.isoformat()})",
                    )
                    return False
        if trigger.concurrency_key is not None and self.concurrency:
            key = self._key(trigger.concurrency_key, job, run, "concurrency_key")
            # No key for this job: the gate lets it through, as an unset key would.
            if key is not None:
                taken, holders = await self.shared.acquire_slot(
                    workflow.name, key, trigger.concurrency_limit, run.id, self.worker, self.lease_s
                )
                if not taken:
                    self._deny(claim, queue, run, workflow, key, holders)
                    return False
                self._holding[run.id] = (queue, run.queue, key)
                job.meta.pop("gate_tries", None)
                job.meta.pop("queue_expires_at", None)
        if (
            trigger.rate_limit is not None
            and not resuming
            and not await self._rate_limit(claim, queue, run, workflow)
        ):
            freed = self.release(run.id)  # the concurrency slot taken above: it does not start
            if freed is not None:
                await self.wake_next(*freed)
            return False
        job.meta.pop("gate", None)
        return True

    def release(self, run_id: str) -> tuple[JobQueue, str, str] | None:
        """Give back the run's concurrency slot, if it has one (every exit path calls this;
        a run without one costs a dict lookup, no write): the queue and key it was of, for
        `wake_next`."""
        if not self._holding:  # no run here holds one (no key, the usual case): no call
            return None
        freed = self._holding.pop(run_id, None)
        if freed is not None:
            self.shared.release_slot(run_id)
        return freed

    async def wake_next(self, queue: JobQueue, name: str, key: str) -> None:
        await wake_next(self.ledger, queue, name, key)

    def renew(self) -> None:
        if self._holding:
            self.shared.renew_slots(self.worker, self.lease_s)

    # ---- helpers ---------------------------------------------------------------------------
    def _key(
        self, expr: Any, job: Job, run: Run, what: str, then: str = "the gate is skipped"
    ) -> str | None:
        """The key `expr` gives this job; None when it gives none or cannot be read (`then`:
        what comes of the run then, for the line that says so)."""
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
            problem = f"{what} {_shown_key(expr)} could not be resolved ({error}); {then}"
            self.ledger.log(run, problem, "warning")
            log.warning("%s run %s: %s", run.workflow_name, run.id, problem)
            return None
        return None if value is None else str(value)

    def _retry_later(
        self, claim: Claim, queue: JobQueue, run: Run, status: RunStatus, when: float
    ) -> None:
        until = from_epoch(when)
        assert until is not None
        self.ledger.hold(claim, queue, run, status, until, claim.job.meta)

    def _expire(self, claim: Claim, queue: JobQueue, run: Run, reason: str) -> None:
        self.ledger.log(run, reason, "warning")
        self.ledger.end(claim, queue, run, RunStatus.EXPIRED, JobState.FAILED, reason)

    def _debounced(self, claim: Claim, queue: JobQueue, run: Run, into: str) -> None:
        run.output = {"debounced_into": into}
        self.ledger.log(run, f"debounced: coalesced into run {into}")
        self.ledger.end(claim, queue, run, RunStatus.DEBOUNCED, JobState.CANCELLED)

    def _deny(
        self,
        claim: Claim,
        queue: JobQueue,
        run: Run,
        workflow: Workflow,
        key: str,
        holders: int,
    ) -> None:
        trigger = workflow.trigger
        assert trigger is not None
        job = claim.job
        now = self.backend.clock.time()
        tries = int(job.meta.get("gate_tries", 0))
        job.meta["gate_tries"] = tries + 1
        when = now + trigger.limit_backoff_ms(tries) / 1000
        busy = f"{holders}/{trigger.concurrency_limit} runs of concurrency key {key!r} in flight"
        job.meta["gate"] = {"gate": "concurrency", "key": key, "until": when}
        if trigger.on_limit == "queue":
            if trigger.queue_timeout is not None:
                expires = float(
                    job.meta.setdefault("queue_expires_at", now + trigger.queue_timeout / 1000)
                )
                if now > expires:
                    self._expire(
                        claim,
                        queue,
                        run,
                        f"expired: queued {exact_duration(trigger.queue_timeout)} behind {busy} "
                        "(the trigger's queue_timeout)",
                    )
                    return
                when = min(when, max(expires, now))
                job.meta["gate"]["until"] = when
            run.error = None
            if tries == 0:
                self.ledger.log(run, f"queued: {busy}; it goes when one of them ends")
            self._retry_later(claim, queue, run, RunStatus.QUEUED, when)
            return
        # throw: this delivery ends throttled and the job comes back later; the retry budget
        # (job.meta["failures"]) is not touched.
        run.error = f"throttled: {busy}"
        self.ledger.log(
            run,
            f"throttled: {busy}; tried when one of them ends, or in {when - now:.2f}s",
            "warning",
        )
        self._retry_later(claim, queue, run, RunStatus.THROTTLED, when)

    async def _rate_limit(
        self, claim: Claim, queue: JobQueue, run: Run, workflow: Workflow
    ) -> bool:
        """Count this start in the rate limit's sliding window, or hold the run `throttled`
        until the oldest start in the window leaves it (its retry budget untouched)."""
        trigger = workflow.trigger
        assert trigger is not None and trigger.rate_limit is not None
        rate = trigger.rate_limit
        job = claim.job
        key = (
            "*"
            if rate.key is None
            else self._key(rate.key, job, run, "rate limit key", UNRESOLVED_THEN)
        )
        if key is None:
            # Not a reason to let the run past the limit (what it guards is still there): the
            # runs whose key cannot be read share one window of their own.
            key = UNRESOLVED_KEY
        now = self.backend.clock.time()
        if now - self._starts_purged_at > PURGE_EVERY_S:
            self._starts_purged_at = now
            await self.shared.forget_starts(now)
        period_s = rate.period / 1000
        decision = await self.shared.acquire_start(workflow.name, key, rate.limit, period_s, run.id)
        if decision.allowed:
            return True
        # On the window's clock, which is the clock the job's run_at is compared with (on
        # PostgreSQL the server's; this process's may be off).
        when = max(decision.free_at, decision.decided_at + 0.001)
        keyed = f" for key {key!r}" if rate.key is not None else ""
        until = from_epoch(when)
        assert until is not None
        busy = (
            f"rate limit: {decision.in_window}/{rate.limit} runs started in the last "
            f"{exact_duration(int(rate.period))}{keyed}"
        )
        first = (job.meta.get("gate") or {}).get("gate") != "rate_limit"
        job.meta["gate"] = {
            "gate": "rate_limit",
            "key": key,
            "until": when,
            "limit": rate.limit,
            "period_ms": rate.period,
        }
        run.error = f"throttled: {busy}; may start at {until.isoformat()}"
        if first:
            self.ledger.log(run, f"throttled: {busy}; may start at {until.isoformat()}")
        self.ledger.hold(claim, queue, run, RunStatus.THROTTLED, until, job.meta)
        return False

    async def _debounce(self, claim: Claim, queue: JobQueue, run: Run, workflow: Workflow) -> bool:
        trigger = workflow.trigger
        assert trigger is not None and trigger.debounce is not None
        debounce = trigger.debounce
        job = claim.job
        if job.meta.get("debounce") == {"let_through": run.id}:
            # Let through already, then held by a later gate (a concurrency key, a rate
            # limit): its window is over (trailing) or its own (leading). Pinged again, a
            # trailing run waited a new window, and a leading one joined its own: recorded
            # debounced into itself, it never ran.
            return True
        key = self._key(debounce.key, job, run, "debounce key")
        if key is None:
            return True
        now = self.backend.clock.time()
        if now - self._purged_at > PURGE_EVERY_S:
            self._purged_at = now
            await self.shared.close_windows(now)
        if job.meta.get("debounce") == "fire":

            def fire(window: Window | None, now: float) -> tuple[str | None, Window | None, bool]:
                if window is None or window.run_id == run.id:
                    return None, None, True  # this run fires: the window closes
                return window.run_id, window, False

            joined = await self.shared.update_window(workflow.name, key, "trailing", fire)
            if joined is not None:
                self._debounced(claim, queue, run, joined)
                return False
            job.meta["debounce"] = {"let_through": run.id}
            return True
        max_delay = debounce.max_delay

        def ping(window: Window | None, now: float) -> tuple[Verdict, Window | None, bool]:
            verdict, kept = _decide(
                window,
                debounce.mode,
                run.id,
                job.id,
                job.created_at.timestamp(),
                now,  # the windows' clock, not this process's (which may be off)
                debounce.delay / 1000,
                max_delay / 1000 if max_delay is not None else NO_CAP_S,
            )
            return verdict, kept, kept is not None

        verdict = await self.shared.update_window(workflow.name, key, debounce.mode, ping)
        if verdict.action == "run":
            job.meta["debounce"] = {"let_through": run.id}
            return True
        if verdict.action == "join":
            assert verdict.into is not None
            self._debounced(claim, queue, run, verdict.into)
            return False
        if verdict.superseded is not None:
            await self._supersede(verdict.superseded, run.id)
        job.meta["debounce"] = "fire"
        job.meta["gate"] = {"gate": "debounce", "key": key, "until": verdict.until}
        until = from_epoch(verdict.until)
        self.ledger.log(
            run,
            f"debounced (trailing, key {key!r}): held until {until.isoformat() if until else '?'}"
            " unless a newer job with the same key replaces it",
        )
        self._retry_later(claim, queue, run, RunStatus.DELAYED, verdict.until)
        return False

    async def _supersede(self, old: Window, into: str) -> None:
        """A newer job of the burst took the window: the one it replaced ends debounced."""
        found = await self.backend.find_job(old.job_id)
        if found is None or found[1].run_id != old.run_id or found[1].state.terminal:
            return
        queue, job = found
        if job.state is JobState.ACTIVE:
            return  # being claimed right now; its own fire() sees the newer window
        run = await self.backend.runs.get_run(old.run_id)
        if run is None:
            return
        await self.ledger.debounce_into(queue, job, run, into)
