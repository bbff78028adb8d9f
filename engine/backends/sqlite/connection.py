"""How blok connects to a SQLite file: the settings of every connection, the page size of a
file it creates, and how None is bound."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import cast

from .refusals import busy_timeout_ms

# sqlite3 binds None as NULL, but first looks for an adapter the slow way: a miss on its
# protocol type raises, and formats, an AttributeError for every None parameter (about fifty
# a job). An adapter registered for None is found at once and hands None back: an empty
# dict's `get`, which returns None for any key, in C (a lambda was a Python call a None).
sqlite3.register_adapter(type(None), cast(Callable[[None], None], {}.get))

# Pages of 1 KB, not SQLite's default 4 KB, for a file blok creates. A commit appends every
# page it changed to the WAL, whole: a job's enqueue changes about 13 (the job and run rows
# and their index entries), its settle as many again, so with 4 KB pages a job writes some
# 100 KB of WAL, mostly untouched bytes, and a checkpoint copies them all again. 1 KB pages
# cut that by four (benchmarks/page_size.py: 34 KB written a job against 136 KB); jobs/s on
# the contract path 0-30 % higher depending on the day (benchmarks/README.md), never lower,
# reads no slower. Rows bigger than a page (a large payload or state snapshot) go to
# overflow pages, as they did at 4 KB.
PAGE_SIZE = 1024
# A big transaction (a purge after the retention was lowered) grew the WAL to its size, and it
# stayed so while the worker ran: twice the disk. It is cut back to this once checkpointed.
WAL_SIZE_LIMIT = 64 * 1024 * 1024


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the file as blok uses them all: autocommit (blok begins its own
    transactions), any thread, the busy timeout, WAL's size limit, rows by name."""
    timeout_ms = busy_timeout_ms()
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=timeout_ms / 1000
    )
    conn.execute(f"PRAGMA busy_timeout = {timeout_ms}")
    # WAL is set by `migrate`, once the file is known to be blok's (it changes the file).
    # NORMAL in WAL mode: a commit survives a process crash (kill -9); only an OS crash or
    # power loss may lose the last transactions. fsync on every batch would cap throughput.
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.row_factory = sqlite3.Row
    return conn
