"""The top line: where you are (breadcrumbs back to the queues view) and what you look at."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class Crumbs(Static):
    DEFAULT_CSS = """
    Crumbs { height: 1; background: $panel; color: $text; padding: 0 1; }
    """

    def show(self, title: str, trail: list[str], right: str = "") -> None:
        """On a narrow terminal the title goes first, then what is on the right, then the
        oldest crumbs: where you are now is the last thing to go."""
        room = (self.size.width or 80) - 2
        crumbs = list(trail)

        def line_of(title: str, crumbs: list[str]) -> Text:
            line = Text()
            if title:
                line.append(title, style="bold")
            elif len(crumbs) < len(trail):
                line.append("…", style="dim")
            for n, crumb in enumerate(crumbs):
                if n or title or len(crumbs) < len(trail):
                    line.append("  ›  " if room >= 100 else " › ", style="dim")
                line.append(crumb, style="bold" if n == len(crumbs) - 1 else "")
            return line

        line = line_of(title, crumbs)
        if line.cell_len + len(right) + 2 > room:
            line = line_of("", crumbs)
        while line.cell_len > room and len(crumbs) > 1:
            crumbs.pop(0)
            line = line_of("", crumbs)
        if right and line.cell_len + len(right) + 2 <= room:
            line.append(" " * (room - line.cell_len - len(right)))
            line.append(right, style="dim")
        self.update(line)
