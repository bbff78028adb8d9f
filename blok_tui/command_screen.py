"""The k9s-style `:` command line, at the bottom of the screen, with completion."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Input, Static

from . import actions


class CommandScreen(ModalScreen[str | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "close", "close")]

    def __init__(self, words: list[str]) -> None:
        super().__init__()
        self.words = words

    def compose(self) -> ComposeResult:
        suggestions = [f"{a.command}" for a in actions.commands()] + self.words
        line = Input(
            placeholder="queues · runs failed · run <id> · dlq <queue> · inject · pause <queue> · help",
            suggester=SuggestFromList(suggestions, case_sensitive=False),
            id="command",
        )
        line.cursor_blink = False
        with Horizontal(id="command-bar"):
            yield Static(":", id="prompt")
            yield line

    def on_mount(self) -> None:
        # Focused here, at once: `Input.focus()` would wait for a turn of the app's queue,
        # behind the keys typed right after `:`.
        self.set_focus(self.query_one("#command", Input))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_close(self) -> None:
        self.dismiss(None)
