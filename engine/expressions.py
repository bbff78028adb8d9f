"""`"$.a.b"` expressions: checked when a workflow is defined, resolved against a run's context."""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Iterable
from typing import Any

ROOTS = ("body", "headers", "params", "state", "run_id", "workflow_name", "attempt")


class ExpressionError(ValueError):
    pass


def did_you_mean(word: str, known: Iterable[object], prefix: str = "") -> str:
    """ "; did you mean 'amount'?" when one of `known` is close to a mistyped `word` (shown
    after `prefix`), else "". The first thousand of `known` are looked at: a payload of a
    million keys must not make a failure's message slow."""
    candidates = [str(k) for k in itertools.islice(known, 1000)]
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {prefix + close[0]!r}?" if close else ""


def is_expression(value: object) -> bool:
    return isinstance(value, str) and value.startswith("$.")


def parse(expr: str) -> list[str]:
    """Split "$.state.charge.id" into ["state", "charge", "id"], checking the root."""
    parts = expr[2:].split(".")
    if not parts or any(part == "" for part in parts):
        raise ExpressionError(f"expression {expr!r} has an empty path segment")
    if parts[0] not in ROOTS:
        raise ExpressionError(
            f"expression {expr!r} starts with {parts[0]!r}; it must start with one of "
            + ", ".join(f"$.{root}" for root in ROOTS)
            + did_you_mean(parts[0], ROOTS, prefix="$.")
        )
    return parts


def referenced_step(expr: str) -> str | None:
    parts = parse(expr)
    if parts[0] == "state":
        if len(parts) < 2:
            raise ExpressionError(f"expression {expr!r} must name a step: $.state.<step>")
        return parts[1]
    return None


def resolve(expr: str, ctx: Any) -> Any:
    parts = parse(expr)
    value: Any = getattr(ctx, parts[0])
    walked = f"$.{parts[0]}"
    for part in parts[1:]:
        if isinstance(value, dict):
            if part not in value:
                known = ", ".join(map(str, list(value)[:8])) or "nothing"
                raise ExpressionError(
                    f"{expr}: {walked} has no key {part!r} (it has {known})"
                    + did_you_mean(part, value)
                )
            value = value[part]
        elif isinstance(value, list | tuple) and part.lstrip("-").isdigit():
            index = int(part)
            if not -len(value) <= index < len(value):
                raise ExpressionError(f"{expr}: {walked} has {len(value)} items, no [{index}]")
            value = value[index]
        else:
            raise ExpressionError(
                f"{expr}: {walked} is {type(value).__name__}, it has no field {part!r}"
            )
        walked += f".{part}"
    return value
