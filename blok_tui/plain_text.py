"""Plain text for the command line's tables and `blok-tui show`: no Textual, no colour, the same
in a terminal and in a file."""

from __future__ import annotations

import re
from collections.abc import Sequence

# The notes the engine ends a step's error with: "(at workflows/shop.py:14, after 3 attempts)",
# "(stopped at workflows/shop.py:14)" for a step whose time ran out.
PLACE = re.compile(r" \((?:at|stopped at) [^()]*\)$")
FOLDERS = re.compile(r"(?<=at )[^\s,()]*/(?=[^/\s,()]+:\d+)")  # a place's folders, to cut
MESSAGE_KEPT = 16  # cells of an error's message a cut that keeps its place leaves at least
# How the engine opens a step's error: "[step 2/5] charge failed: " ("[step 1/1] each[2/3] ›
# check failed: ", "[step 2/2] render: " for a crash). A list of errors says "charge: ": the
# step's name is what tells failures apart; its number and "failed" (the status beside it
# says so) took a third of a narrow column. Every line of a list alike, cut or not.
STEP_OPENING = re.compile(r"^\[step \d+/\d+\] (?:([^:]+?) failed: )?")
# Characters shown of one line of a run's value, error or log message. A step that returned a
# 20 MB string, or raised an error that quoted a response body, is one such line: the console
# laid out every cell of it, frozen at full CPU for good, and a worker's log took it whole.
LINE_CHARS = 2_000
WHOLE = "blok-tui show --json has them"


def typed_duration(error: ValueError) -> str:
    """The engine's word on a bad duration typed in (a command line, the inject form), without
    what only Python can give ("or a timedelta")."""
    return str(error).replace(", or a timedelta", "")


def cut_line(line: str, more: str = WHOLE) -> str:
    """The line's first LINE_CHARS characters, then how many more there are (and `more`)."""
    if len(line) <= LINE_CHARS:
        return line
    return f"{line[:LINE_CHARS]}… ({len(line) - LINE_CHARS:,} more characters{more and ': '}{more})"


def cut_lines(text: str, more: str = WHOLE) -> str:
    """`text` with each line cut to LINE_CHARS (`cut_line`)."""
    if len(text) <= LINE_CHARS:
        return text
    return "\n".join(cut_line(line, more) for line in text.split("\n"))


def one_line_keeping_where(text: str, width: int) -> str:
    """`one_line`, but an error's place at its end ("(at workflows/pay.py:12)") is kept whole,
    its opening shortened (`STEP_OPENING`), and the message before the place cut: the place
    is what an operator scans a list of failures for, and a cut at the end took it first.
    The message keeps at least half the width (and `MESSAGE_KEPT` cells): where the place
    would take more, its folders go ("(at …/pay.py:12)"), and where it still would, the end
    is cut as anywhere else."""
    from rich.cells import cell_len  # here: `blok-tui --version` needs no table

    text = opening_and_end(text, width)
    line = STEP_OPENING.sub(lambda m: f"{m[1]}: " if m[1] else "", " ".join(text.split()), 1)
    found = PLACE.search(line)
    if cell_len(line) <= width or found is None:
        return one_line(line, width)
    kept = max(MESSAGE_KEPT, width // 2)
    place = found[0]
    if len(place) + kept > width:
        place = FOLDERS.sub("…/", place)
    if len(place) + kept > width:
        return one_line(line, width)
    return one_line(line[: found.start()], width - len(place)) + place


def one_line(text: str, width: int) -> str:
    """`text` on one line (its runs of whitespace, line breaks included, made one space), cut
    to `width` terminal cells with an ellipsis: a run's error in a table cell. A CJK character
    or an emoji takes two cells, so a cut by characters made such a cell twice as wide."""
    from rich.cells import cell_len, set_cell_size  # here: `blok-tui --version` needs no table

    cut = len(text) > _head(width)
    line = " ".join(text[: _head(width)].split())  # not the cells of a 5 MB error each refresh
    if not cut and cell_len(line) <= width:
        return line
    return set_cell_size(line, width - 1).rstrip() + "…"


def opening_and_end(text: str, width: int) -> str:
    """A text too long for any cut to `width` cells to read all of (a 5 MB error): its
    opening and its end (where an error says its place), all such a cut shows; else `text`."""
    head = _head(width)
    return f"{text[:head]} … {text[-head:]}" if len(text) > head * 2 else text


def _head(width: int) -> int:
    """Characters of a text enough to fill `width` cells, runs of whitespace made one aside:
    what a cut to `width` reads of a text that may be megabytes long."""
    return 4 * width + 64


def wrapped(line: str, width: int | None, hang: int) -> list[str]:
    """`line` over as many lines of a terminal `width` columns wide as it takes, broken between
    words, those after the first indented `hang` spaces (under the value its label opens,
    say); `width` None (a pipe, a file): the line as it is, for grep. The terminal's own wrap
    broke words anywhere and went back to the first column, under the labels. It counts
    characters, not cells: a line of CJK text may wrap a little late, as the terminal's own."""
    if width is None or len(line) <= width:
        return [line]
    import textwrap  # here: only a terminal's long lines need it

    hang = hang if hang <= width // 2 else 4  # a label as wide as the line leaves no room
    wrapper = textwrap.TextWrapper(
        width=width, subsequent_indent=" " * hang, break_on_hyphens=False
    )
    return wrapper.wrap(line) or [line]


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


def _widths(rows: Sequence[Sequence[str]]) -> list[int]:
    """Each column's width in terminal cells: its widest cell's."""
    from rich.cells import cell_len  # here: `blok-tui --version` needs no table

    return [max(cell_len(row[i]) for row in rows) for i in range(len(rows[0]))]


LAST_COLUMN_MIN = 30  # cells an error keeps where the other columns leave it less
LAST_COLUMN_LEAST = 12  # the same once `fit_table` has no column left to drop


def fit_last_column(
    rows: Sequence[Sequence[str]],
    width: int | None,
    whole: Sequence[bool] = (),
    least: int = LAST_COLUMN_MIN,
) -> list[list[str]]:
    """The rows (a header first) with their last cell, an error, cut for a terminal `width`
    cells wide to the room the other columns leave (at least `least` cells), as
    `one_line_keeping_where` cuts it; `width` None (a pipe, a file): on one line, whole, for
    grep. `whole[n]`: the nth row's cell (the header's is 0) is a note to read to its end, never
    cut. A fixed 60 cells, on a terminal of 150 whose other columns took 104, wrapped every
    row onto a second line."""
    room = 0
    if width is not None:
        others = sum(cells + 2 for cells in _widths(rows)[:-1])  # two spaces after each
        room = max(width - others, least)
    fitted = [list(rows[0])]
    for n, row in enumerate(rows[1:], start=1):
        last = " ".join(row[-1].split())
        if room and not (n < len(whole) and whole[n]):
            last = one_line_keeping_where(last, room)
        fitted.append([*row[:-1], last])
    return fitted


def fit_table(
    rows: Sequence[Sequence[str]],
    width: int | None,
    droppable: Sequence[int] = (),
    whole: Sequence[bool] = (),
    *,
    error_last: bool = True,
) -> tuple[list[list[str]], list[str]]:
    """`fit_last_column`, on a terminal too narrow for every column with its error's
    `LAST_COLUMN_MIN` cells (or all of a shorter error): the columns `droppable` (their
    indexes, the first to go first) go until the rest fits. Returns the rows and the headers
    of the columns that went, for a note of them. Into a pipe (`width` None) nothing goes.
    On 120 columns every row of `blok-tui runs` went on over a second line. `error_last`
    False: a table of short cells (counts, names), whose columns go until all of it fits,
    none of them cut."""
    from rich.cells import cell_len  # here: `blok-tui --version` needs no table

    kept = list(range(len(rows[0])))
    widths = _widths(rows)
    # The error's room: what its longest takes, up to LAST_COLUMN_MIN, and the header's width
    # at least (a table of runs with no error is as wide as "ERROR").
    error = min(max(cell_len(" ".join(row[-1].split())) for row in rows), LAST_COLUMN_MIN)

    def needed() -> int:
        if not error_last:  # every column as wide as it is, two spaces between them
            return sum(widths[i] + 2 for i in kept) - 2
        return sum(widths[i] + 2 for i in kept[:-1]) + error

    dropped: list[str] = []
    for index in droppable:
        if width is None or needed() <= width:
            break
        kept.remove(index)
        dropped.append(rows[0][index])
    narrowed = [[row[i] for i in kept] for row in rows]
    if not error_last:
        return narrowed, dropped
    # With every column it may drop gone, the error takes what is left, down to a few cells.
    least = LAST_COLUMN_LEAST if len(dropped) == len(droppable) else LAST_COLUMN_MIN
    return fit_last_column(narrowed, width, whole, least), dropped
