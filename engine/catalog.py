"""The workflow catalog: what is loaded (from files or given inline), which version serves each
workflow, the older versions waiting runs still resume on, and the files that failed to load.

The worker follows it (`on_change`) to start and stop claiming from queues; hot reload
(engine/reload.py) loads files into it. It knows nothing of queues' jobs or runs.
"""

from __future__ import annotations

import ast
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from . import expressions
from .backends.base import ScheduleSpec, ServedQueue, WorkerCatalog
from .errors import EngineError, WorkflowDefinitionError
from .events import EventBus, ReloadErrorCleared, ReloadFailed, WorkflowReloaded
from .input_models import input_models, required_paths
from .loader import (
    IMPORT_TIMEOUT_S,
    LoadedFile,
    WorkflowLoadError,
    file_digest,
    is_workflow_call,
    load_file_with_timeout,
    passed_over,
    workflow_files,
)
from .models import Run, WorkflowInfo
from .payload_fields import missing_fields
from .primitives import Subworkflow, global_middleware, middleware_chain
from .schedules import declared_settings, spec_of
from .workflow import EventWaitStep, Step, StepDefinition, Workflow

RELOAD_ERROR = "blok_reload_error"  # a log record's attribute: also in `reload_errors`
log = logging.getLogger("blok.catalog")

KEPT_VERSIONS = 100  # per workflow, for waiting runs that resume on the version they began on

WorkflowSource = str | os.PathLike[str] | Sequence[Workflow] | None


def every_step(steps: Sequence[StepDefinition]) -> Iterator[StepDefinition]:
    """The steps and, after each, the steps nested in it (its branches, iterations, arms)."""
    for step in steps:
        yield step
        for branch in step.children():
            yield from every_step(branch)


def body_fields(wf: Workflow) -> list[str]:
    """The `$.body.<path>` expressions a workflow's steps (nested ones too) and trigger read,
    as dotted paths, each once, in order. Callables cannot be read this way."""
    found: dict[str, None] = {}

    def add(expr: object) -> None:
        if expressions.is_expression(expr):
            try:
                parts = expressions.parse(str(expr))
            except expressions.ExpressionError:
                return
            if parts[0] == "body" and len(parts) > 1:
                found.setdefault(".".join(parts[1:]))

    for step in every_step(wf.steps):
        for expr in step.expressions():
            add(expr)
        if isinstance(step, Step):
            # `$.body` given to a parameter annotated with a model: its required fields.
            for param in input_models(step.node):
                below = step.inputs.get(param.name)
                if param.hint is param.model and (str(below) + ".").startswith("$.body."):
                    for path in required_paths(param.model, str(below)):
                        add(path)
    trigger = wf.trigger
    if trigger is not None:
        add(trigger.concurrency_key)
        if trigger.debounce is not None:
            add(trigger.debounce.key)
    return list(found)


def event_keys(wf: Workflow) -> dict[str, list[str]]:
    """Event → the payload paths its keyed waits match on ("order_id" for
    match="$.body.order_id"), each once, in order."""
    keys: dict[str, dict[str, None]] = {}
    for step in every_step(wf.steps):
        if isinstance(step, EventWaitStep) and step.match is not None:
            keys.setdefault(step.event, {})[".".join(step.match_path)] = None
    return {event: list(paths) for event, paths in keys.items()}


def awaited_events(wf: Workflow) -> list[str]:
    """The events the workflow's `wait.for_event` steps (nested ones too) wait for, each once,
    in order."""
    events = (step.event for step in every_step(wf.steps) if isinstance(step, EventWaitStep))
    return list(dict.fromkeys(events))


def definition_lines(path: Path, name: str) -> list[int]:
    """The lines of the file's `Workflow(name="...")` calls that give a workflow this name, in
    order: where a clash of names points. [] when the file does not parse or names its
    workflows otherwise than with a literal (the clash is then reported without a line)."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    lines = []
    for node in ast.walk(tree):
        if is_workflow_call(node) and any(
            keyword.arg == "name"
            and isinstance(keyword.value, ast.Constant)
            and keyword.value.value == name
            for keyword in node.keywords
        ):
            lines.append(node.lineno)
    return sorted(lines)


def line_in(path: Path, wf: Workflow) -> int | None:
    """The line of `path` a workflow was defined on (its `Workflow(...)` call, or the call in
    this file that led to it); else the one `Workflow(name=...)` call of that name in it."""
    source = wf.source
    if source is not None and Path(source[0]) == path:
        return source[1]
    lines = definition_lines(path, wf.name)
    return lines[0] if len(lines) == 1 else None


def inline_workflows(given: object) -> list[Workflow]:
    """The workflows given to Engine(workflows=[...]), refusing two of one name or on one
    queue, as files are refused (check_clashes): the catalog keeps one workflow per name and
    per queue, and the other would never run. The same object given twice is kept once."""
    kept: list[Workflow] = []
    names: dict[str, Workflow] = {}
    queues: dict[str, Workflow] = {}
    if not isinstance(given, list | tuple):
        raise EngineError(
            "workflows= takes a folder, a file or a list of Workflow objects, "
            f"not {type(given).__name__}"
        )
    for wf in given:
        if not isinstance(wf, Workflow):
            raise EngineError(
                f"workflows= takes Workflow objects; one given is {type(wf).__name__}"
            )
        if any(wf is other for other in kept):
            continue
        here = f"{wf.defined_at}: " if wf.defined_at else ""
        first = names.get(wf.name)
        if first is not None:
            there = f" (first at {first.defined_at})" if first.defined_at else ""
            raise WorkflowDefinitionError(
                f"{here}workflow {wf.name!r} is defined twice in Engine(workflows=[...]){there}"
            )
        other = queues.get(wf.queue) if wf.queue else None
        if other is not None:
            there = f" (at {other.defined_at})" if other.defined_at else ""
            raise WorkflowDefinitionError(
                f"{here}queue {wf.queue!r} is already consumed by workflow {other.name!r}{there}"
            )
        names[wf.name] = wf
        if wf.queue:
            queues[wf.queue] = wf
        kept.append(wf)
    return kept


class Catalog:
    def __init__(
        self,
        source: WorkflowSource,
        bus: EventBus,
        *,
        check: Callable[[Workflow], None] = lambda wf: None,
        import_timeout: float = IMPORT_TIMEOUT_S,
    ) -> None:
        """`check` refuses a workflow this engine cannot serve (an unknown provider): it
        raises EngineError, and the file that defines it fails to load."""
        self.source = source
        self.bus = bus
        self.check = check
        self.import_timeout = import_timeout
        self.files: dict[Path, LoadedFile] = {}
        self.inline: list[Workflow] = []
        self.workflows: dict[str, Workflow] = {}
        self._served: dict[str, Workflow] = {}  # made with `workflows`, read at every enqueue
        self.versions: dict[tuple[str, str], Workflow] = {}
        self.reload_errors: dict[str, str] = {}
        # Each file that failed to load, with the digest of what failed: fixed while the hot
        # reloader started, it was never loaded again (`reload._changed_since_load`).
        self.failed: dict[Path, str | None] = {}
        # Files that imported but were refused for a clash (a workflow or queue another file
        # has): tried again at each reload, as the other file may give the name up or go.
        self.refused: dict[Path, LoadedFile] = {}
        self.on_change: list[Callable[[], None]] = []
        self.declares_schedules = False  # a Scheduler declares this worker's (its entry says)
        # (workflow, version, name) of each missing sub-workflow or middleware, and of each
        # schedule whose payload lacks a field, warned of.
        self.warned: set[tuple[str, str, str]] = set()

    # ---- where the workflows are -----------------------------------------------------------
    @property
    def folder(self) -> Path | None:
        """The folder to watch for changes, when workflows come from files."""
        if isinstance(self.source, str | os.PathLike):
            path = Path(self.source)
            return path if path.is_dir() else path.parent
        return None

    @property
    def only_file(self) -> Path | None:
        """The one file to watch when the source is a file rather than a folder."""
        if isinstance(self.source, str | os.PathLike):
            path = Path(self.source)
            return path.resolve() if path.is_file() else None
        return None

    def load_initial(self) -> None:
        source = self.source
        if source is None:
            self.apply()
            return
        if isinstance(source, str | os.PathLike):
            path = Path(source)
            if not path.exists():
                raise EngineError(f"{path}: no such workflows folder or file")
            if path.is_file() and path.suffix != ".py":
                raise EngineError(f"{path}: not a workflow file (a folder of them, or one .py)")
            # Oldest first: of two files that clash, the one that was there first is kept, at
            # a start as at a hot reload (which keeps the loaded one and refuses the newcomer).
            # By name, a restart served the file the reload had refused.
            files = [path] if path.is_file() else sorted(workflow_files(path), key=_modified)
            for file in files:
                self.load(file)
            for file in [] if path.is_file() else passed_over(path.resolve()):
                log.warning(
                    "%s defines a workflow in a subfolder, and is not loaded: only the .py files "
                    "directly in %s are (move it up, or import its workflow from a file there)",
                    file,
                    path,
                )
            self.files = dict(sorted(self.files.items()))
            self.apply()
            return
        self.inline = inline_workflows(source)
        for wf in self.inline:
            self.check(wf)
        self.apply()

    # ---- loading ---------------------------------------------------------------------------
    def load(
        self, path: Path, *, imported: LoadedFile | WorkflowLoadError | None = None
    ) -> LoadedFile | None:
        """(Re)load one workflow file; on failure its previous version keeps serving. The hot
        reloader imports off the event loop and hands the outcome in as `imported`."""
        path = path.resolve()
        key = str(path)
        try:
            if imported is None:
                imported = load_file_with_timeout(path, self.import_timeout)
            if isinstance(imported, WorkflowLoadError):
                raise imported
            loaded = imported
            try:
                self.check_clashes(loaded)
            except WorkflowLoadError:
                self.refused[path] = loaded
                raise
        except WorkflowLoadError as error:
            self.reload_errors[key] = str(error)
            self.failed[path] = file_digest(path)
            kept = "; its previous version keeps serving" if path in self.files else ""
            # Marked: a live view shows `reload_errors` already (the console's banner).
            log.error("workflow file failed to load: %s%s", error, kept, extra={RELOAD_ERROR: True})
            self._changed()
            if self.bus.active:
                self.bus.publish(ReloadFailed(key, str(error)))
            return None
        self.files[path] = loaded
        self.failed.pop(path, None)
        self.refused.pop(path, None)
        if self.reload_errors.pop(key, None) is not None and self.bus.active:
            self.bus.publish(ReloadErrorCleared(key))
        return loaded

    def unload(self, path: Path) -> None:
        path = path.resolve()
        self.files.pop(path, None)
        self.failed.pop(path, None)
        self.refused.pop(path, None)
        if self.reload_errors.pop(str(path), None) is not None and self.bus.active:
            self.bus.publish(ReloadErrorCleared(str(path)))

    def check_clashes(self, loaded: LoadedFile) -> None:
        """Refuse a file whose workflow or queue another loaded file (or the file itself)
        already defines, or a workflow this engine cannot serve."""
        names: dict[str, Path] = {}
        queues: dict[str, str] = {}
        for path, other in self.files.items():
            if path == loaded.path:
                continue
            for wf in other.workflows:
                names[wf.name] = path
                if wf.queue:
                    queues[wf.queue] = wf.name
        for wf in loaded.workflows:
            if wf.name in names:
                here = definition_lines(loaded.path, wf.name)
                if names[wf.name] == loaded.path:  # twice in this file
                    first = f" (first at line {here[0]})" if len(here) >= 2 else ""
                    raise WorkflowLoadError(
                        loaded.path,
                        here[1] if len(here) >= 2 else None,
                        f"workflow {wf.name!r} is defined twice in this file{first}",
                    )
                there = definition_lines(names[wf.name], wf.name)
                raise WorkflowLoadError(
                    loaded.path,
                    here[0] if len(here) == 1 else None,
                    f"workflow {wf.name!r} is already defined in {names[wf.name]}"
                    + (f":{there[0]}" if len(there) == 1 else ""),
                )
            if wf.queue and wf.queue in queues:
                raise WorkflowLoadError(
                    loaded.path,
                    line_in(loaded.path, wf),
                    f"queue {wf.queue!r} is already consumed by workflow {queues[wf.queue]!r}",
                )
            names[wf.name] = loaded.path
            if wf.queue:
                queues[wf.queue] = wf.name
            # Refused here rather than failing when the queue starts, where a hot reload
            # would take the whole engine down (an unknown provider, sqlite without a
            # database).
            try:
                self.check(wf)
            except EngineError as error:
                raise WorkflowLoadError(
                    loaded.path, line_in(loaded.path, wf), f"workflow {wf.name!r}: {error}"
                ) from None

    def apply(self) -> None:
        """Make the current workflows those loaded now; tell the followers."""
        current: dict[str, Workflow] = {}
        for wf in self.inline:
            current[wf.name] = wf
        for loaded in self.files.values():
            for wf in loaded.workflows:
                current[wf.name] = wf
        for wf in current.values():
            self.versions.pop((wf.name, wf.version), None)  # re-added last: the newest
            self.versions[(wf.name, wf.version)] = wf
        # Old versions are kept for runs that wait and resume on them; a long editing session
        # must not keep every module it ever loaded, so only the newest few per workflow stay.
        kept: dict[str, int] = {}
        for key in reversed(list(self.versions)):
            kept[key[0]] = kept.get(key[0], 0) + 1
            if kept[key[0]] > KEPT_VERSIONS:
                del self.versions[key]
        self.workflows = current
        self._served = {wf.queue: wf for wf in current.values() if wf.queue is not None}
        self._warn_of_missing(current)
        self._warn_of_schedule_payloads(current)
        self._changed()

    def _warn_of_missing(self, current: dict[str, Workflow]) -> None:
        """Log, once each, a sub-workflow or middleware a workflow names that no loaded one is:
        its runs fail there, and a typo ("billing.refnd") was found only in a run's error."""
        everywhere = global_middleware()
        for wf in current.values():
            named = [
                (step.defined_at or wf.defined_at, f"subworkflow step {step.name!r}", step.workflow)
                for step in every_step(wf.steps)
                if isinstance(step, Subworkflow)
            ]
            if not wf.middleware:
                named += [
                    (wf.defined_at, "middleware", n) for n in middleware_chain(wf, everywhere)
                ]
            for where, what, target in named:
                found = current.get(target)
                if found is not None and (what != "middleware" or found.middleware):
                    continue
                if (wf.name, wf.version, target) in self.warned:
                    continue
                self.warned.add((wf.name, wf.version, target))
                why = "which no loaded workflow is" if found is None else "not middleware=True"
                fails = "before their first step" if what == "middleware" else "at that step"
                log.warning(
                    "%sworkflow %r: %s names %r, %s: its runs fail %s%s",
                    f"{where}: " if where else "",
                    wf.name,
                    what,
                    target,
                    why,
                    fails,
                    expressions.did_you_mean(target, current) if found is None else "",
                )

    def _warn_of_schedule_payloads(self, current: dict[str, Workflow]) -> None:
        """Log, once each, a schedule whose payload lacks a `$.body` field its workflow reads:
        its every tick's run fails at the step that reads it (as `blok-tui enqueue` warns of
        a payload it is given), and only the runs said so, one a tick."""
        for wf in current.values():
            fields = body_fields(wf) if wf.schedules else []  # a reload reads every workflow
            for schedule in wf.schedules:
                missing = missing_fields(schedule.payload, fields)
                if not missing or (wf.name, wf.version, schedule.id) in self.warned:
                    continue
                self.warned.add((wf.name, wf.version, schedule.id))
                log.warning(
                    "%sworkflow %r, schedule %r: its payload has no %s, which the workflow "
                    "reads: each tick's run fails at the %s (unless in a branch "
                    "the run does not take)",
                    f"{wf.defined_at}: " if wf.defined_at else "",
                    wf.name,
                    schedule.id,
                    ", ".join(f"$.body.{field}" for field in missing),
                    "steps that read them" if len(missing) > 1 else "step that reads it",
                )

    def _changed(self) -> None:
        for follower in self.on_change:
            follower()

    def notify_reloaded(self, loaded: LoadedFile) -> None:
        if self.bus.active:
            self.bus.publish(
                WorkflowReloaded(
                    str(loaded.path),
                    tuple(w.name for w in loaded.workflows),
                    tuple(w.version for w in loaded.workflows),
                )
            )

    # ---- lookups ---------------------------------------------------------------------------
    def workflow(self, name: str) -> Workflow | None:
        return self.workflows.get(name)

    def version(self, name: str, version: str) -> Workflow | None:
        return self.versions.get((name, version))

    def takes_over(self, workflow: Workflow) -> Workflow | None:
        """The loaded version of `workflow` when it is another one with the same steps: a run
        of `workflow` goes on with it where it stops (`resumed_on` says the same)."""
        current = self.workflows.get(workflow.name)
        if current is None or current.version == workflow.version:
            return None
        return current if _step_shape(current.steps) == _step_shape(workflow.steps) else None

    def resumed_on(
        self, current: Workflow, run: Run, resuming: bool
    ) -> tuple[Workflow | None, tuple[str, str] | None]:
        """The definition a claimed run executes, and a note (message, level) for its log: the
        current one, except for a run resuming after a reload that changed the shape of its
        steps (the cursor and the step records would point at different steps), which
        finishes on the version it started on; None when this process does not have that
        version (a restart, another worker's files): it cannot go on here (`versions.
        not_resumable_here`)."""
        if not resuming or run.workflow_version in ("", current.version):
            return current, None
        older = self.version(run.workflow_name, run.workflow_version)
        if older is not None:
            compatible = _step_shape(older.steps) == _step_shape(current.steps)
        else:  # started before a restart: only its top-level step records are left
            compatible = [(s.name, s.kind) for s in run.own_steps()] == [
                (s.name, s.kind) for s in current.steps
            ]
        if compatible:
            return current, (
                f"resumed on version {current.version} (started on {run.workflow_version}); "
                "its steps are unchanged",
                "info",
            )
        if older is not None:
            return older, (
                f"resumed on version {run.workflow_version}, the version it started on: the "
                f"current version {current.version} changed its steps",
                "info",
            )
        # Going on by position would run other steps than its records say: a step done run
        # again under another's name, later ones never run.
        return None, None

    def served(self) -> dict[str, Workflow]:
        """Queue name → the workflow its jobs run (the catalog's own: not to be changed)."""
        return self._served

    def schedule_specs(self) -> dict[str, tuple[ScheduleSpec, ...]]:
        """Workflow → the schedules this worker declares (`Scheduler.declare`): those of the
        workflows it serves, "none" included."""
        return {
            wf.name: tuple(spec_of(wf.name, wf.queue, wf.schedules))
            for wf in self.served().values()
            if wf.trigger
        }

    def infos(self) -> list[WorkflowInfo]:
        everywhere = global_middleware()
        declared = self.schedule_specs() if self.declares_schedules else {}
        return [
            WorkflowInfo(
                name=wf.name,
                version=wf.version,
                queue=wf.queue,
                path=wf.path,
                steps=[s.name for s in wf.steps],
                body_fields=body_fields(wf),
                events=self._events_of_runs(wf, everywhere),
                event_keys=self._keys_of_runs(wf, everywhere),
                schedules=(declared_settings(declared[wf.name]) if wf.name in declared else None),
            )
            for wf in sorted(self.workflows.values(), key=lambda w: w.name)
        ]

    def _events_of_runs(self, wf: Workflow, everywhere: Sequence[str]) -> list[str]:
        """The events a run of `wf` may wait for: its own waits', then those of the middleware
        it runs first (their steps are the run's too)."""
        found = dict.fromkeys(awaited_events(wf))
        for name in middleware_chain(wf, everywhere):
            middleware = self.workflows.get(name)
            if middleware is not None:
                found.update(dict.fromkeys(awaited_events(middleware)))
        return list(found)

    def _keys_of_runs(self, wf: Workflow, everywhere: Sequence[str]) -> dict[str, list[str]]:
        """`event_keys` of a run of `wf`: its own waits', and its middleware's."""
        found = event_keys(wf)
        for name in middleware_chain(wf, everywhere):
            middleware = self.workflows.get(name)
            for event, paths in (event_keys(middleware) if middleware else {}).items():
                found[event] = list(dict.fromkeys([*found.get(event, []), *paths]))
        return found

    def entry(
        self, worker: str, providers: dict[str, str], widths: dict[str, int]
    ) -> WorkerCatalog:
        """What this worker serves, for the shared state: queues with their provider and
        width as served now, workflows with their top-level steps."""
        queues = []
        for name, wf in sorted(self.served().items()):
            trigger = wf.trigger
            assert trigger is not None
            queues.append(
                ServedQueue(
                    name=name,
                    workflow_name=wf.name,
                    workflow_version=wf.version,
                    provider=providers.get(name, ""),
                    concurrency=widths.get(name, trigger.concurrency),
                    retries=trigger.retries,
                    start_delay_ms=trigger.start_delay,
                    timeout_ms=trigger.timeout,
                )
            )
        kinds = {
            wf.name: tuple((s.name, s.kind) for s in wf.steps) for wf in self.workflows.values()
        }
        return WorkerCatalog(
            worker=worker,
            queues=tuple(queues),
            workflows=tuple(self.infos()),
            step_kinds=kinds,
            reload_errors=dict(self.reload_errors),
            updated_at=time.time(),
        )


def _modified(path: Path) -> tuple[int, str]:
    try:
        return path.stat().st_mtime_ns, path.name
    except OSError:  # gone since the folder was listed: its load says so
        return 0, path.name


def _step_shape(steps: Sequence[Any]) -> list[Any]:
    """Names and kinds of steps, nested lists included: what a run's cursor refers to; and
    what a wait waits for (a run waiting for "approved" took "approval_granted" once a reload
    renamed it, and left the event it waited for untaken)."""
    return [
        (s.name, s.kind, s.waits_for(), [_step_shape(branch) for branch in s.children()])
        for s in steps
    ]
