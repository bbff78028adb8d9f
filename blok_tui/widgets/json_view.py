"""Step input and output as highlighted, indented JSON. A large value folds to its first lines
(2,000 items are 18,000 lines); a search shows only the matching lines, with their numbers."""

from __future__ import annotations

import json
from typing import Any

from rich.syntax import Syntax
from rich.text import Text
from textual.widgets import Static

from ..console import printable
from ..plain_text import LINE_CHARS, cut_line

FOLD = 40  # lines shown of a folded value
UNFOLDED = 2_000  # lines shown at most of an unfolded one (a search reaches the rest)
MATCHES = 200  # matching lines shown at most


class JsonView(Static):
    DEFAULT_CSS = """
    JsonView { height: auto; padding: 0 1; }
    """

    folded = False  # whether the value shown was folded to its first lines (z unfolds it)
    _asked: tuple[Any, ...] | None = None  # what `show` was last given
    _note = ""  # and what it said of it

    def show(self, value: Any, *, empty: str = "none", search: str = "", fold: bool = True) -> str:
        """Show `value`; returns a note on what is hidden ("" when everything shows)."""
        asked = (value, empty, search, fold)
        if asked != self._asked:  # a live view shows the same value at each refresh
            self._note = self._show(value, empty=empty, search=search, fold=fold)
            self._asked = asked
        return self._note

    def _show(self, value: Any, *, empty: str, search: str, fold: bool) -> str:
        self.folded = False
        if value is None:
            self.update(Text(empty, style="dim italic"))
            return ""
        lines = printable(json.dumps(value, indent=2, ensure_ascii=False, default=str)).split("\n")
        if search:
            return self._matches(lines, search)
        cut = [line for line in lines if len(line) > LINE_CHARS]
        if cut:
            lines = [cut_line(line) for line in lines]
        note = _cut_note(cut)
        limit = FOLD if fold else UNFOLDED
        if len(lines) > limit:
            if fold:
                self.folded = True
                folding = f"{len(lines):,} lines, the first {FOLD} shown: z unfolds, / searches"
            else:
                folding = f"{len(lines):,} lines, the first {UNFOLDED:,} shown: / searches them all"
            note = "; ".join(filter(None, (folding, note)))
            lines = [*lines[:limit], f"… {len(lines) - limit:,} more lines"]
        elif not fold and len(lines) > FOLD:
            note = "; ".join(filter(None, ("unfolded: z folds", note)))
        code = "\n".join(lines)
        syntax = Syntax(code, "json", theme="ansi_dark", background_color="default")
        # Highlighted once, as a Text: Textual lays out and draws that itself, where a Syntax
        # is rendered by Rich line by line each time (z on 2,000 lines took twice as long).
        highlighted = syntax.highlight(code)
        highlighted.rstrip()
        self.update(highlighted)
        return note

    def _matches(self, lines: list[str], search: str) -> str:
        needle = search.lower()
        found = [(n, line) for n, line in enumerate(lines, start=1) if needle in line.lower()]
        text = Text()
        width = len(str(len(lines)))
        for n, line in found[:MATCHES]:
            text.append(f"{n:>{width}}│ ", style="grey50")
            # A long line: from a little before its match.
            start = max(0, line.lower().find(needle) - 100) if len(line) > LINE_CHARS else 0
            text.append(("…" if start else "") + cut_line(line[start:]))
            text.append("\n")
        text.highlight_words([search], style="reverse khaki1", case_sensitive=False)
        if not found:
            text.append(f"no line matches {_quoted(search)}", style="dim italic")
        text.rstrip()
        self.update(text)
        more = f", the first {MATCHES} shown" if len(found) > MATCHES else ""
        return f"{len(found):,} of {len(lines):,} lines match {_quoted(search)}{more}"


def _cut_note(cut: list[str]) -> str:
    if not cut:
        return ""
    longest = max(len(line) for line in cut)  # kept short: the title does not wrap
    if len(cut) == 1:
        return f"a line cut to {LINE_CHARS:,} of its {longest:,} characters"
    return f"{len(cut):,} lines cut to {LINE_CHARS:,} characters (the longest {longest:,})"


def _quoted(search: str) -> str:
    """The search as typed, in quotes (repr() showed a backslash typed once as two)."""
    return f"'{printable(search)}'"
