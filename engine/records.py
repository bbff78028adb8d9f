"""Building records on the hot path without pydantic's per-field work.

`Model.model_construct` already skips validation, but it still walks every field, looks up
defaults and copies the input: about 7 µs for a Run, several times per job. The engine always
passes every field, so it can set the instance's dict directly (about 1 µs), which is what
`model_construct` ends up doing. `tests/test_records.py` checks the result is the same.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)
_set = object.__setattr__


def construct(cls: type[M], fields: dict[str, Any]) -> M:
    """`cls.model_construct(**fields)` for a `fields` that names every field of `cls`; the
    dict is taken over, not copied."""
    record = cls.__new__(cls)
    _set(record, "__dict__", fields)
    _set(record, "__pydantic_fields_set__", set(fields))
    _set(record, "__pydantic_extra__", None)
    _set(record, "__pydantic_private__", None)
    return record
