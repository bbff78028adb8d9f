"""blok-tui's in-process workflow engine. No Textual import anywhere in this package."""

from .backends.base import EventMessage, RunStore
from .context import MissingStateKey
from .durations import format_duration, parse_duration
from .engine import Capabilities, Engine
from .errors import (
    AmbiguousSchedule,
    DatabaseError,
    EngineError,
    NonRetryable,
    ReplayedAlready,
    UnknownJob,
    UnknownQueue,
    UnknownRun,
)
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
from .filters import RunFilter
from .health import Health
from .last_resort import install as _install_last_resort
from .liveness import Orphan
from .loader import WorkflowLoadError
from .models import (
    Attempt,
    AttemptStatus,
    EventOutcome,
    EventSent,
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
from .primitives import (
    ForEach,
    Loop,
    Subworkflow,
    Switch,
    TryCatch,
    for_each,
    loop,
    subworkflow,
    switch,
    try_catch,
)
from .ratelimit import RateLimit
from .scheduler import ScheduleInfo
from .schedules import Schedule
from .validation import InvalidInput
from .waiting import WaitReason
from .workflow import (
    Debounce,
    EventWaitStep,
    Retry,
    Step,
    WaitStep,
    WorkerTrigger,
    Workflow,
    WorkflowDefinitionError,
    wait,
)

__version__ = "0.1.0"

# With no logging configured, a run's warnings still say which run and step wrote them.
_install_last_resort()

__all__ = [
    "AmbiguousSchedule",
    "Attempt",
    "AttemptFailed",
    "AttemptStatus",
    "Capabilities",
    "DatabaseError",
    "Debounce",
    "Engine",
    "EngineError",
    "Event",
    "EventMessage",
    "EventOutcome",
    "EventSent",
    "EventWaitStep",
    "ForEach",
    "Health",
    "InvalidInput",
    "Job",
    "JobState",
    "Lagged",
    "LogLine",
    "LogRecorded",
    "Loop",
    "MissingStateKey",
    "NonRetryable",
    "Orphan",
    "QueueChanged",
    "QueueInfo",
    "QueueStats",
    "RateLimit",
    "ReloadErrorCleared",
    "ReloadFailed",
    "ReplayedAlready",
    "Retry",
    "Run",
    "RunFilter",
    "RunFinished",
    "RunQueued",
    "RunStarted",
    "RunStatus",
    "RunStatusChanged",
    "RunStore",
    "Schedule",
    "ScheduleInfo",
    "Step",
    "StepFinished",
    "StepRun",
    "StepStarted",
    "StepStatus",
    "Subworkflow",
    "Switch",
    "TryCatch",
    "UnknownJob",
    "UnknownQueue",
    "UnknownRun",
    "WaitReason",
    "WaitStep",
    "WorkerInfo",
    "WorkerTrigger",
    "Workflow",
    "WorkflowDefinitionError",
    "WorkflowInfo",
    "WorkflowLoadError",
    "WorkflowReloaded",
    "for_each",
    "format_duration",
    "loop",
    "parse_duration",
    "subworkflow",
    "switch",
    "try_catch",
    "wait",
]
