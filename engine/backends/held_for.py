"""A job held back for another worker: which workers pass it over, and until when.

A job a worker claimed and will not run, held back for a live worker that has what it needs
(another deployment's workflow, the version a run started on: `engine/versions.py`), carries
`meta[HELD_FOR] = {"until": epoch seconds, "not": [worker ids]}`: until then, a claim by one
of those workers passes it over once it falls due (the database queues' search for due
delayed jobs), so the worker it was left to wins it. The holder had won it back, a second at
a time, when both looked at its due moment: 37 claims and 36 s for one job. After `until`,
anyone claims it (that worker is gone, or busy). A memory queue has one worker: nothing is
passed over there."""

from __future__ import annotations

from typing import Any

HELD_FOR = "held_for"


def held_for(
    meta: dict[str, Any], worker: str, now: float, due: float, window_s: float
) -> dict[str, Any]:
    """`meta` with `worker` among those that pass the job over until `due` + `window_s`
    (epoch seconds, as `now`); the workers of a window still open are kept."""
    held = meta.get(HELD_FOR)
    refused: list[str] = []
    if isinstance(held, dict) and float(held.get("until", 0)) > now:
        refused = [w for w in held.get("not", []) if isinstance(w, str)]
    if worker not in refused:
        refused.append(worker)
    return {**meta, HELD_FOR: {"until": due + window_s, "not": refused}}
