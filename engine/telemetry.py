"""Which observation hooks the engine calls: OpenTelemetry's, or ones that do nothing.

`OBSERVE` starts as `Observer()` (engine/observer.py), whose hooks do nothing, and nothing of
OpenTelemetry is imported. `activate()`, called when an engine starts, makes the choice once: if
`opentelemetry-api` is installed (and BLOK_TELEMETRY_DISABLED is not set), OBSERVE becomes
`engine.tracing.OtelTelemetry`, which records spans while the application has set a tracer
provider and metrics once it has set a meter provider (the API's own no-ops otherwise).
"""

from __future__ import annotations

import importlib.util
import os

from .observer import Observer

# BLOK_TELEMETRY_DISABLED=1: the no-op hooks, even with OpenTelemetry installed.
DISABLED_ENV = "BLOK_TELEMETRY_DISABLED"

OBSERVE: Observer = Observer()
_chosen = False


def available() -> bool:
    """OpenTelemetry's API is installed (and not turned off by BLOK_TELEMETRY_DISABLED=1)."""
    if os.environ.get(DISABLED_ENV, "") in ("1", "true", "yes"):
        return False
    return importlib.util.find_spec("opentelemetry") is not None and (
        importlib.util.find_spec("opentelemetry.trace") is not None
    )


def activate() -> Observer:
    """Choose the hooks, once: OpenTelemetry's if it is installed, else the no-ops; and tell
    them an engine starts."""
    global OBSERVE, _chosen
    if not _chosen:
        _chosen = True
        if available():
            from .tracing import OtelTelemetry

            OBSERVE = OtelTelemetry()
    OBSERVE.engine_started()
    return OBSERVE


__all__ = ["DISABLED_ENV", "OBSERVE", "activate", "available"]
