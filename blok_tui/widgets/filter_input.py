"""The `/` filter line: hidden until asked for; enter keeps the filter, escape drops it."""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Input


class FilterInput(Input):
    DEFAULT_CSS = """
    FilterInput { display: none; height: 1; border: none; padding: 0 1; background: $boost; }
    FilterInput:focus { border: none; }
    FilterInput.-open { display: block; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "drop", "clear filter", show=True),
    ]

    class Done(Message):
        """The operator finished editing (enter) or dropped the filter (escape)."""

        def __init__(self, value: str) -> None:
            super().__init__()
            self.value = value

    def __init__(self, placeholder: str = "filter…") -> None:
        super().__init__(placeholder=placeholder)
        self.cursor_blink = False

    def open(self) -> None:
        self.add_class("-open")
        self.focus()

    def action_drop(self) -> None:
        self.value = ""
        self.remove_class("-open")
        self.post_message(self.Done(""))

    async def action_submit(self) -> None:
        if not self.value:
            self.remove_class("-open")
        self.post_message(self.Done(self.value))
