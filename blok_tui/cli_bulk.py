"""`blok-tui cancel` and `blok-tui replay` over the runs filters choose: the console's bulk
actions (`bulk.py`) on the command line, for the operator after an incident ("cancel what is
queued on orders", "replay what failed in the last hour") and for a script.

Each job once (its newest run), with what is left out and why said before anything is done,
asked on a terminal; `--yes` for a script, which has no terminal to ask on. The engine's
`cancel_many` and `replay_many` act, as for the console.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from engine import RunStatus
from engine.api import EngineAPI
from engine.models import LIVE_RUN_STATUSES
from engine.operations import BulkProgress, BulkResult
from engine.text import printable

from .bulk import plan_for_runs
from .jobs import JobBook
from .run_text import zoned_moment

# What `replay` with filters and no --status replays: the runs that failed.
REPLAYED = ("failed", "timed_out", "crashed")
DONE = {"cancel": "cancelled", "replay": "replayed"}
SKIPPED_SHOWN = 5  # skipped runs named one a line, when no more: else counted by reason


@dataclass(frozen=True, slots=True)
class Chosen:
    """The runs the filters choose, as `runs` takes them."""

    action: str  # cancel | replay
    status: str | None
    workflow: str | None = None
    queue: str | None = None
    text: str | None = None
    since: datetime | None = None
    stuck: float | None = None

    @property
    def statuses(self) -> list[str]:
        if self.status is not None:
            return [self.status]
        return list(LIVE_RUN_STATUSES if self.action == "cancel" else REPLAYED)

    def refusal(self) -> str | None:
        """Why the status given cannot be acted on (a cancel of completed runs), or None."""
        if self.status is None:
            return None
        ended = RunStatus(self.status).terminal
        if self.action == "cancel" and ended:
            return f"a {self.status} run has ended: cancel takes runs that have not"
        if self.action == "replay" and not ended:
            return f"a {self.status} run has not ended: replay takes runs that have"
        return None

    def words(self) -> str:
        """ "every failed, timed_out or crashed run of queue 'orders' created since …" """
        if self.status is not None:
            what = f"every {self.status} run"
        elif self.action == "cancel":
            what = "every run"
        else:
            what = f"every {', '.join(REPLAYED[:-1])} or {REPLAYED[-1]} run"
        if self.workflow:
            what += f" of workflow {self.workflow!r}"
        if self.queue:
            what += f" of queue {self.queue!r}"
        if self.text:
            what += f" holding {self.text!r}"
        if self.since is not None:
            what += f" created since {zoned_moment(self.since)}"
        if self.stuck is not None:
            what += f" running longer than {self.stuck:g}× its workflow's median time"
        if self.status is None and self.action == "cancel":
            what += " that has not ended"
        return what


async def act(
    engine: EngineAPI,
    chosen: Chosen,
    *,
    yes: bool,
    ask: Callable[[str], bool | None],
    from_step: str | None = None,
) -> bool | None:
    """Act on the runs chosen; False if the operator said no, None if there was no terminal
    to ask on (and no --yes), True once done (or nothing to do)."""
    action = chosen.action
    runs = await engine.runs(
        status=chosen.statuses,
        workflow=chosen.workflow,
        queue=chosen.queue,
        limit=None,
        text=chosen.text,
        stuck=chosen.stuck,
        since=chosen.since,
    )
    plan = await plan_for_runs(engine, JobBook(), action, runs, chosen.words())
    if plan.count == 0:
        why = f" {plan.per_job}" if plan.per_job else ""
        _note(f"{chosen.words()}: no run to {action}.{why}")
        return True
    question = f"{plan.question} {plan.chosen[:1].upper()}{plan.chosen[1:]}."
    if plan.per_job:
        question += f" {plan.per_job}"
    if yes:
        if plan.per_job:
            _note(plan.per_job)
    else:
        answer = ask(f"{question} [y/N] ")
        if not answer:
            return answer
    assert isinstance(plan.target, tuple)  # a plan over runs read here: their ids
    target = list(plan.target)
    shown = _Progress(action)
    if action == "cancel":
        result = await engine.cancel_many(target, progress=shown)
    else:
        result = await engine.replay_many(target, from_step=from_step, progress=shown)
    shown.end()
    _report(result)
    return True


def _report(result: BulkResult) -> None:
    """Each run acted on on stdout (a script reads the ids); what was left, and the count,
    on stderr."""
    if result.action == "cancel":
        for run_id in result.ids:
            print(printable(f"{run_id} cancelled"))
    else:
        for source, new in result.replayed.items():
            print(printable(f"{source} replayed: its new run is {new}"))
    if result.skipped <= SKIPPED_SHOWN:  # more are counted by reason below
        for run_id, why in result.skipped_ids.items():
            _note(f"run {run_id} left as it is: {why}")
    line = f"{result.touched:,} of {result.total:,} run(s) {DONE[result.action]}"
    if result.skipped:
        reasons = ", ".join(f"{why}: {n:,}" for why, n in result.reasons.items())
        line += f"; {result.skipped:,} left as they were ({reasons})"
    _note(line)


class _Progress:
    """How far a long bulk action is, on a terminal: one line, rewritten."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.shown = False

    def __call__(self, step: BulkProgress) -> None:
        if sys.stderr.isatty() and step.done < step.total:
            print(
                f"\r{self.action}: {step.done:,} of {step.total:,}",
                end="",
                file=sys.stderr,
                flush=True,
            )
            self.shown = True

    def end(self) -> None:
        if self.shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


def _note(line: str) -> None:
    print(printable(f"blok-tui: {line}"), file=sys.stderr, flush=True)
