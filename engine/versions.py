"""Workflows that the live workers serve at different versions: a rolling deploy under way, or
a worker left behind with old files. Its jobs go to whichever worker claims them, so runs of
one workflow split between versions without a word; each worker says so in its log, once for
each split it finds, when it starts and at each janitor round."""

from __future__ import annotations

import logging

from .backends.base import Backend
from .liveness import LiveWorkers

log = logging.getLogger("blok.versions")


async def version_splits(backend: Backend) -> dict[str, dict[str, list[str]]]:
    """Workflow name → version → the live workers serving it at that version, for the
    workflows served at more than one."""
    live = await LiveWorkers.read(backend)
    served: dict[str, dict[str, list[str]]] = {}
    for catalog in await backend.shared.catalogs():
        if catalog.worker not in live.ids:
            continue
        for info in catalog.workflows:
            served.setdefault(info.name, {}).setdefault(info.version, []).append(catalog.worker)
    return {name: versions for name, versions in served.items() if len(versions) > 1}


def split_line(workflow: str, versions: dict[str, list[str]]) -> str:
    by = "; ".join(
        f"{version} by {', '.join(sorted(workers))}"
        for version, workers in sorted(versions.items())
    )
    return (
        f"workflow {workflow!r} is served at {len(versions)} versions ({by}): its jobs run on "
        "whichever worker claims them"
    )


class VersionWatch:
    """Says each split once in this process's log."""

    def __init__(self) -> None:
        self._told: set[str] = set()

    async def check(self, backend: Backend) -> list[str]:
        """The splits found now, each logged the first time it is seen."""
        lines = [split_line(name, v) for name, v in sorted((await version_splits(backend)).items())]
        for line in lines:
            if line not in self._told:
                self._told.add(line)
                log.warning("%s", line)
        return lines
