"""Schedules: `Schedule(cron="0 * * * *", timezone="Europe/Paris")` or `Schedule(every="30s")` on
a Workflow, and the arithmetic of their ticks.

A tick is a moment (epoch seconds) at which a schedule enqueues one job. Ticks are computed the
same way by every process, so that they can agree on each one: `every` ticks are the multiples
of the interval since the Unix epoch; cron ticks are those of the expression in its time zone
(cronsim, which handles daylight saving changes). The scheduler that fires them runs in the
workers (engine/scheduler.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from .backends.base import ScheduleSpec, ScheduleState, WorkerCatalog
from .durations import Duration, exact_duration
from .errors import WorkflowDefinitionError
from .explain import explain
from .validation import InvalidInput, json_value

CatchUp = Literal["latest", "all", "none"]
CRON_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MIN_EVERY_MS = 1000  # a schedule ticks at most once a second


class Schedule(BaseModel):
    """Enqueue one job to the workflow's queue at each tick, with `payload` as its body.

    `catch_up` says what happens to ticks missed while no worker ran: "latest" (default) one
    run for the missed span, "all" one run per missed tick, "none" none (the next tick fires).
    Its id within the workflow is its expression ("every 30s", "cron 0 * * * * Europe/Paris"):
    change the expression and it is another schedule."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True, extra="forbid")

    cron: str | None = None
    every: Duration | None = None  # at least MIN_EVERY_MS, checked below in the user's terms
    timezone: str = "UTC"
    payload: Any = None
    catch_up: CatchUp = "latest"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise WorkflowDefinitionError(f"Schedule: {explain(error, Schedule)}") from None
        if self.every is not None and self.every < MIN_EVERY_MS:
            given = data.get("every")
            shown = repr(given) if isinstance(given, str) else f"{given!r} (milliseconds)"
            raise WorkflowDefinitionError(
                f"Schedule: every must be at least {exact_duration(MIN_EVERY_MS)}, not {shown}"
            )
        try:  # what enqueue would refuse, refused where it is written, not at every tick
            # A model or a datetime in its JSON form, as enqueue stores it (frozen: set once).
            object.__setattr__(self, "payload", json_value(self.payload, None, what="payload"))
        except InvalidInput as error:
            raise WorkflowDefinitionError(f"Schedule: {error}") from None
        if (self.cron is None) == (self.every is None):
            raise WorkflowDefinitionError(
                "Schedule: give either cron= (an expression) or every= (a duration), not "
                + ("both" if self.cron is not None else "neither")
            )
        if self.every is not None and self.timezone != "UTC":
            raise WorkflowDefinitionError(
                "Schedule: timezone is for cron=; every= ticks on the multiples of its "
                "interval since the Unix epoch, in no time zone"
            )
        problem = self.problem()  # here, not only once it is in a Workflow
        if problem is not None:
            raise WorkflowDefinitionError(f"Schedule: {problem}")

    @field_validator("cron", mode="before")
    @classmethod
    def _expand_macro(cls, cron: Any) -> Any:
        """`@hourly`, `@daily`…, as cron itself and Temporal take them."""
        if isinstance(cron, str) and cron.strip().startswith("@"):
            name = cron.strip().lower()
            if name not in CRON_MACROS:
                raise ValueError(
                    f"unknown cron macro {cron!r}: one of {', '.join(sorted(CRON_MACROS))}"
                )
            return CRON_MACROS[name]
        return cron

    @property
    def id(self) -> str:
        if self.every is not None:
            return f"every {exact_duration(self.every)}"
        return f"cron {self.cron} {self.timezone}"

    def problem(self) -> str | None:
        """What is wrong with the expression or time zone (None: nothing); the workflow that
        holds the schedule reports it with its name."""
        return schedule_problem(self.cron, self.timezone)

    def next_tick(self, after: float) -> float:
        return next_tick(self.cron, self.every, self.timezone, after)

    def latest_tick(self, at: float) -> float:
        return latest_tick(self.cron, self.every, self.timezone, at)


def schedule_problem(cron: str | None, timezone: str) -> str | None:
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        return f"unknown time zone {timezone!r} (use an IANA name such as 'Europe/Paris')"
    if cron is not None and len(cron.split()) == 6:
        # cronsim reads six fields as seconds first: one `*` too many made "every 2 minutes"
        # every 2 seconds, where the README and croniter have five (or seconds last).
        return (
            f"cron expression {cron!r} has 6 fields; a cron has 5 (minute hour day month "
            "weekday); for seconds, use Schedule(every='2s')"
        )
    if cron is not None:
        try:
            CronSim(cron, datetime.now(zone))
        except CronSimError as error:
            return f"invalid cron expression {cron!r}: {error}"
    return None


def next_tick(cron: str | None, every_ms: int | None, timezone: str, after: float) -> float:
    """The first tick strictly after `after` (epoch seconds)."""
    if every_ms is not None:
        step = every_ms / 1000
        return (math.floor(after / step) + 1) * step
    assert cron is not None
    start = datetime.fromtimestamp(after, ZoneInfo(timezone))
    return next(iter(CronSim(cron, start))).timestamp()


def latest_tick(cron: str | None, every_ms: int | None, timezone: str, at: float) -> float:
    """The last tick at or before `at` (epoch seconds)."""
    if every_ms is not None:
        step = every_ms / 1000
        return math.floor(at / step) * step
    assert cron is not None
    start = datetime.fromtimestamp(at, ZoneInfo(timezone)) + timedelta(microseconds=1)
    return next(iter(CronSim(cron, start, reverse=True))).timestamp()


def ticks_between(
    cron: str | None, every_ms: int | None, timezone: str, after: float, until: float, limit: int
) -> list[float]:
    """Ticks in (after, until], oldest first, at most `limit` of them (the newest are kept)."""
    if every_ms is not None:
        step = every_ms / 1000
        first = math.floor(after / step) + 1
        last = math.floor(until / step)
        return [k * step for k in range(max(first, last - limit + 1), last + 1)]
    assert cron is not None
    ticks: list[float] = []
    for moment in CronSim(cron, datetime.fromtimestamp(after, ZoneInfo(timezone))):
        at = moment.timestamp()
        if at > until:
            break
        ticks.append(at)
        if len(ticks) > limit:
            del ticks[0]
    return ticks


def utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def spec_of(workflow: str, queue: str | None, schedules: Sequence[Schedule]) -> list[ScheduleSpec]:
    """The schedules a workflow declares, as the backend keeps them."""
    return [
        ScheduleSpec(
            workflow=workflow,
            schedule=s.id,
            queue=queue or "",
            cron=s.cron,
            every_ms=s.every,
            timezone=s.timezone,
            catch_up=s.catch_up,
            payload=s.payload,
        )
        for s in schedules
    ]


def settings_text(spec: ScheduleSpec) -> str:
    """A schedule's settings as the database gives them back (JSON: a tuple in a payload is a
    list there, and PostgreSQL reorders an object's keys), to compare a declaration with it."""
    return json.dumps(dataclasses.asdict(spec), sort_keys=True, default=str)


def declared_settings(specs: Sequence[ScheduleSpec]) -> dict[str, str]:
    """Schedule id → `settings_text`: what a worker declares, to compare with what is kept."""
    return {spec.schedule: settings_text(spec) for spec in specs}


def kept_settings(states: Sequence[ScheduleState]) -> dict[str, dict[str, str]]:
    """Workflow → schedule id → settings, as the database keeps them: what fires."""
    kept: dict[str, dict[str, str]] = {}
    for state in states:
        kept.setdefault(state.spec.workflow, {})[state.spec.schedule] = settings_text(state.spec)
    return kept


def overruled_workers(
    catalogs: Sequence[WorkerCatalog], states: Sequence[ScheduleState]
) -> dict[str, tuple[str, ...]]:
    """Workflow → the live workers (by their catalogs) whose own schedules for it are not
    those kept: another version of its file, on another worker, declared its own since (or
    none), and those fire. A worker that does not say what it declares is not counted."""
    kept = kept_settings(states)
    overruled: dict[str, list[str]] = {}
    for catalog in catalogs:
        for info in catalog.workflows:
            if info.schedules is not None and info.schedules != kept.get(info.name, {}):
                overruled.setdefault(info.name, []).append(catalog.worker)
    return {name: tuple(sorted(workers)) for name, workers in sorted(overruled.items())}


def overruled_line(workflow: str, workers: Sequence[str], *, any_kept: bool) -> str:
    """What to tell an operator of `overruled_workers`' entry for `workflow`; `any_kept`:
    whether the database keeps any schedule of it (else none fires)."""
    who = (
        f"worker {workers[0]} declares"
        if len(workers) == 1
        else f"workers {', '.join(workers)} declare"
    )
    if any_kept:
        return (
            f"{who} other schedules for {workflow} (another version of its file): those "
            "declared last fire"
        )
    return (
        f"{who} schedules for {workflow}, which another version of its file, declared last, "
        "has none of: none fire"
    )
