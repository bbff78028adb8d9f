"""Backends: where runs, jobs and shared state are kept. `open_backend` is the one place that
turns a `database=` value into one; nothing else in the engine names a backend."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import DatabaseError
from .base import Backend

URL_SCHEMES = ("postgresql://", "postgres://")


def is_url(value: str) -> bool:
    """Anything with a scheme (`name://`) is a URL, never a file name."""
    head, sep, _ = value.partition("://")
    return bool(sep) and head.replace("+", "").isalnum()


def describe(database: str | os.PathLike[str] | None) -> str:
    """The database as the user may be shown it: a path, or a URL without its password."""
    if database is None:
        return "memory"
    text = os.fspath(database)
    if is_url(text):
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(text)
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
            return urlunsplit(parts._replace(netloc=netloc))
    return text


def open_backend(
    database: str | os.PathLike[str] | None,
    *,
    create: bool = True,
    lease_s: float = 30.0,
    worker: bool = False,
) -> Backend:
    """The backend for `database`: None (this process's memory), a SQLite file path, or a
    `postgresql://` URL. `create=False`: refuse a database that does not exist yet (or a file
    that is not a blok database) instead of making one — for commands that only read or act.
    `worker`: the process runs jobs (a server that names its sessions names it a worker, not
    a producer)."""
    if database is None:
        from .memory import MemoryBackend

        return MemoryBackend()
    text = os.fspath(database)
    _not_a_mistyped_url(text)
    if is_url(text):
        if text.startswith(URL_SCHEMES):
            if urlsplit(text).netloc.count("@") > 1:  # the host would be read as "ss@host"
                raise DatabaseError(
                    f"{describe(text)}: the user or password holds an '@': write it %40 in "
                    "the URL (p%40ss for p@ss)"
                )
            try:
                from .postgres import PostgresBackend  # type: ignore[attr-defined, unused-ignore]
            except ImportError as error:
                raise DatabaseError(
                    f"{describe(text)}: PostgreSQL support is not installed "
                    f'(pip install "blok-tui[postgres]"): {error}'
                ) from None
            backend: Backend = PostgresBackend(text, create=create, lease_s=lease_s, worker=worker)
            return backend
        if text.startswith("sqlite:///"):
            text = text.removeprefix("sqlite:///")
        else:
            scheme = text.split("://", 1)[0]
            raise DatabaseError(
                f"{describe(text)}: unsupported database URL scheme {scheme!r} "
                "(use a SQLite file path or a postgresql:// URL)"
            )
    from .sqlite import SqliteBackend

    return SqliteBackend(Path(text), create=create, lease_s=lease_s, worker=worker)


# A value that begins as a database URL does but is not one: taken for a file path, it made a
# SQLite database in a folder named after the URL, which a worker then served.
_URL_LIKE = re.compile(r"\s*(postgres(ql)?|sqlite)(\+\w+)?:", re.IGNORECASE)


def _not_a_mistyped_url(text: str) -> None:
    if text != text.strip() and is_url(text.strip()):
        raise DatabaseError(
            f"{describe(text.strip())!r} has spaces around it (from a .env file?): "
            "a database URL has none"
        )
    if _URL_LIKE.match(text) and not is_url(text):
        raise DatabaseError(
            f"{describe(text)!r} looks like a database URL but is not one: write "
            "postgresql://user@host:port/dbname (a file path for SQLite)"
        )


__all__ = ["Backend", "describe", "is_url", "open_backend"]
