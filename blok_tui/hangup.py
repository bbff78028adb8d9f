"""A closed terminal stops the console and a worker as SIGTERM does.

Closing a terminal window, an ssh connection that drops and `tmux kill-session` send SIGHUP,
whose default ends the process at once: a run going then was recorded crashed by the next
start, a delivery of its job used. Handled, it stops with the runs' grace instead. A process
started to outlive its terminal (`nohup`, which ignores SIGHUP) is left to do so."""

from __future__ import annotations

import signal


def stop_signals(*others: signal.Signals) -> tuple[signal.Signals, ...]:
    """`others`, and SIGHUP unless this process was started with it ignored."""
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        return others
    return (*others, signal.SIGHUP)
