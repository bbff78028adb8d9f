"""Run one measurement in a fresh Python subprocess and read back its JSON result.

Every benchmark that compares systems runs each measurement in its own process, so that one
run's heap, threads and garbage-collector state cannot slow down the next one. The child is the
same script called with a hidden `--one ...` option; it prints one JSON object as its last line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_fresh(script: str | Path, argv: list[str], timeout: float = 900) -> dict[str, Any]:
    """`python script *argv` in a new process; its last stdout line, parsed as JSON."""
    command = [sys.executable, str(Path(script).resolve()), *argv]
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=os.environ)
    if out.returncode != 0:
        raise SystemExit(
            f"{Path(script).name} {' '.join(argv)} failed (exit {out.returncode}):\n"
            f"{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
        )
    lines = out.stdout.strip().splitlines()
    if not lines:
        raise SystemExit(f"{Path(script).name} {' '.join(argv)} printed nothing")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def emit(result: dict[str, Any]) -> None:
    """The child's side: print the result as the last stdout line."""
    print(json.dumps(result), flush=True)
