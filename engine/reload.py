"""Hot reload: watch the workflows folder and swap definitions in without dropping a run.

A burst of saves is one reload (watchfiles groups changes until the folder is quiet for
`step_ms`). Only the files that changed are imported again, except when a helper module beside
them changed: every workflow file may import it, so all of them are. Imports run in a thread
with a time limit, off the event loop, so runs keep going while a file loads and a file that
never finishes importing is reported instead of hanging the engine. Runs in flight hold their
`Workflow` object and finish on it; the worker's queues switch to the new one when the catalog
applies it (`Catalog.apply`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol
from weakref import WeakKeyDictionary

import anyio
import anyio.from_thread
import anyio.lowlevel
from watchfiles import Change, awatch

from .catalog import Catalog
from .errors import DatabaseError
from .loader import (
    LoadedFile,
    WorkflowLoadError,
    file_digest,
    is_workflow_file,
    load_file_with_timeout,
    workflow_files,
)


class HasCatalog(Protocol):
    @property
    def catalog(self) -> Catalog: ...


def _catalog(owner: Catalog | HasCatalog) -> Catalog:
    return owner if isinstance(owner, Catalog) else owner.catalog


log = logging.getLogger("blok.reload")

DEBOUNCE_MS = 1_600  # the longest a stream of saves is grouped before a reload happens anyway
STEP_MS = 50  # a reload starts once the folder has been quiet this long
FOLDER_CHECK_S = 1.0  # how often a watch checks that its folder was not replaced

_watching: WeakKeyDictionary[Catalog, anyio.Event] = WeakKeyDictionary()


def _watching_event(engine: Catalog) -> anyio.Event:
    event = _watching.get(engine)
    if event is None:
        event = _watching[engine] = anyio.Event()
    return event


async def wait_until_watching(owner: Catalog | HasCatalog) -> None:
    """Return once the engine's watcher sees changes; a save before that would go unnoticed
    (tests and benchmarks save right after starting the engine)."""
    await _watching_event(_catalog(owner)).wait()


class _StopSignal:
    """The stop event handed to watchfiles. Its watcher thread polls `is_set()` from the moment
    the OS watch is in place, so the first poll is also the signal that the watch is live."""

    def __init__(self, engine: Catalog, on_live: Callable[[], None]) -> None:
        self._stop = threading.Event()
        self._polled = False
        self._live = _watching_event(engine)  # the engine's first watch
        self.live = anyio.Event()  # this watch
        self._on_live = on_live
        self._token = anyio.lowlevel.current_token()

    def is_set(self) -> bool:
        if not self._polled:
            self._polled = True
            anyio.from_thread.run_sync(self._went_live, token=self._token)
        return self._stop.is_set()

    def _went_live(self) -> None:  # on the event loop, before anyone waiting hears of it
        self._on_live()
        self._live.set()
        self.live.set()

    def set(self) -> None:
        self._stop.set()


def _python_source(change: Change, path: str) -> bool:
    name = os.path.basename(path)
    return name.endswith(".py") and not name.startswith(".")


async def watch_folder(
    engine: Catalog, folder: Path, *, debounce_ms: int = DEBOUNCE_MS, step_ms: int = STEP_MS
) -> None:
    """Reload the catalog's workflow files as they change, until cancelled. A folder removed
    and made again (`rm -rf workflows && cp -r new workflows`, a directory swapped in by
    rename) is watched again: the OS watch was on the old one, and the worker served nothing
    from then on, alive and "healthy", until restarted."""
    folder = folder.resolve()
    one_at_a_time = anyio.Lock()  # imports share sys.modules: never two reloads at once
    identity = _identity(folder)
    while True:
        if identity is None:
            identity = await _folder_back(folder)
        await _watch_while_same(engine, folder, identity, one_at_a_time, debounce_ms, step_ms)
        await anyio.lowlevel.checkpoint()  # a watch stopped by the engine's stop: no more
        identity = _identity(folder)
        if identity is not None:
            log.warning("workflow folder %s was replaced: watching the new one", folder)


async def _watch_while_same(
    engine: Catalog,
    folder: Path,
    identity: tuple[int, int],
    one_at_a_time: anyio.Lock,
    debounce_ms: int,
    step_ms: int,
) -> None:
    """Watch `folder` until cancelled, or until the folder at its path is no longer the one
    the watch is on (`identity`)."""
    only = engine.only_file
    # What changed between the last load and the watch going live: no event will come for
    # it. Taken the moment the watch is live, so that later saves are left to the watcher.
    missed: set[Path] = set()
    stop = _StopSignal(engine, lambda: missed.update(_changed_since_load(engine, folder, only)))
    async with anyio.create_task_group() as tg:
        # awatch waits for its watcher thread before it sets its stop event, so a cancelled
        # watch would linger until the thread's 5 s timeout: stop the thread at once instead.
        tg.start_soon(_stop_when_cancelled, stop)
        tg.start_soon(_stop_when_replaced, folder, identity, stop)
        tg.start_soon(_catch_up, stop, engine, folder, only, missed, one_at_a_time)
        itself = str(folder)
        async for changes in awatch(
            folder,
            watch_filter=lambda change, path: path == itself or _python_source(change, path),
            debounce=debounce_ms,
            step=step_ms,
            stop_event=stop,
            recursive=False,  # helpers are the modules beside the workflow files (see loader)
        ):
            paths = {Path(p) for _, p in changes if p != itself}
            if len(paths) < len(changes):  # the folder itself was removed: watch what comes
                stop.set()  # (its inode may come back with the new one: not a sign)
            try:
                async with one_at_a_time:
                    await reload_paths(engine, folder, paths, only=only)
            except DatabaseError as error:  # its own words say it: no traceback of ours
                log.error("hot reload of %s failed: %s; still watching", folder, error)
            except Exception:
                # A bug here must not take the runs down with the watcher: say so, go on.
                log.exception("hot reload of %s failed; still watching", folder)
        tg.cancel_scope.cancel()


def _identity(folder: Path) -> tuple[int, int] | None:
    """Which directory is at `folder` now (device, inode); None: none."""
    try:
        found = os.stat(folder)
    except OSError:
        return None
    return (found.st_dev, found.st_ino)


async def _stop_when_replaced(folder: Path, identity: tuple[int, int], stop: _StopSignal) -> None:
    # Polled: the OS watch is on the directory itself, and nothing tells of another one put
    # at its path.
    while _identity(folder) == identity:  # noqa: ASYNC110
        await anyio.sleep(FOLDER_CHECK_S)
    stop.set()


async def _folder_back(folder: Path) -> tuple[int, int]:
    """Wait until a directory is at `folder` again."""
    log.warning("workflow folder %s is gone: nothing is reloaded until it is back", folder)
    while (identity := _identity(folder)) is None:  # noqa: ASYNC110 (a path: polled)
        await anyio.sleep(FOLDER_CHECK_S)
    return identity


def _changed_since_load(engine: Catalog, folder: Path, only: Path | None) -> set[Path]:
    """Loaded files whose source or helpers changed on disk, and workflow files not loaded."""
    stale = {
        path
        for path, loaded in engine.files.items()
        if any(file_digest(p) != digest for p, digest in loaded.inputs.items())
    }
    stale |= {path for path, digest in engine.failed.items() if file_digest(path) != digest}
    on_disk = [only] if only is not None else workflow_files(folder)
    known = set(engine.files) | {Path(p) for p in engine.reload_errors}
    stale |= {p.resolve() for p in on_disk if p.exists() and p.resolve() not in known}
    return stale


async def _catch_up(
    stop: _StopSignal,
    engine: Catalog,
    folder: Path,
    only: Path | None,
    missed: set[Path],
    lock: anyio.Lock,
) -> None:
    await stop.live.wait()
    if not missed:
        return
    log.info("catching up with %d file(s) changed while the watcher started", len(missed))
    try:
        async with lock:
            await reload_paths(engine, folder, missed, only=only)
    except Exception:
        log.exception("catching up with %s failed; still watching", folder)


async def _stop_when_cancelled(stop: _StopSignal) -> None:
    try:
        await anyio.sleep_forever()
    finally:
        stop.set()


def _is_workflow(path: Path, folder: Path, only: Path | None) -> bool:
    if only is not None:
        return path == only
    return path.parent == folder and is_workflow_file(path)


def _swap_in(
    engine: Catalog, outcomes: dict[Path, LoadedFile | WorkflowLoadError]
) -> list[LoadedFile]:
    """Hand the imported files to the engine; return those that now serve.

    A file that failed to import keeps its previous version. The files that did import are
    checked against each other's new versions, not their old ones, so that a workflow (or a
    queue) moved from one file to another in one save is not refused as defined twice.
    """
    previous: dict[Path, LoadedFile] = {}
    for path, outcome in outcomes.items():
        if isinstance(outcome, WorkflowLoadError):
            engine.load(path, imported=outcome)
        elif path in engine.files:
            previous[path] = engine.files.pop(path)
    reloaded: list[LoadedFile] = []
    pending = {p: o for p, o in outcomes.items() if isinstance(o, LoadedFile)}
    refusals: dict[Path, WorkflowLoadError] = {}
    while pending:  # files refused for a clash get another try once the others are in
        clashing: dict[Path, LoadedFile] = {}
        for path, outcome in pending.items():
            try:
                engine.check_clashes(outcome)
            except WorkflowLoadError as error:
                clashing[path] = outcome
                refusals[path] = error
                continue
            loaded = engine.load(path, imported=outcome)
            assert loaded is not None, "a file that passed the clash check loads"
            reloaded.append(loaded)
        if len(clashing) == len(pending):
            break
        pending = clashing
    engine.refused = dict(pending)
    for path in pending:
        if engine.reload_errors.get(str(path)) != str(refusals[path]):  # not news otherwise
            engine.load(path, imported=refusals[path])
        old = previous.get(path)
        if old is None:
            continue
        try:
            engine.check_clashes(old)
        except WorkflowLoadError:
            continue  # its names now belong to another file; the error says which
        engine.files[path] = old
    return reloaded


def _import(path: Path, timeout: float) -> LoadedFile | WorkflowLoadError:
    try:
        return load_file_with_timeout(path, timeout)
    except WorkflowLoadError as error:
        return error


async def reload_paths(
    owner: Catalog | HasCatalog, folder: Path, changed: set[Path], *, only: Path | None = None
) -> None:
    """Bring the catalog in line with the files in `changed` (one debounced burst)."""
    engine = _catalog(owner)
    changed = {path.resolve() if path.exists() else path for path in changed}
    targets = {path for path in changed if _is_workflow(path, folder, only)}
    # A workflow file another one imports (its steps shared, a helper not named `_x.py`):
    # the importer kept the old code, since only the file saved was imported again.
    targets |= {p for p, loaded in engine.files.items() if not changed.isdisjoint(loaded.inputs)}
    if any(path not in targets for path in changed):
        # A helper changed: the workflow files that import it would keep the old code.
        on_disk = [only] if only is not None and only.exists() else []
        if only is None:
            on_disk = workflow_files(folder)
        known = set(engine.files) | {Path(p) for p in engine.reload_errors}
        targets |= {p.resolve() for p in on_disk} | {p for p in known if p.parent == folder}
    timeout = engine.import_timeout
    outcomes: dict[Path, LoadedFile | WorkflowLoadError] = {}
    gone: list[Path] = []
    for path in sorted(targets):
        if not path.exists():  # an editor's atomic save shows up as delete + add: look now
            gone.append(path)
            continue
        # The thread that runs the import is abandoned, not waited for, when the engine stops.
        outcomes[path] = await anyio.to_thread.run_sync(
            _import, path, timeout, abandon_on_cancel=True
        )
    for path, outcome in list(engine.refused.items()):
        if path not in targets and path.exists():
            outcomes.setdefault(path, outcome)
    before = {path: loaded.workflows for path, loaded in engine.files.items()}
    failing = set(engine.reload_errors)  # a file fixed back to its last good version: said
    removed = [p for p in gone if p in engine.files or str(p) in engine.reload_errors]
    for path in removed:
        engine.unload(path)
        log.info("workflow file removed: %s", path)
    reloaded = _swap_in(engine, outcomes)
    engine.apply()
    for path in removed:  # a reload to nothing: its workflows and queues are gone
        engine.notify_reloaded(LoadedFile(path, "", []))
    for loaded in reloaded:
        # A helper's edit reloads every file that may import it: those that came out the same
        # are said at debug level, or their lines hid the one that changed.
        old = [(w.name, w.version) for w in before.get(loaded.path, [])]
        same = old == [(w.name, w.version) for w in loaded.workflows]
        fixed = str(loaded.path) in failing
        note = {
            (True, True): " (loads again, as its last good version)",
            (False, True): " (loads again)",
            (True, False): " (unchanged)",
        }.get((same, fixed), "")
        log.log(
            logging.DEBUG if same and not fixed else logging.INFO,
            "reloaded %s: %s%s",
            loaded.path,
            ", ".join(f"{w.name}@{w.version}" for w in loaded.workflows),
            note,
        )
        engine.notify_reloaded(loaded)
