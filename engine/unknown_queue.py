"""Why a queue is unknown, said where the user asked for it (`enqueue`, `runs --queue`): the
queues there are, and what may explain it. A workflow file that failed to load here or on a
live worker (the `UnknownQueue` of a syntax error read as a mistyped queue name), a workflow of
that name with no trigger (it has no queue: it runs as a sub-workflow), runs of the queue that
no worker serves any more, or a producer's database that no worker uses (a mistyped path)."""

from __future__ import annotations

from collections.abc import Sequence

from .backends.base import Backend, WorkerCatalog
from .catalog import Catalog
from .errors import UnknownQueue
from .expressions import did_you_mean
from .filters import RunFilter
from .liveness import LiveWorkers

SHOWN_ERRORS = 2  # load errors quoted; the others are counted


async def unknown_queue(
    queue: str, catalog: Catalog, declared: Sequence[WorkerCatalog], backend: Backend
) -> UnknownQueue:
    known = sorted(set(catalog.served()) | {q.name for c in declared for q in c.queues})
    if catalog.served():
        hint = ""
    else:  # the database named: a producer given a mistyped path has one of its own, empty
        hint = "; a queue is known once a worker serving it has started on this database, "
        hint += backend.location
    if await backend.runs.list_runs(RunFilter.of(queue=queue), limit=1):
        hint = "; it has runs, but no worker serves it: was its workflow file removed, "
        hint += "or its queue renamed?"
    workflow = catalog.workflow(queue)
    if workflow is not None and workflow.trigger is None:
        hint += (
            f"; workflow {queue!r} has no trigger, so no queue: give it "
            "trigger=WorkerTrigger(queue=...), or run it as a sub-workflow"
        )
    errors = dict(catalog.reload_errors)
    for other in (await LiveWorkers.read(backend)).catalogs:  # a stopped one's may be stale
        errors.update(other.reload_errors)
    if errors:
        count = len(errors)
        shown = "; ".join(sorted(errors.values())[:SHOWN_ERRORS])
        more = f"; and {count - SHOWN_ERRORS} more" if count > SHOWN_ERRORS else ""
        files = f"{count} workflow file{'s' if count > 1 else ''} failed to load"
        hint += f"; {files}: {shown}{more}"
    meant = did_you_mean(queue, known)  # "; did you mean 'shop'?", as `runs --queue` says
    return UnknownQueue(
        f"unknown queue {queue!r}{meant.replace(';', ':', 1)} (queues: "
        f"{', '.join(known) or 'none'}{hint})"
    )
