"""Whether a worker registered in the shared state is still alive."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path

from .models import WorkerInfo, utcnow

STALE_HEARTBEAT_S = 10.0  # a worker on another host is gone after this long without one
# A process that began this long after its worker registered is not that worker's: /proc gives
# start times to the clock tick, boot time to the second.
PID_REUSED_AFTER_S = 5.0


def _pid_space() -> str:
    """Where a pid names one process: this boot of the kernel (a random id each boot) and this
    process's PID namespace. Host names do not tell: VMs cloned from one image, containers on
    the host's network and pods with `hostNetwork` share theirs, and a pid taken on one of them
    means nothing on another. Without /proc (not Linux), the host name is all there is."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return socket.gethostname()
    return f"{boot}/{namespace}"


PID_SPACE = _pid_space()


def pid_names_process_here(worker: WorkerInfo) -> bool:
    """Whether `worker.pid` is a pid of this process's pid space: asking the system about it
    then tells whether that worker runs. A row without its pid space (an engine of before it
    was recorded) is judged by its host name, as it was then."""
    if worker.pid_space:
        return worker.pid_space == PID_SPACE
    return worker.host == socket.gethostname()


def process_began(pid: int) -> float | None:
    """When the process with this pid began (epoch seconds), None where /proc does not say."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: its start, in ticks
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def process_runs(worker: WorkerInfo) -> bool:
    """Whether the worker's process (its pid names a process here) still runs: its pid is
    alive and no newer process took it. A pid is given again once its process ended: without
    the second check, a worker killed long ago lived on in whatever process got its pid, its
    row and its jobs never recovered, and `blok-tui health` said a worker was alive when none
    was."""
    if not pid_alive(worker.pid):
        return False
    began = process_began(worker.pid)
    return began is None or began <= worker.started_at.timestamp() + PID_REUSED_AFTER_S


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def worker_alive(worker: WorkerInfo, stale_s: float = STALE_HEARTBEAT_S) -> bool:
    """Alive: its process runs (its pid names a process here) or its heartbeat is recent
    (another machine, another container)."""
    if pid_names_process_here(worker):
        return process_runs(worker)
    return worker.heartbeat_at >= utcnow() - timedelta(seconds=stale_s)
