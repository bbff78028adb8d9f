"""blok's warnings on stderr when the application configured no logging.

With no handler anywhere, Python prints a warning bare (`logging.lastResort`: the message
alone). A run's warnings then said neither which run nor which step wrote them ("card
refused", "orders.charge failed: …"), and with many runs at once they could not be told apart.
This handler, on the `blok` logger, takes that place for blok's records only: the same
warnings, on the same stderr, with the logger, the run and the step. It says nothing once the
application configures logging (a handler on the root logger or on `blok`), or silences the
last resort (`logging.lastResort = None`): what to print is then the application's to say.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

LOGGER = "blok"


class LastResort(logging.StreamHandler[TextIO]):
    """Warnings and errors as `levelname logger [run step]: message`, to the stderr of the
    moment (a test's capture, a redirect made after import), only while nothing else would
    print them."""

    def __init__(self) -> None:
        super().__init__()
        self.setLevel(logging.WARNING)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s%(where)s: %(message)s"))

    @property  # the stderr of the moment, as logging.lastResort's
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass  # StreamHandler.__init__ sets it: the property above answers instead

    def handle(self, record: logging.LogRecord) -> bool:
        if _configured(record.name):
            return False
        return super().handle(record)

    def format(self, record: logging.LogRecord) -> str:
        # Set for this format only: the record goes on to no other handler (there is none).
        record.where = where_written(record)
        return super().format(record)


def where_written(record: logging.LogRecord) -> str:
    """ " [run_… step]": the run and step a record was written for (the attributes the engine
    sets on it), or nothing. With many runs at once, the lines of one are found with grep."""
    run_id, step = record.__dict__.get("run_id"), record.__dict__.get("step")
    return f" [{run_id}{' ' + step if step else ''}]" if run_id else ""


def _configured(name: str) -> bool:
    """The application says where the record goes: a handler on the root logger, or on the
    record's logger or one above it but this one; or it wants no last resort."""
    if logging.lastResort is None or logging.getLogger().handlers:
        return True
    known = logging.Logger.manager.loggerDict  # read, not getLogger: a run's logger is not there
    while name:
        logger = known.get(name)
        if isinstance(logger, logging.Logger) and any(
            not isinstance(h, LastResort) for h in logger.handlers
        ):
            return True
        name = name.rpartition(".")[0]
    return False


def install() -> None:
    """Put the last resort on the `blok` logger, once (an import of the engine does)."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(h, LastResort) for h in logger.handlers):
        logger.addHandler(LastResort())
