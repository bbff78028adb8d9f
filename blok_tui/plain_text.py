"""Plain text for the command line's tables and `blok-tui show`: no Textual, no colour, the same
in a terminal and in a file."""

from __future__ import annotations

from collections.abc import Sequence

MESSAGE_KEPT = 16  # cells of an error's message a cut that keeps its place leaves at least


def one_line_keeping_where(text: str, width: int) -> str:
    """`one_line`, but an error's place at its end ("(at workflows/pay.py:12)") is kept whole,
    and the message before it cut: the place is what an operator scans a list of failures
    for, and a cut at the end took it first. Where the place would leave the message fewer
    than `MESSAGE_KEPT` cells, the end is cut as anywhere else."""
    line = " ".join(text.split())
    head, sep, place = line.rpartition(" (at ")
    if not sep or not place.endswith(")") or len(place) + 5 + MESSAGE_KEPT > width:
        return one_line(line, width)
    tail = f" (at {place}"
    return one_line(head, width - len(tail)) + tail


def one_line(text: str, width: int) -> str:
    """`text` on one line (its runs of whitespace, line breaks included, made one space), cut
    to `width` terminal cells with an ellipsis: a run's error in a table cell. A CJK character
    or an emoji takes two cells, so a cut by characters made such a cell twice as wide."""
    from rich.cells import cell_len, set_cell_size  # here: `blok-tui --version` needs no table

    line = " ".join(text.split())
    if cell_len(line) <= width:
        return line
    return set_cell_size(line, width - 1).rstrip() + "…"


def columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """The rows (a header first) as lines of left-aligned columns two spaces apart, each as
    wide as its widest cell, with no trailing spaces. Widths are in terminal cells, not
    characters: a CJK character or an emoji takes two (`str.ljust` counted one, and the
    columns after such a cell came out of line)."""
    from rich.cells import cell_len  # here: `blok-tui --version` needs no table

    sized = [[(cell, cell_len(cell)) for cell in row] for row in rows]
    widths = [max(row[i][1] for row in sized) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell + " " * (width - length) for (cell, length), width in zip(row, widths, strict=True)
        ).rstrip()
        for row in sized
    ]
