"""Count the commits in a SQLite database's write-ahead log, from outside the process writing.

How: `PRAGMA wal_checkpoint(TRUNCATE)` on our own connection empties the WAL file; after the
writes under study, every frame in the file belongs to them. A WAL frame's header says, in
bytes 4-8, the database's size in pages after the commit for the last frame of a transaction,
and 0 for the others: so the commits are the frames with a non-zero field there.

The count holds only if SQLite did not restart the log meanwhile (an automatic checkpoint
after 1,000 pages, then a new writer, rewrites the file from the start with new salts). Then
the frames of the new generation no longer fill the file, and `count_commits` says so.
"""

from __future__ import annotations

import sqlite3
import struct
from dataclasses import dataclass
from pathlib import Path

WAL_HEADER = 32
FRAME_HEADER = 24


class WalCountError(RuntimeError):
    """The WAL cannot be counted: a checkpoint was blocked, or the log restarted."""


@dataclass(frozen=True)
class WalCount:
    frames: int
    commits: int


def truncate(database: Path) -> None:
    """Checkpoint everything and empty the WAL file (needs no reader holding an old snapshot)."""
    with sqlite3.connect(database, timeout=10) as db:
        busy, _log, _done = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    db.close()
    if busy:
        raise WalCountError(f"{database}: wal_checkpoint(TRUNCATE) was blocked by a reader")
    wal = Path(f"{database}-wal")
    if wal.exists() and wal.stat().st_size:
        raise WalCountError(f"{wal}: not empty after wal_checkpoint(TRUNCATE)")


def count_commits(database: Path) -> WalCount:
    """Frames and commits in the WAL since the last `truncate`."""
    data = Path(f"{database}-wal").read_bytes() if Path(f"{database}-wal").exists() else b""
    if not data:
        return WalCount(0, 0)
    page_size = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    frame_size = FRAME_HEADER + page_size
    frames = commits = 0
    offset = WAL_HEADER
    while offset + frame_size <= len(data):
        header = data[offset : offset + FRAME_HEADER]
        if header[8:16] != salts:
            break
        frames += 1
        if struct.unpack(">I", header[4:8])[0]:
            commits += 1
        offset += frame_size
    if offset != len(data):
        raise WalCountError(
            f"{database}-wal: {frames} current frames but {len(data)} bytes: the log restarted"
        )
    return WalCount(frames, commits)
