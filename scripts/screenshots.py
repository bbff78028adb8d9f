"""Regenerate screenshots/*.svg from the real console over the frozen scenes the snapshot tests
use (tests/console/scene.py, and events_scene.py for events, schedules and rate limits):
`task screenshots` or `python scripts/screenshots.py [name ...]`."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blok_tui.app import BlokApp  # noqa: E402
from tests.console import events_scene, scene  # noqa: E402
from tests.console.helpers import settled  # noqa: E402

WIDE = (140, 40)
SMALL = (80, 24)
Step = Callable[[BlokApp], Awaitable[Any] | Any]


def command(line: str) -> Step:
    return lambda app: app.run_command(line)


def screen_action(name: str) -> Step:
    return lambda app: getattr(app.screen, name)()


@dataclass(frozen=True)
class Shot:
    steps: list[Step] = field(default_factory=list)  # what to do before the picture
    size: tuple[int, int] = WIDE
    world: ModuleType = scene  # the frozen scene it is taken over
    broken: bool = False  # with a workflow file that fails to load


RUN_FAILED = command(f"run {scene.rid(6)}")
RUN_RETRIED = command(f"run {scene.rid(4)}")
RUN_EVENT = command(f"run {scene.rid(20)}")
SHOTS: dict[str, Shot] = {
    "queues": Shot(),
    "queues-80x24": Shot(size=SMALL),
    "runs": Shot([command("runs")]),
    "runs-80x24": Shot([command("runs")], SMALL),
    "runs-failed": Shot([command("runs failed")]),
    "run-failed-attempt": Shot([RUN_FAILED]),
    "run-80x24": Shot([RUN_FAILED], SMALL),
    "run-retried": Shot([RUN_RETRIED]),
    "run-timeline": Shot([RUN_FAILED, screen_action("action_timeline")]),
    "run-timeline-80x24": Shot([RUN_FAILED, screen_action("action_timeline")], SMALL),
    "run-diff": Shot([command(f"run {scene.rid(7)}"), screen_action("action_diff")]),
    "run-waiting": Shot([command(f"run {scene.rid(8)}")]),
    "run-waiting-for-event": Shot([RUN_EVENT], world=events_scene),
    "run-waiting-for-event-80x24": Shot([RUN_EVENT], SMALL, world=events_scene),
    "run-rate-limited": Shot([command(f"run {scene.rid(19)}")], world=events_scene),
    "schedules": Shot([command("schedules")], world=events_scene),
    "schedules-80x24": Shot([command("schedules")], SMALL, world=events_scene),
    "run-nested": Shot([command(f"run {scene.rid(13)}")]),
    "run-throttled": Shot([command(f"run {scene.rid(16)}")]),
    "run-orphaned": Shot([command(f"run {scene.rid(18)}")]),
    "workers": Shot([command("workers")]),
    "bulk-confirm": Shot([command("runs failed"), screen_action("action_bulk_replay")]),
    "inject": Shot([lambda app: app.action_inject("orders")]),
    "inject-80x24": Shot([lambda app: app.action_inject("orders")], SMALL),
    "help": Shot([lambda app: app.action_help()]),
    "reload-error": Shot(broken=True),
}


async def shoot(name: str, shot: Shot, out: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        folder, database = await shot.world.build(Path(tmp))
        if shot.broken:
            scene.break_a_workflow(folder)
        app = shot.world.app(folder, database)
        async with app.run_test(size=shot.size) as pilot:
            await settled(pilot)
            for step in shot.steps:
                result = step(app)
                if hasattr(result, "__await__"):
                    await result
                await settled(pilot)
            svg = app.export_screenshot(title=f"blok-tui — {name}")
    path = out / f"{name}.svg"
    path.write_text(svg)
    return path


async def main(names: list[str]) -> None:
    unknown = [name for name in names if name not in SHOTS]
    if unknown:
        raise SystemExit(f"unknown screenshot {', '.join(unknown)} (known: {', '.join(SHOTS)})")
    out = ROOT / "screenshots"
    out.mkdir(exist_ok=True)
    for name in names or SHOTS:
        path = await shoot(name, SHOTS[name], out)
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
