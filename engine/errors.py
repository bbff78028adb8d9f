"""The errors the engine raises at its users: each message is one line, meant to be read."""

from __future__ import annotations


class EngineError(Exception):
    """A request the engine refuses; the message says why and is meant for the user."""


class UnknownQueue(EngineError):
    pass


class UnknownRun(EngineError):
    pass


class UnknownJob(EngineError):
    pass


def ambiguous_start(word: str, noun: str, named: list[str], *, more: bool = False) -> EngineError:
    """The start of several ids refused, naming the first five of them (`named`; `more`:
    more were found than were read): a run's, a job's, a dead letter's."""
    count = "more than 5" if more else str(len(named))
    shown = ", ".join(named[:5]) + (" …" if len(named) > 5 else "")
    return EngineError(f"{word!r} is the start of {count} {noun} ({shown}): give more of it")


class ReplayedAlready(EngineError):
    """A requeue refused: the job's run was replayed, and the replay (or a replay of it)
    completed, so a requeue would run the job's steps again. `force=True` requeues anyway."""


class AmbiguousSchedule(EngineError):
    """A schedule asked for by its workflow alone, where the workflow has several: `schedules`
    holds their ids, one of which the caller must name."""

    def __init__(self, message: str, workflow: str, schedules: list[str]) -> None:
        super().__init__(message)
        self.workflow = workflow
        self.schedules = schedules


class DatabaseError(RuntimeError):
    """The database cannot be used: not a blok database, not writable, unreachable, from a
    newer version. The message names the database and says what to do."""


class WorkflowDefinitionError(ValueError):
    """A workflow, step, trigger or schedule that cannot work as written. `source`: where the
    part it is about was written (file, line), when that is not where the check ran (a step
    found wrong by its workflow's check): a workflow file's load error names that line."""

    source: tuple[str, int] | None = None


class NonRetryable(Exception):
    """Raised by a node for a failure that trying again cannot mend (a card declined, an order
    that does not exist): its step fails without the attempts it has left, and its job goes to
    the dead-letter queue without the retries it has left, where an operator sees it (as
    Inngest's NonRetriableError, Trigger.dev's AbortTaskRunError, Temporal's non-retryable
    errors). A try_catch around the step still catches it."""


class UnstorableOutput(TypeError):
    """A node returned what cannot be kept as its step's output (not JSON, a coroutine, a
    non-dict to spread). Every attempt would return the same kind of value: the step is not
    tried again, nor is its job (a programming error, for the dead-letter queue at once)."""
