"""Step input and output as highlighted, indented JSON."""

from __future__ import annotations

import json
from typing import Any

from rich.syntax import Syntax
from rich.text import Text
from textual.widgets import Static


class JsonView(Static):
    DEFAULT_CSS = """
    JsonView { height: auto; padding: 0 1; }
    """

    def show(self, value: Any, *, empty: str = "none") -> None:
        if value is None:
            self.update(Text(empty, style="dim italic"))
            return
        blob = json.dumps(value, indent=2, ensure_ascii=False, default=str)
        if len(blob) > 20_000:
            blob = blob[:20_000] + "\n… (cut at 20,000 characters)"
        self.update(
            Syntax(blob, "json", theme="ansi_dark", background_color="default", word_wrap=True)
        )
