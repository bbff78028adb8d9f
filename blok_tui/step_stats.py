"""How long each step of a workflow usually takes: p50 and p95 over its recent completed runs,
per workflow version, so that a step that got slower after a hot reload is flagged."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from rich.text import Text

from engine import Run, UnknownRun
from engine.api import EngineAPI

from .console import duration

SAMPLE = 20  # recent completed runs read
KEEP = 30.0  # seconds a sample serves before it is read again
SLOWER = 1.5  # a version's p50 this many times the previous version's is "slower"
AT_LEAST = 3  # runs a version needs before it is compared


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class StepStats:
    workflow: str
    runs: int = 0
    # step name → workflow version → durations in ms, newest run first
    durations: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    versions: list[str] = field(default_factory=list)  # newest first

    @property
    def names(self) -> list[str]:
        return list(self.durations)

    def all_of(self, name: str) -> list[float]:
        return [ms for by_version in self.durations.get(name, {}).values() for ms in by_version]

    def slower(self, version: str, name: str) -> tuple[float, float, str] | None:
        """(p50 now, p50 before, previous version) when `name` got slower in `version`."""
        by_version = self.durations.get(name, {})
        now = by_version.get(version, [])
        before_version = next((v for v in self.versions if v != version), None)
        if before_version is None:
            return None
        before = by_version.get(before_version, [])
        if len(now) < AT_LEAST or len(before) < AT_LEAST:
            return None
        p50_now, p50_before = statistics.median(now), statistics.median(before)
        if p50_now > SLOWER * p50_before and p50_now - p50_before > 20:
            return p50_now, p50_before, before_version
        return None

    def describe(self, run: Run, name: str) -> Text | None:
        """For the step's title: "usually 160ms (p50), 410ms (p95) over 20 runs"."""
        values = self.all_of(name)
        if len(values) < AT_LEAST:
            return None
        text = Text(
            f"usually {duration(percentile(values, 0.5))} (p50), "
            f"{duration(percentile(values, 0.95))} (p95) over the last {len(values)} runs",
            style="grey62",
        )
        slower = self.slower(run.workflow_version, name)
        if slower is not None:
            now, before, version = slower
            text.append(
                f"\n▲ slower since the reload: p50 {duration(now)} on @{run.workflow_version[:8]}, "
                f"{duration(before)} on @{version[:8]}",
                style="bold khaki1",
            )
        return text


# workflow → (when it was read, on time.monotonic; its StepStats)
StepStatsCache = dict[str, tuple[float, StepStats]]


def typical_text(stats: StepStats, run: Run, name: str) -> Text:
    """For the rail: " p50 160ms p95 410ms", and ▲ when the step got slower after a reload."""
    values = stats.all_of(name)
    text = Text()
    if len(values) >= AT_LEAST:
        text.append(
            f"  p50 {duration(percentile(values, 0.5))} p95 {duration(percentile(values, 0.95))}",
            style="grey50",
        )
    if stats.slower(run.workflow_version, name) is not None:
        text.append(" ▲ slower", style="bold khaki1")
    return text


async def step_stats(engine: EngineAPI, cache: StepStatsCache, workflow: str) -> StepStats:
    """The workflow's recent step durations, read at most every KEEP seconds (`cache`: the
    app's, shared by its run views)."""
    hit = cache.get(workflow)
    if hit is not None and time.monotonic() - hit[0] < KEEP:
        return hit[1]
    stats = StepStats(workflow)
    recent = await engine.runs(status="completed", workflow=workflow, limit=SAMPLE)
    for summary in recent:
        try:
            run = await engine.get_run(summary.id)
        except UnknownRun:
            continue  # purged by the janitor since it was listed: one sample fewer
        stats.runs += 1
        if run.workflow_version not in stats.versions:
            stats.versions.append(run.workflow_version)
        for step in run.steps:
            if step.parent is not None or step.started_at is None or step.finished_at is None:
                continue
            if str(step.status) != "completed":
                continue
            ms = (step.finished_at - step.started_at).total_seconds() * 1000
            by_version = stats.durations.setdefault(step.name, {})
            by_version.setdefault(run.workflow_version, []).append(ms)
    cache[workflow] = (time.monotonic(), stats)
    return stats
