"""A yes/no question before a destructive action. y confirms; n or escape does not (enter
presses the focused button, which starts on the safe one)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
    ]

    def __init__(
        self, question: str, detail: str = "", *, confirm: str = "Yes", keep: str = "Keep it"
    ) -> None:
        """`confirm` and `keep` label the buttons: what y does, and what n leaves as it is
        ("Stay" for a quit, "Keep them" for many runs)."""
        super().__init__()
        self.question = question
        self.detail = detail
        self.confirm = confirm
        self.keep = keep

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog -danger"):
            yield Static(self.question, classes="question")
            if self.detail:
                yield Static(self.detail, classes="detail", markup=False)
            with Horizontal(classes="buttons"):
                yield Button(f"{self.confirm} (y)", variant="error", id="yes")
                yield Button(f"{self.keep} (n)", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
