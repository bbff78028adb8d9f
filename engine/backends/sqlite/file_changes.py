"""Hearing a SQLite file change the moment another process writes it (Linux's inotify).

A process learns that another one committed by reading the file's `data_version`, which costs
next to nothing but says nothing until asked. Asked every few milliseconds, it made each hand-off
between two processes (a job enqueued here and claimed there, its run ended there and awaited
here) wait half that period on average. The kernel can say when the file is written instead:
every commit appends to the `-wal` file (or, outside WAL mode, writes the file itself), and an
inotify watch on the folder wakes the event loop then, with no polling. The folder rather than
the file: SQLite removes its `-wal` file when the last connection closes and makes a new one on
the next open.

A watch is not free: every write to a watched file costs the process that writes it about a
microsecond in the kernel, and a commit writes a page at a time (some twenty for a job). So the
watch is on only while it pays (`SqliteBackend._hear_others` says when: this process waits for
another one that is writing, or is a worker idle on a file another process wrote lately), and
off otherwise (`listen`, `stop`).

The kernel hears the write before the commit shows: SQLite writes its frames, then marks them
committed in its index (shared memory, which inotify does not see). So a change heard is read at
once and, if it has not shown yet, once more a moment later.

Where inotify is missing (not Linux, the user's limits of inotify instances or watches reached),
there is no watch, and the backend polls as it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sys
from pathlib import Path
from typing import Any

import anyio

log = logging.getLogger("blok.sqlite")

inotify_simple: Any = None
if sys.platform == "linux":  # elsewhere the module imports, but has no inotify to call
    with contextlib.suppress(ImportError):  # an install without the dependency: polled
        import inotify_simple  # type: ignore[import-untyped,no-redef]

# What a commit does to the files: appends (modify) or makes the -wal file (create); and what
# says the watch itself may have missed something (an overflowed event queue).
_MASK = 0x2 | 0x100  # IN_MODIFY | IN_CREATE
_OVERFLOW = 0x4000  # IN_Q_OVERFLOW
# Refusals of a watch that mean "not here": the user's limit of watches, a folder it may not
# read, a folder gone. Anything else is a bug and raised.
_NO_WATCH = (errno.ENOSPC, errno.EACCES, errno.ENOENT, errno.EPERM)


class FileChanges:
    """Writes to one database file (its `-wal` and the file itself), heard through an inotify
    watch on its folder while `listen`ing. Made in the event loop that waits on it."""

    def __init__(self, notify: Any, folder: Path, names: frozenset[str]) -> None:
        self._notify = notify
        self._fd: int = notify.fileno()
        self._folder = folder
        self._names = names
        self._heard = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._watch: int | None = None  # the watch descriptor while listening
        self.broken = False  # the kernel refused a watch: polled from then on
        self.heard = 0  # writes heard (the events read that named the file), for tests

    @classmethod
    def open(cls, path: Path) -> FileChanges | None:
        """Changes to the file at `path`, not listened to yet; None where there can be none."""
        if inotify_simple is None:
            return None
        try:
            notify = inotify_simple.INotify(nonblocking=True)
        except OSError as error:
            # EMFILE: the user's inotify instances (128 by default) are all in use.
            _polled_instead(path, error)
            return None
        target = path.resolve()
        return cls(notify, target.parent, frozenset({target.name, f"{target.name}-wal"}))

    @property
    def listening(self) -> bool:
        return self._watch is not None

    def listen(self) -> bool:
        """Watch the file (if not already): whether it is watched."""
        if self._watch is None and not self.broken:
            try:
                self._watch = self._notify.add_watch(self._folder, _MASK)
            except OSError as error:
                if error.errno not in _NO_WATCH:
                    raise
                self.broken = True
                _polled_instead(self._folder, error)
                return False
            self._loop.add_reader(self._fd, self._readable)
        return self._watch is not None

    def stop(self) -> None:
        """No more watch (until the next `listen`): the writes of every process stop paying
        for it."""
        if self._watch is not None:
            self._loop.remove_reader(self._fd)
            with contextlib.suppress(OSError):  # EINVAL: the folder went, and its watch with it
                self._notify.rm_watch(self._watch)
            self._watch = None
            self.drain()
            self._heard.clear()

    def _readable(self) -> None:
        """The loop's reader: every event waiting is read (the kernel merges repeats of one
        still unread, so a busy writer costs a read per turn of the loop at most)."""
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        if self._heard.is_set():
            return  # already told: the wait has not read it yet
        for event in inotify_simple.parse_events(data):
            if event.mask & _OVERFLOW or event.name in self._names:
                self.tell()
                return

    def drain(self) -> bool:
        """Read the writes reported so far without telling anyone: whether there were any."""
        try:
            return bool(os.read(self._fd, 65536))
        except BlockingIOError:
            return False

    def tell(self) -> None:
        """As if a write had been heard."""
        self.heard += 1
        self._heard.set()

    async def wait(self, timeout: float) -> bool:
        """Until the file is written or `timeout` seconds pass, listening: whether it was
        written since the last wait returned."""
        if not self._heard.is_set():
            with anyio.move_on_after(timeout):
                await self._heard.wait()
            if not self._heard.is_set() and self._watch is not None:
                self._readable()  # a report the loop has not read yet, on a timeout
        heard = self._heard.is_set()
        self._heard.clear()
        return heard

    def close(self) -> None:
        self.stop()
        self._notify.close()


def _polled_instead(where: Path, error: OSError) -> None:
    log.info("%s: no file watch (%s); polled instead", where, os.strerror(error.errno or 0))
