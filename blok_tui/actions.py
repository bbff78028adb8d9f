"""The one registry of what an operator can do. Key bindings, the command palette, the `:`
command line and the help screen are all generated from it, so an action reachable one way
is reachable every way, and the help can never drift from the keys."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypedDict

from textual.binding import Binding, BindingType
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content

from engine.filters import MIN_STUCK_ENV, MIN_STUCK_S, NO_BASELINE_S, STUCK_FACTOR

# Where an action applies: the whole app, or one kind of view.
APP = "app"
QUEUES = "queues"
RUNS = "runs"
RUN = "run"
DEAD_LETTERS = "dead_letters"
WORKERS = "workers"
TIMELINE = "timeline"
LOGS = "logs"
DIFF = "diff"
SCHEDULES = "schedules"
SCOPE_TITLES = {
    APP: "Everywhere",
    QUEUES: "Queues view",
    RUNS: "Runs view",
    RUN: "Run view",
    DEAD_LETTERS: "Dead-letter view",
    WORKERS: "Workers view",
    TIMELINE: "Timeline view",
    LOGS: "Live log view",
    DIFF: "Replay diff view",
    SCHEDULES: "Schedules view",
}


@dataclass(frozen=True, slots=True)
class ConsoleAction:
    action: str  # the Textual action on the screen (or app, for APP scope) that carries it out
    title: str  # palette and help wording
    scope: str
    key: str | None = None
    label: str = ""  # footer label; empty: not in the footer
    command: str | None = None  # the `:` word that reaches it
    args: str = ""  # how the `:` word takes arguments, for the help
    help: str = ""
    destructive: bool = False  # asks for confirmation first
    palette: bool = True

    @property
    def key_display(self) -> str:
        if self.key is None:
            return ""
        names = {
            "slash": "/",
            "question_mark": "?",
            "colon": ":",
            "escape": "esc",
            "enter": "enter",
            "ctrl+p": "^p",
            "space": "space",
        }
        return ", ".join(names.get(k, k) for k in self.key.split(","))


STATUS_FILTERS: dict[str, tuple[str, ...]] = {
    "all": (),
    "running": ("running",),
    "waiting": ("waiting",),
    "queued": ("queued", "delayed", "throttled"),
    "failed": ("failed", "timed_out", "crashed"),
    "completed": ("completed",),
    "cancelled": ("cancelled",),
    # Not statuses but questions operators ask; RUN_FLAGS says what each one filters on.
    "retrying": (),
    "stuck": (),
}


class RunFlags(TypedDict, total=False):
    """What a flag filter asks of the runs, as `EngineAPI.runs` and `RunFilter.of` name it."""

    retrying: bool
    stuck: float


RUN_FLAGS: dict[str, RunFlags] = {
    "retrying": {"retrying": True},
    "stuck": {"stuck": STUCK_FACTOR},
}
FILTER_HELP = {
    "retrying": "still going, with a failed attempt behind them",
    "stuck": (
        f"running longer than {STUCK_FACTOR:g}× their workflow's median, and"
        f" {MIN_STUCK_S:g}s at least ({MIN_STUCK_ENV}; {NO_BASELINE_S / 60:g}m if none"
        " completed)"
    ),
}

ACTIONS: tuple[ConsoleAction, ...] = (
    # Everywhere.
    ConsoleAction(
        "command_line",
        "Command line",
        APP,
        "colon",
        "command",
        help="Type a command: :queues, :runs failed, :run <id>, :dlq <queue>, :inject, "
        ":pause <queue>, :workers",
    ),
    ConsoleAction(
        "help", "Help: every key and command", APP, "question_mark", "help", command="help"
    ),
    ConsoleAction(
        "inject",
        "Inject a job",
        APP,
        "i",
        "inject",
        command="inject",
        args="[queue]",
        help="Open the inject modal: queue, JSON payload, priority, delay",
    ),
    ConsoleAction(
        "open_injected",
        "Open the run just injected",
        APP,
        "O",
        "",
        help="After i and send: the new job's run",
    ),
    ConsoleAction(
        "show_queues", "Go to queues", APP, None, command="queues", help="The queues view"
    ),
    ConsoleAction(
        "show_runs",
        "Go to runs",
        APP,
        None,
        command="runs",
        args="[status|queue]",
        help="All runs, or those with a status (running, waiting, queued, failed, completed, "
        "cancelled), retrying, stuck, or on a queue; more words filter by text",
    ),
    ConsoleAction(
        "show_logs",
        "Live log lines of every run",
        APP,
        "L",
        "",
        command="logs",
        help="Every run's log lines as they come, searchable with /; enter opens the run",
    ),
    ConsoleAction(
        "show_workers",
        "Go to workers",
        APP,
        None,
        command="workers",
        help="The worker processes on this database: host, pid, heartbeat, alive",
    ),
    ConsoleAction(
        "show_schedules",
        "Go to schedules",
        APP,
        None,
        command="schedules",
        help="Every schedule: next fire (countdown), last fire, last run's status; pause, run now",
    ),
    ConsoleAction(
        "show_run",
        "Open a run by id",
        APP,
        None,
        command="run",
        args="<run id|prefix|job id>",
        palette=False,
    ),
    ConsoleAction(
        "show_dead_letters",
        "Dead letters of a queue",
        APP,
        None,
        command="dlq",
        args="<queue>",
        palette=False,
    ),
    ConsoleAction(
        "pause_queue",
        "Pause a queue",
        APP,
        None,
        command="pause",
        args="<queue>",
        palette=False,
        help="Claim nothing new from the queue; running jobs finish",
    ),
    ConsoleAction(
        "resume_queue", "Resume a queue", APP, None, command="resume", args="<queue>", palette=False
    ),
    ConsoleAction("quit", "Quit", APP, "q", "quit", command="quit"),
    # Queues view.
    ConsoleAction("open_queue", "Open the queue's runs", QUEUES, "enter", "runs", palette=False),
    ConsoleAction(
        "dead_letters", "Dead letters of the selected queue", QUEUES, "d", "dead letters"
    ),
    ConsoleAction(
        "toggle_pause", "Pause or resume the selected queue", QUEUES, "p", "pause/resume"
    ),
    ConsoleAction("filter", "Filter the queues", QUEUES, "slash", "filter"),
    # Runs view.
    ConsoleAction("open_run", "Open the selected run", RUNS, "enter", "open", palette=False),
    ConsoleAction("cancel_run", "Cancel the selected run", RUNS, "c", "cancel", destructive=True),
    ConsoleAction(
        "replay_run",
        "Replay the selected run",
        RUNS,
        "r",
        "replay",
        help="A new run with the same input; opens it",
    ),
    ConsoleAction(
        "filter",
        "Filter runs by text",
        RUNS,
        "slash",
        "filter",
        help="Matches run and job id, workflow, version, queue, status, error and input",
    ),
    ConsoleAction("cycle_status", "Next status filter", RUNS, "s", "status"),
    ConsoleAction(
        "copy_id",
        "Copy the selected run's full id",
        RUNS,
        "y",
        "",
        help="Ids show as their shortest unique prefix; y puts the whole id on the clipboard",
    ),
    *(
        ConsoleAction(
            f"status('{name}')",
            f"Show {name} runs",
            RUNS,
            str(n),
            "",
            help=FILTER_HELP.get(name) or ", ".join(statuses) or "every status",
        )
        for n, (name, statuses) in enumerate(STATUS_FILTERS.items())
    ),
    ConsoleAction(
        "toggle_mark",
        "Mark or unmark the selected run",
        RUNS,
        "space",
        "mark",
        help="Bulk actions act on the marked runs, else on every run the filter matches",
    ),
    ConsoleAction("clear_marks", "Unmark every run", RUNS, "u", "", palette=True),
    ConsoleAction(
        "bulk_cancel",
        "Cancel the marked runs (or all the filter matches), once per job",
        RUNS,
        "C",
        "",
        destructive=True,
    ),
    ConsoleAction(
        "bulk_replay",
        "Replay the marked runs (or all the filter matches), once per job",
        RUNS,
        "R",
        "",
        destructive=True,
        help="A job retried three times is replayed once (its newest run); a job that "
        "completed on a later delivery is left out",
    ),
    ConsoleAction(
        "bulk_requeue",
        "Requeue the dead jobs of the marked runs (or of all the filter matches)",
        RUNS,
        "D",
        "",
        destructive=True,
    ),
    ConsoleAction(
        "edit_replay",
        "Edit the input and replay the selected run",
        RUNS,
        "e",
        "",
        help="The input opens in the JSON editor; nothing is sent until it is valid",
    ),
    ConsoleAction(
        "retry_now",
        "Retry the selected run now",
        RUNS,
        "t",
        "",
        help="Skip the backoff before a step's next attempt, or start a delayed run now",
    ),
    ConsoleAction(
        "where",
        "Ask where the selected run's code is now",
        RUNS,
        "w",
        "",
        help="The worker running it answers, on any machine (with 8, the stuck runs: waiting "
        "on what?)",
    ),
    ConsoleAction(
        "open_later",
        "Open the run the selected run's job went on to",
        RUNS,
        "J",
        "",
        help="A failed run whose job was retried: the job's latest delivery (↻ in the then "
        "column says how it went)",
    ),
    ConsoleAction("first_page", "First run", RUNS, "g", "", palette=False),
    ConsoleAction("last_page", "Last (oldest) run", RUNS, "G", "", palette=False),
    # Run view.
    ConsoleAction("cancel_run", "Cancel this run", RUN, "c", "cancel", destructive=True),
    ConsoleAction(
        "replay_run",
        "Replay this run",
        RUN,
        "r",
        "replay",
        help="A new run with the same input; opens it",
    ),
    ConsoleAction(
        "replay_from_step",
        "Replay from this step",
        RUN,
        "f",
        "from step",
        help="A new run: the steps before this one are reused (cached) from this run",
    ),
    ConsoleAction(
        "edit_replay",
        "Edit the input and replay this run",
        RUN,
        "e",
        "edit+replay",
        help="The input opens in the JSON editor; nothing is sent until it is valid",
    ),
    ConsoleAction(
        "retry_now",
        "Retry this run now",
        RUN,
        "t",
        "retry now",
        help="Skip the backoff before a step's next attempt, or start a delayed run now",
    ),
    ConsoleAction(
        "where",
        "Ask where this run's code is now",
        RUN,
        "w",
        "where",
        help="The worker running it answers, on any machine: the line of your code each "
        "running step is at (a stuck run: waiting on what?); the answer lands in the run's log",
    ),
    ConsoleAction(
        "open_child",
        "Open the child run of this subworkflow step",
        RUN,
        "enter",
        "child run",
        palette=False,
    ),
    ConsoleAction("open_source", "Open the run this one replays", RUN, "o", "source"),
    ConsoleAction(
        "open_later",
        "Open the run that came after this one",
        RUN,
        "J",
        "later run",
        help="Its job's latest delivery when the job was retried after it, else its newest replay",
    ),
    ConsoleAction("copy_id", "Copy this run's full id", RUN, "y", ""),
    ConsoleAction(
        "diff",
        "Diff this replay against the run it replays",
        RUN,
        "D",
        "diff",
        help="Input, status, duration, and each step's status, duration and output side by side",
    ),
    ConsoleAction(
        "timeline",
        "The run's timeline",
        RUN,
        "T",
        "timeline",
        help="Queue delay, every step and attempt on one time axis, backoffs and waits",
    ),
    ConsoleAction(
        "search",
        "Search the step's input, output and log",
        RUN,
        "slash",
        "search",
        help="Only the matching lines show, with their line numbers; esc clears the search",
    ),
    ConsoleAction(
        "unfold",
        "Unfold or fold the step's output",
        RUN,
        "z",
        "",
        help="A large output shows its first 40 lines until unfolded",
    ),
    ConsoleAction("open_parent", "Open the parent run", RUN, "p", "parent"),
    ConsoleAction(
        "send_event",
        "Send an event to this run",
        RUN,
        "s",
        "send event",
        help="The event's name and JSON payload: a wait.for_event in the run takes it",
    ),
    ConsoleAction(
        "open_holder",
        "Open a run holding what this one waits for",
        RUN,
        "h",
        "holder",
        help="A run in the concurrency slots or the rate-limit window this run waits for; "
        "again for the next",
    ),
    # Timeline view.
    ConsoleAction(
        "every_step",
        "Show every iteration, or fold them again",
        TIMELINE,
        "a",
        "all iterations",
        help="A long for_each shows its first and last iterations and those that did not end "
        "well; the rest in one row, over the time they took",
    ),
    # Schedules view.
    ConsoleAction(
        "toggle_schedule",
        "Pause or resume the selected schedule",
        SCHEDULES,
        "p",
        "pause/resume",
        help="Shared by every process; on resume the paused ticks are not caught up",
    ),
    ConsoleAction(
        "run_schedule",
        "Run the selected schedule now",
        SCHEDULES,
        "n",
        "run now",
        help="One run with the schedule's payload, now; its ticks are untouched",
    ),
    ConsoleAction(
        "open_last_run",
        "Open the schedule's last run",
        SCHEDULES,
        "enter",
        "last run",
        palette=False,
    ),
    # Dead-letter view.
    ConsoleAction(
        "requeue",
        "Requeue the selected dead letter",
        DEAD_LETTERS,
        "r",
        "requeue",
        help="Back in its queue with a fresh run",
    ),
    ConsoleAction(
        "discard",
        "Discard the selected dead letter",
        DEAD_LETTERS,
        "x",
        "discard",
        destructive=True,
        help="Out of the dead-letter queue for good: cancelled, its runs kept until retention",
    ),
    ConsoleAction(
        "open_job_run",
        "Open the dead job's last run",
        DEAD_LETTERS,
        "enter",
        "open run",
        palette=False,
    ),
    ConsoleAction("filter", "Filter dead letters", DEAD_LETTERS, "slash", "filter"),
    ConsoleAction("first_row", "First (newest) dead letter", DEAD_LETTERS, "g", "", palette=False),
    ConsoleAction("last_row", "Last (oldest) dead letter", DEAD_LETTERS, "G", "", palette=False),
    ConsoleAction("filter", "Filter log lines", LOGS, "slash", "filter"),
    ConsoleAction("open_line_run", "Open the line's run", LOGS, "enter", "open run", palette=False),
    ConsoleAction(
        "requeue_all",
        "Requeue every dead letter of this queue",
        DEAD_LETTERS,
        "A",
        "requeue all",
        destructive=True,
    ),
    ConsoleAction(
        "discard_all",
        "Discard every dead letter of this queue",
        DEAD_LETTERS,
        "X",
        "discard all",
        destructive=True,
    ),
)

# Every view can go back along its breadcrumbs.
BACK = ConsoleAction("back", "Back", APP, "escape", "back", palette=False)


def in_scope(scope: str) -> list[ConsoleAction]:
    return [a for a in ACTIONS if a.scope == scope]


def bindings(scope: str) -> list[BindingType]:
    """The key bindings of a scope, for the BINDINGS of the screen (or app) that owns them
    (typed as Textual types BINDINGS, so the list can be assigned to it as it is); and, for a
    view, a hidden one for each letter or digit another view binds, that says where it acts."""
    own: list[BindingType] = [
        Binding(a.key, a.action, a.label or a.title, show=bool(a.label), key_display=None)
        for a in in_scope(scope)
        if a.key is not None
    ]
    if scope == APP:
        return own
    return own + [
        Binding(key, f"key_elsewhere({key!r})", show=False) for key in sorted(_elsewhere(scope))
    ]


def _keys(action: ConsoleAction) -> list[str]:
    return action.key.split(",") if action.key else []


def _elsewhere(scope: str) -> set[str]:
    """The letters and digits other views bind that neither this view nor the app does: `8`
    typed in the queues view did nothing, and the operator could not tell why."""
    taken = {key for a in ACTIONS if a.scope in (scope, APP) for key in _keys(a)}
    return {key for a in ACTIONS for key in _keys(a) if len(key) == 1 and key not in taken}


def where_key_acts(key: str, scope: str) -> str:
    """What `key` does in the views where it does something, for one typed where it does not."""
    acts = [
        f"{SCOPE_TITLES[a.scope]}: {a.title[0].lower()}{a.title[1:]}"
        for a in ACTIONS
        if key in _keys(a)
    ]
    here = SCOPE_TITLES.get(scope, "this view")
    return f"{key} does nothing in the {here}. " + "; ".join(acts) + " (? lists every key)"


def by_command(word: str) -> ConsoleAction | None:
    for action in ACTIONS:
        if action.command == word:
            return action
    return None


def commands() -> list[ConsoleAction]:
    return [a for a in ACTIONS if a.command is not None]


# ---- the command palette ---------------------------------------------------------------------
class ActionCommands(Provider):
    """ctrl+p: the registry's actions for the current view and everywhere, plus one entry per
    queue (its runs, dead letters, inject, pause) and per status filter."""

    def _entries(self) -> list[tuple[str, str, str, Callable[[], Any]]]:
        """(title, key, help, command) for each entry, each title once."""
        screen = self.screen
        app: Any = self.app
        scope = getattr(screen, "SCOPE", None)
        found: list[tuple[str, str, str, Callable[[], Any]]] = []
        for entry in ACTIONS:
            if not entry.palette:
                continue
            if entry.scope == scope:
                target = screen
            elif entry.scope == APP:
                target = app
            else:
                continue
            found.append(
                (
                    entry.title,
                    entry.key_display,
                    entry.help,
                    partial(target.run_action, entry.action),
                )
            )
        if scope != RUNS:  # in the runs view, its own "Show … runs" entries say the same
            for name in STATUS_FILTERS:
                if name != "all":
                    found.append(
                        (f"Runs: {name}", "", "", partial(app.open_runs, status=name, reset=True))
                    )
        for queue in getattr(app, "queue_names", []):
            found.append(
                (f"Runs on {queue}", "", "", partial(app.open_runs, queue=queue, reset=True))
            )
            found.append(
                (f"Dead letters of {queue}", "", "", partial(app.open_dead_letters, queue))
            )
            found.append((f"Inject into {queue}", "", "", partial(app.action_inject, queue)))
            found.append((f"Pause {queue}", "", "", partial(app.set_paused, queue, True)))
            found.append((f"Resume {queue}", "", "", partial(app.set_paused, queue, False)))
        unique: dict[str, tuple[str, str, str, Callable[[], Any]]] = {}
        for item in found:
            unique.setdefault(item[0], item)
        return list(unique.values())

    async def discover(self) -> Hits:
        for title, key, help_text, command in self._entries():
            yield DiscoveryHit(
                _with_key(Content(title), key), command, help=help_text or None, text=title
            )

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, key, help_text, command in self._entries():
            score = matcher.match(title)
            if score > 0:
                shown = _with_key(matcher.highlight(title), key)
                yield Hit(score, shown, command, text=title, help=help_text or None)


def _with_key(title: Content, key: str) -> Content:
    """The title, then its key, dimmed: what the palette teaches for next time. (A Content,
    not a string: "[c]" in a string would be read as markup and vanish.)"""
    if not key:
        return title
    return Content.assemble(title, ("  " + key, "dim bold"))
