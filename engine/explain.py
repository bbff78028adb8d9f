"""A workflow definition's validation error in the user's words: one phrase a problem, the
value given where pydantic's words leave it out, and for an argument the class does not take,
the one meant and the ones it takes (`Step("a", f, retries=3)`: "retries: Step takes no
'retries'; did you mean 'retry'? (it takes name, node, inputs, …)")."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from .expressions import did_you_mean

# Fields that are the class's own, never an argument a user writes (the step kind's tag).
_NOT_ARGUMENTS = frozenset({"kind"})

Special = Callable[[ErrorDetails], str | None]


def arguments(model: type[BaseModel]) -> list[str]:
    """The keyword arguments `model` takes, in its fields' order."""
    return [name for name in model.model_fields if name not in _NOT_ARGUMENTS]


def explain(error: ValidationError, model: type[BaseModel], special: Special | None = None) -> str:
    """Each problem of `error` (raised building `model`) in one phrase; `special`, given a
    pydantic error item, may word it itself (None: the general words)."""
    parts = []
    for item in error.errors():
        where = ".".join(str(loc) for loc in item["loc"]) or "value"
        own = special(item) if special is not None else None
        if own is not None:
            message = own
        elif item["type"] == "extra_forbidden":
            takes = arguments(model)
            message = (
                f"{model.__name__} takes no {where!r}{did_you_mean(where, takes)} "
                f"(it takes {', '.join(takes)})"
            )
        else:
            message = item["msg"].removeprefix("Value error, ")
            given = item.get("input")
            ours = item["type"] == "value_error"  # our validators' words name the value already
            if not ours and isinstance(given, int | float | str) and repr(given) not in message:
                message += f", not {given!r}"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)
