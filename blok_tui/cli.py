"""The `blok-tui` command: the console, a headless worker, attach, and one-shot operator commands.

Exit codes: 0 done, 1 the engine refused (unknown queue or run, a finished run, a file that is
not a blok database), 2 bad usage (unknown command or flag, bad JSON, bad duration, a number or
queue name the engine could not hold). Every error is one line on stderr, `blok-tui: error:
...`, never a traceback. Text that comes from runs (errors, names) is printed with its control
characters escaped, so that what a node raised cannot drive the operator's terminal.

A JSON argument is the JSON itself, `@FILE` (a file holding it) or `-` (standard input): a
payload above ~128 KB does not fit in one command-line argument on Linux.

`enqueue`, `runs`, `cancel` and `replay` work on a database whether or not a worker serves it:
with a worker alive, actions go through the database's control table to the worker that can
carry them out; with none, the job is written to the durable queue and runs when a worker
starts. A queue is known once a worker serving it has started on the database.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import re
import shlex
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

# No `engine` (nor anyio, nor Textual) at the top: `blok-tui --version` and `--help` answer
# without loading the engine (0.4 s); each command imports what it uses.
from .hangup import stop_signals
from .plain_text import columns, cut_lines, fit_table, typed_duration, wrapped
from .queue_counts import COUNTED, read_queue_counts, served_with

if TYPE_CHECKING:
    from engine import AmbiguousSchedule, Orphan

DEFAULT_DB = Path(".blok") / "blok.db"
CONSOLE_GRACE = 2.0  # seconds running jobs get to finish when the console quits
EPILOG = """\
examples:
  blok-tui                                  console on ./workflows (or the bundled demo)
  blok-tui --workflows flows/ --db app.db   console on your workflows and database
  blok-tui worker --db app.db               serve the queues headless (Ctrl-C drains)
  blok-tui attach --db app.db               console on a database a worker is serving
  blok-tui enqueue orders '{"order_id": "A1", "amount": 5}' --priority 5 --delay 2s
  blok-tui enqueue orders @order.json       the payload from a file (- for stdin)
  blok-tui enqueue orders @order.json --wait   wait for the run: its output, or exit 1
  blok-tui runs --status failed --limit 20  the last failed runs (--json for scripts)
  blok-tui runs --status failed --since 1h  the failures of the last hour
  blok-tui show run_0190c3a1b2c3d4e5f6      one run: its steps, failed attempts, log
  blok-tui cancel run_0190c3a1b2c3d4e5f6    cancel a queued, delayed or running run
  blok-tui replay run_0190c3a1b2c3d4e5f6    run it again with the same input
  blok-tui pause orders                     claim nothing new from a queue (resume to undo)
  blok-tui send run_0190c3a1b2 approved '{"by": "ann"}'   an event to a run's wait.for_event
  blok-tui send --by-key paid '{"order_id": "A1"}'         to the runs waiting on that key
  blok-tui schedules                        schedules, next and last fire, last status
  blok-tui schedules pause orders.ship      pause a workflow's schedule (resume, run: likewise)
  blok-tui health --db app.db --max-age 2m  exit 0 if a worker is alive and no queue is stuck
  blok-tui worker --metrics-port 9464       serve with Prometheus metrics on :9464/metrics

The database defaults to $BLOK_DB, else ./.blok/blok.db.
"""

RUN_ID_HELP = "the run's id, its start as the console shows it (1a2b3c4d), or its job's id"

log = logging.getLogger("blok.cli")


class UsageError(Exception):
    """Bad command-line input: exit code 2."""

    def __init__(self, message: str, prog: str) -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """Every parser of the command line: a usage error raises (one line, exit 2), and a long
    option's prefix is refused (`runs --stat failed`), so that an option added later never
    changes what an old script meant. `describe`: a description worked out only when the help
    is printed (one that needs the engine)."""

    def __init__(self, *args: Any, describe: Callable[[], str] | None = None, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._describe = describe

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.prog)

    def format_help(self) -> str:
        if self._describe is not None:
            self.description = self._describe()
        return super().format_help()


class _Version(argparse.Action):
    """`--version`: the number read when asked, not each time the parser is built."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show program's version number and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        print(f"blok-tui {_version()}")
        parser.exit()


class _RunStatuses:
    """`runs --status`'s choices, the engine's run statuses read when first needed (a parse
    that gives --status, `runs --help`), so that building the parser loads no engine."""

    def __iter__(self) -> Iterator[str]:
        from engine import RunStatus

        return (str(status) for status in RunStatus)

    def __contains__(self, value: object) -> bool:
        # "dead" is let through, for `_runs` to point at `blok-tui dead`: a dead letter is a
        # job's state, not a run's, and argparse would only list the statuses.
        return value == DEAD_ASKED or value in list(self)


# `runs --status dead`: what an operator types for the dead letters (the console's `then`
# column says "dead letter"), answered with where they are.
DEAD_ASKED = "dead"


# `runs --stuck` with no FACTOR: the engine's (engine.filters.STUCK_FACTOR), read then. Not a
# string: argparse would give a string const to `type`.
_STUCK_DEFAULT = object()


def _stuck_factor(given: Any) -> float | None:
    """`runs --stuck`'s factor: the one given, the engine's default, or None (not asked)."""
    if given is _STUCK_DEFAULT:
        from engine.filters import STUCK_FACTOR

        return STUCK_FACTOR
    return None if given is None else float(given)


def printable(text: str) -> str:
    """engine.text.printable, imported when first called (the module top imports no engine):
    `text` with its control characters escaped."""
    from engine.text import printable as escaped

    return escaped(text)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("blok-tui")
    except Exception:  # not installed (a source checkout): the package's own number
        from engine import __version__

        return __version__


class _NotStandard(ValueError):
    """NaN, Infinity or -Infinity in JSON text: Python reads them, no other JSON parser does."""


def _refuse_constant(name: str) -> Any:
    raise _NotStandard(f"{name} is not standard JSON")


def _json_arg(text: str) -> Any:
    """A JSON argument: the JSON text, `@FILE` or `-` (stdin). Checked as the engine would
    check it (standard JSON, not nested too deep), the size cap aside: that is the engine's."""
    from engine.validation import InvalidInput, check_payload

    where = ""  # the file it came from, for the messages
    if text == "-":
        where = "stdin"
        text = sys.stdin.read()
    elif text.startswith("@"):  # no JSON text starts with "@"
        where = text[1:]
        if not where:
            raise argparse.ArgumentTypeError("@ needs a file name: @payload.json")
        try:
            text = Path(where).read_text(encoding="utf-8-sig")  # -sig: a BOM is not JSON
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) else str(error)
            raise argparse.ArgumentTypeError(f"cannot read {where}: {reason}") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        source = f"in {where}" if where else f"({_clip(text)})"
        raise argparse.ArgumentTypeError(f"not valid JSON {source} ({error})") from None
    except _NotStandard as error:
        raise argparse.ArgumentTypeError(f"{where}: {error}" if where else str(error)) from None
    except RecursionError:  # ~1000 levels: deeper than Python's json can read
        value = _too_deep()
    except ValueError as error:  # an integer of more than 4300 digits
        source = f" in {where}" if where else ""
        raise argparse.ArgumentTypeError(f"cannot read the JSON{source}: {error}") from None
    try:
        check_payload(value, None)
    except InvalidInput as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _too_deep() -> Any:
    """A value as deep as what json could not read, so that check_payload says why."""
    from engine.validation import MAX_DEPTH

    value: Any = []
    for _ in range(MAX_DEPTH):
        value = [value]
    return value


def _clip(text: str, width: int = 60) -> str:
    """A user's argument, cut short, for a message about it."""
    shown = repr(text)
    return shown if len(shown) <= width else shown[: width - 1] + "…"


def _retries_arg(text: str) -> int:
    from engine.validation import MAX_RETRIES

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= MAX_RETRIES:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_RETRIES}, not {value}")
    return value


def _duration_arg(text: str) -> str:
    from engine import parse_duration

    try:
        parse_duration(text)
    except ValueError as error:
        raise _duration_error(error) from None
    return text


def _duration_error(error: ValueError) -> argparse.ArgumentTypeError:
    """A bad duration's usage error, in the words a command line can act on."""
    return argparse.ArgumentTypeError(typed_duration(error))


def _timeout_arg(text: str) -> str:
    """A job's timeout, checked here as the engine would (whole milliseconds, above 0: 0, or
    0.4ms, would time its run out at once), so that a bad one is a usage error (exit 2)."""
    from engine import parse_duration

    try:
        ms = parse_duration(text)
    except ValueError as error:
        raise _duration_error(error) from None
    if ms < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1ms, not {text!r}")
    return text


def _positive_ms(text: str) -> float:
    """A duration's milliseconds, above 0."""
    from engine import parse_duration

    try:
        ms = parse_duration(text)
    except ValueError as error:
        raise _duration_error(error) from None
    if ms <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text!r}")
    return ms


def _at_least(text: str, least: str, why: str) -> float:
    """A duration's milliseconds, `least` or more: a worker's settings below it do harm."""
    from engine import parse_duration

    ms = _positive_ms(text)
    if ms < parse_duration(least):
        raise argparse.ArgumentTypeError(f"must be at least {least}, not {text.strip()!r}: {why}")
    return ms


def _interval_arg(text: str) -> float:
    """The janitor's interval, in seconds: at 1 ms its loop took 43 % of a core, idle."""
    return _at_least(text, "1s", "its round reads the whole database") / 1000


def _answer_wait_arg(text: str) -> str:
    """`where --timeout`: at 0 no answer could come, and the message blamed a live worker."""
    _positive_ms(text)
    return text


def _lease_arg(text: str) -> str:
    """A lease: at 1 ms every job was taken from its worker by the next claim, three times,
    and went to the dead-letter queue."""
    _at_least(text, "1s", "a worker renews its leases every third of it, over the database")
    return text


def _grace_arg(text: str) -> float:
    value = _seconds(text)
    if value > 86_400:
        raise argparse.ArgumentTypeError(f"must be at most a day (86400), not {value:g}")
    return value


def _retention_arg(text: str) -> str:
    """A duration with a unit: `--retention 7` would mean 7 ms, deleting every finished run."""
    if text.strip().isdigit():
        raise argparse.ArgumentTypeError(
            f"give a unit: {text.strip()}d, {text.strip()}h (a bare number would be milliseconds)"
        )
    _at_least(text, "1m", "a run would be deleted as soon as it ended")
    return text


def _db_arg(text: str) -> str:
    """An empty --db (an unset variable in a script) is refused: it meant $BLOK_DB, or the
    default database, acted on without a word."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: give a SQLite file or a postgresql:// URL")
    return text


def _priority_arg(text: str) -> int:
    from engine.validation import InvalidInput, check_priority

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {_clip(text)}") from None
    try:
        return check_priority(value)
    except InvalidInput as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _queue_arg(text: str) -> str:
    from engine.validation import InvalidInput, check_queue_name

    try:
        return check_queue_name(text)
    except InvalidInput as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {_clip(text)}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, not {value}")
    return value


def _traceparent_arg(text: str) -> str:
    from engine.observer import traceparent_problem, valid_traceparent

    if not valid_traceparent(text):
        raise argparse.ArgumentTypeError(
            f"not a W3C traceparent ({_clip(text)}): {traceparent_problem(text)}"
        )
    return text.strip()


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {value:g}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="blok-tui",
        description="A Python workflow engine with durable SQLite or PostgreSQL queues and a "
        "Textual console.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version)

    def engine_options(p: argparse.ArgumentParser, default: Any) -> None:
        p.add_argument(
            "--workflows",
            metavar="DIR",
            default=default,
            help="workflow files (default: ./workflows if it exists, else the bundled demo)",
        )
        p.add_argument(
            "--memory",
            action="store_true",
            default=default or False,
            help="no database: runs and queues in memory only, in this process (the console "
            "and worker; the other commands read a database: --db)",
        )

    def db_option(p: argparse.ArgumentParser, default: Any) -> None:
        p.add_argument(
            "--db",
            type=_db_arg,
            metavar="PATH",
            default=default,
            help="a SQLite file or a postgresql:// URL (default: $BLOK_DB or ./.blok/blok.db)",
        )

    def run_filters(p: argparse.ArgumentParser, status_help: str, *, stuck: bool = True) -> None:
        """The filters that choose runs: `runs` lists them, `cancel` and `replay` act on them
        (a stuck run is running: no replay of it)."""
        p.add_argument("--status", choices=_RunStatuses(), metavar="STATUS", help=status_help)
        p.add_argument("--workflow", metavar="NAME", help="only runs of this workflow")
        p.add_argument("--queue", metavar="NAME", type=_queue_arg, help="only runs of this queue")
        p.add_argument(
            "--text",
            metavar="TEXT",
            help="only runs whose id, job id, workflow, version, queue, status, error, worker or "
            "input holds TEXT (any case): an order's run by its order id, a worker's by its pid",
        )
        p.add_argument(
            "--since",
            type=_positive_ms,
            metavar="DURATION",
            help="only runs created in the last DURATION (30m, 2h, 1d)",
        )
        if not stuck:
            p.set_defaults(stuck=None)
            return
        p.add_argument(
            "--stuck",
            nargs="?",
            const=_STUCK_DEFAULT,
            type=_factor,
            metavar="FACTOR",
            help="only runs running longer than FACTOR (default 3) times their workflow's "
            "median time (then: blok-tui where RUN_ID)",
        )

    engine_options(parser, None)
    db_option(parser, None)
    parser.add_argument(
        "--no-demo-producer",
        action="store_true",
        help="with the bundled demo workflows, do not feed their queues",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    # Sub-commands take the shared flags too; SUPPRESS keeps a value given before the command.
    keep = argparse.SUPPRESS

    worker = commands.add_parser(
        "worker",
        help="serve the queues headless",
        description="Serve the workflows' queues without a console. SIGTERM or Ctrl-C drains: "
        "no new claims, running jobs get --grace seconds to finish, the rest are stopped and "
        "go back to the queue to go on where they stopped; a second signal stops them at once. "
        "Its terminal closing (SIGHUP) drains it too, unless started with nohup.",
    )
    engine_options(worker, keep)
    db_option(worker, keep)
    worker.add_argument(
        "--grace",
        type=_grace_arg,
        default=10.0,
        metavar="SECONDS",
        help="how long running jobs may finish after a stop signal (default 10)",
    )
    worker.add_argument(
        "--lease",
        type=_lease_arg,
        default="30s",
        metavar="DURATION",
        help="how long a claimed job stays this worker's without a renewal (default 30s); "
        "another worker takes it over after that",
    )
    worker.add_argument(
        "--retention",
        type=_retention_arg,
        default="7d",
        metavar="DURATION",
        help="delete runs that ended longer ago than this: 12h, 7d, 30d (default 7d)",
    )
    worker.add_argument(
        "--janitor-interval",
        type=_interval_arg,
        default="60s",
        metavar="DURATION",
        help="how often a worker deletes the runs past --retention and takes back the pending "
        "runs of memory queues whose worker is gone (default 60s)",
    )
    worker.add_argument(
        "--metrics-port",
        type=_port,
        metavar="N",
        help="serve Prometheus metrics at http://HOST:N/metrics (0: any free port; needs "
        'pip install "blok-tui[metrics]")',
    )
    worker.add_argument(
        "--metrics-host",
        default="0.0.0.0",
        metavar="HOST",
        help="the address the metrics endpoint listens on (default 0.0.0.0)",
    )
    worker.add_argument("--no-watch", action="store_true", help="do not hot-reload workflow files")
    worker.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="stderr log level",
    )

    attach = commands.add_parser(
        "attach",
        help="console on a database another process serves",
        description="The console on a database that a worker (or an app) writes; actions go "
        "to the worker through the database.",
    )
    db_option(attach, keep)

    enqueue = commands.add_parser(
        "enqueue", help="add a job to a queue", description="Add a job; prints its id."
    )
    enqueue.add_argument("queue", metavar="QUEUE", type=_queue_arg)
    enqueue.add_argument(
        "payload", metavar="JSON", type=_json_arg, help="the job's body: JSON, @FILE or - (stdin)"
    )
    enqueue.add_argument(
        "--priority",
        type=_priority_arg,
        default=0,
        metavar="N",
        help="higher runs first (default 0; a signed 64-bit integer)",
    )
    enqueue.add_argument(
        "--delay",
        type=_duration_arg,
        metavar="DURATION",
        help="not before this long: 500ms, 5s, 2m, 1h",
    )
    enqueue.add_argument(
        "--retries",
        type=_retries_arg,
        metavar="N",
        help="this job's retry budget instead of its trigger's",
    )
    enqueue.add_argument(
        "--timeout",
        type=_timeout_arg,
        metavar="DURATION",
        help="this job's run timeout instead of its trigger's (final: not retried)",
    )
    enqueue.add_argument(
        "--traceparent",
        type=_traceparent_arg,
        default=None,  # $TRACEPARENT, read by `_trace_context`: a bad one is not the user's
        metavar="TRACEPARENT",
        help="the W3C trace context the run joins (default: $TRACEPARENT), e.g. "
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    after = enqueue.add_mutually_exclusive_group()
    after.add_argument(
        "--wait",
        action="store_true",
        help="wait for the job to end (through its retries), print its run's output as JSON "
        "and exit 0 if it completed; else exit 1 with the run's error",
    )
    after.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="then print what happens to its run, one line a moment, as show --follow does",
    )
    db_option(enqueue, keep)

    runs = commands.add_parser(
        "runs", help="list runs, newest first", description="List runs, newest first."
    )
    runs.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    run_filters(runs, "only runs in this status: %(choices)s")
    runs.add_argument(
        "--limit", type=_positive_int, default=50, metavar="N", help="at most N runs (default 50)"
    )
    runs.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="then print a line each time a run the filters select starts, waits or ends, "
        "until ctrl-c (with --status failed: a tail of the failures; with --json: a JSON "
        "object a line, from now on)",
    )
    db_option(runs, keep)

    show = commands.add_parser(
        "show",
        help="one run: its steps, failed attempts and log",
        description="Show one run: what it is, its steps in order with their status, time and "
        "attempts, each failed attempt (the last of a step with its traceback) and its log.",
    )
    show.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
    show.add_argument("--json", action="store_true", help="the whole record as JSON")
    show.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="then print what happens to it, one line a moment, until it ends (and the job's "
        "next delivery, if it fails and is retried); exit 1 unless it completed",
    )
    db_option(show, keep)

    cancel = commands.add_parser(
        "cancel",
        help="cancel runs: by id, or every run the filters choose",
        description="Cancel a queued, delayed, waiting or running run, or each run given. "
        "With filters instead of ids (as `runs` takes them): every run they choose that has "
        "not ended, each job once, said and asked first on a terminal (--yes: not asked; "
        "with no terminal, --yes is needed).",
        usage="blok-tui cancel RUN_ID [RUN_ID ...]\n"
        "       blok-tui cancel [--status STATUS] [--workflow NAME] [--queue NAME]\n"
        "                       [--text TEXT] [--since DURATION] [--stuck [FACTOR]] [--yes]",
    )
    cancel.add_argument("run_ids", nargs="*", metavar="RUN_ID", help=RUN_ID_HELP)
    run_filters(
        cancel,
        "only runs in this status (default: every status of a run that has not ended)",
    )
    cancel.add_argument(
        "--yes", action="store_true", help="with filters: cancel what they choose, not asked"
    )
    cancel.set_defaults(input=None, from_step=None)  # replay's options: the same bulk path
    db_option(cancel, keep)

    where = commands.add_parser(
        "where",
        help="where a running run's code is now",
        description="Ask the worker that runs a run, on any machine, where its code is now: "
        "for each step that runs, the line of the workflow file and the frames of your code "
        "that led there (a stuck run: waiting on what?). The answer also lands on the run's "
        "log. Exit 1 if the run is not running or its worker does not answer.",
    )
    where.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
    where.add_argument(
        "--timeout",
        type=_answer_wait_arg,
        default="10s",
        metavar="DURATION",
        help="how long to wait for the worker's answer (default 10s)",
    )
    db_option(where, keep)

    replay = commands.add_parser(
        "replay",
        help="run runs again: by id, or every run the filters choose",
        description="Start a new run with the same input; prints its id. A run whose job "
        "completed on a later delivery, or that was replayed already (a replay that completed "
        "or has not ended), is asked about first on a terminal (--yes: not asked); with no "
        "terminal, a warning says so and the replay goes ahead. With filters instead of ids "
        "(as `runs` takes them): every run they choose that has ended, each job once; left "
        "out, and said: a job that completed on a later delivery or is still retrying, a run "
        "replayed already (its newest replay is the one to replay). Asked first on a terminal "
        "(--yes: not asked; with no terminal, --yes is needed).",
        usage="blok-tui replay RUN_ID [RUN_ID ...] [--from-step STEP] [--input JSON] [--yes]\n"
        "       blok-tui replay RUN_ID [--from-step STEP] [--input JSON] [--wait | --follow]\n"
        "       blok-tui replay [--status STATUS] [--workflow NAME] [--queue NAME]\n"
        "                       [--text TEXT] [--since DURATION] [--from-step STEP] [--yes]",
    )
    replay.add_argument("run_ids", nargs="*", metavar="RUN_ID", help=RUN_ID_HELP)
    replay.add_argument(
        "--yes", action="store_true", help="replay without asking, whatever became of them"
    )
    replay.add_argument(
        "--from-step", metavar="STEP", help="reuse the outputs of the steps before STEP"
    )
    replay.add_argument(
        "--input",
        type=_json_arg,
        metavar="JSON",
        help="a different input (one RUN_ID): JSON, @FILE or -",
    )
    replay_after = replay.add_mutually_exclusive_group()
    replay_after.add_argument(
        "--wait",
        action="store_true",
        help="(one RUN_ID) wait for the replay to end, as enqueue --wait does: its output as "
        "JSON and exit 0 if it completed; else exit 1 with its error",
    )
    replay_after.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="(one RUN_ID) then print what happens to the replay, as show --follow does",
    )
    run_filters(
        replay, "only runs in this status (default: failed, timed_out and crashed)", stuck=False
    )
    db_option(replay, keep)

    health = commands.add_parser(
        "health",
        help="exit 0 if the database answers, a worker is alive and no queue is stuck",
        description="Exit 0 when the database answers, at least one worker is alive on it (its "
        "heartbeat recent: a suspended or stalled worker does not count) and no queue's oldest "
        "waiting job has waited longer than --max-age (paused queues aside); exit 1 otherwise, "
        "with the reason in one line.",
    )
    health.add_argument(
        "--max-age",
        type=_duration_arg,
        default="5m",
        metavar="DURATION",
        help="the longest a due job may wait for a worker (default 5m)",
    )
    db_option(health, keep)

    for name, what in (("pause", "claim nothing new from"), ("resume", "claim again from")):
        command = commands.add_parser(
            name,
            help=f"{what} a queue",
            description=f"{what.capitalize()} a queue: running jobs finish, enqueue still works, "
            "and the pause survives restarts.",
        )
        command.add_argument("queue", metavar="QUEUE", type=_queue_arg)
        db_option(command, keep)

    send = commands.add_parser(
        "send",
        help="send an event to a run",
        description="Send an event to a run: its wait.for_event(EVENT) takes the payload, now "
        "if it waits, else when it gets there. With --by-key: to the runs waiting on the key "
        "the payload carries (wait.for_event(..., match=...)); prints the runs it reached.",
        usage="blok-tui send RUN_ID EVENT JSON | blok-tui send --by-key EVENT JSON",
    )
    send.add_argument(
        "words",
        nargs="+",
        metavar="ARG",
        help="RUN_ID EVENT JSON (RUN_ID: its start will do; JSON: @FILE or -)",
    )
    send.add_argument(
        "--by-key", action="store_true", help="no run id: deliver by the key in the payload"
    )
    db_option(send, keep)

    # What the console's queues, dead-letter and workers views show, for an operator who has
    # only a shell on the server.
    queues = commands.add_parser(
        "queues",
        help="the queues the workers serve, with their runs by status",
        description="The queues the workers declared: workflow, provider, concurrency, state "
        "(serving, paused, or no worker: no live worker serves it, its jobs wait for one), "
        "and their runs by status, in the console's words: queued (ready for a worker), "
        "running, waiting (in a durable wait), delayed (a start delay or a retry's backoff), "
        "throttled (held by a rate limit or a concurrency key), completed, failed, cancelled, "
        "debounced (left for a later job; where a queue has some), dead (out of retries). "
        "--json adds the contract's job counts (waiting = queued).",
    )
    queues.add_argument("--json", action="store_true", help="a JSON list")
    db_option(queues, keep)
    dead = commands.add_parser(
        "dead",
        help="a queue's dead letters",
        description="The jobs of a queue that used up their retries (or crashed their workers "
        "three times): job, its last run, deliveries, when it died and why. "
        "`blok-tui requeue JOB_ID` puts one back; `blok-tui discard JOB_ID` takes it out.",
    )
    dead.add_argument("queue", metavar="QUEUE", type=_queue_arg)
    dead.add_argument("--json", action="store_true", help="a JSON list of the jobs")
    dead.add_argument(
        "--limit",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="the newest N dead letters (default 1000)",
    )
    db_option(dead, keep)
    requeue = commands.add_parser(
        "requeue",
        help="put dead letters back in their queue",
        description="Put each dead-lettered job back in its queue with a fresh retry budget and "
        "a new run; prints each new run's id. With --queue, every dead letter of the queue "
        "(asked first on a terminal; --yes).",
    )
    requeue.add_argument("job_ids", nargs="*", metavar="JOB_ID")
    requeue.add_argument(
        "--queue", type=_queue_arg, metavar="QUEUE", help="every dead letter of QUEUE"
    )
    requeue.add_argument(
        "--yes", action="store_true", help="with --queue: requeue them without asking"
    )
    requeue.add_argument(
        "--force",
        action="store_true",
        help="requeue a job whose run was replayed, the replay completed or still running "
        "(it runs again)",
    )
    db_option(requeue, keep)
    discard = commands.add_parser(
        "discard",
        help="take dead letters out of the dead-letter queue for good",
        description="Take each dead-lettered job out of the dead-letter queue: it is cancelled "
        "and never runs again. Its runs stay readable (blok-tui show) until the retention "
        "deletes them. With --queue, every dead letter of the queue.",
    )
    discard.add_argument("job_ids", nargs="*", metavar="JOB_ID")
    discard.add_argument(
        "--queue", type=_queue_arg, metavar="QUEUE", help="every dead letter of QUEUE"
    )
    discard.add_argument(
        "--yes", action="store_true", help="with --queue: do not ask first (no terminal to ask)"
    )
    db_option(discard, keep)
    workers = commands.add_parser(
        "workers",
        help="the workers registered on the database, alive or not",
        describe=_workers_description,
    )
    workers.add_argument("--json", action="store_true", help="a JSON list")
    db_option(workers, keep)

    schedules = commands.add_parser(
        "schedules",
        help="list, pause, resume or run schedules",
        description="List the schedules the workers declared (next fire, last fire, last "
        "run's status), or act on one: pause, resume, run (enqueue one run now).",
    )
    db_option(schedules, keep)
    schedules.add_argument("--json", action="store_true", help="the list as JSON")
    actions = schedules.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    for name, what in (
        ("pause", "fire no more ticks of a schedule"),
        ("resume", "fire its ticks again, from the next one"),
        ("run", "enqueue one run of a schedule now"),
    ):
        action = actions.add_parser(name, help=what, description=what.capitalize() + ".")
        action.add_argument("workflow", metavar="WORKFLOW")
        action.add_argument(
            "schedule",
            metavar="SCHEDULE",
            nargs="?",
            help="its id ('every 30s'), when the workflow has more than one",
        )
        db_option(action, keep)
    return parser


def _workers_description() -> str:
    from engine.liveness import STALE_HEARTBEAT_S

    return (
        "The workers registered on the database: id, host and pid, state, started, last "
        "heartbeat. State: alive, gone (its process, or its heartbeat), or, for a process of "
        f"this machine that runs but sent no heartbeat for {STALE_HEARTBEAT_S:g}s, suspended "
        "(stopped) or stalled: it keeps its jobs until their leases run out, and claims none."
    )


# ---- where things are ----------------------------------------------------------------------
def _database(args: argparse.Namespace) -> Path | str:
    """The --db value: a SQLite file path, or a database URL (never taken for a file name)."""
    from engine.backends import is_url

    chosen = getattr(args, "db", None) or os.environ.get("BLOK_DB") or DEFAULT_DB
    return str(chosen) if is_url(str(chosen)) else Path(chosen)


def _bundled_examples() -> Path:
    import examples

    return Path(examples.__file__).parent


def _workflows(args: argparse.Namespace) -> tuple[Path, bool]:
    """The workflows folder, and whether it is the bundled demo. The demo serves the default
    database, or memory, only: started from a folder with no ./workflows on a database of
    the user's, its `orders.pipeline` took over their `orders` queue, and the console's demo
    producer wrote demo jobs into it."""
    if args.workflows:
        return Path(args.workflows), False
    local = Path("workflows")
    if local.is_dir():
        return local, False
    database = None if getattr(args, "memory", False) else _database(args)
    if database is not None and database != DEFAULT_DB:
        watch = (
            "; to watch what its workers do: blok-tui attach --db ..." if not args.command else ""
        )
        raise UsageError(
            f"no ./workflows in {Path.cwd()}: give --workflows DIR to serve {database} (the "
            f"bundled demo serves only the default database, {DEFAULT_DB}, or --memory){watch}",
            "blok-tui" + (f" {args.command}" if args.command else ""),
        )
    return _bundled_examples(), True


def _can_watch() -> bool:
    return importlib.util.find_spec("engine.reload") is not None


# ---- commands ------------------------------------------------------------------------------
def _client(args: argparse.Namespace) -> Any:
    """An engine with no workflows on the --db database, for a one-shot command: it acts on
    what the workers serve, runs nothing, and never creates a database."""
    from engine import Engine

    return Engine(database=_database(args), create=False, follow=False)


async def _console(args: argparse.Namespace) -> int:
    import anyio

    from engine import Engine

    from .app import run_console  # Textual loads only for the console

    folder, bundled = _workflows(args)
    _need_a_terminal("blok-tui", "for an engine with no screen: blok-tui worker")
    database = None if args.memory else _database(args)
    _log_quietly(database)
    from . import engine_log

    engine_log.installed()  # what loading the workflows warns of, kept for the console
    # Quitting the console should feel immediate: runs still going after CONSOLE_GRACE seconds
    # go back to the (durable) queue and run again on the next start.
    engine = Engine(
        workflows=folder, database=database, watch=_can_watch(), grace_period=CONSOLE_GRACE
    )
    async with engine, anyio.create_task_group() as tg:
        if bundled and not args.no_demo_producer:
            from .demo import demo_producer_for

            lock = None  # in memory: no other console shares this engine's jobs
            if isinstance(database, Path):
                lock = database.with_name(f"{database.name}.demo")
            tg.start_soon(demo_producer_for, engine, lock)
        status = await run_console(engine, title=f"blok-tui · {folder}", grace=CONSOLE_GRACE)
        tg.cancel_scope.cancel()
    return status


def _need_a_terminal(prog: str, instead: str) -> None:
    """The console draws on a terminal: with none (a pipe, a service, cron) it drew its screen
    into stderr and hung until killed."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError(f"the console needs a terminal (its input and output); {instead}", prog)


def _log_quietly(database: Path | str | None) -> logging.Handler:
    """Under the console, log lines would tear the screen: they go to a file by the database
    (or nowhere, for an in-memory engine or a database URL); the handler. The folder and the
    file are the owner's only, as the database is (they hold runs' errors)."""
    root = logging.getLogger()
    if isinstance(database, Path):
        database.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = database.parent / "blok.log"
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600))
        handler: logging.Handler = logging.FileHandler(path)
        handler.setFormatter(_Printable("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler = logging.NullHandler()
    handler.setLevel(logging.WARNING)  # the console shows runs' own log lines
    root.addHandler(handler)
    return handler


async def _attach(args: argparse.Namespace) -> int:
    from engine import Engine

    from .app import run_console

    database = _database(args)
    # An engine with no workflows: it runs nothing, and follows what the workers write.
    async with Engine(database=database, create=False, follow=True) as engine:
        # Once the database is known to be there: a mistyped path made its folders and a
        # blok.log before it was refused.
        _need_a_terminal("blok-tui attach", "for a listing: blok-tui runs, blok-tui queues")
        _log_quietly(database)
        from . import engine_log

        engine_log.installed()
        status = await run_console(
            engine,
            title="blok-tui · attached",  # the header names the database
        )
    return status


async def _worker(args: argparse.Namespace) -> None:
    import anyio

    from engine import Engine

    logging.basicConfig(level=args.log_level, stream=sys.stderr)
    for handler in logging.getLogger().handlers:
        # A job's payload, logged or in an error, must not drive the operator's terminal.
        handler.setFormatter(_Printable("%(asctime)s %(levelname)s %(name)s%(where)s: %(message)s"))
        handler.addFilter(_name_the_run)
    folder, bundled = _workflows(args)
    if bundled:
        log.warning("no ./workflows here: serving the bundled demo (--workflows DIR for yours)")
    database = None if args.memory else _database(args)
    watch = not args.no_watch and _can_watch()
    engine = Engine(
        workflows=folder,
        database=database,
        watch=watch,
        grace_period=args.grace,
        lease=args.lease,
        retention=args.retention,
        janitor_interval=args.janitor_interval,
    )
    endpoint = _serve_metrics(args)
    # Signals are received from the start, so that one arriving while booting still drains.
    # SIGHUP too: a worker started in a terminal drains when the terminal closes (`hangup`).
    with anyio.open_signal_receiver(*stop_signals(signal.SIGTERM, signal.SIGINT)) as signals:
        async with engine:
            log.info("runs that ended are kept for %s (--retention)", args.retention)
            await engine.flush()  # ready means: what it serves is visible to others
            # Its own: on a shared database, queues() lists the other workers' too.
            queues = engine.served_queues()
            failed = engine.catalog.reload_errors  # its own files (not followed workers')
            if failed and not watch and not queues:
                # Kept alive by a supervisor, it served nothing, for good, and looked healthy.
                from engine import EngineError

                await engine.shutdown()  # unregistered: no dead worker left in the list
                raise EngineError(
                    f"nothing to serve: every workflow file in {folder} failed to load "
                    f"({len(failed)}; their errors are above), and --no-watch waits for no fix"
                )
            if not queues:
                # Up and watching, serving nothing: said, not left to "serving queues (none)".
                log.warning(
                    "no workflow loaded: every workflow file in %s failed (their errors are "
                    "above); each is served once it is fixed and saved"
                    if failed
                    else "no queue to serve: %s holds no workflow with a WorkerTrigger (the .py "
                    "files directly in it); each is served once it is saved there",
                    folder,
                )
            names = ", ".join(queues) or "(none)"
            print(
                f"blok worker {engine.worker.id} serving queues {names} on "
                f"{engine.capabilities.location}",
                flush=True,
            )
            # What it runs, by version: a deploy script checks it started what it shipped.
            served = sorted(engine.catalog.served().items()) if engine.consume else []
            if served:
                log.info(
                    "workflows: %s",
                    ", ".join(f"{wf.name}@{wf.version} (queue {q})" for q, wf in served),
                )
            if endpoint is not None:
                print(f"metrics at http://{endpoint.host}:{endpoint.port}/metrics", flush=True)
            async for signum in signals:
                log.info(
                    "%s: draining, running jobs have %gs to finish",
                    signal.Signals(signum).name,
                    args.grace,
                )
                break
            async with anyio.create_task_group() as tg:

                async def insist() -> None:
                    async for signum in signals:
                        if signum == signal.SIGHUP:
                            # A terminal closing after the stop began (`tmux kill-server` sends
                            # SIGTERM, then SIGHUP): nobody insisting, the grace stands.
                            continue
                        log.warning(
                            "%s again: stopping now; running jobs are recorded where they "
                            "stopped and go back to the queue once their code stopped",
                            signal.Signals(signum).name,
                        )
                        engine.force_stop()

                tg.start_soon(insist)
                await engine.shutdown(args.grace)
                tg.cancel_scope.cancel()
    if endpoint is not None:
        endpoint.stop()
    log.info("worker %s stopped", engine.worker.id)


class _Printable(logging.Formatter):
    """A log line, its traceback included, with control characters escaped (`printable`),
    and each line cut to LINE_CHARS: a run's 5 MB error went into the worker's log whole."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(cut_lines(super().format(record), more=""))


class _OneLine(logging.Formatter):
    """`blok-tui: warning: ...` on stderr for a one-shot command or a follower: what a library
    logs while it runs (the database driver retrying through an outage) in one line, its
    exception's last line included, not a traceback between the command's own lines."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text += " " + _exception_line(record.exc_info[1])
        return printable(f"blok-tui: {record.levelname.lower()}: {text}").replace("\n", " ")


def _exception_line(error: BaseException | None) -> str:
    return f"({type(error).__name__}: {error})" if error is not None else ""


def _name_the_run(record: logging.LogRecord) -> bool:
    """A run's log line on the worker's stderr says which run and step wrote it (the attributes
    the engine sets on it): with many runs at once, the lines of one are found with grep."""
    from engine.last_resort import where_written

    record.where = where_written(record)
    return True


def _serve_metrics(args: argparse.Namespace) -> Any:
    """The Prometheus endpoint `--metrics-port` asks for (engine/metrics.py), or None."""
    if args.metrics_port is None:
        return None
    from engine import EngineError
    from engine.telemetry import available

    if not available():
        raise EngineError('--metrics-port needs OpenTelemetry: pip install "blok-tui[metrics]"')
    from engine.metrics import serve_prometheus

    return serve_prometheus(args.metrics_port, args.metrics_host)


async def _enqueue(args: argparse.Namespace) -> None:
    if args.follow:
        await _enqueue_and_follow(args)
        return
    async with _client(args) as engine:
        job_id = await _enqueue_job(engine, args)
        if args.wait:
            run = await _wait_for(engine, job_id)
    if not args.wait:
        print(printable(job_id))
        return
    _print_output(run)


async def _wait_for(engine: Any, job_id: str) -> Any:
    """`--wait`'s wait for the job's run to end. Stopped by ctrl-c, it says the job goes on: it
    had printed nothing, and a user who stopped waiting on a slow run had no id to find it by."""
    import anyio

    try:
        return await engine.wait_for_job(job_id)
    except anyio.get_cancelled_exc_class():
        print(
            f"blok-tui: stopped waiting; job {job_id} goes on (blok-tui show {job_id} -f; "
            "or cancel it)",
            file=sys.stderr,
            flush=True,
        )
        raise


def _print_output(run: Any) -> None:
    """`--wait`'s answer: the run's output as JSON, or its error (exit 1)."""
    from engine import EngineError, RunStatus

    if run.status is not RunStatus.COMPLETED:
        error = cut_lines(run.error or str(run.status))  # a 5 MB error: its first 2,000 chars
        raise EngineError(f"run {run.id} {run.status}: {error} (blok-tui show {run.id})")
    print(json.dumps(run.output, ensure_ascii=False))


async def _enqueue_and_follow(args: argparse.Namespace) -> None:
    """`enqueue --follow`: the job, then what happens to its run, as `show --follow` tells it."""
    from .run_follow import RunFollower, follow

    async with _following(args) as (engine, events):
        job_id = await _enqueue_job(engine, args, note=False)  # the follower says why it waits
        run = await engine.get_run((await engine.get_job(job_id)).run_id)
        follower = RunFollower()
        _tell(
            follower.line(run.created_at, f"job {job_id} is run {run.id} (ctrl-c stops following)")
        )
        run = await follow(engine, events, run, follower, _tell)
    _refuse_unless_completed(run)


def _trace_context(given: str | None) -> dict[str, str] | None:
    """The job's trace headers: the --traceparent given, else $TRACEPARENT if it is one. A
    malformed one in the environment is left out with a warning, as OpenTelemetry's
    propagators leave out what they cannot read: the enqueue is not its to stop."""
    from engine.observer import valid_traceparent

    if given is None:
        given = os.environ.get("TRACEPARENT") or None
        if given is not None and not valid_traceparent(given):
            print(
                f"blok-tui: warning: $TRACEPARENT is not a W3C traceparent ({_clip(given)}): "
                "the job joins no trace",
                file=sys.stderr,
            )
            given = None
    return {"traceparent": given} if given else None


async def _enqueue_job(engine: Any, args: argparse.Namespace, *, note: bool = True) -> str:
    """The job `enqueue`'s arguments ask for; a note on stderr when no live worker serves its
    queue (its workers stopped) or the queue is paused: it waits, which is not what one
    expects (`--wait` hung without a word on a paused queue)."""
    job_id: str = await engine.enqueue(
        args.queue,
        args.payload,
        priority=args.priority,
        delay=args.delay,
        headers=_trace_context(args.traceparent),
        retries=args.retries,
        timeout=args.timeout,
    )
    await _warn_of_missing_fields(engine, args.queue, args.payload)
    if note:
        await _note_held(engine, (await engine.get_job(job_id)).run_id, args.queue)
    return job_id


async def _note_held(engine: Any, run_id: str, queue: str) -> None:
    """A note on stderr when the new run waits for what may not come: no live worker serves
    its queue (its workers stopped), or the queue is paused (`--wait` hung without a word)."""
    why = await engine.why_waiting(run_id)
    if why.gate == "no_worker":
        print(f"blok-tui: note: {printable(why.summary)}", file=sys.stderr, flush=True)
    elif why.gate == "paused":
        _note_paused(queue)


async def _warn_of_missing_fields(engine: Any, queue: str, payload: Any) -> None:
    """A warning when the payload (of `enqueue`, a replay's `--input`) lacks a `$.body` field
    the queue's workflow reads: the step that reads it fails with "bad input", each retry
    alike, and the job ends a dead letter."""
    from .payload_template import missing_fields

    for info in await engine.workflows():
        if info.queue != queue:
            continue
        missing = missing_fields(payload, info.body_fields)
        if missing:
            fields = ", ".join(f"$.body.{field}" for field in missing)
            fails = "steps that read them fail" if len(missing) > 1 else "step that reads it fails"
            print(
                printable(
                    f"blok-tui: warning: the payload has no {fields}, which {info.name} reads: "
                    f'the {fails} with "bad input" (unless in a branch the run does not take)'
                ),
                file=sys.stderr,
            )


async def _runs(args: argparse.Namespace) -> None:
    args.stuck = _stuck_factor(args.stuck)
    if args.status == DEAD_ASKED:
        await _refuse_dead_status(args)
    if args.follow:
        if args.stuck is not None:
            # Stuck is how long a run has run, not something that happens: nothing to follow.
            raise UsageError(
                "--stuck lists the runs stuck now; it does not follow", "blok-tui runs"
            )
        if args.text:
            raise UsageError(
                "--text lists the runs that hold it; it does not follow", "blok-tui runs"
            )
        if args.since is not None and args.json:
            raise UsageError(
                "--since picks the runs listed first; --follow --json lists none, it follows "
                "from now on",
                "blok-tui runs",
            )
        await _follow_runs(args)
        return
    async with _client(args) as engine:
        since = _since(engine, args.since)
        runs = await engine.runs(
            status=args.status,
            workflow=args.workflow,
            queue=args.queue,
            limit=args.limit,
            text=args.text,
            stuck=args.stuck,
            since=since,
        )
        if not runs:
            await _refuse_unknown_names(engine, args)
        orphans = await _orphans(engine, runs)
        now = engine.now()
        # More may match than were printed: counted, to say the table is cut (not for --stuck:
        # what is stuck is worked out from every running run and its workflow's median).
        total = 0
        if len(runs) >= args.limit and args.stuck is None and not args.json:
            from engine import RunFilter

            where = RunFilter.of(args.status, args.workflow, args.queue, args.text, since=since)
            total = await engine.count_runs(where)
    unknown = f" holding {args.text!r}" if args.text else ""
    if since is not None:
        from .run_text import zoned_moment

        unknown += f" created since {zoned_moment(since)}"
    if args.stuck is not None:
        from engine.filters import NO_BASELINE_S

        unknown += (
            f" running longer than {args.stuck:g}× their workflow's median time"
            f" ({NO_BASELINE_S / 60:g}m where none completed)"
        )
    if args.json:
        from .runs_follow import listed

        records = [listed(run) for run in runs]
        for record in records:  # a running run nobody runs: why, and what comes of it
            orphan = orphans.get(record["id"])
            if orphan is not None:
                record["orphaned"], record["orphaned_then"] = orphan.why, orphan.then
        print(json.dumps(records, indent=2))
        return
    if runs:
        table, dropped = _table(runs, now, orphans)
        print(table)
        _note_dropped(dropped)
    else:
        print(f"no runs{unknown}")
    if total > len(runs):  # on stderr: a pipe reads the table alone
        narrow = [
            f"--{name}"
            for name in ("status", "workflow", "queue", "text", "since")
            if not getattr(args, name)
        ]
        hint = "--limit N" + (f", or filter with {'/'.join(narrow)}" if narrow else "")
        line = f"blok-tui: {len(runs):,} of {total:,} runs shown (newest first; {hint})"
        width = _terminal_width()
        if width and len(line) > width:  # one line of the terminal: the filters are in --help
            line = f"blok-tui: {len(runs):,} of {total:,} runs shown (newest first; --limit N)"
        print(line, file=sys.stderr)


def _since(engine: Any, ms: float | None) -> datetime | None:
    """`--since DURATION` as a moment, on the engine's clock (the database's, on PostgreSQL:
    the clock the runs' times are on)."""
    from datetime import timedelta

    return None if ms is None else engine.now() - timedelta(milliseconds=ms)


async def _refuse_dead_status(args: argparse.Namespace) -> NoReturn:
    """`runs --status dead`: a usage error that names the command for dead letters and the
    queues that hold some, so the next command can be typed as it is."""
    async with _client(args) as engine:
        queues = [args.queue] if args.queue else [info.name for info in await engine.queues()]
        counted = [await engine.queue_stats(queue) for queue in queues]
    held = [(stats.queue, stats.dead) for stats in counted if stats.dead]
    where = (
        ": " + ", ".join(f"blok-tui dead {queue} ({dead:,})" for queue, dead in held)
        if held
        else (f" (queue {args.queue} has none)" if args.queue else " (no queue has any)")
    )
    raise UsageError(
        "dead is not a run status: a job that used up its retries is a dead letter, and its "
        f"last run failed (blok-tui runs --status failed); they are listed by queue{where}",
        "blok-tui runs",
    )


async def _orphans(engine: Any, runs: Sequence[Any]) -> dict[str, Orphan]:
    """Why nobody runs each running run whose worker is gone (the console's `⚠ orphaned`)."""
    from .jobs import JobBook

    return await JobBook().orphans(engine, runs)


async def _follow_runs(args: argparse.Namespace) -> None:
    """`runs --follow`: the table, then a line a run's start, wait or end, until ctrl-c."""
    from .runs_follow import RunsFilter, follow_runs

    async with _following(args) as (engine, events):
        only = RunsFilter(args.status, args.workflow, args.queue)
        await _refuse_unknown_names(engine, args)
        if args.json:  # JSON Lines of what happens from now on, for a script to read
            # The first line says what is followed, once it is: the filters, and the moment.
            filters = {"status": args.status, "workflow": args.workflow, "queue": args.queue}
            _say(json.dumps({"at": engine.now().isoformat(), "following": filters}))
            await follow_runs(engine, events, only, _say, as_json=True)
            return
        runs = await engine.runs(
            status=args.status,
            workflow=args.workflow,
            queue=args.queue,
            limit=args.limit,
            since=_since(engine, args.since),
        )
        orphans = await _orphans(engine, runs)
        table, dropped = _table(runs, engine.now(), orphans) if runs else ("no runs", [])
        _say(table)
        _note_dropped(dropped)
        _say("\nFOLLOWING (ctrl-c stops)")
        await follow_runs(engine, events, only, _tell)


async def _refuse_unknown_names(engine: Any, args: argparse.Namespace) -> None:
    """A filter by a name no worker declared, that found nothing, is an error (exit 1): a typo
    read as "no runs" (`--json`: `[]`), which a script cannot tell from an empty queue."""
    from engine import EngineError
    from engine.expressions import did_you_mean

    for what, given, infos in (
        ("workflow", args.workflow, engine.workflows),
        ("queue", args.queue, engine.queues),
    ):
        if given:
            names = [info.name for info in await infos()]
            if names and given not in names and not await engine.runs(**{what: given}, limit=1):
                raise EngineError(
                    f"unknown {what} {given!r} (no worker declared it and no run has it"
                    f"{did_you_mean(given, names)})"
                )


def _zoned(title: str, moments: Sequence[datetime | None]) -> tuple[str, list[str]]:
    """A column of times in this machine's zone (TZ): its header, which names the zone once
    ("CREATED (UTC)", "CREATED (CET)"), and its cells ("-" for none). Rows on both sides of a
    daylight-saving change (CET and CEST) each name their own zone instead."""
    local = [moment.astimezone() if moment is not None else None for moment in moments]
    zones = {moment.strftime("%Z") for moment in local if moment is not None}
    shape = "%Y-%m-%d %H:%M:%S" if len(zones) == 1 else "%Y-%m-%d %H:%M:%S %Z"
    cells = [moment.strftime(shape) if moment is not None else "-" for moment in local]
    return (f"{title} ({zones.pop()})" if len(zones) == 1 else title), cells


def _table(
    runs: Sequence[Any], now: datetime, orphans: Mapping[str, Orphan] | None = None
) -> tuple[str, list[str]]:
    """The runs in columns, a running run's DURATION up to `now` (the engine's clock), and
    the headers of the columns a narrow terminal left out; `orphans`: why nobody runs a
    running run (in its ERROR column)."""
    from engine import format_duration

    from .step_order import run_ms, time_runs_to

    orphans = orphans or {}
    created, when = _zoned("CREATED", [run.created_at for run in runs])
    header = ("RUN", "WORKFLOW", "QUEUE", "STATUS", "WORKER", created, "DURATION", "ERROR")
    rows = [header]
    for run, created_at in zip(runs, when, strict=True):
        # Not the record's duration_ms: that runs on for a run a worker's stop sent back to
        # the queue, which nobody runs (a listing has no steps to say when it stopped: "-").
        orphan = orphans.get(run.id)
        duration = run_ms(run, time_runs_to(run, now, orphan))
        rows.append(
            (
                printable(run.id),
                printable(run.workflow_name),
                printable(run.queue),
                str(run.status),
                printable(run.worker or "-"),
                created_at,
                format_duration(duration) if duration is not None else "-",
                f"orphaned: {orphan}"
                if orphan is not None
                else printable(cut_lines(_why(run, now) or "")),  # not 5 MB a row
            )
        )
    if len(rows) == 1:
        return "no runs", []
    # An orphan's note in full (the last column): what comes of it, and what to do (start a
    # worker) when nothing will, hang on its end.
    whole = [False, *(run.id in orphans for run in runs)]
    # On a narrow terminal the columns least read when scanning runs go first: the worker,
    # the queue (its workflow names it), the duration, the date and time.
    return _fitted(rows, (4, 2, 6, 5), whole)


async def _show(args: argparse.Namespace) -> None:
    if args.follow:
        if args.json:
            raise UsageError("--follow prints lines, not JSON: give one of them", "blok-tui show")
        await _follow(args)
        return
    async with _client(args) as engine:
        run = await engine.find_run(args.run_id)
        if not args.json:
            text, _ = await _shown(engine, run, args.db)
    if args.json:
        print(json.dumps(run.model_dump(mode="json", exclude={"state", "cursor"}), indent=2))
        return
    print(text)


async def _shown(engine: Any, run: Any, db: str | None) -> tuple[str, Any]:
    """`show`'s text of the run, with what the engine says of it (its job, what it waits for,
    its workflow's usual time, why nobody runs it), and its job as read then (None once
    purged). `db`: the --db given, for the commands it suggests."""
    from .run_follow import delivery_of, job_of, orphan_of, usual_of, why_held
    from .run_text import run_text

    job, why = await job_of(engine, run), await why_held(engine, run)
    usual, orphaned = await usual_of(engine, run), await orphan_of(engine, run, job)
    text = run_text(
        run,
        engine.now(),
        job=job,
        why=why,
        usual=usual,
        orphaned=orphaned,
        delivery=await delivery_of(engine, run, job),
        db=db,
        width=_terminal_width(),
    )
    return text, job


async def _follow(args: argparse.Namespace) -> None:
    """`show --follow`: the run as `show` prints it, then what happens to it until it ends."""
    from .run_follow import RunFollower, follow, went_on

    async with _following(args) as (engine, events):
        run = await engine.find_run(args.run_id)
        text, job = await _shown(engine, run, args.db)
        _say(text)
        if not run.terminal or went_on(run, job):  # the job read above: no second read
            _say("\nFOLLOWING (ctrl-c stops)")
        follower = RunFollower()
        follower.know(run)
        run = await follow(engine, events, run, follower, _tell)
    _refuse_unless_completed(run)


@asynccontextmanager
async def _following(args: argparse.Namespace) -> AsyncIterator[tuple[Any, Any]]:
    """An engine that follows the database, and its events: they say when a run changed (the
    follower re-reads the run then), subscribed before anything is read, so that nothing
    falls between."""
    from engine import Engine

    async with (
        Engine(database=_database(args), create=False, follow=True) as engine,
        engine.events() as events,
    ):
        yield engine, events


def _say(line: str) -> None:
    print(line, flush=True)  # as it happens, through a pipe too


def _tell(lines: str) -> None:
    """A follower's lines, as they happen, fitted to the terminal (as wide as it is now)."""
    from .run_follow import fitted

    _say(fitted(lines, _terminal_width()))


def _refuse_unless_completed(run: Any) -> None:
    from engine import EngineError, RunStatus

    if run.status is not RunStatus.COMPLETED:
        raise EngineError(f"run {run.id} {run.status} (blok-tui show {run.id})")


async def _cancel(args: argparse.Namespace) -> int:
    from engine import EngineError

    if _chosen_by_filters(args):
        return await _bulk(args)
    refused = 0
    async with _client(args) as engine:
        for given in dict.fromkeys(args.run_ids):  # a run named twice is cancelled once
            try:
                run = await engine.cancel((await engine.find_run(given, going=True)).id)
            except EngineError as error:
                if len(args.run_ids) == 1:
                    raise
                _error(str(error))
                refused += 1
                continue
            _cancelled(run)
    return _refusals("cancelled", len(dict.fromkeys(args.run_ids)), refused, "run")


def _cancelled(run: Any) -> None:
    print(printable(f"{run.id} {run.status}"), flush=True)
    if not run.terminal:
        # The signal is on its job, and stays: the worker holding it ends the run once it
        # reads it. Not an error, but no "done" either.
        from engine.cancelling import CANCEL_WAIT_S

        print(
            printable(
                f"blok-tui: warning: cancel asked, but run {run.id} is still {run.status} after "
                f"{CANCEL_WAIT_S:g}s: the worker holding it has not stopped it (its code may "
                "hold the worker's event loop, or the worker is frozen); that worker stops it "
                "once it reads the cancel, unless it ends first"
            ),
            file=sys.stderr,
        )


def _chosen_by_filters(args: argparse.Namespace) -> bool:
    """Whether `cancel` or `replay` acts on the runs filters choose (else on the ids given):
    one of the two, not both."""
    filters = [
        f"--{name}"
        for name in ("status", "workflow", "queue", "text", "since", "stuck")
        if getattr(args, name) is not None
    ]
    prog = f"blok-tui {args.command}"
    if filters and args.run_ids:
        raise UsageError(f"give run ids or filters ({', '.join(filters)}), not both", prog)
    if not filters and not args.run_ids:
        raise UsageError(
            "give run ids, or filters that choose the runs (--status, --workflow, --queue, "
            "--text, --since" + (", --stuck)" if args.command == "cancel" else ")"),
            prog,
        )
    return bool(filters)


async def _bulk(args: argparse.Namespace) -> int:
    """`cancel` or `replay` with filters: every run they choose, each job once."""
    from .cli_bulk import DONE, Chosen, act

    prog = f"blok-tui {args.command}"
    if args.status == DEAD_ASKED:
        raise UsageError(
            "dead is not a run status: a dead letter's last run failed (--status failed; "
            "blok-tui requeue --queue QUEUE puts a queue's dead letters back)",
            prog,
        )
    if args.input is not None:
        raise UsageError("--input gives one run a new input: give its RUN_ID, not filters", prog)
    refusal = Chosen(args.command, args.status).refusal()  # before the database is opened
    if refusal is not None:
        raise UsageError(refusal, prog)
    async with _client(args) as engine:
        chosen = Chosen(
            args.command,
            args.status,
            args.workflow,
            args.queue,
            args.text,
            _since(engine, args.since),
            _stuck_factor(args.stuck),
        )
        await _refuse_unknown_names(engine, args)
        answer = await act(
            engine,
            chosen,
            yes=args.yes,
            ask=_confirmed,
            from_step=args.from_step,
        )
    if answer is None:
        raise UsageError(
            f"runs chosen by filters are {DONE[args.command]} only when confirmed: there is "
            "no terminal to ask on, add --yes",
            prog,
        )
    if not answer:
        _error(f"nothing {DONE[args.command]}")
        return 1
    return 0


async def _where(args: argparse.Namespace) -> None:
    from engine import parse_duration

    async with _client(args) as engine:
        run = await engine.find_run(args.run_id, going=True)
        answer = await engine.where(run.id, timeout=parse_duration(args.timeout) / 1000)
    for line in answer.splitlines():
        print(printable(line))


async def _replay(args: argparse.Namespace) -> int:
    from engine import EngineError

    after = "--wait waits for" if args.wait else "--follow follows" if args.follow else None
    if _chosen_by_filters(args):
        if after is not None:
            raise UsageError(f"{after} one replay: give one RUN_ID", "blok-tui replay")
        return await _bulk(args)
    given = list(dict.fromkeys(args.run_ids))  # a run named twice is replayed once
    if args.input is not None and len(given) > 1:
        raise UsageError("--input gives one run a new input: give one RUN_ID", "blok-tui replay")
    if after is not None and len(given) > 1:
        raise UsageError(f"{after} one replay: give one RUN_ID", "blok-tui replay")
    if args.follow:
        return await _replay_and_follow(args, given[0])
    refused = 0
    async with _client(args) as engine:
        for run_id in given:
            try:
                replayed = await _replay_one(engine, run_id, args)
            except EngineError as error:
                if len(given) == 1:
                    raise
                _error(str(error))
                replayed = None
            refused += replayed is None
        if args.wait and replayed is not None:
            run = await engine.get_run(replayed)
            await _note_held(engine, run.id, run.queue)
            ended = await _wait_for(engine, run.job_id)
    if args.wait and replayed is not None:
        _print_output(ended)
    return _refusals("replayed", len(given), refused, "run")


async def _replay_and_follow(args: argparse.Namespace, given: str) -> int:
    """`replay --follow`: the replay's id, then what happens to it, as `show --follow` says."""
    from .run_follow import RunFollower, follow

    async with _following(args) as (engine, events):
        replayed = await _replay_one(engine, given, args)
        if replayed is None:
            return 1
        run = await engine.get_run(replayed)
        follower = RunFollower()
        _tell(follower.line(run.created_at, f"following run {run.id} (ctrl-c stops following)"))
        run = await follow(engine, events, run, follower, _tell)
    _refuse_unless_completed(run)
    return 0


async def _replay_one(engine: Any, given: str, args: argparse.Namespace) -> str | None:
    """Replay one run, asked first where it would do again what is done: the replay's id, or
    None if not replayed."""
    run = await engine.find_run(given)
    warning = None if args.yes else await engine.replay_warning(run.id)
    if warning is not None:
        # Its job completed since, or a replay of it did or is under way: a replay runs
        # its steps again (a charge twice). Asked on a terminal; a script is told.
        said = printable(f"run {run.id}: {warning}")
        answer = _confirmed(f"{said}. Replay it anyway? [y/N] ")
        if answer is False:
            _error(f"run {run.id} not replayed")
            return None
        if answer is None:
            print(f"blok-tui: warning: {said}; replayed all the same", file=sys.stderr)
    run_id: str = await engine.replay(run.id, from_step=args.from_step, input=args.input)
    if args.input is not None:
        await _warn_of_missing_fields(engine, run.queue, args.input)
    job = await _job_or_none(engine, run.job_id)
    from .run_text import replay_version

    version = replay_version(run, await engine.get_run(run_id))
    print(printable(run_id), flush=True)
    if version:  # on stderr: a script reads the id alone
        print(printable(f"blok-tui: note: the replay runs {version}"), file=sys.stderr)
    if job is not None and job.run_id != run.id and not job.state.terminal:
        # A crashed or failed run whose job went on: the replay runs beside that delivery.
        print(
            printable(
                f"blok-tui: warning: run {run.id}'s job went on as run {job.run_id} "
                f"({job.state}): the replay runs the same input beside it"
            ),
            file=sys.stderr,
        )
    return run_id


async def _job_or_none(engine: Any, job_id: str) -> Any:
    """The job, or None once it is no longer kept."""
    from engine import UnknownJob

    try:
        return await engine.get_job(job_id)
    except UnknownJob:
        return None


async def _pause_or_resume(args: argparse.Namespace) -> None:
    async with _client(args) as engine:
        await (engine.pause if args.command == "pause" else engine.resume)(args.queue)
    print(f"{args.queue} {'paused' if args.command == 'pause' else 'resumed'}")


async def _send(args: argparse.Namespace) -> None:
    words = list(args.words)
    wanted = 2 if args.by_key else 3
    if len(words) != wanted:
        shape = "--by-key EVENT JSON" if args.by_key else "RUN_ID EVENT JSON"
        raise UsageError(f"expected {shape}, got {len(words)} argument(s)", "blok-tui send")
    run_id = None if args.by_key else words.pop(0)
    event, text = words
    try:
        payload = _json_arg(text)
    except argparse.ArgumentTypeError as error:
        raise UsageError(f"argument JSON: {error}", "blok-tui send") from None
    from engine import EngineError

    from .run_text import event_fate, keyless, never_awaited

    async with _client(args) as engine:
        if run_id is not None:
            try:
                run_id = (await engine.find_run(run_id)).id
            except EngineError as error:
                raise EngineError(f"{error}: event {event!r} not sent") from None
        reached = await engine.send_event(run_id, event, payload)
    if args.by_key:
        print(printable(" ".join(reached)) if reached else "no run waits on that key: kept")
    else:
        print(printable(f"{run_id} {event} {event_fate(reached)}"))
    # The wait's output is the payload, and None when it times out: the two read the same.
    null = "a null payload reads as a timeout to the wait (its output is None both ways)"
    for warning in (never_awaited(reached), keyless(reached), null if payload is None else None):
        if warning:
            print(printable(f"blok-tui: warning: {warning}"), file=sys.stderr)


async def _schedules(args: argparse.Namespace) -> None:
    from engine import AmbiguousSchedule, EngineError
    from engine.schedules import overruled_line

    async with _client(args) as engine:
        if args.action is None:
            infos = await engine.schedules()
            # The workers fire the ticks: with none alive, NEXT comes and goes unfired.
            idle = bool(infos) and not await engine.live_workers()
            overruled = await engine.overruled_schedules()
        else:
            try:
                await _act_on_schedule(engine, args)
            except AmbiguousSchedule as error:
                raise EngineError(_name_a_schedule(error, args.action)) from None
            return
    if args.json:
        print(json.dumps([_schedule_json(info) for info in infos], indent=2))
    else:
        table, dropped = _schedule_table(infos)
        print(table)
        _note_dropped(dropped)
    if idle:
        print(
            # One line of an 80-column terminal (it took 105 characters).
            "blok-tui: note: no schedule fires until a worker starts (blok-tui worker)",
            file=sys.stderr,
        )
        return
    unserved = sorted({info.workflow for info in infos if not info.served})
    if unserved:  # its file failed to load on every worker, or its workers went
        print(
            f"blok-tui: note: no live worker serves {', '.join(unserved)}: its ticks are not "
            "fired (blok-tui health names the workflow files that fail to load)",
            file=sys.stderr,
        )
    # A mixed fleet: the workers whose own schedules are not those that fire (a workflow
    # whose version declared last has none is not listed above: said here too).
    kept = {info.workflow for info in infos}
    for workflow, workers in overruled.items():
        line = overruled_line(workflow, workers, any_kept=workflow in kept)
        print(
            printable(f"blok-tui: note: {line}; deploy the same file to every worker"),
            file=sys.stderr,
        )


async def _act_on_schedule(engine: Any, args: argparse.Namespace) -> None:
    if args.action == "run":
        print(printable(await engine.run_schedule(args.workflow, args.schedule)))
        return
    act = engine.pause_schedule if args.action == "pause" else engine.resume_schedule
    name = await act(args.workflow, args.schedule)
    print(printable(f"{args.workflow} {name}: {args.action}d"))


def _name_a_schedule(error: AmbiguousSchedule, action: str) -> str:
    """The command again, with a schedule named: "name one" alone left the user to find
    where its id goes, and how to quote it."""
    ids = [shlex.quote(schedule) for schedule in error.schedules]
    command = f"blok-tui schedules {action} {shlex.quote(error.workflow)} {ids[-1]}"
    return printable(
        f"workflow {error.workflow!r} has {len(ids)} schedules; name one after it: {command} "
        f"(its schedules: {', '.join(ids)})"
    )


def _schedule_json(info: Any) -> dict[str, Any]:
    from dataclasses import asdict

    fields = asdict(info)
    for name in ("next_at", "last_tick_at", "last_fired_at"):
        fields[name] = fields[name].isoformat() if fields[name] is not None else None
    fields["last_status"] = str(info.last_status) if info.last_status else None
    return fields


def _schedule_table(infos: Sequence[Any]) -> tuple[str, list[str]]:
    """The schedules in columns, and the headers of those a narrow terminal left out."""
    if not infos:
        return "no schedules", []

    from .run_text import zoned_moment

    def when(moment: Any) -> str:
        # This machine's time, named: a cron's own zone is in its SCHEDULE.
        return zoned_moment(moment) if moment else "-"

    header = ("WORKFLOW", "SCHEDULE", "QUEUE", "STATE", "NEXT", "LAST FIRED", "LAST RUN", "STATUS")
    rows = [header]
    for info in infos:
        rows.append(
            (
                printable(info.workflow),
                printable(info.schedule),
                printable(info.queue),
                "paused" if info.paused else "active" if info.served else "not served",
                when(info.next_at) if info.served else "-",
                when(info.last_fired_at),
                printable(info.last_run_id or "-"),
                str(info.last_status or "-"),
            )
        )
    # On a narrow terminal: the last run's id, the queue, when it last fired, how that ended.
    return _fitted(rows, (6, 2, 5, 7), error_last=False)


async def _health(args: argparse.Namespace) -> None:
    from engine import DatabaseError, EngineError

    try:
        async with _client(args) as engine:
            report = await engine.health(args.max_age)
    except DatabaseError as error:  # no database there, or not a blok one
        raise EngineError(f"unhealthy: {error}") from None
    if not report.ok:
        raise EngineError(f"unhealthy: {report.reason}")
    # A monitor reads one line; on a terminal it wraps between words, after "healthy: ".
    print("\n".join(wrapped(f"healthy: {printable(report.reason)}", _terminal_width(), 9)))


def _queue_state(info: Any, served: bool) -> str:
    if served:
        return "paused" if info.paused else "serving"
    return "paused, no worker" if info.paused else "no worker"


async def _queues(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    async with _client(args) as engine:
        infos = await engine.queues()
        read = {
            info.name: await read_queue_counts(engine, info.name, debounced=True) for info in infos
        }
    if args.json:
        # The contract's job counts as they are (a script reads `waiting` as the jobs ready to
        # be claimed), and beside them the console's counts of the runs.
        print(
            json.dumps(
                [
                    {
                        **info.model_dump(mode="json"),
                        **read[info.name][0].model_dump(mode="json"),
                        "throttled": read[info.name][1].throttled,  # of the delayed ones
                        "runs": asdict(read[info.name][1]),
                    }
                    for info in infos
                ],
                indent=2,
            )
        )
        return
    # Debounced runs only where a queue has some: most queues debounce nothing.
    counted = [c for c in COUNTED if c != "debounced" or any(r.debounced for _, r in read.values())]
    header = ("QUEUE", "WORKFLOW", "PROVIDER", "SLOTS", "STATE", *(c.upper() for c in counted))
    rows = [header]
    for info in infos:
        counts = asdict(read[info.name][1])
        rows.append(
            (
                printable(info.name),
                printable(served_with(info)),
                info.provider,
                str(info.concurrency),
                _queue_state(info, info.served),
                *(str(counts[c]) for c in counted),
            )
        )
    if not infos:
        print("no queues (no worker declared any yet)")
        return
    # On a narrow terminal: the provider, the counts an operator reads least, the slots, then
    # the workflow (the queue names the row; at 80 columns the demo's rows wrapped).
    least = ("PROVIDER", "THROTTLED", "DEBOUNCED", "CANCELLED", "DELAYED", "SLOTS", "WORKFLOW")
    _print_fitted(rows, [header.index(c) for c in least if c in header], error_last=False)


async def _dead(args: argparse.Namespace) -> None:
    async with _client(args) as engine:
        jobs = await engine.dead_letters(args.queue, limit=args.limit)
        total = (await engine.queue_stats(args.queue)).dead if len(jobs) >= args.limit else 0
    if args.json:
        print(json.dumps([job.model_dump(mode="json") for job in jobs], indent=2))
    else:
        _print_dead(args.queue, jobs)
    if total > len(jobs):  # the older ones were left out: said on stderr, not hidden
        print(
            f"blok-tui: showing the newest {len(jobs):,} of {total:,} dead letters on "
            f"{printable(repr(args.queue))} (--limit N for more)",
            file=sys.stderr,
        )


def _why(run: Any, now: datetime) -> str | None:
    """A run's error; for one not ended (throttled, delayed), its moments ("may start at …")
    in this machine's time, as `show` and the CREATED column say them."""
    from .console import local_times

    return run.error if run.terminal or not run.error else local_times(run.error, None, now)


def _fitted(
    rows: Sequence[Sequence[str]],
    droppable: Sequence[int],
    whole: Sequence[bool] = (),
    *,
    error_last: bool = True,
) -> tuple[str, list[str]]:
    """The rows (a header first) laid out in columns for where stdout goes (`fit_table`:
    fitted to a terminal, whole into a pipe), and the headers of the columns left out."""
    fitted, dropped = fit_table(rows, _terminal_width(), droppable, whole, error_last=error_last)
    return "\n".join(columns(fitted)), dropped


def _print_fitted(
    rows: Sequence[Sequence[str]], droppable: Sequence[int], *, error_last: bool = True
) -> None:
    """`_fitted`, printed, with the note of the columns left out."""
    table, dropped = _fitted(rows, droppable, error_last=error_last)
    print(table)
    _note_dropped(dropped)


def _note_dropped(dropped: Sequence[str]) -> None:
    """On stderr (a pipe reads the table alone): the columns a narrow terminal left out, in
    one line of it (the last names counted, where all of them would wrap it)."""
    if dropped:
        names = [name.split(" (")[0] for name in dropped]  # "CREATED (UTC)"
        width = _terminal_width() or 0
        shown = len(names)
        line = f"blok-tui: no room here for {', '.join(names)}"
        while width and len(line) > width and shown > 1:
            shown -= 1
            more = len(names) - shown
            line = f"blok-tui: no room here for {', '.join(names[:shown])} and {more} more"
        print(line, file=sys.stderr)


def _terminal_width() -> int | None:
    """The width of the terminal the tables go to; None into a pipe or a file, where an
    error is printed whole for grep (cut, the order id and the place were lost)."""
    import shutil

    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def _print_dead(queue: str, jobs: Sequence[Any]) -> None:
    title, when = _zoned("DIED", [job.finished_at for job in jobs])
    rows = [("JOB", "LAST RUN", "DELIVERIES", title, "ERROR")]
    for job, died in zip(jobs, when, strict=True):
        rows.append(
            (
                printable(job.id),
                printable(job.run_id),
                str(job.deliveries),
                died,
                printable(cut_lines(job.error or "")),
            )
        )
    if not jobs:
        print(f"no dead letters on queue {queue!r}")
        return
    # On a narrow terminal: the last run's id (`show JOB` finds it), then the deliveries.
    _print_fitted(rows, (1, 2))


async def _requeue(args: argparse.Namespace) -> int:
    from engine import EngineError, ReplayedAlready

    if bool(args.job_ids) == bool(args.queue):
        raise UsageError("give job ids or --queue QUEUE (one of them)", "blok-tui requeue")
    refused = 0
    async with _client(args) as engine:
        if args.queue:
            return await _requeue_queue(engine, args)
        paused = {info.name for info in await engine.queues() if info.paused}
        for given in dict.fromkeys(args.job_ids):  # a job named twice is requeued once
            # Each job on its own: one refused (unknown, not dead, fixed by a replay) left the
            # valid ones after it in the dead-letter queue without a word.
            try:
                given = (await engine.find_dead_letter(given)).id  # or the start of its id
                job = await engine.get_job(await engine.requeue(given, force=args.force))
            except ReplayedAlready as error:
                _error(f"{error} (--force to requeue it anyway)")
            except EngineError as error:
                _error(str(error))
            else:
                print(printable(f"{job.id} requeued: its new run is {job.run_id}"))
                if job.queue in paused:
                    _note_paused(job.queue)
                    paused.discard(job.queue)  # said once per queue
                continue
            refused += 1
    return _refusals("requeued", len(dict.fromkeys(args.job_ids)), refused)


async def _requeue_queue(engine: Any, args: argparse.Namespace) -> int:
    """`requeue --queue Q`: every dead letter of the queue, asked first on a terminal."""
    if not await _whole_queue_asked(engine, args, "Requeue", "requeued"):
        return 1
    result = await engine.requeue_dead(args.queue, force=args.force)
    print(f"{len(result.ids):,} dead letter(s) of queue {args.queue!r} requeued")
    for job_id, why in result.skipped_ids.items():  # replayed, or taken meanwhile
        _error(f"job {job_id} left as it is: {why}" + (" (--force)" if "replayed" in why else ""))
    if result.ids and any(info.paused for info in await engine.queues() if info.name == args.queue):
        _note_paused(args.queue)
    return 1 if result.skipped_ids else 0


async def _whole_queue_asked(engine: Any, args: argparse.Namespace, verb: str, done: str) -> bool:
    """Whether every dead letter of `--queue` may be acted on: asked on a terminal (`--yes`:
    not asked, none: nothing to ask); with no terminal to ask on, a usage error."""
    count = (await engine.queue_stats(args.queue)).dead
    for_good = " for good" if verb == "Discard" else ""
    question = f"{verb} the {count:,} dead letter(s) of queue {args.queue!r}{for_good}?"
    answer = True if args.yes or not count else _confirmed(f"{question} [y/N] ")
    if answer is None:
        raise UsageError(
            f"every dead letter of a queue is {done} only when confirmed: there is no terminal "
            "to ask on, add --yes",
            f"blok-tui {verb.lower()}",
        )
    if not answer:
        _error(f"nothing {done}")
    return answer


def _note_paused(queue: str) -> None:
    """The note that a job added to a paused queue waits (`enqueue`, `requeue`), in the words
    of its run's why line (`Engine.why_waiting`), with the command that resumes the queue."""
    print(
        printable(
            f"blok-tui: note: queue {queue!r} is paused: nothing new starts (blok-tui resume {queue})"
        ),
        file=sys.stderr,
        flush=True,
    )


async def _discard(args: argparse.Namespace) -> int:
    from engine import EngineError

    if bool(args.job_ids) == bool(args.queue):
        raise UsageError("give job ids or --queue QUEUE (one of them)", "blok-tui discard")
    async with _client(args) as engine:
        if args.queue:
            if not await _whole_queue_asked(engine, args, "Discard", "discarded"):
                return 1
            result = await engine.discard_dead(args.queue)
            print(f"{len(result.ids):,} dead letter(s) of queue {args.queue!r} discarded")
            for job_id, why in result.skipped_ids.items():  # taken or requeued meanwhile
                _error(f"job {job_id} left as it is: {why}")
            return 0
        refused = 0
        for given in dict.fromkeys(args.job_ids):  # a job named twice is discarded once
            try:
                given = (await engine.find_dead_letter(given)).id  # or the start of its id
                print(printable(f"{await engine.discard(given)} discarded"))
            except EngineError as error:
                _error(str(error))
                refused += 1
    return _refusals("discarded", len(dict.fromkeys(args.job_ids)), refused)


def _refusals(done: str, given: int, refused: int, item: str = "job") -> int:
    """The exit status of a command that acts on each id on its own; with several given, a
    line that counts the refused (their own errors are above it)."""
    if refused and given > 1:
        _error(f"{given - refused} of {given} {item}(s) {done}, {refused} refused")
    return 1 if refused else 0


async def _workers(args: argparse.Namespace) -> None:
    async with _client(args) as engine:
        found = await engine.workers()
        alive = {worker.id for worker in found if engine.worker_alive(worker)}
        # `alive` is recovery's judgement (its process runs); the state says whether it serves:
        # a suspended or stalled worker is alive by its pid but claims nothing, as health says.
        states = {worker.id: engine.worker_state(worker) for worker in found}
    if args.json:
        print(
            json.dumps(
                [
                    {**w.model_dump(mode="json"), "alive": w.id in alive, "state": states[w.id]}
                    for w in found
                ],
                indent=2,
            )
        )
        return
    started, starts = _zoned("STARTED", [worker.started_at for worker in found])
    heartbeat, beats = _zoned("HEARTBEAT", [worker.heartbeat_at for worker in found])
    rows = [("WORKER", "HOST", "PID", "STATE", started, heartbeat)]
    for worker, started_at, heartbeat_at in zip(found, starts, beats, strict=True):
        rows.append(
            (
                printable(worker.id),
                printable(worker.host),
                str(worker.pid),
                states[worker.id],
                started_at,
                heartbeat_at,
            )
        )
    if not found:
        print("no workers registered")
        return
    # On a narrow terminal: the host and pid (the worker's id holds them), then its start.
    _print_fitted(rows, (1, 2, 4), error_last=False)


COMMANDS = {
    None: _console,
    "worker": _worker,
    "attach": _attach,
    "enqueue": _enqueue,
    "runs": _runs,
    "show": _show,
    "cancel": _cancel,
    "where": _where,
    "replay": _replay,
    "pause": _pause_or_resume,
    "resume": _pause_or_resume,
    "send": _send,
    "schedules": _schedules,
    "health": _health,
    "queues": _queues,
    "dead": _dead,
    "requeue": _requeue,
    "discard": _discard,
    "workers": _workers,
}


def _confirmed(question: str) -> bool | None:
    """Asked on the terminal, the answer y or yes; None without a terminal to ask on."""
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return None
    print(question, end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _error(message: str) -> None:
    """`blok-tui: error: ...` on one line, whatever the message holds (a file name, a run's
    text): control characters escaped, line breaks made spaces."""
    print(f"blok-tui: error: {printable(message).replace(chr(10), ' ')}", file=sys.stderr)


# The commands that run an engine of their own; the others read and act on a database that
# another process's engine writes, which an in-memory engine is not.
IN_MEMORY = frozenset({None, "worker"})


def _refuse_engine_options(args: argparse.Namespace) -> None:
    """`--memory` or `--workflows` given to a command that reads a database: `--memory` would
    read ./.blok/blok.db instead, and say that no such database exists; `--workflows` was
    ignored without a word (the workers that serve the database load the workflows)."""
    if args.command in IN_MEMORY:
        return
    if args.memory:
        raise UsageError(
            f"--memory has no meaning for {args.command!r}: an in-memory engine's runs and "
            "queues live in its own process; use --db",
            f"blok-tui {args.command}",
        )
    if args.workflows is not None:
        raise UsageError(
            f"--workflows has no meaning for {args.command!r}: it reads the database, and the "
            "workers that serve it load the workflows (blok-tui worker --workflows DIR)",
            f"blok-tui {args.command}",
        )


# A value that starts with "-" and a digit: `-5s`, `-1m`, `-.5s`. argparse takes one for an
# option unless it is a plain negative number (`-5`), and said "expected one argument".
_NEGATIVE = re.compile(r"-\.?\d")


def _value_options(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings that take a value (one, or an optional one) in `parser` and its
    sub-commands, less any that is a flag in one of them."""
    values: set[str] = set()
    flags: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
            elif action.nargs is None or action.nargs == argparse.OPTIONAL:
                values.update(action.option_strings)
            else:
                flags.update(action.option_strings)

    walk(parser)
    return values - flags


def _negative_values_attached(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """`argv` with each `--opt -5s` made `--opt=-5s`, for an option that takes a value (the
    durations: --delay, --timeout, --lease, --grace, --retention, --janitor-interval,
    --max-age): the value then reaches the option's own check, which says in one line what
    is wrong with it (duration '-5s' is negative). Nothing after `--` is touched."""
    options = _value_options(parser)
    given = list(argv)
    out: list[str] = []
    i = 0
    while i < len(given):
        word = given[i]
        if word == "--":
            out.extend(given[i:])
            break
        if word in options and i + 1 < len(given) and _NEGATIVE.match(given[i + 1]):
            out.append(f"{word}={given[i + 1]}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        given = sys.argv[1:] if argv is None else argv
        args = parser.parse_args(_negative_values_attached(parser, given))
        _refuse_engine_options(args)
    except UsageError as error:
        _error(f"{error} (see {error.prog} --help)")
        return 2
    import anyio

    from engine import DatabaseError, EngineError, WorkflowLoadError
    from engine.validation import InvalidInput

    refusals = (EngineError, DatabaseError, WorkflowLoadError, InvalidInput)
    if args.command not in (None, "worker", "attach"):  # the console and the worker log their way
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_OneLine())
        handler.setLevel(logging.WARNING)
        logging.getLogger().addHandler(handler)
    try:
        # The console says how it ended (1: it crashed); the other commands raise to fail.
        status = anyio.run(COMMANDS[args.command], args)
        sys.stdout.flush()  # a reader gone (`| head`) shows here, not as Python exits
    except BrokenPipeError:
        # The reader stopped reading (`blok-tui runs | head`): stop without a word, as `git log |
        # head` does, and with the status a process killed by SIGPIPE has. Standard output goes
        # to /dev/null first: Python's last flush of it would fail again and say so.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except UsageError as error:
        _error(f"{error} (see {error.prog} --help)")
        return 2
    except refusals as error:
        _error(str(error))
        return 1
    except BaseExceptionGroup as group:
        # A refusal from one of the engine's own tasks (the database writer found the file
        # damaged): one line too, not the task group's traceback.
        found = _first_leaf(group, refusals)
        if found is None:
            raise
        _error(str(found))
        return 1
    except KeyboardInterrupt:
        return 130
    return status if isinstance(status, int) else 0


def _first_leaf(
    group: BaseExceptionGroup[BaseException], kinds: tuple[type[BaseException], ...]
) -> BaseException | None:
    """The first error of `kinds` in a (nested) exception group."""
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            found = _first_leaf(error, kinds)
            if found is not None:
                return found
        elif isinstance(error, kinds):
            return error
    return None


if __name__ == "__main__":
    sys.exit(main())
