"""The top line: where you are (breadcrumbs back to the queues view) and what you look at."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class Crumbs(Static):
    DEFAULT_CSS = """
    Crumbs { height: 1; background: $panel; color: $text; padding: 0 1; }
    """

    def show(self, title: str, trail: list[str], right: str = "") -> None:
        line = Text()
        line.append(title, style="bold")
        for crumb in trail:
            line.append("  ›  ", style="dim")
            line.append(crumb, style="bold" if crumb is trail[-1] else "")
        if right:
            width = max(0, self.size.width - 2 - line.cell_len - len(right))
            line.append(" " * max(2, width))
            line.append(right, style="dim")
        self.update(line)
