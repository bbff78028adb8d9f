"""Why a backend has no queue of the provider a trigger names: the one message every backend
gives, whether the name is unknown or the database does not fit it."""

from __future__ import annotations

# The providers that keep jobs in a database: what `database=` each needs, an example of it,
# and what a backend of that kind is, for a provider that does not fit it.
_NEEDS = {"sqlite": "a SQLite file", "postgres": "a postgresql:// database"}
_EXAMPLE = {"sqlite": "'path/to/blok.db'", "postgres": "'postgresql://user@host/dbname'"}
_IS = {"sqlite": "a SQLite file", "postgres": "a PostgreSQL database"}


def provider_refusal(provider: str, kind: str) -> str:
    """Why a backend of `kind` has no queue of `provider` (neither its kind nor "memory"):
    a name no backend has is unknown; a known one says which database it needs. (Before, an
    unknown name on the memory backend read as a real provider: "the redis queue needs a
    database"; and a known one on a database as unknown.)"""
    if provider not in _NEEDS:
        return (
            f"unknown queue provider {provider!r}: the providers are 'memory', 'sqlite' and "
            "'postgres'"
        )
    if kind not in _IS:  # no database at all
        return (
            f"provider {provider!r} needs {_NEEDS[provider]}: pass "
            f"database={_EXAMPLE[provider]} to Engine (or use provider='memory')"
        )
    return (
        f"provider {provider!r} needs {_NEEDS[provider]}, not {_IS[kind]} (use {kind!r}, "
        "'memory' or leave it unset)"
    )
