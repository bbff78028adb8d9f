"""Header values that look secret are not stored or shown.

A node still gets the real values in `ctx.headers`; what the store keeps (a run's headers,
step inputs and outputs, state, errors) and what a node logs have them replaced by
"[redacted]", so neither the database nor the console nor a log handler ever holds them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# A name is secret when it contains one of these words (so X-Api-Key, X-Client-Secret,
# X-CSRF-Token, Set-Cookie, Proxy-Authorization, X-Session-Id), or is x-auth or begins with
# x-auth- (X-Auth-User, X-Auth-Email: the credentials of services that split them over headers;
# not X-Author).
# Over-redacting a harmless header costs a value in the console; under-redacting leaks.
_SECRET = re.compile(
    r"^x[-_]auth(?:[-_]|$|enticat)"
    r"|authori[sz]ation|cookie|session|token|secret|key|password|passwd|passphrase"
    r"|credential|jwt|bearer",
    re.I,
)
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


def redact_value(value: Any, secrets: Iterable[str]) -> Any:
    """A copy of a JSON value (a step's input or output, a state snapshot, an error's details)
    with `secrets` (from `secret_values`) replaced wherever they land: a string equal to one or
    holding one, in values and keys, in dicts and lists at any depth, and a whole number whose
    digits are one. Anything else (other objects, numbers, booleans) is returned as it is.
    Two keys that both redact to "[redacted]" keep the later one's value: losing a value in
    the record is the price of not storing the secret.

    Recursive, like json.dumps, which the engine calls on the same value to store it: a value
    the engine can store can be walked here too.
    """
    found = tuple(secrets)
    if not found:
        return value
    return _redact(value, found)


def _redact(value: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, dict):
        return {_redact(k, secrets): _redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(item, secrets) for item in value]
    if isinstance(value, tuple):  # json stores it as a list; kept a tuple for the node's sake
        return tuple(_redact(item, secrets) for item in value)
    if isinstance(value, int) and not isinstance(value, bool) and str(value) in secrets:
        return REDACTED
    return value
