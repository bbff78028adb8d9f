"""A close whose PostgreSQL server has gone away: the writes still queued are given up on as
soon as the server is found gone (a connection it refuses: at once; one it does not answer:
after `ANSWER_S`), with one line naming what was not written, instead of waiting 10 s for the
writer and up to 15 s more for `flush_now`. A server that answers, slowly, is still waited for.

The server is cut off by a TCP proxy in this process (the shared server stays up for the other
tests): shut (its connections closed, its port refusing), or stalled (its connections kept,
nothing relayed, new ones accepted and never answered)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import pytest
from anyio.abc import SocketAttribute, SocketStream
from pg import NO_DRIVER
from support import until

pytest.importorskip("asyncpg", reason=NO_DRIVER)

from backends.builders import a_run

from engine.backends import open_backend
from engine.backends.postgres import CLOSE_FLUSH_S, LOOK_AFTER_S, PostgresBackend
from engine.backends.postgres.db import ANSWER_S

from .conftest import connect

pytestmark = pytest.mark.anyio

LOST = "could not commit"


@dataclass
class Proxy:
    """A TCP proxy to the server: `url` goes through it."""

    url: str
    shut: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stalled: anyio.Event = field(default_factory=anyio.Event)

    def refuse(self) -> None:
        """Its connections are closed and its port refuses: a server that was stopped."""
        self.shut.cancel()

    def stall(self) -> None:
        """Nothing goes through any more, and nothing is closed: a server (or a network) that
        does not answer."""
        self.stalled.set()


@asynccontextmanager
async def proxy_to(url: str) -> AsyncIterator[Proxy]:
    found = re.match(r"^(postgres(?:ql)?://[^/@]*@?)([^:/]+):(\d+)(/.*)$", url)
    assert found is not None, url
    user, host, port, rest = found.groups()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    local = listener.extra(SocketAttribute.local_port)
    proxy = Proxy(f"{user}127.0.0.1:{local}{rest}")

    async def pipe(source: SocketStream, sink: SocketStream) -> None:
        async for chunk in source:
            if proxy.stalled.is_set():
                await anyio.sleep_forever()  # held: neither relayed nor closed
            await sink.send(chunk)
        await sink.send_eof()

    async def relay(client: SocketStream) -> None:
        async with client:
            if proxy.stalled.is_set():
                await anyio.sleep_forever()  # accepted, never answered
            async with (
                await anyio.connect_tcp(host, int(port)) as server,
                anyio.create_task_group() as both,
            ):
                both.start_soon(pipe, client, server)
                both.start_soon(pipe, server, client)

    async def serve() -> None:
        with proxy.shut:  # the listener's relays end with it
            await listener.serve(relay)
        await listener.aclose()  # the port refuses from here on

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        yield proxy
        proxy.shut.cancel()


def lost_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if LOST in r.getMessage()]


async def test_a_close_on_a_server_that_refuses_connections_ends_at_once(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """It waited 10 s for the writer to get through, which it never would."""
    caplog.set_level(logging.INFO, logger="blok.postgres")
    run = a_run()
    async with proxy_to(pg_url) as proxy:
        async with open_backend(proxy.url) as backend:
            assert isinstance(backend, PostgresBackend)
            proxy.refuse()
            backend.runs.save_run(run)  # the writer tries, and finds the server gone
            await until(lambda: backend.db.down_since is not None, timeout=5)
            started = time.monotonic()
        took = time.monotonic() - started
    assert took < 1.0, f"the close took {took:.1f}s"
    [said] = lost_lines(caplog)
    assert said.endswith(
        f"{LOST} 1 pending write(s) before going down (the latest state of run(s) {run.id}): "
        "the server refused the connection (is it stopped?)"
    ), said


async def test_a_close_on_a_server_that_does_not_answer_ends_within_the_limit(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its writer's batch sent and never answered, a new connection accepted and never
    answered either: the close gives up once a connection went unanswered for ANSWER_S. It
    took 10 s for the writer, 5 s for `flush_now`'s connection, then 9 s of goodbyes to a
    server that would not hear them."""
    caplog.set_level(logging.INFO, logger="blok.postgres")
    run = a_run()
    async with proxy_to(pg_url) as proxy:
        async with open_backend(proxy.url) as backend:
            proxy.stall()
            backend.runs.save_run(run)
            started = time.monotonic()
        took = time.monotonic() - started
    limit = LOOK_AFTER_S + ANSWER_S
    assert limit - 0.5 < took < limit + 1.5, f"the close took {took:.1f}s"
    [said] = lost_lines(caplog)
    assert said.endswith(
        f"{LOST} 1 pending write(s) before going down (the latest state of run(s) {run.id}): "
        f"the server did not answer a connection within {ANSWER_S:g}s"
    ), said


async def test_a_process_going_down_gives_up_on_a_server_that_does_not_answer(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The crash path (`flush_now`, the event loop blocked): its fresh connection is given
    ANSWER_S, not the 5 s a worker riding out an outage gives one, and the line says why (it
    said nothing: a timeout has no text). The close after it, with nothing left to write, says
    goodbye to the server no longer than its first goodbye goes unanswered (it took 9 s)."""
    caplog.set_level(logging.INFO, logger="blok.postgres")
    run = a_run()
    async with proxy_to(pg_url) as proxy:
        async with open_backend(proxy.url) as backend:
            proxy.stall()
            backend.runs.save_run(run)
            started = time.monotonic()
            backend.flush_now()
            took = time.monotonic() - started
            closing = time.monotonic()
        closed = time.monotonic() - closing
    assert took < ANSWER_S + 1.0, f"flush_now took {took:.1f}s"
    assert closed < 3.0, f"the close took {closed:.1f}s"
    assert lost_lines(caplog) == [
        f"{backend.location}: {LOST} 1 pending write(s) before going down (the latest state "
        f"of run(s) {run.id}): no answer within {ANSWER_S:g}s"
    ]


async def test_a_close_waits_for_a_slow_batch_on_a_server_that_answers(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer's batch waits on a lock another client holds for longer than LOOK_AFTER_S:
    the close looks at the server, finds it answering, and waits for the batch, which
    commits (the look gives up only on a server that is gone)."""
    caplog.set_level(logging.INFO, logger="blok.postgres")
    hold_s = LOOK_AFTER_S + 1.5
    assert hold_s < CLOSE_FLUSH_S
    run = a_run()
    locked = anyio.Event()
    async with anyio.create_task_group() as tg:
        async with open_backend(pg_url) as backend:  # its schema made: the table to lock
            other = await connect(pg_url)

            async def lock_runs() -> None:
                try:
                    async with other.transaction():
                        await other.execute("LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE")
                        locked.set()
                        await anyio.sleep(hold_s)
                finally:
                    await other.close()

            tg.start_soon(lock_runs)
            await locked.wait()
            backend.runs.save_run(run)
            started = time.monotonic()
        took = time.monotonic() - started
    assert hold_s - 0.5 < took < CLOSE_FLUSH_S, f"the close took {took:.1f}s"
    assert lost_lines(caplog) == []
    check = await connect(pg_url)
    try:
        assert await check.fetchval("SELECT status FROM runs WHERE id = $1", run.id) == str(
            run.status
        )
    finally:
        await check.close()
