"""Building records on the hot path without pydantic's per-field work.

`Model.model_construct` already skips validation, but it still walks every field, looks up
defaults and copies the input: about 7 µs for a Run, several times per job. The engine always
passes every field, so it can set the instance's dict directly (about 1 µs), which is what
`model_construct` ends up doing. `tests/test_records.py` checks the result is the same.

`copy_run` is the copy the engine makes before it changes a run record it read: records read
from a store are snapshots other readers may hold (see `RunStore.get_run`).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from .models import Attempt, Run, StepRun

M = TypeVar("M", bound=BaseModel)
_set = object.__setattr__


# A record that names every field has every field set: its `__pydantic_fields_set__` is one
# set per class, shared. pydantic only ever adds a name to it on assignment (a name already
# there) and copies it when it copies a record, so sharing it is safe, and it spares a job's
# records four sets the garbage collector would visit for as long as the records are kept.
_ALL_SET: dict[type[BaseModel], set[str]] = {}


def _all_set(cls: type[BaseModel]) -> set[str]:
    names = _ALL_SET.get(cls)
    if names is None:
        names = _ALL_SET[cls] = set(cls.model_fields)
    return names


def construct(cls: type[M], fields: dict[str, Any]) -> M:
    """`cls.model_construct(**fields)` for a `fields` that names every field of `cls`; the
    dict is taken over, not copied."""
    names = _ALL_SET.get(cls) or _all_set(cls)
    return _fresh(cls, fields, names if len(fields) == len(names) else set(fields))


def _fresh(cls: type[M], fields: dict[str, Any], names: set[str]) -> M:
    """A record over `fields` with `names` as its fields set (taken over, not copied)."""
    record = cls.__new__(cls)
    _set(record, "__dict__", fields)
    _set(record, "__pydantic_fields_set__", names)
    _set(record, "__pydantic_extra__", None)
    _set(record, "__pydantic_private__", None)
    return record


def assign(record: BaseModel, **fields: Any) -> None:
    """`record.name = value` for each of `fields`, for the engine's own records on the hot
    path (a run it runs, its step and attempt records): written straight into the record's
    dict, as pydantic's `__setattr__` does for a model that does not validate assignments,
    without its per-name dispatch (about 0.5 µs a name, some twenty names a job). Every name
    must be a field of the record."""
    record.__dict__.update(fields)
    names = record.__pydantic_fields_set__
    if names is not _ALL_SET.get(type(record)):
        names.update(fields)


def _names(record: BaseModel) -> set[str]:
    """The fields set for a copy of `record`: the shared one if it has every field set."""
    names = record.__pydantic_fields_set__
    shared = _all_set(type(record))
    return shared if names is shared else set(names)


def copy_run(run: Run) -> Run:
    """A copy of a run's record to change: the run, its steps and their attempts are new
    objects, with new lists (steps, attempts, logs, tags, cursor) and a new `state` dict. Log
    lines and JSON values (input, output, step inputs and outputs) are shared: the engine
    replaces those, it never changes one in place. About 5 µs for a run of two steps, against
    about 80 µs for `model_copy(deep=True)`."""
    steps = []
    for step in run.steps:
        fields = dict(step.__dict__)
        fields["attempts"] = [_fresh(Attempt, dict(a.__dict__), _names(a)) for a in step.attempts]
        fields["logs"] = list(step.logs)
        fields["tags"] = list(step.tags)
        steps.append(_fresh(StepRun, fields, _names(step)))
    fields = dict(run.__dict__)
    fields["steps"] = steps
    fields["logs"] = list(run.logs)
    fields["cursor"] = list(run.cursor)
    fields["state"] = dict(run.state)
    fields["headers"] = dict(run.headers)
    return _fresh(Run, fields, _names(run))
