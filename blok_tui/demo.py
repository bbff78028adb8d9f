"""The demo producer: feeds the bundled example queues at a calm pace so that a newcomer sees,
within ten seconds, a retry, a slow run, a wait, a timeout and a dead letter, and then a steady
trickle of ordinary work."""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import random
from pathlib import Path
from typing import Any

import anyio

from engine import EngineError
from engine.api import EngineAPI

log = logging.getLogger("blok.demo")

# The opening act: one of everything, a second or so apart.
OPENING: list[tuple[str, dict[str, Any]]] = [
    ("orders", {"order_id": "A1001", "amount": 4200, "items": 3, "flaky": 2}),
    ("reports", {"month": "2026-11", "seconds": 40}),
    ("webhooks", {"url": "https://gone.example.com/hooks/orders", "event": "order.paid"}),
    ("exports", {"size_mb": 90}),
    ("orders", {"order_id": "A1002", "amount": 1299, "items": 1}),
    ("webhooks", {"url": "https://warming.example.com/hooks/orders", "event": "order.paid"}),
    ("orders", {"order_id": "A1003", "amount": 560, "items": 2, "flaky": 1}),
    ("exports", {"size_mb": 12}),
]


def _next_job(n: int, rng: random.Random) -> tuple[str, dict[str, Any]]:
    roll = rng.random()
    if roll < 0.6:
        return "orders", {
            "order_id": f"A{1003 + n}",
            "amount": rng.randint(300, 9000),
            "items": rng.randint(1, 5),
            "flaky": rng.choice([0, 0, 0, 1, 2]),
        }
    if roll < 0.8:
        return "exports", {"size_mb": rng.choice([5, 10, 20, 25, 60])}
    if roll < 0.95:
        kind = rng.random()
        host = (
            "gone.example.com"
            if kind < 0.25
            else "warming.example.com"
            if kind < 0.5
            else "hooks.example.com"
        )
        return "webhooks", {"url": f"https://{host}/e/{n}", "event": "order.shipped"}
    return "reports", {"month": "2026-10", "seconds": rng.randint(20, 60)}


async def demo_producer(
    engine: EngineAPI, *, pace: float = 1.2, seed: int | None = None, opening: bool = True
) -> None:
    """Run forever, one job every `pace` seconds or so. Queues that are not loaded (a user's
    own workflows folder) are skipped silently: the producer only feeds the examples.

    The opening comes at a steady pace, then jobs come at random: what a newcomer sees in the
    first ten seconds (a retry, a slow run, a wait, a timeout, a dead letter) must not depend
    on the dice (with a random pace the opening's timeout came anywhere from 6 to 11 s in).
    `opening=False` starts with the trickle (a producer taking over from another)."""
    rng = random.Random(seed)
    known = {q.name for q in await engine.queues()}
    counter = itertools.count(1)
    first = OPENING if opening else []
    plan = itertools.chain(first, (_next_job(next(counter), rng) for _ in itertools.count()))
    for n, (queue, payload) in enumerate(plan):
        if queue in known:
            try:
                await engine.enqueue(queue, payload)
            except EngineError as error:
                # A hot reload may have removed the queue meanwhile; look again and go on.
                log.info("demo producer: %s", error)
                known = {q.name for q in await engine.queues()}
        await anyio.sleep(pace if n < len(first) else pace * (0.6 + 0.8 * rng.random()))


async def demo_producer_for(
    engine: EngineAPI, lock: Path | None, *, pace: float = 1.2, recheck: float = 2.0
) -> None:
    """The demo producer, one for a database however many consoles serve it: a second console
    on the demo's database doubled its jobs and played the opening again. The producer holds a
    lock on the file `lock` (by the database; None for an engine in memory, which no other
    console shares); a console that finds it held feeds nothing, looking again every `recheck`
    seconds, and takes over with the trickle once the first one has quit."""
    if lock is None:
        await demo_producer(engine, pace=pace)
        return
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        waited = False
        while not _try_lock(descriptor):
            if not waited:
                log.info("demo producer: another console feeds the demo (%s); waiting", lock)
                waited = True
            await anyio.sleep(recheck)
        await demo_producer(engine, pace=pace, opening=not waited)
    finally:
        os.close(descriptor)  # the lock goes with it


def _try_lock(descriptor: int) -> bool:
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
