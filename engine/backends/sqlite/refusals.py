"""When an SQLite file refuses a write: which refusals may pass (busy, disk full, I/O) and are
waited out, which will not (a damaged file, a bug), and the one log line that says so."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

from ...errors import DatabaseError

log = logging.getLogger("blok.sqlite")

BUSY_TIMEOUT_MS = 10_000  # BLOK_SQLITE_BUSY_TIMEOUT_MS: how long one statement waits for a lock
# How long the writer waits in the event loop's thread for another process's write lock, in
# steps, before it leaves the batch to a thread that waits up to the busy timeout: about 0.3 ms,
# a few transactions of another busy process (`begin_briefly`).
BRIEF_WAITS_S = (0.00005, 0.00005, 0.0001, 0.0001)
RETRY_MAX_S = 5.0  # a write the database refused (busy, disk full) is tried again this often


def busy_timeout_ms() -> int:
    value = os.environ.get("BLOK_SQLITE_BUSY_TIMEOUT_MS", "")
    return int(value) if value.isdigit() else BUSY_TIMEOUT_MS


def begin_briefly(conn: sqlite3.Connection) -> bool:
    """BEGIN IMMEDIATE in the event loop's thread, on a connection whose busy timeout is 0:
    False if another process still holds the write lock after BRIEF_WAITS_S. Another process's
    transaction holds it for a hundred µs or so; waiting for it in a thread cost a hop there and
    back, three to four times that."""
    for wait in BRIEF_WAITS_S:
        if _began(conn):
            return True
        time.sleep(wait)
    return _began(conn)


def _began(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as error:
        if transient(error) != "busy":
            raise
        return False
    return True


def transient(error: BaseException) -> str | None:
    """What keeps the database from being written now, if it may pass: "busy" (another
    process holds the write lock), "full" (no space left) or "io" (an I/O error); None for an
    error that will not go away by waiting (a damaged file, a read-only one, a bug)."""
    if not isinstance(error, sqlite3.Error):
        return None
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return "busy"
    if code == sqlite3.SQLITE_FULL:
        return "full"
    if code == sqlite3.SQLITE_IOERR:
        return "io"
    return None


def damaged(error: BaseException) -> bool:
    return getattr(error, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_CORRUPT


def damaged_message(path: Path, detail: object) -> str:
    return (
        f"{path}: the database file is damaged ({detail}); restore it from a backup, "
        "or move it aside to start with a new one"
    )


# SQLite's quick_check reads the whole file: 2 s at 130 MB, 34 s at 600 MB after the page
# cache was dropped, at every command and console start and every `health`. A file larger than
# this is checked only by the processes that serve it (a worker, once at its start); a command
# that meets a damaged page says so in one line all the same, when it reads it.
QUICK_CHECK_MAX_BYTES = 64 * 1024 * 1024


def quick_check(conn: sqlite3.Connection, path: Path, serving: bool) -> bool:
    """SQLite's quick_check (structure, not index contents), so that a damaged file is
    refused on open rather than half-way through serving it; DatabaseError if it is damaged.
    False if not checked: a large file, opened by a process that does not serve it."""
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    if not serving and size > QUICK_CHECK_MAX_BYTES:
        return False
    row = conn.execute("PRAGMA quick_check(1)").fetchone()
    if row is None or row[0] != "ok":
        raise DatabaseError(damaged_message(path, row[0] if row else "no answer"))
    return True


class Troubles:
    """One line in the log when the database starts refusing writes for a reason that may
    pass, one when it takes them again: not a traceback per attempt."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self.kind: str | None = None
        self.since = 0.0
        self.delay = 0.05

    def failed(self, error: BaseException, kind: str) -> float:
        """Note a refusal; the seconds to wait before trying again."""
        if kind != self.kind:
            self.kind, self.since = kind, time.monotonic()
            if kind == "busy":
                log.warning(
                    "database %s is busy: another process holds its write lock (a VACUUM, a "
                    "migration, an open transaction); %s waits and tries again",
                    self.path,
                    self.what,
                )
            elif kind == "full":
                log.error(
                    "disk full: cannot write to %s (%s); %s is kept and tried again until "
                    "there is space, nothing is lost",
                    self.path,
                    error,
                    self.what,
                )
            else:
                log.error(
                    "cannot write to %s: %s; %s is kept and tried again",
                    self.path,
                    error,
                    self.what,
                )
        else:
            self.delay = min(self.delay * 2, RETRY_MAX_S)
        return self.delay

    def cleared(self) -> None:
        if self.kind is not None:
            log.warning(
                "database %s: written again after %.1fs (%s)",
                self.path,
                time.monotonic() - self.since,
                {"busy": "the lock was released", "full": "there is space again"}.get(
                    self.kind, "the error went away"
                ),
            )
            self.kind, self.delay = None, 0.05


def rollback(conn: sqlite3.Connection) -> None:
    """Undo an open transaction, if SQLite has not already (it has, after a disk full): a
    failed ROLLBACK must not hide the error that caused it."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as error:
            log.debug("rollback after an error failed too: %s", error)


def not_the_calls(conn: sqlite3.Connection, error: Exception) -> bool:
    """Whether a call in a batch failed for the database's sake, not its own: the disk is
    full, the file busy or unreadable (the whole batch is tried again, the call with it), or
    SQLite rolled the transaction back itself (on a full disk it may: its savepoint is gone
    with the rest)."""
    return transient(error) is not None or not conn.in_transaction
