"""The console's terminal driver: Textual's LinuxDriver, kept from hanging when its terminal
closes.

When a terminal hangs up (`tmux kill-session`, a closed window, a dropped ssh connection) the
kernel sends the session's leader SIGHUP and then SIGCONT. The console stops on SIGHUP
(`hangup`), but Textual's driver takes any SIGCONT for the end of a ctrl+z and starts its
application mode again: on a terminal that is gone, a second output thread whose first write
fails (EIO) and ends it, while the console's last screens are queued to it. Its queue holds 30
writes; the 30th blocked the console's exit for good. A console left so had stopped its
heartbeats (`blok-tui health` said its worker "stalled") and stayed, an orphan with its
database open, until it was killed.

So here a SIGCONT resumes only a console a SIGTSTP suspended, and the output thread's writes to
a terminal that is gone are dropped instead of ending the thread (nobody is there to read
them): whatever the order of the signals, the queue drains and the console exits.
"""

from __future__ import annotations

from io import TextIOWrapper
from typing import IO, Any, cast

from textual.drivers.linux_driver import LinuxDriver


class TerminalOutput:
    """The file the output thread writes to: the terminal's, until it is gone (a write or a
    flush fails with OSError, EIO on a hung-up terminal); from then on, nothing."""

    def __init__(self, file: IO[str]) -> None:
        self.file = file
        self.gone: OSError | None = None

    def write(self, text: str) -> int:
        if self.gone is None:
            try:
                return self.file.write(text)
            except OSError as error:
                self.gone = error
        return len(text)

    def flush(self) -> None:
        if self.gone is None:
            try:
                self.file.flush()
            except OSError as error:
                self.gone = error

    def fileno(self) -> int:
        return self.file.fileno()


class TerminalDriver(LinuxDriver):
    def __init__(self, app: Any, **options: Any) -> None:
        super().__init__(app, **options)
        if self._file is not None:
            # The output thread calls only its write, flush and fileno.
            self._file = cast(TextIOWrapper, TerminalOutput(self._file))

    def _sigcont_application(self, *args: Any) -> None:
        # Set by the SIGTSTP of a ctrl+z (with the driver's restart on): back from it. Else the
        # kernel's SIGCONT after a hang-up, or a stray `kill -CONT`: nothing was suspended.
        if self._must_signal_resume:
            super()._sigcont_application(*args)
