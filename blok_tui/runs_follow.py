"""`blok-tui runs --follow`: after the table, a line each time a run the filters select starts,
begins to wait or ends, as it happens: what a server's operator watches, and with
`--status failed`, a tail of the failures.

Lines come from the engine's events (an attached engine's are what the workers wrote); a run
that ended is read once for its time and its error. No Textual here."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any

from engine import Run, UnknownRun
from engine.api import EngineAPI
from engine.events import Lagged, RunFinished, RunStarted, RunStatusChanged, Subscription
from engine.text import printable

from .plain_text import one_line
from .run_follow import clock_line
from .run_text import between
from .tracebacks import clean_error

ERROR_CHARS = 100
STATUS = 9  # the width of the status column: "completed", "timed_out"


@dataclass(frozen=True, slots=True)
class RunsFilter:
    """What `runs` was given: None selects every value."""

    status: str | None = None
    workflow: str | None = None
    queue: str | None = None

    def selects(self, status: str, workflow: str | None, queue: str) -> bool:
        """Whether a run in `status` of `workflow` (None: not told, so any) on `queue` is one
        the filters select."""
        return (
            self.status in (None, status)
            and self.queue in (None, queue)
            and (self.workflow is None or workflow in (None, self.workflow))
        )


async def follow_runs(
    engine: EngineAPI,
    events: Subscription,
    only: RunsFilter,
    say: Callable[[str], None],
    tz: tzinfo | None = None,
    *,
    as_json: bool = False,
) -> None:
    """Tell `say` each start, wait and end of a run `only` selects, until cancelled; as a line
    of text, or (`as_json`) of JSON."""
    # Columns as wide as the longest names the workers declared: the lines stay aligned.
    widths = (
        max((len(info.name) for info in await engine.workflows()), default=0),
        max((len(info.name) for info in await engine.queues()), default=0),
    )
    async for event in events:
        if isinstance(event, Lagged):
            missed = {"missed": event.dropped, "at": engine.now().isoformat()}
            say(
                json.dumps(missed)
                if as_json
                else f"({event.dropped} events went by unread: `blok-tui runs` lists what ended)"
            )
            continue
        if isinstance(event, RunStarted | RunFinished):
            status = "running" if isinstance(event, RunStarted) else event.status
            workflow: str | None = event.workflow_name
        elif isinstance(event, RunStatusChanged):
            status, workflow = event.status, None
        else:
            continue
        if not only.selects(status, workflow, event.queue):
            continue
        try:
            run = await engine.get_run(event.run_id)
        except UnknownRun:  # purged since, with the runs that ended before the retention
            continue
        if only.workflow is not None and run.workflow_name != only.workflow:
            continue
        if as_json:
            say(run_json(run, status, engine.now()))
        else:
            say(run_line(run, status, engine.now(), widths, tz))


def listed(run: Run) -> dict[str, Any]:
    """The run as `runs --json` lists it: its record without its steps, logs, state and
    cursor (`show --json` has them)."""
    return run.model_dump(mode="json", exclude={"steps", "logs", "state", "cursor"})


def run_json(run: Run, status: str, now: datetime) -> str:
    """One line of JSON for a script (`runs --follow --json`): when, the status the run came
    to, and the run as `runs --json` lists it (as it is now)."""
    told = {"at": now.isoformat(), "status": status, "run": listed(run)}
    return json.dumps(told, ensure_ascii=False)


def run_line(
    run: Run,
    status: str,
    now: datetime,
    widths: tuple[int, int] = (0, 0),
    tz: tzinfo | None = None,
) -> str:
    """One line of the run as it came to `status` (its record may have gone further since),
    stamped `now`, when it was told (a tail's lines keep their order): the status, the run,
    its workflow and queue (padded to `widths`); for a start, its worker and version; for an
    end, how long it ran and its error; for a wait, until when."""
    cells = [
        f"{status:<{STATUS}}",
        run.id,
        f"{printable(run.workflow_name):<{widths[0]}}",
        f"{printable(run.queue):<{widths[1]}}",
    ]
    if status == "running" and run.worker:
        # Which version it runs: a deploy is watched by the runs that start on the new one.
        cells.append(f"on {printable(run.worker)}, version {printable(run.workflow_version)}")
    elif status == str(run.status) and run.terminal:
        if run.started_at is not None and run.finished_at is not None:
            cells.append(between(run.started_at, run.finished_at))
        if run.error:
            cells.append(one_line(clean_error(run.error), ERROR_CHARS))
    elif status == "waiting" and run.wait_until is not None:
        cells.append(f"until {run.wait_until.isoformat()}")
    elif status in ("delayed", "throttled") and run.run_at is not None:
        cells.append(f"until {run.run_at.isoformat()}")
    return clock_line(now, "  ".join(cells).rstrip(), tz)
