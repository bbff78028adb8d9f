"""The run view: the step rail on the left; on the right, the selected step's attempts (with
errors, tracebacks and backoff), its input and output as JSON, and its log lines, all live.
The header says what the run is waiting for, which delivery of its job it is and what came
after it (the job's later delivery, or a replay: J opens it); the footer shows only the keys
that apply to this run."""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import ClassVar

from rich.console import Console
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import OptionList, Static

from engine import (
    EngineError,
    EventMessage,
    EventOutcome,
    Job,
    JobState,
    LogLine,
    Orphan,
    Run,
    RunStatus,
    StepRun,
    WaitReason,
)
from engine.filters import is_stuck

from . import actions
from .base_screen import ESSENTIAL, BlokScreen, Changes
from .console import (
    clock_time,
    countdown,
    day_time,
    duration,
    local_times,
    printable,
    short_ids,
    status_text,
)
from .diff_screen import DiffScreen
from .inject_screen import InjectScreen
from .jobs import RETRIED_AFTER, one_per_job, orphaned_text, then_text
from .phrases import Phrase, flowed, phrase
from .run_follow import delivery_of, usual_of
from .run_text import event_fate, event_wait_phrase, never_awaited, stuck_words
from .step_order import GOING, run_ms, step_path, time_runs_to
from .step_stats import StepStats, step_stats, typical_text
from .timeline_screen import TimelineScreen
from .tracebacks import clean_error
from .widgets import AttemptsView, FilterInput, JsonView, StepRail

CRUMB_ID = 9  # characters of the run's id in its breadcrumb, at least
REPLAYS = 50  # replay runs of a run read (one per delivery of each replay job)
NARROW = 110  # below this many columns the rail narrows and the run log moves under the step
WIDE = 160  # from this many columns the rail also shows each step's usual duration
# Lines of a long error shown in the run's header and a step's title: the rest is a line
# saying where it all is (a 41-line error took the whole screen, the step rail with it).
ERROR_LINES = 3
SHORT_ERROR_LINES = 2  # on a screen under TALL rows
TALL = 30

LEVELS = {"debug": "dbg", "info": "info", "warning": "warn", "error": "err", "critical": "crit"}
LOG_STYLES = {
    "debug": "grey50",
    "info": "",
    "warning": "khaki1",
    "error": "red1",
    "critical": "bold red1",
}


def log_lines(lines: list[LogLine], tz: tzinfo | None, limit: int = 200) -> Text:
    text = Text()
    shown = lines[-limit:]
    if len(lines) > limit:
        text.append(f"… {len(lines) - limit} earlier lines\n", style="dim")
    for n, line in enumerate(shown):
        text.append(clock_time(line.ts, tz), style="grey50")
        level = line.level.lower()
        text.append(f" {LEVELS.get(level, level[:4]):<4} ", style=LOG_STYLES.get(level) or "grey70")
        text.append(local_times(clean_error(line.message), tz), style=LOG_STYLES.get(level, ""))
        if n < len(shown) - 1:
            text.append("\n")
    return text


def folded_error(
    error: str, width: int, most: int, console: Console, where: str, style: str = "red1"
) -> Text:
    """`error` in at most `most` lines of `width` cells (as they wrap there), then how many
    lines more there are and `where` they all are (": step charge has the whole error"). An
    error that fits, or would with the line that says so, shows whole."""
    whole = Text(error, style=style)
    if width <= 0 or len(whole.wrap(console, width)) <= most + 1:
        return whole
    sources = error.split("\n")
    shown: list[Text] = []
    more = len(sources)
    for line in sources:
        rows = Text(line, style=style).wrap(console, width)
        room = most - len(shown)
        if len(rows) > room:
            if room:  # the start of a long line, its cut end marked
                cut = rows[room - 1]
                cut.truncate(width - 1)
                cut.append("…")
                shown.extend(rows[: room - 1])
                shown.append(cut)
                more -= 1
            break
        shown.extend(rows)
        more -= 1
    text = Text("\n").join(shown)
    if more:
        text.append(f"\n… {more:,} more line{'s' if more != 1 else ''}{where}", style="grey62")
    return text


GATE_STATUSES = frozenset({"queued", "delayed", "throttled", "debounced", "expired"})
PENDING = frozenset({"queued", "delayed", "throttled", "waiting"})
PANEL_GATES = frozenset(
    {"rate_limit", "concurrency", "debounce", "paused", "subworkflow", "no_worker"}
)


def event_wait(run: Run) -> StepRun | None:
    """The wait.for_event step the run is parked in, if it is."""
    found = [s for s in run.steps if s.kind == "event" and str(s.status) == "waiting"]
    return found[-1] if found else None


def why_text(
    why: WaitReason | None,
    events: list[EventMessage],
    holder: int,
    tz: tzinfo | None,
    now: datetime | None = None,
) -> Text | None:
    """The "why is it waiting" panel: the gate, its key, the runs holding its slots (h opens
    them in turn), when it may start, and the events nobody took."""
    text = Text()
    # A wait, a delay or a plain queue is said in the header already: the panel adds what a
    # gate, a pause or a child run holds it with.
    if why is not None and why.gate in PANEL_GATES:
        summary = local_times(why.summary, tz, now)  # the engine says ISO 8601; we, the clock
        gate = why.gate.replace("_", " ")
        summary = summary.removeprefix(f"{gate}: ")  # said by the tag already
        text.append("why waiting ", style="bold")
        text.append(f"[{gate}] ", style="khaki3")
        text.append(clean_error(summary), style="grey85")
        if why.holders:
            short = short_ids(list(why.holders))
            text.append("\nheld by ", style="grey62")
            for n, run_id in enumerate(why.holders[:4]):
                style = "bold deep_sky_blue1" if n == holder % len(why.holders) else "grey70"
                text.append(("" if n == 0 else ", ") + short[run_id], style=style)
            if len(why.holders) > 4:
                text.append(f" +{len(why.holders) - 4}", style="grey62")
            text.append("   h opens the highlighted one", style="grey50")
    untaken = [m for m in events if m.taken_by is None]
    if untaken:
        if text:
            text.append("\n")
        events_word = "event" if len(untaken) == 1 else "events"
        text.append(f"✉ {len(untaken)} {events_word} nobody took: ", style="khaki1")
        text.append(", ".join(printable(m.event) for m in untaken[:5]), style="grey85")
    return text or None


def wait_line(step: StepRun, now: datetime, tz: tzinfo | None) -> Text:
    """Under a wait step's title: what it waits for and until when (an event wait's deadline
    is a timeout, not the moment it resumes); once it has ended, what became of the wait."""
    line = Text()
    status = str(step.status)
    waiting = status == "waiting"
    if step.kind == "event":
        line.append(f"\n✉ {event_wait_phrase(step, tz)}", style="khaki1")
        if waiting and step.wait_until is not None:
            line.append(
                f"; times out at {clock_time(step.wait_until, tz)} "
                f"({countdown(step.wait_until, now)})",
                style="khaki1",
            )
        elif waiting:
            line.append(" (no timeout)", style="khaki1")
        return line
    if step.wait_until is not None:
        until = clock_time(step.wait_until, tz)
        if status == "cancelled":
            line.append(f"\ncancelled while waiting until {until}", style="khaki1")
        else:
            line.append(f"\n{'waits' if waiting else 'waited'} until {until}", style="khaki1")
        if waiting:
            line.append(f" — resumes {countdown(step.wait_until, now)}", style="khaki1")
    return line


def gate_reason(
    run: Run, now: datetime, tz: tzinfo | None, *, explained: bool = False, keyed: bool = False
) -> Text | None:
    """Why a run is held or ended by a scheduling gate, and until when. `explained`: the why
    panel under the header says what holds it, so its reason is not said twice. `keyed`: a
    concurrency key holds it, and it goes when a run of its key ends: its time is only when
    the gate looks again ("starts in 2s" was said of a run whose key's holder had 20 s to go),
    and retry now would only find the key full again."""
    status = str(run.status)
    if status not in GATE_STATUSES:
        return None
    why = "" if explained else local_times(clean_error(run.error or "").strip(), tz)
    line = Text()
    if status == "debounced":
        into = run.output.get("debounced_into") if isinstance(run.output, dict) else None
        line.append("≈ debounced", style="bold grey70")
        line.append(f": joined run {into}" if into else "", style="deep_sky_blue1")
        if why and (not into or into not in why):
            line.append(f"\n{why}", style="grey70")
        return line
    icon, style = {
        "queued": ("○ queued", "grey70"),
        "delayed": ("◷ delayed", "khaki3"),
        "throttled": ("⋯ throttled", "khaki3"),
        "expired": ("⌀ expired", "grey70"),
    }[status]
    line.append(icon, style=f"bold {style}")
    if keyed and status != "expired":
        line.append(" until a run of its key ends", style=style)
        if run.run_at is not None:
            line.append(f" (looks again {countdown(run.run_at, now)})", style="grey62")
    elif run.run_at is not None and status != "expired":
        line.append(
            f" until {clock_time(run.run_at, tz)} — starts {countdown(run.run_at, now)}",
            style=style,
        )
    if why:
        line.append(f"\n{why}", style="khaki1" if status != "expired" else "grey70")
    if status == "queued" and run.run_at is None and not why:
        return None  # plainly waiting its turn: nothing to explain
    if status in ("delayed", "queued") and not keyed:  # what retry now can start
        line.append("   t starts it now", style="grey50")
    return line


class RunLogScroll(VerticalScroll):
    """The run log's scroll, in tab's way only when it has something to scroll: the first tab
    from the rail went to it, with no mark, mostly to hold "no engine messages"."""

    def allow_focus(self) -> bool:
        return self.max_scroll_y > 0


class RunScreen(BlokScreen):
    SCOPE: ClassVar[str] = actions.RUN
    BINDINGS: ClassVar[list[BindingType]] = actions.bindings(actions.RUN)

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.run: Run | None = None
        self.missing: str | None = None
        self.search = ""  # `/` in the run view: lines of the step's output and log that match
        self.unfolded = False  # z: the step's whole output instead of its first lines
        self.stats: StepStats | None = None  # the workflow's recent step durations
        self.why: WaitReason | None = None  # why a pending run waits (h opens its holders)
        self.events: list[EventMessage] = []  # the run's mailbox
        self.holder = 0  # which holder h opens next
        self.job: Job | None = None  # the run's job: which delivery this is, what came after
        self.next_delivery: int | None = None  # the job's run after this one: which delivery
        self.orphaned: Orphan | None = None  # nobody runs it, for a running run (jobs.orphans)
        self.replays: list[Run] = []  # replays of this run, newest first, one run per job
        # How long its workflow's completed runs take (s), read once while it runs: "stuck?".
        self.usual: float | None = None
        self.usual_read = False
        # The header shows a long run error's first lines; one no step holds is shown whole
        # in the detail pane.
        self.error_folded = False

    @property
    def crumb(self) -> str:
        return self.crumb_among([self])

    def crumb_among(self, trail: list[BlokScreen]) -> str:
        """ "run 1a2497ad0", longer where another run view in the trail starts the same (two
        deliveries of one job, started moments apart), and "#2" for a job's later delivery."""
        ids = [view.run_id for view in trail if isinstance(view, RunScreen)]
        crumb = "run " + short_ids([*ids, self.run_id], least=CRUMB_ID)[self.run_id]
        run = self.run
        if run is not None and run.job_attempt > 1:
            crumb += f" #{run.job_attempt}"
        return crumb

    @property
    def narrow(self) -> bool:
        return self.size.width < NARROW

    @property
    def error_lines(self) -> int:
        """The lines of a long error the header and a step's title show."""
        return ERROR_LINES if self.size.height >= TALL else SHORT_ERROR_LINES

    def on_resize(self) -> None:
        # (BlokScreen's own on_resize runs too: Textual calls each class's handler.)
        self.set_class(self.narrow, "-narrow")
        self.set_class(self.size.width >= WIDE, "-wide")
        if self.run is not None:
            self.render_run()

    def compose_body(self) -> ComposeResult:
        yield Static(id="run-header", classes="run-header")
        yield Static(id="why", classes="run-header why")
        with Horizontal(id="run-body"):
            with Vertical(id="rail-column"):
                yield Static("steps", classes="section", id="steps-title")
                yield StepRail(id="rail")
                yield Static("run log", classes="section wide-only")
                with RunLogScroll(id="run-log-scroll", classes="wide-only"):
                    yield Static(id="run-log")
            with Vertical(id="detail-column"):
                yield FilterInput("search the step's input, output and log…")
                with VerticalScroll(id="detail"):
                    yield Static("run error", classes="section run-error", id="run-error-title")
                    yield Static(id="run-error", classes="log run-error")
                    yield Static(id="step-title", classes="section")
                    yield AttemptsView(id="attempts")
                    yield Static("input", classes="section")
                    yield JsonView(id="step-input")
                    yield Static("output", classes="section", id="output-title")
                    yield JsonView(id="step-output")
                    yield Static("log", classes="section")
                    yield Static(id="step-log", classes="log")
                    yield Static("run log", classes="section narrow-only")
                    yield Static(id="run-log-narrow", classes="log narrow-only")

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one(StepRail).focus()

    async def load(self) -> None:
        try:
            self.run = await self.engine.get_run(self.run_id)
            self.missing = None
        except EngineError as error:
            self.missing = str(error)
        if self.run is not None and self.stats is None:
            self.stats = await step_stats(
                self.engine, self.blok.step_stats_cache, self.run.workflow_name
            )
        await self.load_why()
        await self.load_lineage()
        if self.run is not None and not self.usual_read:
            self.usual = await usual_of(self.engine, self.run)  # None unless it runs
            self.usual_read = self.run.status is RunStatus.RUNNING
        self.render_run()
        self.show_crumbs()  # the run read: which delivery of its job it is

    async def load_lineage(self) -> None:
        """Its job (which delivery the run is; whether the job went on after it) and its
        replays."""
        run = self.run
        if run is None:
            return
        jobs = await self.blok.jobs.read(self.engine, [run.job_id])
        self.job = jobs.get(run.job_id)
        self.next_delivery = await delivery_of(self.engine, run, self.job)
        self.orphaned = (await self.blok.jobs.orphans(self.engine, [run])).get(run.id)
        replays = await self.engine.runs(replay_of=run.id, limit=REPLAYS) if run.terminal else []
        # A replay is a job: each of its deliveries is a run with replay_of set.
        self.replays = one_per_job(replays).runs

    @property
    def later_delivery(self) -> Job | None:
        """The run's job, when the job went on to another delivery after this run."""
        run, job = self.run, self.job
        if run is None or job is None or str(run.status) not in RETRIED_AFTER:
            return None
        return job if job.run_id != run.id else None

    @property
    def held_by_key(self) -> bool:
        """A concurrency key holds the run: it goes when a run of its key ends, and retry now
        would only find the key full again."""
        return self.why is not None and self.why.gate == "concurrency"

    async def load_why(self) -> None:
        run = self.run
        self.why, self.events = None, []
        if run is None:
            return
        try:
            if str(run.status) in PENDING:
                self.why = await self.engine.why_waiting(run.id)
            self.events = await self.engine.events_of(run.id)
        except EngineError:
            pass  # the panel is a help: the run itself is on screen

    def selected_step(self) -> StepRun | None:
        if self.run is None or not self.run.steps:
            return None
        index = self.query_one(StepRail).step_index()
        return self.step_at(index if index is not None else 0)

    def step_at(self, index: int | None) -> StepRun | None:
        if self.run is None or index is None:
            return None
        return next((s for s in self.run.steps if s.index == index), None)

    def top_step(self, step: StepRun) -> StepRun:
        """The top-level step that holds a nested one (replay starts at that level)."""
        seen: set[int] = set()
        while step.parent is not None and step.parent not in seen:
            seen.add(step.index)
            parent = self.step_at(step.parent)
            if parent is None:
                break
            step = parent
        return step

    def render_run(self) -> None:
        header = self.query_one("#run-header", Static)
        if self.run is None:
            header.update(Text(self.missing or "loading…", style="red1" if self.missing else "dim"))
            return
        run, now, tz = self.run, self.blok.now(), self.blok.tz
        took_to = self.run_clock()
        header_width = self.line_width
        # What the run is, then its times: each line broken between its phrases, never inside
        # one ("dead" / "letter" read as two facts).
        line = flowed(self.what_phrases(run), header_width)
        line.append("\n")
        line.append_text(flowed(self.when_phrases(run, took_to), header_width))
        if self.orphaned is not None:
            line.append("\n")
            line.append_text(orphaned_text(self.orphaned, tz))
        later = self.later_delivery
        if later is not None:
            line.append("\n")
            shown = short_ids([run.id, later.run_id])[later.run_id]
            line.append_text(
                then_text(later, long=True, shown_id=shown, delivery=self.next_delivery)
            )
            line.append("   J opens it", style="grey50")
        elif self.replays:
            newest = self.replays[0]
            short = short_ids([r.id for r in self.replays])
            line.append("\n")
            line.append("⟲ replayed as run ", style="medium_purple1")
            line.append(short[newest.id], style="bold medium_purple1")
            line.append(" (")
            line.append_text(status_text(str(newest.status)))
            line.append(")")
            if len(self.replays) > 1:
                more = len(self.replays) - 1
                line.append(f" and {more} more", style="grey62")
            line.append("   J opens it", style="grey50")
        parked = event_wait(run) if str(run.status) == "waiting" else None
        if parked is not None:
            wanted = parked.input if isinstance(parked.input, dict) else {}
            line.append("\n")
            line.append(f"✉ waiting for event {wanted.get('event', '?')!r}", style="bold khaki1")
            if wanted.get("key") is not None:
                line.append(f" with key {printable(str(wanted['key']))!r}", style="khaki1")
            # At 80 columns the line keeps to one: the countdown says when, the footer s.
            if parked.wait_until is not None:
                until = "" if self.narrow else f" until {clock_time(parked.wait_until, tz)}"
                line.append(
                    f"{until} — times out {countdown(parked.wait_until, now)}", style="khaki1"
                )
            else:
                line.append(" (no timeout)", style="khaki1")
            if not self.narrow:
                line.append("   s sends it", style="grey50")
        elif str(run.status) == "waiting" and run.wait_until:
            line.append("\n")
            line.append(
                f"⏸ waiting until {clock_time(run.wait_until, tz)} — resumes "
                f"{countdown(run.wait_until, now)}",
                style="bold khaki1",
            )
        else:
            explained = self.why is not None and self.why.gate in PANEL_GATES
            reason = gate_reason(run, now, tz, explained=explained, keyed=self.held_by_key)
            if reason is not None:
                line.append("\n")
                line.append_text(reason)
        if run.parent_run_id:
            line.append("\n")
            line.append(f"↰ child of run {run.parent_run_id}", style="deep_sky_blue1")
            line.append(f" (depth {run.depth}; p opens it)", style="grey62")
        self.error_folded = False
        if run.error and str(run.status) not in GATE_STATUSES:
            line.append("\n")
            failed = next((s for s in run.steps if s.error and str(s.status) == "failed"), None)
            where = (
                f": step {printable(failed.name)} has the whole error"
                if failed is not None
                else ": the run error below has them all"
            )
            error = clean_error(run.error)
            folded = folded_error(
                error, header_width, self.error_lines, self.app.console, where, "bold red1"
            )
            self.error_folded = failed is None and folded.plain != error
            line.append_text(folded)
        header.update(line)
        for part in self.query(".run-error"):
            part.display = self.error_folded
        if self.error_folded:
            self.query_one("#run-error", Static).update(
                Text(clean_error(run.error or ""), style="red1")
            )
        why = self.query_one("#why", Static)
        panel = why_text(self.why, self.events, self.holder, tz, self.blok.now())
        why.display = panel is not None
        if panel is not None:
            why.update(panel)
        typical = {}
        if self.stats is not None and self.size.width >= WIDE:
            typical = {name: typical_text(self.stats, run, name) for name in self.stats.names}
        self.query_one(StepRail).show(run, took_to, tz, narrow=self.narrow, typical=typical)
        run_log = (
            log_lines(run.logs, tz) if run.logs else Text("no engine messages", style="dim italic")
        )
        self.query_one("#run-log", Static).update(run_log)
        self.query_one("#run-log-narrow", Static).update(run_log)
        self.query_one("#steps-title", Static).update(
            "steps" if run.steps else "steps: not started"
        )
        self.render_step()
        self.show_keys()

    def what_phrases(self, run: Run) -> list[Phrase]:
        """The header's first line: status, workflow, queue, ids, which delivery of its job."""
        workflow = Text.assemble(
            (printable(run.workflow_name), "bold"), (f" @{run.workflow_version[:8]}", "grey62")
        )
        phrases = [
            Phrase(status_text(str(run.status))),
            Phrase(workflow),
            phrase(f"queue {printable(run.queue)}", "grey70"),
        ]
        if not self.narrow:
            phrases.append(phrase(f"{run.id}  job {run.job_id}", "grey62"))  # its ids
        # Which delivery of its job, and whether its job went to the dead-letter queue after
        # it (the last of its deliveries): one phrase, kept together on a line.
        job = self.job
        delivery = Text()
        # The job's budget as the CLI's `show` says it: a crash or an engine's stop adds one.
        deliveries = job.delivery_budget if job is not None else None
        if run.job_attempt > 1 or (str(run.status) in RETRIED_AFTER and (deliveries or 1) > 1):
            of = f" of {deliveries}" if deliveries else ""
            delivery.append(f"delivery {run.job_attempt}{of}  ", style="khaki3")
        if job is not None and job.run_id == run.id and job.state is JobState.DEAD:
            delivery.append("dead letter", style="bold magenta")
        elif job is not None and job.run_id == run.id and job.meta.get("discarded"):
            delivery.append("dead letter, discarded", style="grey58")
        delivery.rstrip()
        phrases.append(Phrase(delivery))
        return phrases

    def run_clock(self) -> datetime:
        """The moment the run's and its steps' time runs to: now, but for an orphan the last
        time its worker was seen (nobody runs it since)."""
        now = self.blok.now()
        return now if self.run is None else time_runs_to(self.run, now, self.orphaned)

    def when_phrases(self, run: Run, now: datetime) -> list[Phrase]:
        """The header's second line: created, started, how long it took, its attempts."""
        tz = self.blok.tz
        phrases = [phrase(f"created {day_time(run.created_at, tz, now)}", "grey70")]
        if run.started_at:
            phrases.append(
                phrase(f"started {day_time(run.started_at, tz, now)}", "grey70", gap="   ")
            )
        if run.worker and run.started_at:  # the first question of an incident: which worker
            verb = "on" if str(run.status) in GOING and self.orphaned is None else "ran on"
            phrases.append(phrase(f"{verb} {printable(run.worker)}", "grey70", gap="   "))
        took = run_ms(run, now)
        if took is not None:
            # A run a worker's stop sent back to the queue, or an orphan, ran this long:
            # nobody runs it now.
            ran = run.finished_at is None and (
                str(run.status) not in GOING or self.orphaned is not None
            )
            verb = "ran" if ran else "took"
            phrases.append(phrase(f"{verb} {duration(took)}", "grey70", gap="   "))
            # `show` said a run was stuck and the console's header did not (w: where it is).
            if run.status is RunStatus.RUNNING and not ran and is_stuck(took / 1000, self.usual):
                stuck = f"stuck? {stuck_words(took / 1000, self.usual)} (w: where it is)"
                phrases.append(phrase(stuck, "bold khaki1", gap="   ", keep=1))
        if run.attempts:  # none before it starts, or while it waits for its first step
            attempts = Text.assemble((f"attempts {run.attempts}", "grey70"))
            if run.failed_attempts:
                attempts.append(f" ({run.failed_attempts} failed)", style="red1")
            phrases.append(Phrase(attempts, gap="   "))
        if run.replay_of:
            replay = f"replay of {run.replay_of}"
            if run.replay_from_step:
                replay += f" from {run.replay_from_step}"
            phrases.append(phrase(replay, "medium_purple1", gap="   "))
        return phrases

    def unreached(self, step: StepRun) -> bool:
        """A step its run never came to, as the run has ended."""
        ended = self.run is not None and self.run.status.terminal
        return ended and str(step.status) == "pending" and not step.attempts

    def render_step(self) -> None:
        step, run = self.selected_step(), self.run
        if step is None or run is None:
            self.render_unstarted()
            return
        tz = self.blok.tz
        title = Text()
        if step.parent is None and not (step.tags and step.tags[0].startswith("mw:")):
            top = run.own_steps()
            position = next((n for n, s in enumerate(top) if s.index == step.index), 0)
            title.append(f"step {position + 1}/{len(top)} ")
        else:
            title.append("step ")
        title.append(printable(step_path(run, step)), style="bold")
        title.append("  ")
        title.append_text(status_text(str(step.status), steps=True))
        unreached = self.unreached(step)
        if unreached:  # its run ended: "pending" read as still to come
            title.append("  not reached: the run ended before it", style="grey62")
        if step.child_run_id:
            title.append(f"\n↳ child run {step.child_run_id}", style="deep_sky_blue1")
            title.append("  enter opens it", style="grey62")
        title.append_text(wait_line(step, self.blok.now(), tz))
        if step.error:
            title.append("\n")
            if any(attempt.error for attempt in step.attempts):
                title.append_text(
                    folded_error(
                        clean_error(step.error),
                        self.query_one("#step-title", Static).content_size.width,
                        self.error_lines,
                        self.app.console,
                        " in the attempts below",
                    )
                )
            else:  # no attempt says it: here is the only place
                title.append(clean_error(step.error), style="red1")
        if self.stats is not None and self.run is not None:
            usual = self.stats.describe(self.run, step.name)
            if usual is not None:
                title.append("\n")
                title.append_text(usual)
        self.query_one("#step-title", Static).update(title)
        self.query_one(AttemptsView).show(step, self.run_clock(), unreached=unreached)
        self.query_one("#step-input", JsonView).show(step.input, search=self.search)
        folded = self.query_one("#step-output", JsonView).show(
            step.output,
            empty="none yet"
            if str(step.status) in ("pending", "running", "waiting") and not unreached
            else "none",
            search=self.search,
            fold=not self.unfolded,
        )
        self.query_one("#output-title", Static).update(
            Text.assemble(
                "output",
                (f"  {folded}", "grey50") if folded else "",
                # The box may be closed (enter keeps the search): esc is how it ends.
                ("  esc clears", "dim") if self.search else "",
            )
        )
        detail = self.query_one("#detail", VerticalScroll)
        following = detail.scroll_y >= detail.max_scroll_y - 1
        logs = step.logs
        if self.search:
            needle = self.search.lower()
            logs = [line for line in logs if needle in line.message.lower()]
        self.query_one("#step-log", Static).update(
            log_lines(logs, tz) if logs else Text("no log lines", style="dim italic")
        )
        # A running step's log follows its new lines, unless the operator scrolled up to read.
        if str(step.status) == "running" and following and step.logs:
            detail.call_after_refresh(detail.scroll_end, animate=False)

    def render_unstarted(self) -> None:
        """A run no worker has started has no steps yet: its input is what there is to see."""
        run = self.run
        if run is None:
            return
        self.query_one("#step-title", Static).update(
            Text("not started yet: the run's input", style="dim italic")
        )
        self.query_one(AttemptsView).update("")
        self.query_one("#step-input", JsonView).show(run.input, search=self.search)
        self.query_one("#step-output", JsonView).show(None, empty="none yet")
        self.query_one("#output-title", Static).update("output")
        self.query_one("#step-log", Static).update(Text("no log lines", style="dim italic"))

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self.unfolded = False
        self.render_step()
        self.show_keys()  # enter opens a child run only on a step that has one

    def key_rank(self, action: str) -> int:
        # A run that waits for an event waits for the operator's `s`: kept at 80 columns.
        run = self.run
        if action == "send_event" and run is not None and event_wait(run) is not None:
            return ESSENTIAL
        return 0

    def key_applies(self, action: str) -> bool:
        """The keys the footer offers for this run: no "diff" on a run that is no replay, no
        "cancel" on one that has ended."""
        run = self.run
        if run is None:
            return action in ("timeline", "search")
        status = str(run.status)
        step = self.selected_step()
        match action:
            case "cancel_run":
                return not run.terminal
            case "where":
                return status == "running"
            case "replay_run" | "edit_replay":
                return run.terminal
            case "replay_from_step":
                return run.terminal and bool(run.steps)
            case "retry_now":
                going = run.failed_attempts > 0 and status == "running"
                job = self.later_delivery
                return (
                    (status in ("queued", "delayed", "throttled") and not self.held_by_key)
                    or going
                    or (job is not None and not job.state.terminal)
                )
            case "open_child":
                return step is not None and step.child_run_id is not None
            case "open_source" | "diff":
                return run.replay_of is not None
            case "open_later":
                return self.later_delivery is not None or bool(self.replays)
            case "open_parent":
                return run.parent_run_id is not None
            case "send_event":
                return event_wait(run) is not None
            case "open_holder":
                return self.why is not None and bool(self.why.holders)
            case "timeline":
                return bool(run.steps)
        return True

    # ---- search and fold -------------------------------------------------------------------
    def action_search(self) -> None:
        box = self.query_one(FilterInput)
        box.value = self.search
        box.open()

    def on_input_changed(self, event: FilterInput.Changed) -> None:
        self.search = event.value.strip()
        self.render_step()

    def on_filter_input_done(self, event: FilterInput.Done) -> None:
        self.search = event.value.strip()
        self.render_step()
        self.query_one(StepRail).focus()

    def clear_filter(self) -> bool:
        if not self.search:
            return False
        self.query_one(FilterInput).action_drop()
        return True

    def action_unfold(self) -> None:
        self.unfolded = not self.unfolded
        output = self.query_one("#step-output", JsonView)
        if not (self.unfolded and output.folded):
            self.render_step()
            return
        # Drawing up to 2,000 lines holds the screen for a while (about half a second): say
        # so first, and draw them once that is on screen.
        self.query_one("#output-title", Static).update(
            Text.assemble("output", ("  unfolding…", "bold khaki1"))
        )
        self.call_after_refresh(self.render_step)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.action_open_child()

    def engine_changed(self, changes: Changes) -> None:
        if self.run_id in changes.runs or changes.everything:
            self.request_reload()

    def tick(self) -> None:
        if self.run is not None and not self.run.terminal:
            self.render_run()  # countdowns and running durations

    # ---- actions ---------------------------------------------------------------------------
    def action_cancel_run(self) -> None:
        self.confirm_cancel(self.run, self.orphaned)

    async def action_replay_run(self) -> None:
        await self.blok.replay(self.run_id)

    async def action_replay_from_step(self) -> None:
        step = self.selected_step()
        if step is None:
            self.notify("this run has no steps to replay from", severity="warning")
            return
        if step.tags and step.tags[0].startswith("mw:"):
            self.notify(
                f"{step.name} is a middleware step: replay from a step of the workflow",
                severity="warning",
            )
            return
        top = self.top_step(step)
        await self.blok.replay(self.run_id, from_step=top.name, title="Replayed from a step")

    def action_copy_id(self) -> None:
        self.blok.copy_id(self.run_id)

    def action_diff(self) -> None:
        if self.run is not None and self.run.replay_of:
            self.app.push_screen(DiffScreen(self.run_id))
        else:
            self.notify("this run is not a replay: open a replay to compare it", severity="warning")

    def action_timeline(self) -> None:
        self.app.push_screen(TimelineScreen(self.run_id))

    def action_edit_replay(self) -> None:
        if self.run is not None:
            self.blok.edit_and_replay(self.run)

    def action_where(self) -> None:
        self.blok.ask_where(self.run_id)

    async def action_retry_now(self) -> None:
        if await self.blok.retry_now(self.run_id):
            self.request_reload()

    def action_open_child(self) -> None:
        step = self.selected_step()
        if step is not None and step.child_run_id:
            self.blok.open_run(step.child_run_id)
        elif step is not None and step.kind == "subworkflow":
            self.notify(f"{step.name} has not dispatched its child run yet", severity="warning")

    def action_send_event(self) -> None:
        run = self.run
        if run is None:
            return
        if run.terminal:
            self.notify(
                f"run {run.id} has ended ({run.status}): no event reaches it", severity="warning"
            )
            return
        parked = event_wait(run)
        wanted = parked.input if parked is not None and isinstance(parked.input, dict) else {}

        def sent(run_id: str | None) -> None:
            if not run_id:
                return
            fate = modal.sent
            if fate is None or fate.outcome is EventOutcome.DELIVERED:
                self.notify(f"run {run_id} gets it", title="Event sent")
            else:  # kept: the run waits for something else now, maybe a typo
                unawaited = never_awaited(fate)
                self.notify(
                    f"{fate.event} {event_fate(fate)}" + (f"\n{unawaited}" if unawaited else ""),
                    title="Event kept",
                    severity="warning",
                )
            self.request_reload()

        # The dialog covers the run's countdown: the moment its wait gives up goes in it.
        until = parked.wait_until if parked is not None else None
        modal = InjectScreen(
            self.engine,
            list(self.blok.queue_names),
            event_for=run,
            event=str(wanted.get("event", "")),
            note=f"its wait times out at {clock_time(until, self.blok.tz)}" if until else "",
        )
        self.app.push_screen(modal, sent)

    def action_open_holder(self) -> None:
        holders = self.why.holders if self.why is not None else ()
        if not holders:
            self.notify("no run holds what this run waits for", severity="warning")
            return
        run_id = holders[self.holder % len(holders)]
        self.holder += 1
        self.blok.open_run(run_id)

    def action_open_later(self) -> None:
        job = self.later_delivery
        if job is not None:
            self.blok.open_run(job.run_id)
        elif self.replays:
            self.blok.open_run(self.replays[0].id)
        else:
            self.notify(
                "nothing came after this run: its job did not go on, and it was not replayed",
                severity="warning",
            )

    def action_open_parent(self) -> None:
        if self.run is not None and self.run.parent_run_id:
            self.blok.open_run(self.run.parent_run_id)
        else:
            self.notify("this run is not a child of another run", severity="warning")

    def action_open_source(self) -> None:
        if self.run is not None and self.run.replay_of:
            self.blok.open_run(self.run.replay_of)
        else:
            self.notify("this run is not a replay", severity="warning")
