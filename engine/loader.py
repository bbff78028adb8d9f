"""Loading workflow files: each file in a fresh module namespace, errors with file and line.

A file defines `workflow` or a list `workflows`. Its version is a hash of its own source and of
the helper modules beside it that it imports, so editing a helper makes a new version too.
"""

from __future__ import annotations

import hashlib
import sys
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path

from .workflow import Workflow


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


def workflow_files(folder: Path) -> list[Path]:
    """The files that define workflows: *.py not starting with '_' (helpers start with '_'
    or are imported by a workflow file, and reload with it)."""
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


def _error_line(error: BaseException, path: Path) -> int | None:
    if isinstance(error, SyntaxError) and error.filename and Path(error.filename) == path:
        return error.lineno
    line = None
    for frame in traceback.extract_tb(error.__traceback__):
        if Path(frame.filename) == path:
            line = frame.lineno
    return line


def _helper_sources(folder: Path, before: set[str]) -> list[bytes]:
    """Sources of modules from `folder` that importing the file pulled in."""
    found = []
    for name, module in list(sys.modules.items()):
        if name in before:
            continue
        origin = getattr(module, "__file__", None)
        if origin and Path(origin).parent == folder:
            found.append(Path(origin).read_bytes())
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
    # be seen: drop every module that came from this folder before importing.
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin and Path(origin).parent == folder:
            del sys.modules[name]
    before = set(sys.modules)
    module_name = f"blok_workflows.{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    added_path = str(folder) not in sys.path
    if added_path:
        sys.path.insert(0, str(folder))
    try:
        code = compile(source, str(path), "exec")
        exec(code, module.__dict__)
    except Exception as error:
        kind = type(error).__name__
        raise WorkflowLoadError(path, _error_line(error, path), f"{kind}: {error}") from error
    finally:
        if added_path:
            sys.path.remove(str(folder))
    digest = hashlib.sha1(source)
    for helper in sorted(_helper_sources(folder, before)):
        digest.update(helper)
    version = digest.hexdigest()[:8]
    found = module.__dict__.get("workflows")
    if found is None and "workflow" in module.__dict__:
        found = [module.__dict__["workflow"]]
    if found is None:
        raise WorkflowLoadError(path, None, "defines neither `workflow` nor `workflows`")
    if isinstance(found, Workflow):
        found = [found]
    if not isinstance(found, list | tuple) or not all(isinstance(w, Workflow) for w in found):
        raise WorkflowLoadError(path, None, "`workflows` must be a list of Workflow objects")
    return LoadedFile(path, version, [w.with_version(version, str(path)) for w in found])
