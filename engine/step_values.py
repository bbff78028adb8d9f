"""What a step's node is given and what it gives back, as the runner checks them: why an
input (or the step's idempotency key) could not be made, and whether a return value can be
stored as the step's output."""

from __future__ import annotations

import inspect
import math
import sys
from typing import Any

from . import expressions
from .errors import UnstorableOutput
from .input_models import InputModelError
from .validation import InvalidInput, json_value

# Below this many bits an int has fewer than Python's 4,300 digits that `str()` and json.dumps
# take (2 ** 14_000 has 4,215): such a return value needs no further look.
_SHORT_INT_BITS = 14_000


def stored_output(value: Any, what: str) -> Any:
    """A node's return value as its step's output is stored, and as later steps see it: what
    every backend stores (standard JSON: no NaN, string keys, no NUL; see `json_value`), a
    pydantic model, a dataclass or a datetime in pydantic's JSON form (a later step saw the
    model here and a dict in a run resumed elsewhere). One a database refuses would otherwise
    fail the run's write after the step passed, and leave the run recorded as it was."""
    kind = type(value)
    if value is None or kind is bool or (kind is int and value.bit_length() < _SHORT_INT_BITS):
        return value  # most nodes return these
    if kind is float and math.isfinite(value):
        return value
    if inspect.iscoroutine(value) or inspect.isgenerator(value) or inspect.isasyncgen(value):
        raise UnstorableOutput(_not_a_value(value, what))
    if kind is int:
        try:
            str(value)
        except ValueError:  # past Python's limit on int-to-str conversion, which JSON uses
            raise UnstorableOutput(
                f"{what} is an integer of more than {sys.get_int_max_str_digits():,} digits, "
                "which JSON cannot hold here; return it as a string"
            ) from None
        return value
    try:
        return json_value(value, None, what=what)
    except InvalidInput as error:
        raise UnstorableOutput(
            f"{error}; return JSON (dicts, lists, strings, numbers, booleans, None) or "
            "what pydantic makes JSON of (models, dataclasses, datetimes, UUIDs, Decimals, enums)"
        ) from None


def _not_a_value(value: Any, what: str) -> str:
    """Why a coroutine or a generator is no output, closed so that Python's "never awaited"
    warning does not point into the engine."""
    name = getattr(value, "__qualname__", type(value).__name__)
    if inspect.iscoroutine(value) or inspect.isgenerator(value):
        value.close()
    if inspect.iscoroutine(value):
        return f"{what} is a coroutine ({name}) that was never awaited: did you forget `await`?"
    return f"{what} is a generator ({name}): a node returns its value (return, not yield)"


def fixed_input(value: Any) -> str | None:
    """Why a job whose input `value` (an expression, a callable, a constant) could not be made
    is not worth retrying: an expression that reads the job's body or headers reads the same
    thing at every delivery ("the job's body lacks what the step reads"). None where a retry
    may read something else (a step's output, a callable's world)."""
    if not expressions.is_expression(value):
        return None
    root = value[2:].split(".", 1)[0]
    if root == "body":
        return "a retry reads the same body; replay the run with --input to give it another"
    return "a retry reads the same headers" if root == "headers" else None


KEY = "idempotency_key"  # what `bad_input` is told while the step's key is made


def bad_input(name: str, error: BaseException) -> str:
    """Why a step's input, or its idempotency key, could not be made: an expression's error
    names its path already; a callable's names the input and its exception ("KeyError
    'amount'", not a bare "'amount'")."""
    if name == KEY:
        what, name = "bad idempotency key", ""
    else:
        what, name = "bad input", f" {name}"
    if isinstance(error, expressions.ExpressionError):
        return f"{what}: {error}"
    if isinstance(error, InputModelError):  # "bad input order: not a valid Order: id: …"
        return f"{what}{name}: {error}"
    if isinstance(error, KeyError) and len(error.args) == 1:
        return f"{what}{name}: KeyError {error.args[0]!r}"
    return f"{what}{name}: {type(error).__name__}" + (f": {error}" if str(error) else "")
