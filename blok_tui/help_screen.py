"""The help screen, generated from the action registry: every key and `:` command, by view."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from . import actions
from .console import RUN_STATUS_LOOK


def help_text() -> Group:
    parts: list[RenderableType] = []
    for scope, title in actions.SCOPE_TITLES.items():
        entries = [a for a in actions.in_scope(scope) if a.key]
        if scope == actions.APP:
            entries = [actions.BACK, *entries]
        if not entries:
            continue
        table = Table(box=None, padding=(0, 2, 0, 0), show_header=False, expand=False)
        table.add_column(width=8, style="bold deep_sky_blue1", no_wrap=True)
        table.add_column(style="", no_wrap=False)
        if scope == actions.APP:  # no action of the registry: every list's own keys
            table.add_row("↑↓ j k", "Move in a list or a run's steps (pgup pgdn home end: by page)")
            table.add_row("tab", "The next pane")
        statuses = [e for e in entries if e.action.startswith("status(")]
        for entry in entries:
            if entry in statuses:
                if entry is statuses[0]:
                    flags = [n for n in actions.STATUS_FILTERS if n in actions.RUN_FLAGS]
                    names = " ".join(n for n in actions.STATUS_FILTERS if n not in flags)
                    table.add_row(
                        f"0-{len(statuses) - 1}",
                        f"Show runs by status: {names}; or {', '.join(flags)}",
                    )
                continue
            table.add_row(
                entry.key_display, entry.title + (" (asks first)" if entry.destructive else "")
            )
        parts.append(Text(title, style="bold underline"))
        parts.append(table)
        parts.append(Text(""))
    commands = Table(box=None, padding=(0, 2, 0, 0), show_header=False)
    commands.add_column(width=22, style="bold deep_sky_blue1", no_wrap=True)
    commands.add_column()
    for entry in actions.commands():
        commands.add_row(
            Text(f":{entry.command} {entry.args}".rstrip()), Text(entry.help or entry.title)
        )
    parts.append(Text("Commands (press :)", style="bold underline"))
    parts.append(commands)
    parts.append(
        Text(
            "\nctrl+p opens the command palette: every action above, searchable.\n"
            "ctrl+c quits as q does (asking first while runs are in flight); in a dialog it\n"
            "copies the selected text instead: esc closes the dialog.",
            style="dim",
        )
    )
    parts.append(Text("\nReading the views", style="bold underline"))
    legend = Text()
    for n, (status, (icon, style)) in enumerate(RUN_STATUS_LOOK.items()):
        legend.append("\n" if n == 6 else "   " if n else "")
        legend.append(f"{icon} {status.replace('_', ' ')}", style=style)
    parts.append(legend)
    parts.append(
        Text(
            "attempts 5 4✗ j2: 5 step attempts, 4 failed, the job's 2nd delivery\n"
            "rail ━━━╸──: time against the run's slowest step; 2/4: attempts of the budget;\n"
            "     cached, until HH:MM:SS (a wait), timed out (a limit hit)\n"
            "     ▾ iteration N / case / try / catch: nested steps under their parent;\n"
            "     … 35 more completed: iterations that ended well (enter shows them);\n"
            "     mw:<name> a middleware step; ↳ sub waits for a child run (enter opens it),\n"
            "     ↳ async dispatched one\n"
            "runs ● a marked row: C, R and D act on the marked rows, else on the whole filter"
        )
    )
    return Group(*parts)


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "close", "close"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog help"):
            yield Static("blok-tui — keys and commands", classes="question")
            with VerticalScroll():
                yield Static(help_text())

    def action_close(self) -> None:
        self.dismiss(None)
