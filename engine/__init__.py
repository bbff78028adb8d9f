"""blok-tui's in-process workflow engine. No Textual import anywhere in this package."""

from .durations import format_duration, parse_duration
from .engine import Engine, EngineError, UnknownJob, UnknownQueue, UnknownRun
from .events import (
    AttemptFailed,
    Event,
    Lagged,
    LogRecorded,
    QueueChanged,
    ReloadErrorCleared,
    ReloadFailed,
    RunFinished,
    RunQueued,
    RunStarted,
    RunStatusChanged,
    StepFinished,
    StepStarted,
    WorkflowReloaded,
)
from .loader import WorkflowLoadError
from .models import (
    Attempt,
    AttemptStatus,
    Job,
    JobState,
    LogLine,
    QueueInfo,
    QueueStats,
    Run,
    RunStatus,
    StepRun,
    StepStatus,
    WorkerInfo,
    WorkflowInfo,
)
from .sqlite_db import DatabaseError
from .store import RunFilter, RunStore
from .workflow import Retry, Step, WaitStep, WorkerTrigger, Workflow, WorkflowDefinitionError, wait

__version__ = "0.1.0"

__all__ = [
    "Attempt",
    "AttemptFailed",
    "AttemptStatus",
    "DatabaseError",
    "Engine",
    "EngineError",
    "Event",
    "Job",
    "JobState",
    "Lagged",
    "LogLine",
    "LogRecorded",
    "QueueChanged",
    "QueueInfo",
    "QueueStats",
    "ReloadErrorCleared",
    "ReloadFailed",
    "Retry",
    "Run",
    "RunFilter",
    "RunFinished",
    "RunQueued",
    "RunStarted",
    "RunStatus",
    "RunStatusChanged",
    "RunStore",
    "Step",
    "StepFinished",
    "StepRun",
    "StepStarted",
    "StepStatus",
    "UnknownJob",
    "UnknownQueue",
    "UnknownRun",
    "WaitStep",
    "WorkerInfo",
    "WorkerTrigger",
    "Workflow",
    "WorkflowDefinitionError",
    "WorkflowInfo",
    "WorkflowLoadError",
    "WorkflowReloaded",
    "format_duration",
    "parse_duration",
    "wait",
]
