"""Header values that look secret are not stored or shown.

A node still gets the real values in `ctx.headers`; what the store keeps (a run's headers) and
what a node logs have them replaced by "[redacted]", so neither the database nor the console
nor a log handler ever holds them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_SECRET = re.compile(r"authorization|cookie|token|secret|key|password|passwd|credential", re.I)
REDACTED = "[redacted]"

# Shorter fragments are not searched for in log text: "1" or "dark" would blank out ordinary
# words. A whole header value is searched for from this length…
_MIN_VALUE = 4
# …and its parts (the credentials after "Bearer ", each cookie's value) from this one.
_MIN_PART = 8
_PARTS = re.compile(r"[\s;,]+")


def is_secret(name: str) -> bool:
    return bool(_SECRET.search(name))


def redact_headers(headers: dict[str, str] | None) -> dict[str, str]:
    if not headers:
        return {}
    return {k: (REDACTED if is_secret(k) else v) for k, v in headers.items()}


def secret_values(headers: dict[str, str] | None) -> tuple[str, ...]:
    """The strings to hide in text a node writes: the values of secret-looking headers and the
    credentials inside them, longest first so a whole value is replaced before its parts."""
    found: set[str] = set()
    for name, value in (headers or {}).items():
        if not is_secret(name) or not isinstance(value, str):
            continue
        whole = value.strip()
        if len(whole) >= _MIN_VALUE:
            found.add(whole)
        for part in _PARTS.split(whole):
            _, _, cookie_value = part.partition("=")
            for piece in (part, cookie_value):
                if len(piece) >= _MIN_PART:
                    found.add(piece)
    return tuple(sorted(found, key=len, reverse=True))


def redact_text(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text
