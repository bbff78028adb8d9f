"""Loading workflow files: each file in a fresh module namespace, errors with file and line.

A file defines `workflow` or a list `workflows`. Its version is a hash of its own source and of
the helper modules beside it that it imports, so editing a helper makes a new version too.
"""

from __future__ import annotations

import hashlib
import re
import sys
import threading
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path

from .workflow import Workflow

IMPORT_TIMEOUT_S = 5.0  # a workflow file whose import takes longer is reported, not waited for

# Each workflow file is imported as a module of its own: PACKAGE.<file stem>_<path hash>.
PACKAGE = "blok_workflows"
_MODULE_PREFIX = re.compile(rf"\b{PACKAGE}\.[^\s.:]+_[0-9a-f]{{8}}\.")


def user_names(text: str) -> str:
    """`text` (a traceback, a log line) with the names of a workflow file's classes as the
    user wrote them: `CardDeclined`, not `blok_workflows.orders_1a2b3c4d.CardDeclined`."""
    return _MODULE_PREFIX.sub("", text) if PACKAGE in text else text


class WorkflowLoadError(Exception):
    """A workflow file that did not import or validate; `str()` is "file:line: message"."""

    def __init__(self, path: Path, line: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {message}")


@dataclass
class LoadedFile:
    path: Path
    version: str
    workflows: list[Workflow] = field(default_factory=list)
    # sha1 of each file the import read (the file itself and its helpers), to tell later
    # whether any of them changed since.
    inputs: dict[Path, str] = field(default_factory=dict)


def file_digest(path: Path) -> str | None:
    try:
        return hashlib.sha1(path.read_bytes()).hexdigest()
    except OSError:
        return None


def workflow_files(folder: Path) -> list[Path]:
    """The files that define workflows: *.py not starting with '_' (helpers start with '_'
    or are imported by a workflow file, and reload with it)."""
    return sorted(p for p in folder.glob("*.py") if is_workflow_file(p))


def is_workflow_file(path: Path) -> bool:
    """A top-level *.py that is neither a helper (`_name.py`) nor an editor's lock or backup
    file (`.#name.py`, `.name.py`)."""
    return path.suffix == ".py" and not path.name.startswith(("_", "."))


def _error_line(error: BaseException, path: Path) -> int | None:
    if isinstance(error, SyntaxError) and error.filename and Path(error.filename) == path:
        return error.lineno
    line = None
    for frame in traceback.extract_tb(error.__traceback__):
        if Path(frame.filename) == path:
            line = frame.lineno
    return line


# Names of helper modules imported from any workflows folder. A helper of the same name from
# another folder (a second engine, an earlier test) would otherwise be found in sys.modules
# and used in place of this folder's file.
_helper_names: set[str] = set()


def _helper_sources(folder: Path, before: set[str]) -> dict[Path, bytes]:
    """Sources of modules from `folder` that importing the file pulled in."""
    found = {}
    for name, module in list(sys.modules.items()):
        if name in before:
            continue
        origin = getattr(module, "__file__", None)
        if origin and Path(origin).parent == folder:
            _helper_names.add(name)
            found[Path(origin)] = Path(origin).read_bytes()
    return found


def load_file(path: Path) -> LoadedFile:
    """Import one workflow file into a fresh namespace; raise WorkflowLoadError on any problem."""
    path = path.resolve()
    folder = path.parent
    try:
        source = path.read_bytes()
    except OSError as error:
        raise WorkflowLoadError(path, None, f"cannot read: {error}") from error
    # Helper modules next to the workflows must be re-imported too, or edits to them would not
    # be seen: drop every module that came from this folder (or from another workflows
    # folder) before importing.
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if name in _helper_names or (origin and Path(origin).parent == folder):
            del sys.modules[name]
    before = set(sys.modules)
    module_name = f"{PACKAGE}.{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    added_path = str(folder) not in sys.path
    if added_path:
        sys.path.insert(0, str(folder))
    try:
        code = compile(source, str(path), "exec")
        exec(code, module.__dict__)
    except (Exception, SystemExit) as error:  # a `sys.exit()` at import must not stop the engine
        kind = type(error).__name__
        raise WorkflowLoadError(path, _error_line(error, path), f"{kind}: {error}") from error
    finally:
        if added_path:
            sys.path.remove(str(folder))
    digest = hashlib.sha1(source)
    helpers = _helper_sources(folder, before)
    for helper in sorted(helpers.values()):
        digest.update(helper)
    version = digest.hexdigest()[:8]
    inputs = {path: hashlib.sha1(source).hexdigest()}
    inputs.update((p, hashlib.sha1(text).hexdigest()) for p, text in helpers.items())
    found = module.__dict__.get("workflows")
    if found is None and "workflow" in module.__dict__:
        found = [module.__dict__["workflow"]]
    if found is None:
        raise WorkflowLoadError(path, None, "defines neither `workflow` nor `workflows`")
    if isinstance(found, Workflow):
        found = [found]
    if not isinstance(found, list | tuple) or not all(isinstance(w, Workflow) for w in found):
        raise WorkflowLoadError(path, None, "`workflows` must be a list of Workflow objects")
    return LoadedFile(path, version, [w.with_version(version, str(path)) for w in found], inputs)


def load_file_with_timeout(path: Path, timeout: float = IMPORT_TIMEOUT_S) -> LoadedFile:
    """`load_file` in a daemon thread, given up on after `timeout` seconds.

    A file that loops forever at import would otherwise hang whoever loads it. Python cannot
    kill a thread, so a runaway import keeps running in the background (a daemon thread: it does
    not keep the process alive) and the file is reported as failed; while it runs it competes
    for the GIL, and a helper module it is stuck importing stays locked for other imports.
    """
    path = path.resolve()
    outcome: list[LoadedFile | BaseException] = []

    def target() -> None:
        try:
            outcome.append(load_file(path))
        except WorkflowLoadError as error:
            outcome.append(error)
        except Exception as error:  # outside the file's own code (a helper vanished mid-read…)
            outcome.append(WorkflowLoadError(path, None, f"{type(error).__name__}: {error}"))
        except BaseException as error:  # raised again in the caller's thread, below
            outcome.append(error)

    thread = threading.Thread(target=target, name=f"blok-import:{path.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise WorkflowLoadError(
            path,
            _running_line(thread, path),
            f"import did not finish within {timeout:g}s (does it loop or block at import?); "
            "the previous version keeps serving",
        )
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result


def _running_line(thread: threading.Thread, path: Path) -> int | None:
    """The line of `path` that a stuck import thread is executing, to point the user at it."""
    frame = sys._current_frames().get(thread.ident or -1)
    line = None
    for entry in traceback.extract_stack(frame) if frame is not None else []:
        if Path(entry.filename) == path:
            line = entry.lineno
    return line
