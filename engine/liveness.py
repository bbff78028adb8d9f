"""Whether a worker registered in the shared state is still alive."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from .models import WorkerInfo, utcnow

STALE_HEARTBEAT_S = 10.0  # a worker on another host is gone after this long without one


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def worker_alive(worker: WorkerInfo, stale_s: float = STALE_HEARTBEAT_S) -> bool:
    """Alive: its process runs (same host) or its heartbeat is recent (another host)."""
    if worker.host == socket.gethostname():
        return pid_alive(worker.pid)
    return worker.heartbeat_at >= utcnow() - timedelta(seconds=stale_s)
