"""What a producer hands the engine, checked at the edge before anything is written.

Pure functions: each returns the checked value or raises `InvalidInput` with a one-line message
that the engine and the command line show as is. They exist because a value the database or
the scheduler cannot hold does not fail where it was given, but later, in a worker: a priority
above 2**63 - 1 killed the claim loop of every worker serving the queue, a 1000-level payload
broke every `runs --json` listing that included it.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from pydantic_core import PydanticSerializationError, to_jsonable_python

from .durations import parse_duration
from .errors import EngineError

T = TypeVar("T")

# SQLite's INTEGER and PostgreSQL's BIGINT both hold a signed 64-bit integer.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# How many containers (objects, arrays) deep a payload may nest. Real payloads rarely go past
# 10; pydantic-core's JSON parser stops at 200 levels and its serialiser at 255 (a Run holding
# a deeper input can be neither read back nor listed), and Python's json raises RecursionError
# near 1000. 64 leaves room below all of them, also for the envelope a payload is stored in.
MAX_DEPTH = 64

MAX_RETRIES = 1_000  # job-level retries (each waits at most 30 s): more is a typo

MAX_QUEUE_NAME = 128  # characters: fits a table column and a log line
# A caller's own job id is an idempotency key (an order number, a UUID, a URL): room for any
# of those, yet short enough for a table cell and a log line.
MAX_JOB_ID = 255
MAX_EVENT_NAME = 200
# Headers are a request's metadata, not its body: HTTP servers cap them at 8 to 64 KB.
MAX_HEADERS_BYTES = 64 * 1024

# Characters a name must not hold: Unicode's control (Cc), format (Cf: bidi overrides, zero
# widths), surrogate and line/paragraph separator categories. A name holding one prints as
# something else than it is, or drives a terminal.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# In a header value: control characters but tab. CR and LF would split a header in two when a
# node forwards it to an HTTP call.
_HEADER_VALUE_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
# In a stored string: NUL and lone surrogates, which PostgreSQL's jsonb refuses and which
# cannot be encoded as UTF-8.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")


class InvalidInput(ValueError):
    """A value the engine refuses before writing anything; the message is one line."""


def checked(check: Callable[..., T], value: object, *args: Any, **kwargs: Any) -> T:
    """`check(value, ...)`, one of the checks here, its refusal an EngineError: the API's."""
    try:
        return check(value, *args, **kwargs)
    except InvalidInput as error:
        raise EngineError(str(error)) from None


# ---- numbers and durations --------------------------------------------------------------------
def check_priority(value: object) -> int:
    """A job's priority: a whole number that fits a signed 64-bit integer."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInput(f"priority must be an integer, not {shown_value(value)}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidInput(
            f"priority {shown_value(value)} is outside the signed 64-bit range "
            f"({INT64_MIN} to {INT64_MAX})"
        )
    return int(value)


def check_delay(delay: object) -> int:
    """A job's delay in milliseconds: a duration (see `parse_duration`), at most 100 years, so
    that now + delay is a datetime."""
    try:
        return parse_duration(delay)
    except ValueError as error:
        raise InvalidInput(f"delay: {error}") from None


def check_retries(value: object) -> int:
    """A job's retry budget: a whole number from 0 to MAX_RETRIES (as WorkerTrigger.retries)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInput(f"retries must be an integer, not {shown_value(value)}")
    if not 0 <= value <= MAX_RETRIES:
        raise InvalidInput(f"retries must be from 0 to {MAX_RETRIES}, not {shown_value(value)}")
    return int(value)


def check_timeout(value: object) -> int:
    """A job's time limit in milliseconds: a duration above zero, at most 100 years."""
    try:
        ms = parse_duration(value)
    except ValueError as error:
        raise InvalidInput(f"timeout: {error}") from None
    if ms <= 0:
        raise InvalidInput(f"timeout must be above zero, not {shown_value(value)}")
    return ms


def check_wait_timeout(value: object) -> float | None:
    """How long a caller waits for something, in seconds: None (no limit) or a number from 0
    up (0: only if it is there already; infinity: no limit). Refused here, as anyio would
    take a negative or NaN limit silently as "time is up at once" or "never"."""
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidInput(f"timeout must be a number of seconds or None, not {shown_value(value)}")
    if math.isnan(value) or value < 0:
        raise InvalidInput(
            f"timeout must be a number of seconds from 0 up, not {shown_value(value)}"
        )
    return float(value)


# ---- names ------------------------------------------------------------------------------------
def check_queue_name(name: object) -> str:
    """A queue name: text that reads as what it is, on one line, in a table cell."""
    return _check_name(name, "queue name", MAX_QUEUE_NAME)


def check_job_id(job_id: object) -> str:
    """A job id a caller chooses (`enqueue(job_id=...)`): as a queue name, up to MAX_JOB_ID
    characters. Checked, as an int went into memory and SQLite as is and failed on PostgreSQL,
    and "" silently became a generated id."""
    return _check_name(job_id, "job id", MAX_JOB_ID)


def check_event_name(event: object) -> str:
    """An event's name: matched exactly and printed on one line, so as a queue name, up to
    MAX_EVENT_NAME characters (a line break would break that line, a space at an end would
    make a name no one types)."""
    return _check_name(event, "event name", MAX_EVENT_NAME)


def check_lookup_id(value: object, what: str) -> str:
    """An id to look something up by (`what`: "run id", "job id"): a string. Any string may
    name nothing (an unknown run or job says so); another type is the caller's mistake, which
    "unknown run None" would hide."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, not {shown_value(value)}")
    return value


def _check_name(name: object, what: str, max_length: int) -> str:
    if not isinstance(name, str):
        raise InvalidInput(f"{what} must be a string, not {shown_value(name)}")
    if not name:
        raise InvalidInput(f"{what} is empty")
    if len(name) > max_length:
        raise InvalidInput(
            f"{what} is {len(name):,} characters long, above the limit of {max_length}"
        )
    if not name.strip():
        raise InvalidInput(f"{what} {name!r} is only whitespace")
    for char in name:
        if unicodedata.category(char) in _HIDDEN:
            raise InvalidInput(f"{what} {name!r} holds a control character (U+{ord(char):04X})")
    if name != name.strip():
        raise InvalidInput(f"{what} {name!r} starts or ends with whitespace")
    return name


# ---- listings ---------------------------------------------------------------------------------
def check_limit(value: object, what: str = "limit") -> int | None:
    """How many items a listing returns (or skips, `what="offset"`): None (no limit) or a whole
    number from 0 up that fits a signed 64-bit integer. Refused here, as each database took a
    negative or a None its own way: all rows, a raw "datatype mismatch", a raw asyncpg error."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInput(
            f"{what} must be a whole number from 0 up or None, not {shown_value(value)}"
        )
    if value < 0:
        raise InvalidInput(f"{what} must be a whole number from 0 up, not {shown_value(value)}")
    if value > INT64_MAX:
        raise InvalidInput(
            f"{what} {shown_value(value)} is above {INT64_MAX}: pass None for no limit"
        )
    return int(value)


# ---- payloads in bulk -------------------------------------------------------------------------
def check_payload_list(payloads: object) -> list[Any]:
    """`enqueue_many`'s payloads: a list (or another iterable) of payloads, one job each. A
    dict, a string or bytes is refused: iterated, it made one job per key or per character."""
    if isinstance(payloads, str | bytes | bytearray | memoryview | Mapping):
        raise InvalidInput(
            f"payloads must be a list of payloads (one job each), not a {type(payloads).__name__}"
            " (enqueue adds one job)"
        )
    if not isinstance(payloads, Iterable):
        raise InvalidInput(
            f"payloads must be a list of payloads (one job each), not {shown_value(payloads)}"
        )
    return list(payloads)


# ---- headers ----------------------------------------------------------------------------------
def check_headers(headers: object) -> dict[str, str]:
    """Headers: None (none) or a dict of names to string values, as HTTP could carry them."""
    if headers is None:
        return {}
    if not isinstance(headers, dict):
        raise InvalidInput(f"headers must be a dict of strings, not {type(headers).__name__}")
    size = 0
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidInput(
                f"headers must be a dict of strings to strings: {shown_value(name)} -> "
                f"{type(value).__name__}"
            )
        if not name or any(c.isspace() or unicodedata.category(c) in _HIDDEN for c in name):
            raise InvalidInput(
                f"header name {shown_value(name)} is empty or holds whitespace or a control character"
            )
        if _HEADER_VALUE_CONTROL.search(value):
            raise InvalidInput(
                f"header {shown_value(name)} holds a control character (a line break would "
                "split the header in two)"
            )
        size += len(name.encode(errors="replace")) + len(value.encode(errors="replace"))
    if size > MAX_HEADERS_BYTES:
        raise InvalidInput(f"headers are {size:,} bytes, above the {MAX_HEADERS_BYTES:,}-byte cap")
    return headers


# ---- payloads ---------------------------------------------------------------------------------
# `json.dumps(value, allow_nan=False)` builds an encoder at each call (any option does).
_strict_json = json.JSONEncoder(allow_nan=False).encode


def check_payload(payload: Any, max_bytes: int | None, *, what: str = "payload") -> None:
    """A payload (or any JSON value the engine stores, named by `what`): standard JSON (no NaN
    or Infinity, string keys, no NUL or lone surrogate), at most `MAX_DEPTH` containers deep,
    and at most `max_bytes` once serialised (None: no cap, for a value parsed from JSON text
    whose cap the engine checks later).

    The walk is iterative, so a payload deeper than the interpreter's stack is refused and does
    not raise RecursionError; and it stops after `max_bytes` values, since each value takes at
    least one byte, so that a small object sharing its lists (`a = [b, b]`, `b = [c, c]`, ...)
    cannot make it, or json.dumps, run for ever.
    """
    _walk(payload, max_bytes, what)
    try:
        blob = _strict_json(payload)
    except (TypeError, ValueError) as error:  # e.g. an int of more than 4300 digits
        raise InvalidInput(f"{what} is not JSON-serialisable: {_short(str(error))}") from None
    if max_bytes is not None:
        size = len(blob.encode())
        if size > max_bytes:
            raise InvalidInput(_too_big(what, max_bytes, size))


class NotJsonType(InvalidInput):
    """A value holds something JSON has no type for (a datetime, a model, an object)."""


def json_value(payload: Any, max_bytes: int | None, *, what: str = "payload") -> Any:
    """`payload` as the engine stores it: itself when it is standard JSON (`check_payload`),
    else pydantic's JSON form of what it holds — a pydantic model, a dataclass, a datetime, a
    date, a UUID, a Decimal, an Enum, a set, UTF-8 bytes, as `model_dump(mode="json")` makes
    them — checked again. What is not JSON for other reasons (NaN, an int key, a NUL, a
    cycle) is refused as it is: converted, it would come back other than it was sent."""
    try:
        check_payload(payload, max_bytes, what=what)
        return payload
    except NotJsonType as refused:
        if isinstance(payload, bytes | bytearray | memoryview):
            # Most likely JSON text (a request's body): parsed or decoded, not guessed at.
            raise NotJsonType(f"{refused} (JSON text? json.loads() it first)") from None
        # Walked again past such values: an int key or a NaN beside a datetime is refused as
        # it is alone (pydantic would make the key a string).
        _walk(payload, max_bytes, what, foreign=True)
        try:
            converted = to_jsonable_python(payload)
        except (PydanticSerializationError, ValueError, TypeError, RecursionError):
            raise refused from None
    check_payload(converted, max_bytes, what=what)
    return converted


_Node = tuple[Any, "_Node | None", "str | int | None"]  # value, parent, key in the parent


def _walk(payload: Any, max_bytes: int | None, what: str, *, foreign: bool = False) -> None:
    """Raise InvalidInput at the first value no backend stores; `foreign`: values JSON has no
    type for (a datetime, a model) pass, for pydantic to convert."""
    if not isinstance(payload, dict | list | tuple):
        _check_leaf(payload, what, (payload, None, None), foreign)
        return
    stack: list[_Node] = [(payload, None, None)]
    depths = [1]  # how deep each container on the stack sits
    seen = 1
    while stack:
        node, depth = stack.pop(), depths.pop()
        value = node[0]
        if depth > MAX_DEPTH:
            loop = _first_repeat(node)
            if loop is not None:
                raise InvalidInput(f"{what} refers to itself at {_path(loop)} (a cycle)")
            raise InvalidInput(f"{what} is nested deeper than {MAX_DEPTH} levels")
        seen += len(value)
        if max_bytes is not None and seen > max_bytes:
            raise InvalidInput(_too_big(what, max_bytes))
        if isinstance(value, dict):
            for key in value:
                if not isinstance(key, str):
                    raise InvalidInput(
                        f"{what} has a key {shown_value(key)} ({type(key).__name__}) at "
                        f"{_path(node)}: JSON object keys are strings"
                    )
                if _UNSTORABLE.search(key):
                    _refuse_string(key, what, node, "key")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in items:
            kind = type(child)
            # The common leaves first, by exact type: this loop runs once per value.
            if kind is str:
                if _UNSTORABLE.search(child):
                    _refuse_string(child, what, (child, node, key), "string")
            elif kind is int or kind is bool or child is None:
                pass
            elif kind is float:
                if not math.isfinite(child):
                    _check_leaf(child, what, (child, node, key))
            elif isinstance(child, dict | list | tuple):
                stack.append((child, node, key))
                depths.append(depth + 1)
            else:
                _check_leaf(child, what, (child, node, key), foreign)


def _check_leaf(value: Any, what: str, node: _Node, foreign: bool = False) -> None:
    """A value that is not a container: a string, a number, a boolean or null."""
    if isinstance(value, str):
        if _UNSTORABLE.search(value):
            _refuse_string(value, what, node, "string")
    elif isinstance(value, float):
        if not math.isfinite(value):
            shown = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
            raise InvalidInput(f"{what} holds {shown} at {_path(node)}: not standard JSON")
    elif value is not None and not isinstance(value, int) and not foreign:
        hint = ""
        if inspect.iscoroutine(value):  # an async helper called without await, in a dict
            value.close()  # else Python's "never awaited" warning points into the engine
            hint = f" ({value.__qualname__}) that was never awaited: did you forget `await`?"
        raise NotJsonType(
            f"{what} is not JSON-serialisable: {_path(node)} is {_a(type(value).__name__)}{hint}"
        )


def _a(name: str) -> str:
    """ "an object", "a datetime": a type's name with its article."""
    return f"{'an' if name[:1] in ('a', 'e', 'i', 'o', 'u') else 'a'} {name}"


def _refuse_string(text: str, what: str, node: _Node, kind: str) -> None:
    found = _UNSTORABLE.search(text)
    char = "a NUL character" if found and found.group() == "\x00" else "a lone surrogate"
    in_key = " (in a key)" if kind == "key" else ""
    raise InvalidInput(
        f"{what} holds {char} at {_path(node)}{in_key}: PostgreSQL's jsonb cannot store it"
    )


def _first_repeat(node: _Node) -> _Node | None:
    """The first container on the way from the top down to `node` that is one of its own
    ancestors: where a cycle closes. None: just deep."""
    chain: list[_Node] = []
    current: _Node | None = node
    while current is not None:
        chain.append(current)
        current = current[1]
    seen: set[int] = set()
    for step in reversed(chain):
        if id(step[0]) in seen:
            return step
        seen.add(id(step[0]))
    return None


def _path(node: _Node) -> str:
    """`$.a.b[3]` for the value at `node`: where in the payload to look."""
    parts: list[str] = []
    current: _Node | None = node
    while current is not None and current[1] is not None:
        key = current[2]
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif isinstance(key, str) and key.isidentifier():
            parts.append(f".{_short(key, 40)}")
        else:
            parts.append(f"[{_short(json.dumps(key), 40)}]")
        current = current[1]
    return "$" + "".join(reversed(parts))


def _too_big(what: str, max_bytes: int, size: int | None = None) -> str:
    said = f"is {size:,} bytes, above" if size is not None else "is larger than"
    return f"{what} {said} the {max_bytes:,}-byte cap (Engine(max_payload_bytes=...) to raise it)"


def shown_value(value: object) -> str:
    """A user's value as Python writes it, cut short, for a message about it."""
    try:
        return _short(repr(value))
    except ValueError:  # an int past Python's 4300-digit limit for str()
        return "(a number too long to show)"


def _short(text: str, width: int = 60) -> str:
    """One line, at most `width` characters: a user's value inside a message about it."""
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= width else text[: width - 1] + "…"
