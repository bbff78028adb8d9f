"""One run as `blok-tui show` prints it: what the console's run screen shows, as plain text for
a terminal, a pipe or a ticket: the run's facts, its steps in the rail's order, the errors of
the attempts that failed (the last one of a step with its traceback, folded to the user's
frames) and the log.

No Textual and no colour here: the text is the same in a terminal and in a file, but for a
terminal's width: its long lines wrapped between words, its steps' notes cut to fit."""

from __future__ import annotations

import json
import shlex
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

from engine import (
    Attempt,
    EventOutcome,
    EventSent,
    Job,
    JobState,
    Orphan,
    Run,
    StepRun,
    StepStatus,
    WaitReason,
    format_duration,
)
from engine.filters import is_stuck
from engine.text import printable

from .console import clock_time, local_times
from .plain_text import LAST_COLUMN_LEAST, columns, fit_last_column, one_line, wrapped
from .step_order import (
    fold_parts,
    folded_groups,
    is_fold,
    own_tags,
    rail_rows,
    step_ms,
    step_path,
    time_runs_to,
)
from .tracebacks import clean_error, fold_traceback

VALUE_CHARS = 400  # of an input or output shown inline; `--json` has all of it
NOTE_CHARS = 70
ERROR_CHARS = 200  # of an error in one line
LABEL = 10  # the width of the facts' labels


def run_text(
    run: Run,
    now: datetime,
    *,
    job: Job | None = None,
    why: WaitReason | None = None,
    usual: float | None = None,
    orphaned: Orphan | None = None,
    delivery: int | None = None,
    tz: tzinfo | None = None,
    cwd: Path | None = None,
    db: str | None = None,
    width: int | None = None,
) -> str:
    """The whole text, lines joined. `now`: the moment a running step's time runs to (the
    engine's clock); `job`: the run's job, if it is still kept (its deliveries, its fate);
    `why`: what a run that has not started or goes on later waits for (`why_waiting`);
    `usual`: the seconds its workflow's runs usually take (`usual_duration`), for a running
    run; `orphaned`: why nobody runs a running run (`Engine.orphaned`); `delivery`: which of its
    job's deliveries the job's run is, where the job went on after this run (the job's claims
    do not count a retry's yet in its backoff); `tz`: the time zone times
    are shown in (None: this machine's); `db`: the --db the command was given, for the
    commands it suggests; `width`: the terminal's columns, its long lines wrapped between words
    under their values and its steps' notes cut to fit (None: a pipe or a file, lines whole)."""
    now = time_runs_to(run, now, orphaned)  # an orphan's does not run on: nobody runs it
    facts = _facts(run, now, job, tz, usual, orphaned, delivery)
    if why is not None:
        facts.insert(2, f"{'why':<{LABEL}} {why_line(run, why, tz, now, db)}")
    lines = [part for fact in facts for part in wrapped(fact, width, LABEL + 1)]
    if run.steps:
        lines += ["", *_steps_table(run, now, tz, width)]
    failures = _failures(run, cwd)
    if failures:
        lines += [""]
        for line in failures:  # an attempt's error under itself; a traceback's line too
            indent = len(line) - len(line.lstrip(" "))
            under = indent + 4 if indent else max(line.find(": ") + 2, 4)
            lines += wrapped(line, width, under)
    log, hang = _log(run, tz)
    if log:
        lines += ["", *(part for line in log for part in wrapped(line, width, hang))]
    return "\n".join(line.rstrip() for line in lines)


# ---- the run ------------------------------------------------------------------------------
def _facts(
    run: Run,
    now: datetime,
    job: Job | None,
    tz: tzinfo | None,
    usual: float | None = None,
    orphaned: Orphan | None = None,
    delivery: int | None = None,
) -> list[str]:
    facts: list[tuple[str, str]] = [("run", run.id), ("status", _status(run, tz, now))]
    workflow = run.workflow_name
    if run.workflow_version:
        workflow += f"  version {run.workflow_version}"
    facts.append(("workflow", workflow))
    queue = run.queue
    deliveries = job.delivery_budget if job is not None else None
    if run.job_attempt > 1 or (deliveries or 1) > 1:
        queue += f"  delivery {run.job_attempt}" + (f" of {deliveries}" if deliveries else "")
    if run.priority:
        queue += f"  priority {run.priority}"
    facts.append(("queue", queue))
    facts.append(("job", run.job_id + _fate(run, job, delivery)))
    if run.worker:
        facts.append(("worker", run.worker))
    facts.append(("created", zoned_moment(run.created_at, tz)))
    if run.started_at is not None:
        facts.append(("started", zoned_moment(run.started_at, tz)))
    if run.finished_at is not None:
        facts.append(("finished", f"{zoned_moment(run.finished_at, tz)}  ({_took(run, now)})"))
    elif run.started_at is not None and str(run.status) == "running":
        if orphaned is not None:  # whether it is stuck is moot: nothing runs it
            note = f"; nobody runs it now: {local_times(str(orphaned), tz)}"
            facts.append(("running", f"ran {_took(run, now)}{note}"))
        else:
            facts.append(("running", f"for {_took(run, now)}{_stuck(run, now, usual)}"))
    if str(run.status) in ("delayed", "throttled", "debounced") and run.run_at is not None:
        facts.append(("due", zoned_moment(run.run_at, tz)))
    if str(run.status) == "waiting" and run.wait_until is not None:
        facts.append(("waits", f"until {zoned_moment(run.wait_until, tz)}"))
    if run.replay_of:
        replay = run.replay_of
        if run.replay_from_step:
            replay += f"  from step {run.replay_from_step}"
        facts.append(("replay of", replay))
    if run.parent_run_id:
        facts.append(("parent", run.parent_run_id))
    if run.headers:
        facts.append(("headers", _value(run.headers)))
    facts.append(("input", _value(run.input)))
    if run.output is not None or str(run.status) == "completed":
        facts.append(("output", _value(run.output)))
    return [f"{label:<{LABEL}} {printable(text)}" for label, text in facts]


def why_line(
    run: Run, why: WaitReason, tz: tzinfo | None, now: datetime, db: str | None = None
) -> str:
    """What the run waits for, in the engine's words with this machine's clock (a moment of
    another day than `now` with its date); for an event, the command that sends it (to the
    database `db`, if the user named one)."""
    text = local_times(printable(clean_error(why.summary)), tz, now)
    if why.gate == "event" and why.event is not None:
        to = f" --db {shlex.quote(db)}" if db else ""
        text += printable(f"; send it: blok-tui send {run.id} {shlex.quote(why.event)} JSON{to}")
    return text


def _fate(run: Run, job: Job | None, delivery: int | None) -> str:
    """What became of the run's job, where this run does not say it: another delivery runs
    now, or this one was its last and the job is a dead letter."""
    if job is None:
        if run.terminal:
            return "  (no longer kept)"
        # Kept until it ends: a memory queue's job, in the memory of the process serving it.
        return "  (a memory queue's: in the memory of the process serving it)"
    if job.run_id != run.id:
        return f"  {job.state}: its delivery {delivery or job.deliveries} is run {job.run_id}"
    if job.state is JobState.DEAD:
        return (
            f"  dead: in the dead-letter queue (blok-tui requeue {job.id} or discard {job.id},"
            " or the console's d)"
        )
    if job.state is JobState.CANCELLED and job.meta.get("discarded"):
        return "  discarded: taken out of the dead-letter queue; kept until the retention"
    return ""


def _status(run: Run, tz: tzinfo | None, now: datetime) -> str:
    status = str(run.status)
    if not run.error:
        return status
    # A gate's error names its status already ("throttled: rate limit: …"), and its moment
    # in ISO 8601, shown on this clock as the why line shows it (a failure's is the node's own
    # text: left as it was written).
    cleaned = clean_error(run.error)
    cleaned = cleaned if run.status.terminal else local_times(cleaned, tz, now)
    error = one_line(cleaned, len(cleaned)).removeprefix(f"{status}: ")
    return f"{status}: {_cut_keeping_origin(error)}"


def _cut_keeping_origin(error: str) -> str:
    """An error cut to ERROR_CHARS, but for its last part saying where it came from ("(at
    shop.py:14, after 4 attempts)"): what the line is for."""
    if len(error) <= ERROR_CHARS:
        return error
    head, at, origin = error.rpartition(" (at ")
    if not at or len(origin) > ERROR_CHARS // 2:
        return error[: ERROR_CHARS - 1] + "…"
    return head[: ERROR_CHARS - len(origin) - 7] + "…" + at + origin


def _stuck(run: Run, now: datetime, usual: float | None) -> str:
    """For a run running past STUCK_FACTOR × its workflow's usual time: how far past, and the
    command that says where it is."""
    if run.started_at is None:
        return ""
    took = (now - run.started_at).total_seconds()
    if not is_stuck(took, usual):
        return ""
    return f", {stuck_words(took, usual)}: stuck? (blok-tui where {run.id} says where it is)"


def stuck_words(took_s: float, usual_s: float | None) -> str:
    """How far past its workflow's usual time a stuck run is: "12× its workflow's usual 2s"."""
    if not usual_s:
        return "and no run of its workflow has completed"
    return f"{took_s / usual_s:.0f}× its workflow's usual {format_duration(usual_s * 1000)}"


def _took(run: Run, now: datetime) -> str:
    if run.started_at is None:
        # A crashed run handed straight to a slot may have begun before its start landed.
        return "its start was not recorded" if str(run.status) == "crashed" else "never started"
    return between(run.started_at, run.finished_at or now)


def between(start: datetime, end: datetime) -> str:
    """How long from `start` to `end` ("1.2s"), never below 0 (two clocks may disagree)."""
    return format_duration(max(0.0, (end - start).total_seconds() * 1000))


def zoned_moment(moment: datetime, tz: tzinfo | None = None) -> str:
    """A date and time in `tz` (None: this machine's), naming the zone: a run read from
    another machine's database, or in a container on UTC, is otherwise hours off."""
    return moment.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z")


def _value(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) <= VALUE_CHARS:
        return text
    return f"{text[: VALUE_CHARS - 1]}… ({len(text):,} characters; --json shows all)"


# ---- the steps ----------------------------------------------------------------------------
def _steps_table(run: Run, now: datetime, tz: tzinfo | None, width: int | None) -> list[str]:
    header = ("STEP", "STATUS", "TOOK", "ATTEMPTS", "NOTE")
    rows: list[tuple[str, ...]] = [header]
    for index, depth, label, _ in folded_groups(run, rail_rows(run)):
        indent = "  " * depth
        if is_fold(label):  # a stretch of groups left out
            more, status, span = fold_parts(label)
            rows.append((f"{indent}{more}", status, "", "", printable(span)))
            continue
        if index is None:  # a group of a parent's nested steps: an iteration, a case, an arm
            rows.append((f"{indent}{printable(label)}:", "", "", "", ""))
            continue
        step = run.steps[index]
        rows.append(
            (
                indent + printable(step.name),
                str(step.status),
                _step_took(step, now),
                _tries(step),
                printable(_note(step, tz, ended=run.status.terminal)),
            )
        )
    if width is None:  # into a pipe: each note as `_note` made it, its own spaces kept
        return columns(rows)
    return columns(fit_last_column(rows, width, least=LAST_COLUMN_LEAST))


def _step_took(step: StepRun, now: datetime) -> str:
    ms = step_ms(step, now)
    return format_duration(ms) if ms is not None else ""


def _tries(step: StepRun) -> str:
    """ "2/3": attempts made of the step's budget, as on the console's rail; nothing where none
    was made (a cached, skipped or pending step)."""
    tries = len(step.attempts)
    if not tries:
        return ""
    return f"{tries}/{step.max_attempts}" if step.max_attempts > 1 or tries > 1 else "1"


def _note(step: StepRun, tz: tzinfo | None, *, ended: bool) -> str:
    """`ended`: the run is over, so a step still pending never will run (a bare "pending"
    read as "still to come" on a cancelled or failed run)."""
    notes: list[str] = []
    if ended and step.status is StepStatus.PENDING and not step.attempts:
        notes.append("not reached")
    notes += [f"[{tag}]" for tag in own_tags(step)]
    if step.cached_from:
        notes.append(f"cached from {step.cached_from}")
    if step.child_run_id:
        notes.append(f"child run {step.child_run_id}")
    if step.kind == "event" and str(step.status) != "pending":
        notes.append(event_wait_phrase(step, tz))
    if step.wait_until is not None and str(step.status) == "waiting":
        notes.append(f"until {zoned_moment(step.wait_until, tz)}")
    error = step.error or (step.attempts[-1].error if step.attempts else None)
    if error and str(step.status) != "completed":
        notes.append(clean_error(error))  # a timed-out step's says so
    elif step.timed_out:
        notes.append("timed out")
    return one_line("  ".join(notes), NOTE_CHARS)


def awaited_event(step: StepRun) -> str:
    """The event an event wait waits for, as it is said: "event 'approved'", with its key
    when it matches on one."""
    wanted = step.input if isinstance(step.input, dict) else {}
    event = f"event {printable(str(wanted.get('event', '?')))!r}"
    if wanted.get("key") is not None:
        event += f" with key {printable(str(wanted['key']))!r}"
    return event


def event_wait_phrase(step: StepRun, tz: tzinfo | None) -> str:
    """What an event wait does or did: "waits for event 'approved'", "got event 'approved'
    at 10:02:11", "no event 'approved' before its timeout at 10:05:00"… (the run view's line
    under the step, `show`'s note)."""
    event = awaited_event(step)
    status = str(step.status)
    finished = step.finished_at
    if status == "completed":
        # On its timeout the step completes too, with None for a payload.
        timed_out = (
            step.output is None
            and step.wait_until is not None
            and finished is not None
            and finished >= step.wait_until
        )
        if timed_out:
            return f"no {event} before its timeout at {clock_time(step.wait_until, tz)}"
        return f"got {event}" + (f" at {clock_time(finished, tz)}" if finished else "")
    if status == "cancelled":
        return f"cancelled while waiting for {event}"
    if status == "failed":
        return f"did not wait for {event}"  # its error says why (a match with no value)
    if status in ("waiting", "running"):
        return f"waits for {event}"
    return f"waited for {event}"


# ---- what failed --------------------------------------------------------------------------
def _failures(run: Run, cwd: Path | None) -> list[str]:
    """Each failed attempt in one line; the last failed attempt of each step with its
    traceback (the earlier ones of a retried step are usually the same)."""
    lines: list[str] = []
    by_index = {step.index: step for step in run.steps}
    for index, _, _, _ in rail_rows(run):
        if index is None:
            continue
        step = run.steps[index]
        failed = [a for a in step.attempts if a.error]
        for attempt in failed:
            name = step_path(run, step, by_index)  # a for_each's step: which iteration's
            lines.append(_attempt_line(name, attempt))
            if attempt is failed[-1] and attempt.traceback:
                folded = fold_traceback(attempt.traceback, cwd=cwd)
                lines += ["    " + line for line in folded.splitlines()]
    return ["FAILED ATTEMPTS", *lines] if lines else []


def _attempt_line(name: str, attempt: Attempt) -> str:
    took = ""
    if attempt.finished_at is not None:
        took = f" after {between(attempt.started_at, attempt.finished_at)}"
    return printable(
        f"{name}, attempt {attempt.number}: {attempt.status}{took}: {attempt_error(attempt)}"
    )


def attempt_error(attempt: Attempt) -> str:
    """A failed attempt's error in one line, with its kind, and the wait before the next one:
    "ValueError: card declined; next in 400ms". `show` and `show --follow` print it."""
    kind = f"{attempt.error_type}: " if attempt.error_type else ""
    error = one_line(clean_error(f"{kind}{attempt.error}"), ERROR_CHARS)
    then = f"; next in {format_duration(attempt.backoff_ms)}" if attempt.backoff_ms else ""
    return error + then


# ---- the log ------------------------------------------------------------------------------
def _log(run: Run, tz: tzinfo | None) -> tuple[list[str], int]:
    """The run's lines and its steps' lines, in the order they were written; and the width
    of their opening (the time, the level, the step), which a message's own lines go under."""
    entries = [(line, "") for line in run.logs]
    for step in run.steps:
        entries += [(line, step.name) for line in step.logs]
    if not entries:
        return [], 0
    entries.sort(key=lambda entry: entry[0].ts)
    width = max(len(printable(name)) for _, name in entries)
    lines = [f"LOG ({entries[0][0].ts.astimezone(tz).strftime('%Z')})"]
    for line, name in entries:
        when = line.ts.astimezone(tz).strftime("%H:%M:%S.%f")[:-3]
        message = local_times(clean_error(line.message), tz).splitlines() or [""]
        first = f"{when}  {line.level:<7}  {printable(name) or '-':<{width}}  "
        lines.append(first + message[0])
        lines += [" " * len(first) + rest for rest in message[1:]]
    return lines, len(first)


# ---- an event sent to a run ------------------------------------------------------------------
def event_fate(sent: EventSent) -> str:
    """What became of an event sent to one run, after its name: "sent" when a wait took it,
    else kept, and what the run waits for instead."""
    if sent.outcome is EventOutcome.DELIVERED:
        return "sent"
    event = sent.event
    if sent.waits_for:
        now = "the run waits for " + " and ".join(repr(e) for e in sent.waits_for) + " now"
        return f"kept: {now}; it will get {event!r} if it waits for it later"
    return (
        f"kept: the run waits for no event now (it is {sent.run_status}); "
        f"it will get {event!r} when it waits for it"
    )


def keyless(sent: EventSent) -> str | None:
    """A warning when an event sent by key carries none of the paths the waits for it match
    on: kept, it never reaches a run ("orderId" sent for "order_id"); or when no wait for it
    matches on a key at all."""
    if sent.unkeyed:
        return (
            f"no wait.for_event({sent.event!r}) here matches on a key (match=): kept, it reaches "
            f"no run; send it to the run instead (blok-tui send RUN_ID {sent.event} JSON)"
        )
    if not sent.missing_keys:
        return None
    paths = " or ".join(repr(path) for path in sent.missing_keys)
    return (
        f"the payload has no {paths}, which the waits for {sent.event!r} match on: it is kept "
        "for a run that never comes"
    )


def never_awaited(sent: EventSent) -> str | None:
    """A warning when the run's workflow waits for the event nowhere: a typo in its name
    would be kept for ever without a word. None when some wait takes it, or nobody knows."""
    if sent.awaited is not False:
        return None
    waits = ", ".join(repr(e) for e in sent.workflow_events or ()) or "none"
    if sent.workflow is None:  # sent by key: kept for a run no workflow here would start
        return (
            f"no workflow on this database has a wait.for_event({sent.event!r}): it is kept "
            f"for a run that never comes (the events they wait for: {waits})"
        )
    return (
        f"workflow {sent.workflow!r} has no wait.for_event({sent.event!r}): no step of it "
        f"takes this event (the events it waits for: {waits})"
    )


def replay_version(source: Run, replay: Run) -> str:
    """What a replay runs, when it is not the version its run ran: "version 1a28466d of
    orders.process (run R ran 0b610d2f)"; "" when the same. A replay runs the code served now,
    and nothing had said so: the source's version showed only in the diff view."""
    if not source.workflow_version or replay.workflow_version == source.workflow_version:
        return ""
    return (
        f"version {replay.workflow_version} of {replay.workflow_name} "
        f"(run {source.id} ran {source.workflow_version})"
    )
