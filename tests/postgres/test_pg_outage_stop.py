"""A worker told to stop while its PostgreSQL server is out of reach stops: every wait of a
stop on the database (the claim in flight, the last writes, the last flush) ends a lease past
the grace. It waited for the server to come back, through a second SIGTERM too.

The server is put out of reach by a TCP proxy between the worker and it, in this process: the
proxy is shut (its connections closed, a new one closed as it is accepted), the server stays up
for the other tests."""

from __future__ import annotations

import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketStream
from cli_helpers import Worker, start_worker, write_workflows
from pg import NO_DRIVER

pytest.importorskip("asyncpg", reason=NO_DRIVER)

pytestmark = pytest.mark.anyio


class Shutter:
    """Shuts a proxy: its relays end, and a connection that comes after is closed as it is
    accepted (the listener goes on accepting: cancelling its accept as a connection arrived
    raised asyncio's InvalidStateError in the test's loop, now and then)."""

    def __init__(self) -> None:
        self.shut = False
        self.relays: set[anyio.CancelScope] = set()

    def cancel(self) -> None:
        self.shut = True
        for scope in self.relays:
            scope.cancel()


@asynccontextmanager
async def tcp_proxy(host: str, port: int) -> AsyncIterator[tuple[int, Shutter]]:
    """A proxy to host:port on a free local port: (that port, what shuts it)."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    local = listener.extra(anyio.abc.SocketAttribute.local_port)
    shutter = Shutter()

    async def pipe(source: SocketStream, sink: SocketStream) -> None:
        async for chunk in source:
            await sink.send(chunk)
        await sink.send_eof()

    async def relay(client: SocketStream) -> None:
        if shutter.shut:
            await client.aclose()
            return
        with anyio.CancelScope() as scope:
            shutter.relays.add(scope)
            async with (
                client,
                await anyio.connect_tcp(host, port) as server,
                anyio.create_task_group() as both,
            ):
                both.start_soon(pipe, client, server)
                both.start_soon(pipe, server, client)

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, relay)
        yield local, shutter
        shutter.cancel()
        tg.cancel_scope.cancel()  # the worker is gone by now: no connection is coming


async def ended(worker: Worker, within: float) -> None:
    """Once the worker's process has exited, failing after `within` seconds."""
    with anyio.fail_after(within):
        while worker.process.poll() is None:  # noqa: ASYNC110 - another process
            await anyio.sleep(0.1)


def kill(worker: Worker) -> None:
    """The worker's process, ended if a failing test left it running."""
    if worker.process.poll() is None:
        worker.process.kill()
        worker.process.wait()


@asynccontextmanager
async def cut_off(pg_url: str, tmp_path: Path, lease: str, grace: str) -> AsyncIterator[Worker]:
    """A `blok-tui worker` on the server through a proxy, once the proxy is shut and the
    worker has said it lost the database; ended when the block is left."""
    found = re.match(r"^(postgres(?:ql)?://[^/@]*@?)([^:/]+):(\d+)(/.*)$", pg_url)
    assert found is not None, pg_url
    user, host, port, rest = found.groups()
    async with tcp_proxy(host, int(port)) as (local, shut):
        through = f"{user}127.0.0.1:{local}{rest}"
        worker = await anyio.to_thread.run_sync(
            lambda: start_worker(
                tmp_path / "unused.db",
                write_workflows(tmp_path / "workflows"),
                "--db",
                through,
                "--lease",
                lease,
                "--grace",
                grace,
                "--no-watch",
            )
        )
        try:
            shut.cancel()  # the server is out of reach from here on
            await said(worker, "lost the database")
            yield worker
        finally:
            kill(worker)


async def said(worker: Worker, text: str) -> None:
    """Once the worker's log holds `text`, failing after 20 s."""
    with anyio.fail_after(20):
        while text not in worker.stderr():  # noqa: ASYNC110 - a file
            await anyio.sleep(0.1)


async def test_a_worker_stops_while_its_database_is_out_of_reach(
    pg_url: str, tmp_path: Path
) -> None:
    async with cut_off(pg_url, tmp_path, lease="2s", grace="1") as worker:
        worker.process.send_signal(signal.SIGTERM)
        # 1 s of grace, a 2 s lease, and the backend's last flush (at most 15 s).
        await ended(worker, within=30)
    log = worker.stderr()
    assert "stopped without its last writes: the database did not answer" in log, log
    assert f"worker {worker.id} stopped" in log, log


async def test_a_second_signal_cuts_the_wait_and_says_it_did(pg_url: str, tmp_path: Path) -> None:
    """A second SIGTERM cut the stop's wait on the database short, and the log blamed the
    database: "the database did not answer", said of a wait the operator had ended."""
    async with cut_off(pg_url, tmp_path, lease="30s", grace="0") as worker:
        worker.process.send_signal(signal.SIGTERM)
        await said(worker, "draining")
        worker.process.send_signal(signal.SIGTERM)
        await ended(worker, within=20)  # not the 30 s lease
    log = worker.stderr()
    assert (
        "stopped without its claims: a second stop signal cut the wait for the database short"
    ) in log or (
        "stopped without its last writes: a second stop signal cut the wait for the database short"
    ) in log, log
    assert "the database did not answer" not in log, log


async def test_a_worker_whose_database_is_dropped_says_so_in_one_line(
    pg_url: str, tmp_path: Path
) -> None:
    """It went down with some hundred lines of the driver's traceback, and its run's error
    called the dropped database an 'unhandled error'."""
    from pg import drop_under_its_users

    worker = await anyio.to_thread.run_sync(
        lambda: start_worker(
            tmp_path / "unused.db",
            write_workflows(tmp_path / "workflows"),
            "--db",
            pg_url,
            "--lease",
            "2s",
            "--no-watch",
        )
    )
    try:
        name = pg_url.rsplit("/", 1)[1]
        await drop_under_its_users(pg_url)
        await ended(worker, within=30)
    finally:
        kill(worker)
    said = worker.stderr()
    assert worker.process.returncode == 1, said
    assert "Traceback" not in said, said
    last = said.strip().splitlines()[-1]
    assert last.startswith(f'blok-tui: error: {pg_url}: database "{name}" does not exist'), said
