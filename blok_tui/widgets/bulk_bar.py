"""The progress of a bulk action, above the footer while it runs: what, how far, how many."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import ProgressBar, Static

from engine.operations import BulkProgress


class BulkBar(Horizontal):
    DEFAULT_CSS = """
    BulkBar { display: none; height: 1; background: $boost; padding: 0 1; }
    BulkBar.-running { display: block; }
    BulkBar > Static { width: auto; margin-right: 2; }
    BulkBar > ProgressBar { width: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.reports: list[BulkProgress] = []  # of the last action, for tests and the log

    def compose(self) -> ComposeResult:
        yield Static(id="bulk-label")
        yield ProgressBar(id="bulk-progress", show_eta=False)

    def start(self, what: str, total: int) -> None:
        self.add_class("-running")
        self.reports = []
        self.query_one(Static).update(Text(what, style="bold"))
        self.query_one(ProgressBar).update(total=max(total, 1), progress=0)

    def advance(self, progress: BulkProgress) -> None:
        self.reports.append(progress)
        self.query_one(ProgressBar).update(total=max(progress.total, 1), progress=progress.done)
        label = Text(f"{progress.action} ", style="bold")
        label.append(f"{progress.done:,}/{progress.total:,}")
        if progress.skipped:
            label.append(f"  {progress.skipped:,} skipped", style="khaki3")
        self.query_one(Static).update(label)

    def finish(self) -> None:
        self.remove_class("-running")
