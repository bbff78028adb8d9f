"""Loading workflow files: each file in a fresh module namespace, errors with file and line.

A file defines `workflow` or a list `workflows`. Its version is a hash of its own source and of
the helper modules beside it that it imports, so editing a helper makes a new version too.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import sys
import threading
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, TypeGuard

from .durations import parse_duration
from .errors import EngineError
from .workflow import Workflow

# A workflow file whose import takes longer is reported, not waited for: long enough for a
# cold import of a large library (5 s refused `import torch` at a worker's start), short
# enough that a file that loops at import does not hold up the others for long.
IMPORT_TIMEOUT_S = 30.0
IMPORT_TIMEOUT_ENV = "BLOK_IMPORT_TIMEOUT"  # seconds, or a duration ("2m"): the limit's override

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


_DEFINES = re.compile(r"^workflows?\s*(:[^=]*)?=", re.MULTILINE)


def passed_over(folder: Path, most: int = 200) -> list[Path]:
    """Files in `folder`'s subfolders that define a workflow (they assign `workflow` or
    `workflows`) and that no loaded file imported: only the folder's own files are loaded,
    and a `workflows/billing/invoice.py` was passed over without a word. Up to `most` files
    are looked at (a folder given as a project's root may hold a virtualenv), in subfolders
    not hidden or private (`.venv`, `__pycache__`, `_lib`)."""
    imported = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    found: list[Path] = []
    looked = 0
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        if Path(top) == folder:
            continue
        for name in sorted(files):
            path = Path(top) / name
            if looked >= most:
                return found
            if not is_workflow_file(path):
                continue
            looked += 1
            if str(path) in imported:
                continue
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue  # gone since it was listed, or unreadable: nothing to say of it
            if "Workflow(" in text and _DEFINES.search(text):
                found.append(path)
    return found


def is_workflow_file(path: Path) -> bool:
    """A top-level *.py that is neither a helper (`_name.py`) nor an editor's lock or backup
    file (`.#name.py`, `.name.py`)."""
    return path.suffix == ".py" and not path.name.startswith(("_", "."))


def _in_file(error: SyntaxError, path: Path) -> bool:
    """A syntax error of the workflow file itself (not of a helper module it imports)."""
    return bool(error.filename) and Path(str(error.filename)) == path


def _error_line(error: BaseException, path: Path) -> int | None:
    if isinstance(error, SyntaxError) and _in_file(error, path):
        return error.lineno
    # A workflow's error about one of its steps carries where the step was written (see
    # workflow._placed): its line, rather than the Workflow(...) line the check raised on.
    source = getattr(error, "source", None)
    if isinstance(source, tuple) and source and Path(source[0]) == path:
        return int(source[1])
    line = None
    for frame in traceback.extract_tb(error.__traceback__):
        if Path(frame.filename) == path:
            line = frame.lineno
    return line


def _helper_place(error: BaseException, path: Path) -> str:
    """Where in a helper module next to the file (`_helpers.py`) an error raised at import
    came from, after the file's own line that imported it: " (at _helpers.py:3)", or ""
    when the error's last frame of the folder is in the file itself."""
    last = None
    for frame in traceback.extract_tb(error.__traceback__):
        if Path(frame.filename).parent == path.parent:
            last = frame
    if last is None or Path(last.filename) == path:
        return ""
    return f" (at {Path(last.filename).name}:{last.lineno})"


# Names of helper modules imported from any workflows folder. A helper of the same name from
# another folder (a second engine, an earlier test) would otherwise be found in sys.modules
# and used in place of this folder's file.
_helper_names: set[str] = set()


def _helper_sources(folder: Path, before: set[str]) -> dict[Path, bytes]:
    """Sources of modules from `folder` that importing the file pulled in."""
    found = {}
    for name, module in list(sys.modules.items()):
        if name in before or name.startswith(f"{PACKAGE}."):
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
        if name.startswith(f"{PACKAGE}."):
            continue  # a workflow file's own module: replaced when that file loads again
        if name in _helper_names or (origin and Path(origin).parent == folder):
            del sys.modules[name]
    before = set(sys.modules)
    module_name = f"{PACKAGE}.{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    # Found by its name, as an imported module is: pydantic resolves a model's annotations
    # (`at: datetime.datetime`) in `sys.modules[cls.__module__]`, as do typing.get_type_hints
    # and pickle; unregistered, a model in a workflow file failed as it was first used.
    sys.modules.setdefault(PACKAGE, types.ModuleType(PACKAGE))
    previous = sys.modules.get(module_name)
    sys.modules[module_name] = module
    added_path = str(folder) not in sys.path
    if added_path:
        sys.path.insert(0, str(folder))
    try:
        tree = ast.parse(source, str(path))
        # The file's own `from __future__` imports, not this module's: inherited, its
        # annotations were all strings (`from __future__ import annotations`).
        exec(compile(tree, str(path), "exec", dont_inherit=True), module.__dict__)
    except BaseException as error:
        _unregister(module_name, previous)
        # Whatever the file raises is its failure, not the engine's: a `sys.exit()`, a
        # `raise KeyboardInterrupt`, pytest's `importorskip`. It runs in an import thread of
        # its own (`load_file_with_timeout`), where no signal nor cancellation arrives.
        kind = type(error).__name__
        said = str(error)
        if isinstance(error, SyntaxError) and error.msg and _in_file(error, path):
            said = error.msg  # str() adds "(name.py, line 4)", which the error's place says
        said += _helper_place(error, path)
        raise WorkflowLoadError(path, _error_line(error, path), f"{kind}: {said}") from error
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
    try:
        found = _defined_workflows(path, tree, module.__dict__)
    except WorkflowLoadError:
        _unregister(module_name, previous)  # its previous version keeps serving: its module
        raise
    return LoadedFile(path, version, [w.with_version(version, str(path)) for w in found], inputs)


def _unregister(name: str, previous: types.ModuleType | None) -> None:
    """Put back the module of a file's version that serves on, after a load that failed."""
    if previous is None:
        sys.modules.pop(name, None)
    else:
        sys.modules[name] = previous


def _defined_workflows(path: Path, tree: ast.Module, names: dict[str, object]) -> list[Workflow]:
    """The workflows a file's module defines in `workflow` or `workflows`. A file that would
    lose one without a word is refused: one that assigns either name twice, or defines both
    (unless `workflows` holds `workflow` too)."""
    for name in ("workflow", "workflows"):
        _refuse_reassigned(path, tree, name)
    if "workflow" in names and "workflows" in names:
        single, listed = names["workflow"], names["workflows"]
        if not isinstance(listed, list | tuple) or all(w is not single for w in listed):
            one, many = _binding_lines(tree, "workflow"), _binding_lines(tree, "workflows")
            shown = [
                f"`{name}`" + (f" (line {lines[-1]})" if lines else "")
                for name, lines in (("workflow", one), ("workflows", many))
            ]
            raise WorkflowLoadError(
                path,
                max(one[-1:] + many[-1:], default=None),
                f"defines both {shown[0]} and {shown[1]}; only `workflows` would be served: "
                "put every workflow in `workflows`",
            )
    name = "workflows" if "workflows" in names else "workflow"
    if name not in names:
        if not _held(names) and _imported_beside(path):
            return []  # a helper module not named `_x.py`: a workflow file beside it imports it
        _refuse_missing(path, tree, names)
    found = names[name]
    if isinstance(found, Workflow):
        return [found]
    if name == "workflows" and isinstance(found, list | tuple):
        wrong = next((w for w in found if not isinstance(w, Workflow)), None)
        if wrong is None:
            return list(found)
        problem = f"`workflows` must be a list of Workflow objects, not of {type(wrong).__name__}"
    elif name == "workflows":
        problem = f"`workflows` must be a list of Workflow objects, got {type(found).__name__}"
    else:
        problem = f"`workflow` must be a Workflow, got {type(found).__name__}" + (
            " (a list goes in `workflows`)" if isinstance(found, list | tuple) else ""
        )
    bound = _binding_lines(tree, name)
    raise WorkflowLoadError(path, bound[-1] if bound else None, problem)


def _held(names: dict[str, object]) -> list[tuple[str, str, str]]:
    """The names a module holds workflows in, other than `workflow` and `workflows`: (name,
    what it holds, the name it should have)."""
    held = []
    for key, value in names.items():
        if isinstance(value, Workflow):
            held.append((key, "a Workflow", "workflow"))
        elif (
            isinstance(value, list | tuple)
            and value
            and all(isinstance(item, Workflow) for item in value)
        ):
            held.append((key, "a list of Workflow", "workflows"))
    return held


def _imported_beside(path: Path) -> bool:
    """Whether another .py file in the folder imports the file as a module (`import pricing`,
    `from pricing import price`): a helper, whatever its name."""
    for other in path.parent.glob("*.py"):
        if other == path:
            continue
        try:
            tree = ast.parse(other.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue  # its own error is said where it loads
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(
                alias.name.split(".")[0] == path.stem for alias in node.names
            ):
                return True
            if isinstance(node, ast.ImportFrom) and not node.level and node.module == path.stem:
                return True
    return False


def _refuse_missing(path: Path, tree: ast.Module, names: dict[str, object]) -> NoReturn:
    """A file that defines neither name: say where its workflows are if it has some under
    other names (`wf = Workflow(...)`), else that a helper module's name starts with `_`."""
    held = _held(names)
    said = "defines neither `workflow` nor `workflows`"
    if not held:
        hint = f"a helper module? name it _{path.name}"
        if path.name.startswith("_"):  # given on its own: a helper already
            hint = "a helper module: give the workflow file that imports it, or their folder"
        raise WorkflowLoadError(path, None, f"{said} ({hint})")
    lines = {key: _binding_lines(tree, key) for key, _, _ in held}
    shown = [f"`{key}`" + (f", line {lines[key][-1]}" if lines[key] else "") for key, _, _ in held]
    _, what, wanted = held[0]
    if len(held) == 1:
        hint = f"it has {what} in {shown[0]}: name it `{wanted}`"
    else:
        hint = f"it has workflows in {', '.join(shown)}: list them in `workflows = [...]`"
    line = next((lines[k][-1] for k, _, _ in held if lines[k]), None)
    raise WorkflowLoadError(path, line, f"{said} ({hint})")


def is_workflow_call(node: ast.AST) -> TypeGuard[ast.Call]:
    """`Workflow(...)` or `engine.Workflow(...)` in a file's syntax tree."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return called == "Workflow"


def _binds(statement: ast.AST, name: str) -> bool:
    """An assignment or import that binds `name` (a plain name, not unpacked)."""
    if isinstance(statement, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in statement.targets)
    if isinstance(statement, ast.AnnAssign | ast.AugAssign):
        return isinstance(statement.target, ast.Name) and statement.target.id == name
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return any((a.asname or a.name) == name for a in statement.names)
    return False


def _binding_lines(tree: ast.Module, name: str) -> list[int]:
    """The lines that bind `name` at module level (under an `if` or `try` too, not in a
    function or class), in order: where a load error about `name` points."""
    lines = []
    pending: list[ast.AST] = list(tree.body)
    while pending:
        statement = pending.pop()
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if isinstance(statement, ast.stmt) and _binds(statement, name):
            lines.append(statement.lineno)
        for part in ("body", "orelse", "finalbody", "handlers"):  # handlers: `except` blocks
            pending.extend(getattr(statement, part, []))
    return sorted(lines)


def _refuse_reassigned(path: Path, tree: ast.Module, name: str) -> None:
    """Refuse a second top-level `name = ...` that throws away a workflow the first one
    defined: the module keeps only the last value. One that reads the name
    (`workflows = workflows + [...]`) keeps it; one under an `if` is a choice, not a loss."""
    defined_at: int | None = None  # the line whose Workflow(...) the name holds now
    for statement in tree.body:
        if not isinstance(statement, ast.Assign | ast.AnnAssign) or not _binds(statement, name):
            continue
        value = statement.value
        nodes = list(ast.walk(value)) if value is not None else []
        keeps = any(isinstance(n, ast.Name) and n.id == name for n in nodes)
        if defined_at is not None and not keeps:
            advice = "put both in `workflows = [...]`" if name == "workflow" else "make one list"
            raise WorkflowLoadError(
                path,
                statement.lineno,
                f"`{name}` is assigned twice (first at line {defined_at}) and only the last "
                f"would be served; {advice}",
            )
        if any(is_workflow_call(n) for n in nodes):
            defined_at = statement.lineno
        elif not keeps:
            defined_at = None


def import_limit() -> float:
    """Seconds a workflow file's import may take: BLOK_IMPORT_TIMEOUT (seconds, or a
    duration such as "2m"), else IMPORT_TIMEOUT_S."""
    raw = os.environ.get(IMPORT_TIMEOUT_ENV, "").strip()
    if not raw:
        return IMPORT_TIMEOUT_S
    try:
        seconds = float(raw) if raw.replace(".", "", 1).isdigit() else parse_duration(raw) / 1000
    except ValueError as error:
        raise EngineError(f"{IMPORT_TIMEOUT_ENV}={raw!r}: {error}") from None
    if seconds <= 0:
        raise EngineError(f"{IMPORT_TIMEOUT_ENV}={raw!r}: the limit must be above 0")
    return seconds


def load_file_with_timeout(path: Path, timeout: float = IMPORT_TIMEOUT_S) -> LoadedFile:
    """`load_file` in a daemon thread, given up on after `timeout` seconds.

    A file that loops forever at import would otherwise hang whoever loads it. Python cannot
    kill a thread, so a runaway import keeps running in the background (a daemon thread: it does
    not keep the process alive) and the file is reported as failed; while it runs it competes
    for the GIL, and a helper module it is stuck importing stays locked for other imports.
    """
    path = path.resolve()
    outcome: list[LoadedFile | WorkflowLoadError] = []

    def target() -> None:
        try:
            outcome.append(load_file(path))
        except WorkflowLoadError as error:
            outcome.append(error)
        except Exception as error:  # outside the file's own code (a helper vanished mid-read…)
            outcome.append(WorkflowLoadError(path, None, f"{type(error).__name__}: {error}"))

    thread = threading.Thread(target=target, name=f"blok-import:{path.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise WorkflowLoadError(
            path,
            _running_line(thread, path),
            f"import did not finish within {timeout:g}s (does it loop or block at import? "
            f"{IMPORT_TIMEOUT_ENV} sets the limit)",
        )
    result = outcome[0]
    if isinstance(result, WorkflowLoadError):
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
