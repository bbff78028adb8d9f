"""The bottom line: the view's keys from the action registry, as many as fit, with `? help`
and the palette always at the right end, so an 80-column terminal never cuts the way to the
rest. Each key is a link: a click runs its action."""

from __future__ import annotations

from collections.abc import Sequence

from rich.style import Style
from rich.text import Text
from textual.widgets import Static

# (key as shown, label, action as Textual spells it: "screen.cancel_run", "app.help")
Key = tuple[str, str, str]


class KeyBar(Static):
    DEFAULT_CSS = """
    KeyBar { dock: bottom; height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[Key] = []
        self.pinned: list[Key] = []

    def show(self, keys: Sequence[Key], pinned: Sequence[Key]) -> None:
        if list(keys) == self.keys and list(pinned) == self.pinned and self.size.width:
            return  # the run view asks at every redraw: nothing to draw when nothing changed
        self.keys, self.pinned = list(keys), list(pinned)
        self.render_keys()

    def on_resize(self) -> None:
        self.render_keys()

    def render_keys(self) -> None:
        width = self.size.width - 2 if self.size.width else 78
        right = Text()
        for key in self.pinned:
            right.append_text(_key(*key))
        left = Text()
        for key in self.keys:
            part = _key(*key)
            if left.cell_len + part.cell_len + right.cell_len > width:
                break
            left.append_text(part)
        gap = max(0, width - left.cell_len - right.cell_len)
        self.update(Text.assemble(left, " " * gap, right), layout=False)


def _key(key: str, label: str, action: str) -> Text:
    link = Style(meta={"@click": action})
    text = Text()
    text.append(f"{key} ", style=Style(bold=True, color="orange1") + link)
    text.append(f"{label}  ", style=link)
    return text
