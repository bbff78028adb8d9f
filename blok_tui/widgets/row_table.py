"""A keyed table that redraws only the rows that changed, and fits its columns to its width.

Textual's DataTable keys its render caches on one update counter: changing one cell re-renders
every visible cell, which under a live stream of runs cost most of a core. Here each row is
rendered once into a Strip and kept until that row changes; an update refreshes only its own
line. Columns have a priority: when the table is too narrow for all of them, the least
important go first (never a horizontal scroll bar), and one flexible column takes the room
left over on a wide terminal.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from rich.console import Console, JustifyMethod
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ..plain_text import one_line_keeping_where

GAP = 1  # spaces between columns


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    label: str
    width: int
    priority: int = 0  # higher stays longer when the width runs out
    flex: bool = False  # takes the width left over (one column at most is sensible)
    justify: JustifyMethod = "left"
    # An error's column: a cut keeps its place at the end ("(at workflows/pay.py:12)"),
    # what an operator scans a list of failures for, and cuts the message before it.
    keeps_place: bool = False


Cells = Sequence[Text | str]


class RowTable(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    RowTable { height: 1fr; scrollbar-size-vertical: 1; overflow-x: hidden; }
    RowTable > .row-table--header { text-style: bold; color: $text-muted; background: $surface; }
    RowTable > .row-table--odd { background: $surface 40%; }
    RowTable > .row-table--cursor { background: $block-cursor-blurred-background; }
    RowTable:focus > .row-table--cursor {
        background: $block-cursor-background; text-style: bold;
    }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "row-table--header",
        "row-table--odd",
        "row-table--cursor",
    }
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "cursor(-1)", "up", show=False),
        Binding("down,j", "cursor(1)", "down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("home", "edge(0)", "first", show=False),
        Binding("end", "edge(1)", "last", show=False),
        Binding("enter", "select", "select", show=False),
    ]

    class Highlighted(Message):
        """The cursor moved onto the row `key` (at `row`)."""

        def __init__(self, table: RowTable, key: str, row: int) -> None:
            super().__init__()
            self.table = table
            self.key = key
            self.row = row

        @property
        def control(self) -> RowTable:
            return self.table

    class Selected(Highlighted):
        """Enter (or a click on the highlighted row) on the row `key`."""

    def __init__(self, columns: Iterable[Column], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.columns = list(columns)
        self.keys: list[str] = []
        self._cells: dict[str, list[Text]] = {}
        self._strips: dict[str, Strip] = {}  # rendered rows, without cursor or stripe
        self._layout: list[tuple[Column, int]] = []  # the columns shown, with their widths
        self._layout_width = -1
        self.cursor_row = 0
        self.hidden: frozenset[str] = frozenset()  # columns with nothing to show just now

    def fit_column(self, key: str, width: int) -> None:
        """Make the column `key` `width` wide (at least its declared width): for ids whose
        shortest unique prefix grows with how close together they were made."""
        for n, column in enumerate(self.columns):
            if column.key == key and column.width != width:
                self.columns[n] = replace(column, width=width)
                self._layout_width = -1  # lay out again at the next draw
                self._strips.clear()
                self.refresh()

    def hide_columns(self, keys: Iterable[str]) -> None:
        """Leave these columns out (their room goes to the others) until hidden no more: for
        a column that is empty on every row shown."""
        hidden = frozenset(keys)
        if hidden != self.hidden:
            self.hidden = hidden
            self._layout_width = -1  # lay out again at the next draw
            self._strips.clear()
            self.refresh()

    # ---- columns -------------------------------------------------------------------------
    def fit_columns(self, width: int) -> list[tuple[Column, int]]:
        """The columns that fit in `width`, most important kept, in their order."""
        shown = [c for c in self.columns if c.key not in self.hidden]

        def used(columns: list[Column]) -> int:
            return sum(c.width for c in columns) + GAP * max(0, len(columns) - 1) + 1

        while len(shown) > 1 and used(shown) > width:
            shown.remove(min(shown, key=lambda c: (c.priority, -self.columns.index(c))))
        spare = max(0, width - used(shown))
        flex = next((c for c in shown if c.flex), None)
        return [(c, c.width + (spare if c is flex else 0)) for c in shown]

    @property
    def shown_columns(self) -> list[str]:
        return [column.key for column, _ in self._layout]

    def _relayout(self) -> None:
        width = self.scrollable_content_region.width
        if width != self._layout_width:
            self._layout_width = width
            self._layout = self.fit_columns(width)
            self._strips.clear()

    def on_resize(self) -> None:
        self._relayout()
        self.refresh()

    # ---- rows ----------------------------------------------------------------------------
    @property
    def row_count(self) -> int:
        return len(self.keys)

    @property
    def cursor_key(self) -> str | None:
        if not self.keys:
            return None
        return self.keys[min(self.cursor_row, len(self.keys) - 1)]

    def cell(self, key: str, column: str) -> Text:
        index = next(n for n, c in enumerate(self.columns) if c.key == column)
        return self._cells[key][index]

    def set_rows(self, rows: Sequence[tuple[str, Cells]]) -> None:
        """Show exactly these rows, in this order. Rows whose cells did not change are not
        redrawn; the cursor stays on its row's key when that row is still there."""
        keys = [key for key, _ in rows]
        changed: list[str] = []
        for key, cells in rows:
            texts = _texts(cells)
            if not _same(self._cells.get(key), texts):
                self._cells[key] = texts
                self._strips.pop(key, None)
                changed.append(key)
        if keys == self.keys:
            for key in changed:
                self._refresh_row(self.keys.index(key))
            return
        cursor_key = self.cursor_key
        for gone in set(self.keys) - set(keys):
            self._cells.pop(gone, None)
            self._strips.pop(gone, None)
        self.keys = keys
        self.virtual_size = Size(0, len(keys) + 1)
        if cursor_key is not None and cursor_key in keys:
            self.cursor_row = keys.index(cursor_key)
        else:
            self.cursor_row = min(self.cursor_row, max(0, len(keys) - 1))
        self.refresh()
        self._scroll_to_cursor()
        if keys and self.cursor_key != cursor_key:
            self._announce()

    def update_row(self, key: str, cells: Cells) -> None:
        if key not in self._cells:
            return
        texts = _texts(cells)
        if not _same(self._cells[key], texts):
            self._cells[key] = texts
            self._strips.pop(key, None)
            self._refresh_row(self.keys.index(key))

    def clear(self) -> None:
        self.set_rows([])

    def _refresh_row(self, row: int) -> None:
        # Line 0 of the widget is the header; rows follow it.
        self.refresh(Region(0, row + 1 - self.scroll_offset.y, self.size.width, 1))

    # ---- cursor --------------------------------------------------------------------------
    def move_cursor(self, row: int, *, announce: bool = True) -> None:
        if not self.keys:
            return
        row = max(0, min(row, len(self.keys) - 1))
        if row == self.cursor_row:
            return
        old, self.cursor_row = self.cursor_row, row
        self._refresh_row(old)
        self._refresh_row(row)
        self._scroll_to_cursor()
        if announce:
            self._announce()

    def _announce(self) -> None:
        key = self.cursor_key
        if key is not None:
            self.post_message(self.Highlighted(self, key, self.cursor_row))

    def _scroll_to_cursor(self) -> None:
        body = max(1, self.scrollable_content_region.height - 1)
        top = round(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + body:
            self.scroll_to(y=self.cursor_row - body + 1, animate=False)

    def action_cursor(self, delta: int) -> None:
        self.move_cursor(self.cursor_row + delta)

    def action_page(self, direction: int) -> None:
        body = max(1, self.scrollable_content_region.height - 1)
        self.move_cursor(self.cursor_row + direction * body)

    def action_edge(self, end: int) -> None:
        self.move_cursor(len(self.keys) - 1 if end else 0)

    def action_select(self) -> None:
        key = self.cursor_key
        if key is not None:
            self.post_message(self.Selected(self, key, self.cursor_row))

    def on_click(self, event: events.Click) -> None:
        if event.y < 1:
            return
        row = round(self.scroll_y) + event.y - 1
        if row >= len(self.keys):
            return
        if row == self.cursor_row or event.chain > 1:
            self.move_cursor(row)
            self.action_select()
        else:
            self.move_cursor(row)

    # ---- drawing -------------------------------------------------------------------------
    def _row_strip(self, key: str, console: Console) -> Strip:
        strip = self._strips.get(key)
        if strip is None:
            strip = self._render_cells(self._cells[key], console)
            self._strips[key] = strip
        return strip

    def _render_cells(self, cells: Sequence[Text], console: Console) -> Strip:
        line = Text(" ", end="", no_wrap=True)
        for n, (column, width) in enumerate(self._layout):
            index = self.columns.index(column)
            cell = cells[index].copy() if index < len(cells) else Text("")
            cell.end = ""
            justify = cell.justify or column.justify
            if column.keeps_place and cell.cell_len > width:
                cell = Text(one_line_keeping_where(cell.plain, width), style=cell.style, end="")
            cell.truncate(width, overflow="ellipsis")
            pad = width - cell.cell_len
            if justify == "right":
                cell.pad_left(pad)
            else:
                cell.pad_right(pad)
            if n:
                line.append(" " * GAP)
            line.append_text(cell)
        segments = list(line.render(console))
        return Strip(segments).adjust_cell_length(self.scrollable_content_region.width)

    def _header_strip(self, console: Console) -> Strip:
        cells = [Text(column.label, justify=column.justify) for column in self.columns]
        strip = self._render_cells(cells, console)
        return strip.apply_style(self.get_component_rich_style("row-table--header"))

    def render_line(self, y: int) -> Strip:
        self._relayout()
        console = self.app.console
        width = self.scrollable_content_region.width
        if y == 0:
            return self._header_strip(console)
        row = round(self.scroll_y) + y - 1
        if row >= len(self.keys):
            return Strip([Segment(" " * width, self.rich_style)])
        strip = self._row_strip(self.keys[row], console)
        base: Style = self.rich_style
        if row == self.cursor_row:
            base = base + self.get_component_rich_style("row-table--cursor")
        elif row % 2:
            base = base + self.get_component_rich_style("row-table--odd")
        return strip.apply_style(base)


def _texts(cells: Cells) -> list[Text]:
    return [cell if isinstance(cell, Text) else Text(cell) for cell in cells]


def _same(old: list[Text] | None, new: list[Text]) -> bool:
    """Equal as drawn: Text's own == ignores the base style and justification."""
    if old is None or len(old) != len(new):
        return False
    return all(
        a.plain == b.plain and a.style == b.style and a.spans == b.spans and a.justify == b.justify
        for a, b in zip(old, new, strict=True)
    )
