"""Header values that look secret are not stored or shown."""

from __future__ import annotations

import re

_SECRET = re.compile(r"authorization|cookie|token|secret|key|password|passwd|credential", re.I)
REDACTED = "[redacted]"


def is_secret(name: str) -> bool:
    return bool(_SECRET.search(name))


def redact_headers(headers: dict[str, str] | None) -> dict[str, str]:
    if not headers:
        return {}
    return {k: (REDACTED if is_secret(k) else v) for k, v in headers.items()}
