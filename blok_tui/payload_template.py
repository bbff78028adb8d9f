"""The inject modal's starting payload for a queue: the `$.body` fields its workflow's steps
read (`WorkflowInfo.body_fields`), as a JSON object with a null to fill in for each.

"customer.email" becomes {"customer": {"email": null}}; a number in a path ("items.0.sku", how
an expression indexes a list) becomes a list of one such item. Values stay null: the engine
knows which fields are read, not what they hold, and a value copied from an earlier run could
charge an order twice.
"""

from __future__ import annotations

import json
from typing import Any

from engine.payload_fields import at_path, missing_fields

__all__ = ["body_template", "missing_fields", "null_fields", "template_text"]

INDENT = 2


def body_template(fields: list[str]) -> dict[str, Any]:
    """An object holding every dotted path in `fields`, each leaf null. A field read both
    whole and by a part ("customer" and "customer.email") is shown by its parts."""
    root: dict[str, Any] = {}
    for field in fields:
        parts = [part for part in field.split(".") if part]
        if parts:
            _put(root, parts)
    return root


def _put(node: dict[str, Any] | list[Any], parts: list[str]) -> None:
    head, rest = parts[0], parts[1:]
    if isinstance(node, list):  # a list is shown with one item, whatever the index read
        if not rest:
            if not node:
                node.append(None)
            return
        if not node or not isinstance(node[0], dict | list):
            node[:] = [[] if rest[0].isdigit() else {}]
        _put(node[0], rest)
        return
    if not rest:
        node.setdefault(head, None)
        return
    wanted: dict[str, Any] | list[Any] = [] if rest[0].isdigit() else {}
    child = node.get(head)
    if not isinstance(child, type(wanted)):
        node[head] = child = wanted
    _put(child, rest)


def null_fields(payload: Any, fields: list[str]) -> list[str]:
    """The `fields` (dotted paths, as `body_template` takes them) that `payload` holds as
    null: the template's blanks not filled in yet."""
    return [f for f in fields if f.strip(".") and at_path(payload, f) is None]


def template_text(fields: list[str]) -> str:
    """The template as the editor shows it: indented JSON, "{}" when no field is known."""
    template = body_template(fields)
    if not template:
        return "{}"
    return json.dumps(template, indent=INDENT, ensure_ascii=False)
