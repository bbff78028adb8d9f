"""Regenerate screenshots/*.svg from the real console over the frozen showcase scene
(the same scene the snapshot tests use): `task screenshots` or `python scripts/screenshots.py`."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blok_tui.app import BlokApp  # noqa: E402
from tests.console import scene  # noqa: E402
from tests.console.helpers import settled  # noqa: E402

SIZE = (140, 40)
Step = Callable[[BlokApp], Awaitable[Any] | Any]

SMALL = (80, 24)
SIZES = {"run-80x24": SMALL, "runs-80x24": SMALL}  # the others at SIZE
SHOTS: dict[str, tuple[bool, list[Step]]] = {
    # name: (with a broken workflow file, what to do before the picture)
    "queues": (False, []),
    "runs": (False, [lambda app: app.run_command("runs")]),
    "run-failed-attempt": (False, [lambda app: app.run_command(f"run {scene.rid(6)}")]),
    "run-waiting": (False, [lambda app: app.run_command(f"run {scene.rid(8)}")]),
    "run-timeline": (
        False,
        [
            lambda app: app.run_command(f"run {scene.rid(6)}"),
            lambda app: app.screen.action_timeline(),
        ],
    ),
    "run-diff": (
        False,
        [
            lambda app: app.run_command(f"run {scene.rid(7)}"),
            lambda app: app.screen.action_diff(),
        ],
    ),
    "run-80x24": (False, [lambda app: app.run_command(f"run {scene.rid(6)}")]),
    "runs-80x24": (False, [lambda app: app.run_command("runs")]),
    "run-nested": (False, [lambda app: app.run_command(f"run {scene.rid(13)}")]),
    "run-throttled": (False, [lambda app: app.run_command(f"run {scene.rid(16)}")]),
    "workers": (False, [lambda app: app.run_command("workers")]),
    "bulk-confirm": (
        False,
        [
            lambda app: app.run_command("runs failed"),
            lambda app: app.screen.action_toggle_mark(),
            lambda app: app.screen.action_toggle_mark(),
            lambda app: app.screen.action_bulk_replay(),
        ],
    ),
    "inject": (False, [lambda app: app.action_inject("orders")]),
    "help": (False, [lambda app: app.action_help()]),
    "reload-error": (True, []),
}


async def shoot(name: str, broken: bool, steps: list[Step], out: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        folder, database = await scene.build(Path(tmp))
        if broken:
            scene.break_a_workflow(folder)
        app = scene.app(folder, database)
        async with app.run_test(size=SIZES.get(name, SIZE)) as pilot:
            await settled(pilot)
            for step in steps:
                result = step(app)
                if hasattr(result, "__await__"):
                    await result
                await settled(pilot)
            svg = app.export_screenshot(title=f"blok-tui — {name}")
    path = out / f"{name}.svg"
    path.write_text(svg)
    return path


async def main() -> None:
    out = ROOT / "screenshots"
    out.mkdir(exist_ok=True)
    for name, (broken, steps) in SHOTS.items():
        path = await shoot(name, broken, steps, out)
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    anyio.run(main)
