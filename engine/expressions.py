"""`"$.a.b"` expressions: checked when a workflow is defined, resolved against a run's context."""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Iterable
from typing import Any

ROOTS = ("body", "headers", "params", "state", "run_id", "workflow_name", "attempt")
# The keys of ctx.params, fixed by Context.for_job (engine/context.py), and the type of each value;
# with the context's other scalars. An expression naming a key no run has, or reading below a
# str or an int, can never resolve: it is refused when the workflow is defined, not at a run.
PARAMS = {"queue": "str", "job_id": "str", "attempt": "int", "priority": "int"}
_SCALARS = {"run_id": "str", "workflow_name": "str", "attempt": "int"}


class ExpressionError(ValueError):
    pass


def did_you_mean(word: str, known: Iterable[object], prefix: str = "") -> str:
    """ "; did you mean 'amount'?" when one of `known` is close to a mistyped `word` (shown
    after `prefix`), else "". The first thousand of `known` are looked at: a payload of a
    million keys must not make a failure's message slow."""
    candidates = [str(k) for k in itertools.islice(known, 1000)]
    # The first part of names ("shop" of "shop.order" and "shop.refund"): all are named, where
    # difflib found one of them, or none.
    longer = sorted(
        c
        for c in candidates
        if word and c.startswith(word) and c[len(word) : len(word) + 1] in _PARTS
    )
    if len(longer) > 1:
        named = ", ".join(repr(prefix + c) for c in longer[:3])
        return f"; did you mean one of {named}{', …' if len(longer) > 3 else ''}?"
    close = longer or difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {prefix + close[0]!r}?" if close else ""


_PARTS = (".", "_", "-", ":")  # what separates a name's parts


def is_expression(value: object) -> bool:
    return isinstance(value, str) and value.startswith("$.")


# "$body.x", "$state.a.b": a root right after the "$", with no dot between. Only these: "$5.00",
# "$HOME" or "$bodyguard" are literals a node may well be given.
_MISSING_DOT = re.compile(r"\$(?:" + "|".join(ROOTS) + r")(?:\.|$)")


def missing_dot(value: object) -> str | None:
    """The expression a literal string such as "$body.x" was meant to be ("$.body.x"), which
    would otherwise reach the node as that text; None for any other value."""
    if isinstance(value, str) and _MISSING_DOT.match(value):
        return "$." + value[1:]
    return None


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
            # `$.item` is the natural guess inside a for_each: say where the item is.
            + (
                f" (a for_each's {parts[0]} is $.state.<its name>.{parts[0]})"
                if parts[0] in ("item", "index")
                else ""
            )
        )
    _check_known(expr, parts)
    return parts


def _check_known(expr: str, parts: list[str]) -> None:
    """Refuse a path that exists in no run's context: a `$.params` key other than the four,
    or a field of a value that is always a str or an int."""
    path, kind = f"$.{parts[0]}", _SCALARS.get(parts[0])
    if parts[0] == "params" and len(parts) > 1:
        if parts[1] not in PARAMS:
            raise ExpressionError(
                f"expression {expr!r}: $.params has no key {parts[1]!r}; its keys are "
                + ", ".join(PARAMS)
                + did_you_mean(parts[1], PARAMS, prefix="$.params.")
            )
        path, kind = f"$.params.{parts[1]}", PARAMS[parts[1]]
        parts = parts[1:]
    if kind is not None and len(parts) > 1:
        raise ExpressionError(
            f"expression {expr!r}: {path} is {'a number' if kind == 'int' else 'a string'}, it has no "
            f"field {parts[1]!r}; use {path} itself"
        )


def _kind(value: Any) -> str:
    """What a value is, in the words of the JSON it came from ("$.body is null", where it said
    NoneType): a body is what a user sent as JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return f"a {type(value).__name__}"


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
            raise ExpressionError(f"{expr}: {walked} is {_kind(value)}, it has no field {part!r}")
        walked += f".{part}"
    return value
