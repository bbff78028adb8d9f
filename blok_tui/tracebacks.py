"""Errors and tracebacks as an operator reads them: starting at the user's own frame, with the
engine's and libraries' frames folded into one line, and exception names without the module
prefix the loader gives workflow files (`blok_workflows.webhooks_2b0425cb.EndpointGone` reads
`EndpointGone`). Everything run-provided passes through `printable` first."""

from __future__ import annotations

import re
from pathlib import Path

from engine.origin import is_engine_frame, shown_path

from .console import printable
from .plain_text import cut_lines

# The loader imports each workflow file as blok_workflows.<stem>_<8 hex digits>.
_LOADED_MODULE = re.compile(r"\bblok_workflows\.[A-Za-z_][A-Za-z0-9_]*_[0-9a-f]{8}\.")
_FRAME = re.compile(r'^  File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')


def clean_error(text: str) -> str:
    """An error line or message: printable, with loaded-module prefixes dropped, each line cut
    to LINE_CHARS (an error that quoted a 5 MB response body froze the console)."""
    return _LOADED_MODULE.sub("", printable(cut_lines(text)))  # cut first: 5 MB, once


def fold_traceback(text: str, *, cwd: Path | None = None) -> str:
    """The traceback with each run of engine or library frames folded into one line, leading
    ones included, so it starts at the user's frame. Paths under `cwd` are shown relative."""
    out: list[str] = []
    folded = 0
    lines = clean_error(text).rstrip().splitlines()
    n = 0

    def flush() -> None:
        nonlocal folded
        if folded:
            out.append(f"  … {folded} engine frame{'s' if folded != 1 else ''}")
            folded = 0

    while n < len(lines):
        line = lines[n]
        frame = _FRAME.match(line)
        if frame is None:
            flush()
            out.append(line)
            n += 1
            continue
        # A frame is its "File" line and the indented source lines under it (3.11+ adds a
        # line of carets under the source).
        body = [line]
        n += 1
        while n < len(lines) and lines[n].startswith("    "):
            body.append(lines[n])
            n += 1
        path = frame["path"]
        if is_engine_frame(path):
            folded += 1
            continue
        flush()
        body[0] = line.replace(path, shown_path(path, cwd), 1)
        out.extend(body)
    flush()
    return "\n".join(out)
