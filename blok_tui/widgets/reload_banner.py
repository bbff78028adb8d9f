"""A persistent banner while any workflow file fails to load: file, line and message, so the
operator knows the previous version is still serving and where to look."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widgets import Static

SHOWN = 5  # lines of files under the banner's first: its height is 6


class ReloadBanner(Static):
    DEFAULT_CSS = """
    ReloadBanner {
        display: none; height: auto; max-height: 6;
        background: $error 25%; color: $text; border-left: thick $error; padding: 0 1;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    ReloadBanner.-failing { display: block; }
    """

    def show_errors(self, errors: dict[str, str]) -> None:
        self.set_class(bool(errors), "-failing")
        if not errors:
            self.update("")
            return
        text = Text()
        count = len(errors)
        text.append(
            f"⚠ {count} workflow file{'s' if count > 1 else ''} failed to load",
            style="bold",
        )
        # Short enough for 80 columns: "fix and save; until then its last good ve…" lost the
        # point there.
        serves = "last good versions serve" if count > 1 else "its last good version serves"
        text.append(f" — {serves} until fixed", style="dim")
        # One line each, and no more lines than the banner's height: a long error wrapped onto
        # a second line and pushed the last files out of sight, without a word.
        entries = sorted(errors.values())
        shown = entries if len(entries) <= SHOWN else entries[: SHOWN - 1]
        places = _distinct([message.partition(": ")[0] for message in shown])
        for message, place in zip(shown, places, strict=True):
            what = message.partition(": ")[2]
            text.append("\n  ")
            text.append(place, style="bold underline")
            text.append(f"  {what}" if what else "")
        if len(shown) < len(entries):
            rest = [_file(m.partition(": ")[0]) for m in entries[len(shown) :]]
            text.append(f"\n  … and {len(rest)} more: {', '.join(rest)}", style="dim")
        self.update(text)


def _file(where: str) -> str:
    """ "/long/path/to/workflows/orders.py:12" -> "workflows/orders.py"."""
    short = _short(where)
    file, sep, line = short.rpartition(":")
    return file if sep and line.isdigit() else short


def _short(where: str, depth: int = 2) -> str:
    """ "/long/path/to/workflows/orders.py:12" -> "workflows/orders.py:12" (its last `depth`
    parts)."""
    file, sep, line = where.rpartition(":")
    if not sep or not line.isdigit():
        file, line = where, ""
    parts = Path(file).parts
    shown = str(Path(*parts[-depth:])) if len(parts) >= depth else file
    return f"{shown}:{line}" if line else shown


def _distinct(places: list[str]) -> list[str]:
    """Each place as short as it stays told apart from the others: two machines' checkouts
    failing on one file read "workflows/orders.py:5" twice ("m1/workflows/…", "m2/…")."""
    depth = 2
    while True:
        short = [_short(place, depth) for place in places]
        clashing = len(set(short)) < len(set(places))
        if not clashing or all(s == _short(p, 99) for s, p in zip(short, places, strict=True)):
            return short
        depth += 1
