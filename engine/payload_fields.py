"""Which of the `$.body` fields a workflow reads (engine/catalog.py `body_fields`) a payload
lacks: `blok-tui enqueue` and the console's inject warn of them, and a schedule whose payload
lacks one is warned of when its workflow loads (its every tick would fail at that step)."""

from __future__ import annotations

from typing import Any

MISSING = object()


def at_path(payload: Any, field: str) -> Any:
    """The value at a dotted path of `payload`, or `MISSING`."""
    node: Any = payload
    for part in (part for part in field.split(".") if part):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def missing_fields(payload: Any, fields: list[str]) -> list[str]:
    """The `fields` that `payload` does not have (below a null one aside: that one is a blank,
    `null_fields`): the step that reads one fails with "bad input", unless it is in a branch
    the run does not take. Below a missing field, only that field is named."""
    found: list[str] = []
    for field in fields:
        parts = [part for part in field.split(".") if part]
        if not parts or at_path(payload, field) is not MISSING:
            continue
        # The first part of the path that is not there, unless a null blank comes first.
        for end in range(1, len(parts) + 1):
            above = ".".join(parts[:end])
            value = at_path(payload, above)
            if value is None:
                break
            if value is MISSING:
                if above not in found:
                    found.append(above)
                break
    return found
