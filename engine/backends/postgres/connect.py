"""Connections to the server, and what their failures mean.

Every connection blok opens is named in `pg_stat_activity` (`application_name`: "blok-tui
<role> <host>:<pid>", after the URL's own `application_name`) and has blok's schema on its
search path. The driver's pool logs its retries in one line. A failure to connect becomes one
line for the user (`DatabaseError`): a URL that cannot be used, a server that does not answer,
a login the server refuses. A failure while connected is sorted into those worth trying again
(the connection dropped, the server restarts, a deadlock or serialization failure) and the
others, which are the caller's.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg
import asyncpg.exceptions as pgerr

from ...errors import DatabaseError
from .schema import SCHEMA

CONNECT_TIMEOUT_S = 5.0
BACKOFF_MIN_S = 0.05  # the first wait before a connection is tried again; doubled each try
BACKOFF_MAX_S = 2.0

# The connection is gone or the server cannot serve it now: reconnect and try again.
_CONNECTION_LOST: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    pgerr.ConnectionDoesNotExistError,
    pgerr.PostgresConnectionError,  # class 08
    pgerr.AdminShutdownError,  # 57P01: pg_terminate_backend, a fast shutdown
    pgerr.CrashShutdownError,  # 57P02
    pgerr.CannotConnectNowError,  # 57P03: starting up, shutting down, in recovery
    pgerr.TooManyConnectionsError,  # 53300: others may leave
    # asyncpg out of step with a session the server ended while it sat idle ("cannot switch
    # to state ..."): the connection is dropped and another made.
    pgerr.InternalClientError,
)
# What a connection's opening is refused with for good, not for a while.
REFUSED_AT_CONNECT: tuple[type[BaseException], ...] = (
    pgerr.InvalidCatalogNameError,
    pgerr.InvalidAuthorizationSpecificationError,
    pgerr.InvalidPasswordError,
)
# The statement lost a race with another transaction: run the transaction again.
_CONFLICT: tuple[type[BaseException], ...] = (
    pgerr.SerializationError,  # 40001
    pgerr.DeadlockDetectedError,  # 40P01
)


def connection_lost(error: BaseException) -> bool:
    if isinstance(error, _CONNECTION_LOST):
        return True
    # asyncpg says "connection is closed" with a plain InterfaceError once a connection died.
    return isinstance(error, pgerr.InterfaceError) and "closed" in str(error)


def conflict(error: BaseException) -> bool:
    return isinstance(error, _CONFLICT)


DRIVER_REPEAT_S = 60.0  # a driver's message said again within this long is not logged again
_driver_said: dict[str, float] = {}  # the driver's messages (their templates), when last logged


def _driver_errors_in_one_line(record: logging.LogRecord) -> bool:
    """The driver's own retries through an outage (its pool restoring its connections) say
    their error in one line, once a minute: in an application's log, a 25-line traceback of
    the driver's internals came four times in five seconds and buried the lines around them
    (blok's own say when the database is lost and when it is back)."""
    now = time.monotonic()
    template = str(record.msg)
    if now - _driver_said.get(template, -DRIVER_REPEAT_S) < DRIVER_REPEAT_S:
        return False
    _driver_said[template] = now
    if record.exc_info and record.exc_info[1] is not None:
        error = record.exc_info[1]
        record.msg = f"{record.getMessage()} ({type(error).__name__}: {error})"
        record.args, record.exc_info, record.exc_text = None, None, None
    return True


logging.getLogger("asyncpg.pool").addFilter(_driver_errors_in_one_line)


def retryable(error: BaseException) -> bool:
    return connection_lost(error) or conflict(error)


WRITER = "writer"  # the role of the connection that commits every write (db.py)


def application_name(role: str, url: str | None = None, kind: str = "producer") -> str:
    """How the connection is named in `pg_stat_activity`: "blok-tui worker/pool host:pid", after
    the name the URL gives (`?application_name=webapp`), which blok's own replaced: a DBA could
    not tell a web app's producer from a worker, nor, by a bare pid, one machine from another.
    `kind`: what the process is to the database, a "worker" (it runs jobs) or a "producer"
    (it enqueues and reads: an application, the console, a command)."""
    name = f"blok-tui {kind}/{role} {socket.gethostname()}:{os.getpid()}"
    given = parse_qs(urlsplit(url).query).get("application_name") if url else None
    return f"{given[0]} ({name})" if given else name


def settings(
    role: str,
    idle_in_transaction_s: float | None = None,
    url: str | None = None,
    kind: str = "producer",
) -> dict[str, str]:
    """The session settings of a connection in `role`. `idle_in_transaction_s`: the server
    ends the session if it sits inside a transaction that long without a statement — a process
    frozen in the middle of one (SIGSTOP, a long pause) would otherwise keep the rows it locked
    from a worker taking its jobs over once their leases ran out. blok's own transactions never
    wait between their statements."""
    values = {"search_path": SCHEMA, "application_name": application_name(role, url, kind)}
    if role == WRITER:
        # The writer's statements find their rows by key (a job, a run, its steps). The server
        # plans a prepared statement once for all after a few runs, with the tables as they
        # are then, and keeps that plan for the whole session, until an ANALYZE: planned on a
        # new database's near-empty `jobs`, a batch would scan the whole table every time, a
        # little slower with every job added (two thirds of the speed at 5,000 jobs). Without
        # scans to choose from, it plans the index lookups, right at any size.
        values["enable_seqscan"] = "off"
    if idle_in_transaction_s is not None:
        values["idle_in_transaction_session_timeout"] = str(int(idle_in_transaction_s * 1000))
    return values


def idle_limit(lease_s: float) -> float:
    """How long a transaction of blok's may sit idle: half a lease (at least a second), so that
    a frozen process's locks are gone before its leases run out."""
    return max(1.0, lease_s / 2)


async def connect(
    url: str,
    role: str,
    idle_in_transaction_s: float | None = None,
    *,
    kind: str = "producer",
    **kwargs: Any,
) -> asyncpg.Connection:
    return await asyncpg.connect(
        url,
        timeout=CONNECT_TIMEOUT_S,
        server_settings=settings(role, idle_in_transaction_s, url, kind),
        **kwargs,
    )


def explain(location: str, error: BaseException) -> DatabaseError:
    """A failure to connect as the one line the user reads: what and where, and what to do."""
    if isinstance(error, (ValueError, pgerr.ClientConfigurationError)):
        text = f"not a usable PostgreSQL URL ({error})"
    elif isinstance(error, socket.gaierror):
        text = f"cannot find the server's host ({error.strerror or error})"
    elif isinstance(error, ConnectionRefusedError):
        text = "the server refused the connection (is PostgreSQL running there?)"
    elif isinstance(error, TimeoutError):
        text = f"the server did not answer within {CONNECT_TIMEOUT_S:g}s"
    elif isinstance(
        error, (pgerr.InvalidAuthorizationSpecificationError, pgerr.InvalidPasswordError)
    ):
        text = f"the server refused the login: {error}"
    elif isinstance(error, pgerr.InvalidCatalogNameError):
        text = f"{error} (create it first, e.g. createdb)"
    elif isinstance(error, pgerr.CannotConnectNowError):
        text = f"the server cannot take connections now: {error}"
    elif isinstance(error, pgerr.InsufficientPrivilegeError):
        text = f"not allowed: {error} (blok keeps its tables in a schema {SCHEMA!r} of its own)"
    elif isinstance(error, OSError):
        text = f"cannot connect: {error.strerror or error}"
    else:
        text = f"cannot connect: {type(error).__name__}: {error}"
    return DatabaseError(f"{location}: {text}".replace("\n", " "))
