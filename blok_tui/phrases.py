"""Lines made of phrases ("queue orders", "delivery 2 of 2", "dead letter", "filter: 'sh'") that
a narrow terminal must not cut in the middle: a Static wraps a long line at any space, and one
updated without a new layout keeps its height and hides what wrapped. So a line is laid out here,
for the width it has: broken between phrases (`flowed`), or without the phrases that matter least
(`fitted`), never inside one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Span, Text


@dataclass(frozen=True, slots=True)
class Phrase:
    """A piece of a line that reads as one: it is shown whole or not at all."""

    text: Text
    gap: str = "  "  # before it, after another phrase on the same line
    keep: int = 0  # how much it matters: where there is no room, the lowest go first


def phrase(text: str, style: str = "", *, gap: str = "  ", keep: int = 0) -> Phrase:
    return Phrase(Text(text, style=style), gap, keep)


def _joined(phrases: Sequence[Phrase]) -> Text:
    line = Text()
    for n, part in enumerate(phrases):
        gap = part.gap if n else ""
        if not gap.isspace():  # " · ": its own (plain) look
            line.append(gap)
            gap = ""
        # Spaces in the style the phrase starts with, in one piece with it: they show only a
        # background, and the line draws as one append of "  phrase" did.
        piece = Text(gap + part.text.plain, style=part.text.style, end="")
        spans = [span.move(len(gap)) for span in part.text.spans]
        if gap and spans and spans[0].start == len(gap):
            spans[0] = Span(0, spans[0].end, spans[0].style)
        piece.spans = spans
        line.append_text(piece)
    return line


def flowed(phrases: Sequence[Phrase], width: int) -> Text:
    """The phrases on as many lines of `width` cells as they need, each line broken between two
    phrases (a phrase that starts a line drops its gap). A phrase wider than a line has one to
    itself, where it wraps: there is nothing better to do with it. A width of 0 or less (not
    laid out yet): one line."""
    lines: list[list[Phrase]] = []
    used = 0
    for part in phrases:
        if not part.text.plain:
            continue
        needed = part.text.cell_len
        if lines and (width <= 0 or used + cell_len(part.gap) + needed <= width):
            lines[-1].append(part)
            used += cell_len(part.gap) + needed
        else:
            lines.append([part])
            used = needed
    return Text("\n").join(_joined(line) for line in lines)


def fits(phrases: Sequence[Phrase], width: int) -> bool:
    """Whether the phrases fit one line of `width` cells whole."""
    return _joined([part for part in phrases if part.text.plain]).cell_len <= width


def fitted(phrases: Sequence[Phrase], width: int) -> Text:
    """The phrases on one line of `width` cells: while they do not fit, the phrase that matters
    least (the later one of equals) is left out. The first phrase always stays. A width of 0 or
    less (not laid out yet): all of them."""
    kept = [part for part in phrases if part.text.plain]
    while width > 0 and len(kept) > 1 and _joined(kept).cell_len > width:
        least = min(range(1, len(kept)), key=lambda n: (kept[n].keep, -n))
        del kept[least]
    return _joined(kept)
