"""What a user reported of the `blok-tui` command: negative durations that argparse took for
options, abbreviated options, a `--version` that loaded the whole engine, queues said to be
served by no one, table times with no zone, and tables and cells that wide characters put out of line."""

from __future__ import annotations

import argparse
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from cli_helpers import Terminal, blok, blok_json, cli_env, start_worker, write_workflows
from rich.cells import cell_len

from blok_tui.cli import _negative_values_attached, _stuck_factor, build_parser
from blok_tui.plain_text import (
    PLACE,
    columns,
    fit_last_column,
    fit_table,
    one_line,
    one_line_keeping_where,
)
from engine import Step, WorkerTrigger, Workflow
from engine.filters import STUCK_FACTOR


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("blok-tui: error: "), done.stderr
    return lines[0]


# ---- 1: a negative duration reaches the duration's own check ---------------------------------
NEGATIVE = [
    (["enqueue", "naps", "{}", "--delay", "-5s"], "argument --delay: duration '-5s' is negative"),
    (["enqueue", "naps", "{}", "--delay=-5s"], "argument --delay: duration '-5s' is negative"),
    (["enqueue", "naps", "{}", "--timeout", "-1m"], "argument --timeout: duration '-1m' is"),
    (["enqueue", "naps", "{}", "--delay", "-0.5s"], "argument --delay: duration '-0.5s' is"),
    (["worker", "--lease", "-5s"], "argument --lease: duration '-5s' is negative"),
    (["worker", "--retention", "-1d"], "argument --retention: duration '-1d' is negative"),
    (["worker", "--janitor-interval", "-1s"], "argument --janitor-interval: duration '-1s'"),
    (["worker", "--grace", "-5s"], "argument --grace: not a number of seconds: '-5s'"),
    (["worker", "--grace", "-1"], "argument --grace: must not be negative, not -1"),
    (["health", "--max-age", "-5m"], "argument --max-age: duration '-5m' is negative"),
    (["where", "1a2b3c4d", "--timeout", "-5s"], "argument --timeout: duration '-5s' is"),
]


@pytest.mark.parametrize(("args", "says"), NEGATIVE, ids=[" ".join(a) for a, _ in NEGATIVE])
def test_a_negative_duration_gets_the_durations_own_message(
    tmp_path: Path, args: list[str], says: str
) -> None:
    # `--delay -5s` said "argument --delay: expected one argument": argparse took -5s for an
    # option.
    done = blok(*args, "--db", tmp_path / "blok.db")
    line = one_error_line(done)
    assert says in line, line
    assert "expected one argument" not in line
    assert not (tmp_path / "blok.db").exists()


def test_only_an_options_value_is_attached_and_nothing_after_a_double_dash() -> None:
    parser = build_parser()
    given = ["enqueue", "q", "{}", "--delay", "-5s", "--wait", "--", "--timeout", "-1s"]
    assert _negative_values_attached(parser, given) == [
        "enqueue",
        "q",
        "{}",
        "--delay=-5s",
        "--wait",
        "--",
        "--timeout",
        "-1s",
    ]
    # A flag takes no value: what follows it is left to argparse.
    assert _negative_values_attached(parser, ["runs", "--json", "-5s"]) == [
        "runs",
        "--json",
        "-5s",
    ]


# ---- 2: no abbreviations ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["runs", "--stat", "failed"],
        ["runs", "--lim", "5"],
        ["enqueue", "naps", "{}", "--prio", "5"],
        ["health", "--max", "5m"],
        ["--vers"],
    ],
    ids=" ".join,
)
def test_a_prefix_of_a_long_option_is_refused(tmp_path: Path, args: list[str]) -> None:
    # `runs --stat failed` listed the failed runs: an option added later (--stats) would
    # have changed what the script meant.
    done = blok(*args, "--db", tmp_path / "blok.db")
    line = one_error_line(done)
    assert "unrecognized arguments: " + args[-2 if len(args) > 1 else -1] in line, line


def test_every_parser_refuses_abbreviations() -> None:
    def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
        found = [parser]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    found += parsers(sub)
        return found

    every = parsers(build_parser())
    assert len(every) > 20  # the commands, and the schedules' actions
    assert [p.prog for p in every if p.allow_abbrev] == []


# ---- 3: --version and --help load no engine --------------------------------------------------
LOADED = """
import sys
from blok_tui.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
print("LOADED", sorted({{m.split(".")[0] for m in sys.modules}} & {{"engine", "textual"}}))
"""


@pytest.mark.parametrize("argv", [["--version"], ["--help"]], ids=" ".join)
def test_version_and_help_load_neither_the_engine_nor_textual(argv: list[str]) -> None:
    # `blok-tui --version` imported the whole engine: 0.3-0.5 s.
    done = subprocess.run(
        [sys.executable, "-c", LOADED.format(argv=argv)],
        capture_output=True,
        text=True,
        timeout=30,
        env=cli_env(),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "LOADED []", done.stdout
    assert done.stdout.startswith("blok-tui " if argv == ["--version"] else "usage: blok-tui")


def test_the_help_that_names_engine_values_still_names_them() -> None:
    runs = blok("runs", "--help")
    assert runs.returncode == 0, runs.stderr
    assert "queued, delayed, debounced," in runs.stdout
    workers = blok("workers", "--help")
    assert workers.returncode == 0, workers.stderr
    assert "sent no heartbeat for 10s" in workers.stdout


# ---- 4 and 5: queues with no worker; the zone of table times ---------------------------------
def row(table: str, first: str) -> str:
    return next(line for line in table.splitlines() if line.split()[0] == first)


def test_queues_with_no_live_worker_say_so(tmp_path: Path) -> None:
    # `blok-tui queues` said "serving" once the only worker had stopped.
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"))
    try:
        assert "  serving  " in row(blok("queues", "--db", database).stdout, "naps")
        served = {q["name"]: q for q in blok_json("queues", "--json", "--db", database)}
        assert served["naps"]["served"] is True
        assert blok("pause", "single", "--db", database).returncode == 0
        assert "  paused  " in row(blok("queues", "--db", database).stdout, "single")
    finally:
        assert worker.stop() == 0, worker.stderr()
    table = blok("queues", "--db", database)
    assert table.returncode == 0, table.stderr
    assert "  no worker  " in row(table.stdout, "naps"), table.stdout
    assert "  paused, no worker  " in row(table.stdout, "single"), table.stdout
    listed = {q["name"]: q for q in blok_json("queues", "--json", "--db", database)}
    # The keys scripts read are kept; `served` is added.
    assert set(listed["naps"]) >= {"name", "workflow_name", "provider", "concurrency", "paused"}
    assert set(listed["naps"]) >= {"waiting", "active", "completed", "failed", "dead"}
    assert (listed["naps"]["served"], listed["naps"]["paused"]) == (False, False)
    assert (listed["single"]["served"], listed["single"]["paused"]) == (False, True)


def test_queues_count_cancelled_jobs(tmp_path: Path) -> None:
    # Cancelled jobs were nowhere in the table: 3,000 of them on a queue, and no column.
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"))
    try:
        job_id = blok("enqueue", "naps", '{"seconds": 0}', "--delay", "1h", "--db", database)
        run_id = blok_json("show", job_id.stdout.strip(), "--json", "--db", database)["id"]
        assert blok("cancel", run_id, "--db", database).returncode == 0
        table = blok("queues", "--db", database).stdout
    finally:
        assert worker.stop() == 0, worker.stderr()
    header = table.splitlines()[0].split()
    cells = row(table, "naps").split()
    assert cells[-len(header) + header.index("CANCELLED")] == "1", table


def in_zone(zone: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blok_tui", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**cli_env(), "TZ": zone},
    )


def test_table_times_name_their_zone_once(tmp_path: Path) -> None:
    # `runs` printed 2026-12-05 10:18:25: in which zone?
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"))
    try:
        job_id = blok("enqueue", "naps", '{"seconds": 0}', "--db", database).stdout.strip()
        run = blok_json("show", job_id, "--json", "--db", database)
        runs = in_zone("Asia/Tokyo", "runs", "--db", database)
        workers = in_zone("Asia/Tokyo", "workers", "--db", database)
    finally:
        assert worker.stop() == 0, worker.stderr()
    assert runs.returncode == 0 and workers.returncode == 0, runs.stderr + workers.stderr
    header = runs.stdout.splitlines()[0]
    assert "  CREATED (JST)  " in header, header
    created = datetime.fromisoformat(run["created_at"]).astimezone(timezone(timedelta(hours=9)))
    assert created.strftime("%Y-%m-%d %H:%M:%S") in row(runs.stdout, run["id"])
    header = workers.stdout.splitlines()[0]
    assert "  STARTED (JST)  " in header and header.endswith("  HEARTBEAT (JST)"), header


ZONED = """
from datetime import datetime, timezone
from blok_tui.cli import _zoned
winter = datetime(2026, 1, 15, 12, 0, tzinfo=timezone.utc)
summer = datetime(2026, 7, 15, 12, 0, tzinfo=timezone.utc)
print(_zoned("CREATED", [winter, None]))
print(_zoned("CREATED", [winter, summer]))
"""


def test_rows_on_both_sides_of_a_daylight_saving_change_each_name_their_zone() -> None:
    done = subprocess.run(
        [sys.executable, "-c", ZONED],
        capture_output=True,
        text=True,
        timeout=30,
        env={**cli_env(), "TZ": "Europe/Paris"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "('CREATED (CET)', ['2026-01-15 13:00:00', '-'])",
        "('CREATED', ['2026-01-15 13:00:00 CET', '2026-07-15 14:00:00 CEST'])",
    ]


# ---- 6: wide characters ----------------------------------------------------------------------
def test_columns_line_up_in_terminal_cells_with_wide_characters() -> None:
    # str.ljust counted a CJK character or an emoji as one cell: the columns after it came
    # out one cell a character to the right.
    rows = [
        ("RUN", "WORKFLOW", "STATUS"),
        ("run_1", "注文.処理", "completed"),
        ("run_2", "orders.🎉", "failed"),
        ("run_3", "orders.charge", "running"),
    ]
    lines = columns(rows)
    starts = set()
    for line, cells in zip(lines, rows, strict=True):
        before = line[: line.index(cells[2])]
        starts.add(cell_len(before))
    assert starts == {len("run_1  ") + len("orders.charge  ")}, lines


def test_a_cell_cut_to_its_width_is_cut_in_terminal_cells() -> None:
    # An error cut to 60 characters took 120 cells in Japanese, and pushed the table's lines
    # past the terminal's width.
    japanese = "注文の金額が不正です。" * 10
    for width in (10, 11, 60):
        cut = one_line(japanese, width)
        assert cut.endswith("…") and width - 1 <= cell_len(cut) <= width, (width, cut)
    assert one_line("plain  error\ntext", 60) == "plain error text"
    assert one_line("x" * 80, 60) == "x" * 59 + "…"


def test_an_error_cut_for_a_terminal_keeps_its_place() -> None:
    # The dead-letter list cut its errors at 70 characters: the file and line went first.
    error = (
        "[step 1/1] send failed: ConnectionError: payment gateway 503 for ORD-10 "
        "(at workflows/payments.py:12)"
    )
    cut = one_line_keeping_where(error, 70)
    # Its opening too: the step's name stays, its number and "failed" go (the status says it).
    assert cut == "send: ConnectionError: payment gateway… (at workflows/payments.py:12)"
    # Where it fits too: a list's lines all open alike.
    assert one_line_keeping_where(error, 200) == error.replace("[step 1/1] send failed:", "send:")
    assert one_line_keeping_where("short (at x.py:1)", 70) == "short (at x.py:1)"
    assert one_line_keeping_where("no place " * 10, 20) == one_line("no place " * 10, 20)
    # A timed-out step's place, and one whose folders would leave the message less than half
    # the width: the folders go, the file and line stay (the queues view's recent failures).
    timed_out = "[step 2/2] upload failed: timed out after 2s (stopped at workflows/ex.py:18)"
    assert one_line_keeping_where(timed_out, 66) == (
        "upload: timed out after 2s (stopped at workflows/ex.py:18)"
    )
    assert one_line_keeping_where(timed_out, 56) == (
        "upload: timed out after 2s (stopped at …/ex.py:18)"
    )
    far = (
        "[step 1/1] send failed: ConnectionError: payment gateway 503 for ORD-10 "
        "(at /srv/app/flows/pay.py:9, after 2 attempts)"
    )
    assert one_line_keeping_where(far, 80) == (
        "send: ConnectionError: payment gateway 503 fo… (at …/pay.py:9, after 2 attempts)"
    )
    # A nested step's path stays; a crash's opening has no "failed" to drop.
    nested = "[step 1/1] each[2/3] › check failed: item 2 is bad, very bad (at workflows/x.py:3)"
    assert one_line_keeping_where(nested, 60) == (
        "each[2/3] › check: item 2 is bad, ver… (at workflows/x.py:3)"
    )
    crashed = "[step 2/2] render: its worker process w1 died before the run finished"
    assert one_line_keeping_where(crashed, 50) == (
        "render: its worker process w1 died before the run…"
    )


def test_a_tables_error_column_takes_the_room_the_others_leave() -> None:
    error = "[step 1/1] send failed: " + "x" * 200 + " (at workflows/pay.py:9)"
    rows = [("RUN", "ERROR"), ("run_1", error), ("run_22", "orphaned: " + "y" * 200)]
    # 120 cells, "run_22" and its two spaces before the column: 112 left for the errors.
    fitted = fit_last_column(rows, 120, whole=[False, False, True])
    assert fitted[1][1] == "send: " + "x" * 81 + "… (at workflows/pay.py:9)"
    assert all(cell_len(line) <= 120 for line in columns(fitted[:2]))
    assert fitted[2][1] == rows[2][1]  # a note to read whole
    # Never less than 30 cells, however wide the others; whole where nothing is cut.
    assert cell_len(fit_last_column(rows, 20)[1][1]) == 30
    assert fit_last_column(rows, None)[1][1] == error
    # A table too wide for its terminal: the droppable columns go, first named first, until
    # it fits; then the error takes what is left, down to a few cells.
    wide = [("RUN", "WORKER", "QUEUE", "ERROR"), ("run_1", "w" * 20, "q" * 10, error)]
    assert fit_table(wide, 80, droppable=(1, 2))[1] == []  # 41 cells, and the error's 30
    fitted, dropped = fit_table(wide, 60, droppable=(1, 2))
    assert dropped == ["WORKER"] and [row[:2] for row in fitted] == [
        ["RUN", "QUEUE"],
        ["run_1", "q" * 10],
    ]
    assert cell_len(columns(fitted)[1]) == 60
    fitted, dropped = fit_table(wide, 30, droppable=(1, 2))
    assert dropped == ["WORKER", "QUEUE"] and cell_len(columns(fitted)[1]) == 7 + 23
    assert fit_table(wide, None, droppable=(1, 2)) == (fit_last_column(wide, None), [])
    # Errors short enough: nothing goes.
    short = [("RUN", "WORKER", "ERROR"), ("run_1", "w" * 20, "boom")]
    assert fit_table(short, 34, droppable=(1,)) == ([list(row) for row in short], [])
    # No error at all: the header's "ERROR" is what the column needs (its rows ran over).
    assert fit_table(short, 33, droppable=(1,))[1] == ["WORKER"]
    done = [("RUN", "WORKER", "ERROR"), ("run_1", "w" * 20, "")]
    assert fit_table(done, 33, droppable=(1,))[1] == ["WORKER"]


async def terminal_lines(cwd: Path, *args: str, width: int) -> list[str]:
    """`blok-tui ARGS` run to its end (exit 0) on a terminal `width` columns wide: the lines
    it showed, blank ones left out."""
    import anyio

    def on_a_terminal() -> list[str]:
        terminal = Terminal(cwd, "-m", "blok_tui", *args, size=(width, 20))
        assert terminal.finish() == 0, terminal.text
        return [line for line in terminal.text.splitlines() if line.strip()]

    return await anyio.to_thread.run_sync(on_a_terminal)


@pytest.mark.anyio
async def test_the_tables_on_a_terminal_fit_its_width(tmp_path: Path) -> None:
    # The ERROR column was cut at 60 cells (70 for `dead`) whatever the terminal: where the
    # other columns took 104 of 150, every row went on over a second line.

    from engine import Engine, Schedule, Step, WorkerTrigger, Workflow

    async def send(ctx: object) -> None:
        raise ConnectionError("payment gateway 503 for order ORD-10, " + "retry later " * 10)

    failing = Workflow(
        name="pay",
        trigger=WorkerTrigger(queue="pay"),
        schedules=[Schedule(cron="0 0 1 1 *")],  # listed, never firing within the test
        steps=[Step("send", send)],
    )
    database = tmp_path / "blok.db"

    db = ("--db", str(database))

    async with Engine(workflows=[failing], database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("pay", {}), timeout=10)
        await engine.flush()
        # Workers while this one is alive (a stopped engine takes its entry out).
        lines = await terminal_lines(tmp_path, "workers", *db, width=60)
        assert len(lines) == 3 and all(cell_len(line) <= 60 for line in lines), lines
        assert lines[0].split() == ["WORKER", "STATE", "HEARTBEAT", "(UTC)"], lines
        assert lines[2] == "blok-tui: no room here for HOST, PID, STARTED", lines
        wide = await terminal_lines(tmp_path, "workers", *db, width=200)
        assert len(wide) == 2 and wide[0].split()[:3] == ["WORKER", "HOST", "PID"], wide
        # Schedules: the last run's id, the queue, the last firing and its status go first.
        lines = await terminal_lines(tmp_path, "schedules", *db, width=70)
        assert len(lines) == 3 and all(cell_len(line) <= 70 for line in lines), lines
        order = ["LAST RUN", "QUEUE", "LAST FIRED", "STATUS"]
        names = lines[2].removeprefix("blok-tui: no room here for ").split(", ")
        assert names == order[: len(names)] and lines[0].split()[:3] == [
            "WORKFLOW",
            "SCHEDULE",
            "STATE",
        ], lines
        wide = await terminal_lines(tmp_path, "schedules", *db, width=200)
        assert len(wide) == 2 and all(name in wide[0] for name in order), wide
    assert run.error is not None and run.error.startswith("[step 1/1] send failed: ")
    found = PLACE.search(run.error)
    assert found is not None, run.error
    where = found[0].rsplit("/", 1)[1]  # "test_cli_polish.py:N)": its folders may go

    for args in (("runs",), ("dead", "pay")):
        for width in (150, 180):
            lines = await terminal_lines(tmp_path, *args, *db, width=width)
            # The error takes the room the other columns leave: the row ends at the edge, or a
            # cell before it where the cut fell after a space ("for…", not "for …"; with a
            # worker's pid of 3 digits, not 5, it did).
            assert len(lines) == 2 and cell_len(lines[1]) in (width - 1, width), lines
            assert cell_len(lines[0]) < width and " send: ConnectionError: pay" in lines[1]
        # Where the column has room for it (the message keeps half), the file and line.
        assert lines[1].endswith(where), (where, lines)
    # Narrower than the columns: those least read go, and a line on stderr says which.
    narrow = {
        (100, "runs"): (
            ["RUN", "WORKFLOW", "STATUS", "CREATED", "(UTC)", "ERROR"],
            ["WORKER", "QUEUE", "DURATION"],
        ),
        (90, "runs"): (
            ["RUN", "WORKFLOW", "STATUS", "ERROR"],
            ["WORKER", "QUEUE", "DURATION", "CREATED"],
        ),
        (100, "dead", "pay"): (["JOB", "DELIVERIES", "DIED", "(UTC)", "ERROR"], ["LAST RUN"]),
        (90, "dead", "pay"): (["JOB", "DIED", "(UTC)", "ERROR"], ["LAST RUN", "DELIVERIES"]),
    }
    for (width, *args), (header, names) in narrow.items():
        lines = await terminal_lines(tmp_path, *args, *db, width=width)
        assert len(lines) == 3 and all(cell_len(line) <= width for line in lines), lines
        assert lines[0].split() == header and " send: ConnectionError: pay" in lines[1], lines
        assert lines[2] == f"blok-tui: no room here for {', '.join(names)}", lines
    # A table of short cells alike: the queue's counts read least go first, none is cut.
    lines = await terminal_lines(tmp_path, "queues", *db, width=80)
    assert len(lines) == 3 and all(cell_len(line) <= 80 for line in lines), lines
    header = "QUEUE WORKFLOW STATE QUEUED RUNNING WAITING COMPLETED FAILED DEAD"
    assert " ".join(lines[0].split()) == header, lines
    names = "PROVIDER, THROTTLED, CANCELLED, DELAYED, SLOTS"
    assert lines[2] == f"blok-tui: no room here for {names}", lines
    # Narrower still, the workflow goes (at 80 columns the demo's queues wrapped): the queue
    # names the row.
    lines = await terminal_lines(tmp_path, "queues", *db, width=70)
    assert len(lines) == 3 and all(cell_len(line) <= 70 for line in lines), lines
    assert lines[0].split() == header.replace("WORKFLOW ", "").split(), lines
    # The note fits the line too, the last names counted.
    assert lines[2] == "blok-tui: no room here for PROVIDER, THROTTLED, CANCELLED and 3 more"
    wide = await terminal_lines(tmp_path, "queues", *db, width=200)
    assert len(wide) == 2 and "PROVIDER" in wide[0] and "CANCELLED" in wide[0], wide
    # Into a pipe: whole, for grep.
    piped = blok("runs", "--db", database).stdout
    assert " ".join(run.error.split()) in piped, piped


@pytest.mark.anyio
async def test_queues_count_the_runs_a_concurrency_key_holds_as_queued(tmp_path: Path) -> None:
    """A job its key holds (on_limit="queue") is delayed while its run is queued: the queues
    view said "0 queued, 2 delayed" of the two runs its `3 queued` filter listed."""
    import anyio

    from engine import Engine, RunFilter

    release = anyio.Event()

    async def hold(ctx: object) -> int:
        await release.wait()
        return 1

    keyed = Workflow(
        name="keyed",
        trigger=WorkerTrigger(
            queue="keyed", concurrency=4, concurrency_key="$.body.k", on_limit="queue"
        ),
        steps=[Step("hold", hold)],
    )
    database = tmp_path / "blok.db"
    async with Engine(workflows=[keyed], database=database) as engine:
        jobs = [await engine.enqueue("keyed", {"k": "same"}) for _ in range(3)]
        with anyio.fail_after(10):
            while await engine.count_runs(RunFilter.of("queued")) != 2 or (  # noqa: ASYNC110
                (await engine.queue_stats("keyed")).delayed != 2
            ):
                await anyio.sleep(0.02)
        await engine.flush()
        table = await anyio.to_thread.run_sync(lambda: blok("queues", "--db", database))
        release.set()
        for job_id in jobs:
            await engine.wait_for_job(job_id, timeout=10)
    header = table.stdout.splitlines()[0].split()
    counts = dict(zip(header, row(table.stdout, "keyed").split(), strict=True))
    assert (counts["QUEUED"], counts["RUNNING"], counts["DELAYED"]) == ("2", "1", "0"), table


@pytest.mark.anyio
async def test_queues_counts_runs_in_the_consoles_words(tmp_path: Path) -> None:
    # The console's queues view said "1 waiting" (a run in a durable wait) where `blok-tui
    # queues` said WAITING 0 and DELAYED 1 for the same run: its WAITING was the jobs ready to
    # be claimed, the console's "queued". And the jobs a debounce left for a later one were
    # CANCELLED, as if an operator had cancelled them. The table speaks the console's words
    # now; the JSON keeps the contract's job counts and adds the console's under "runs".
    import anyio

    from engine import Debounce, Engine, RunFilter, Step, WorkerTrigger, Workflow, wait

    async def call(ctx: object) -> int:
        return 1

    napping = Workflow(
        name="napping",
        trigger=WorkerTrigger(queue="napping"),
        steps=[Step("call", call), wait.for_("1h"), Step("after", call)],
    )
    debounced = Workflow(
        name="search",
        trigger=WorkerTrigger(
            queue="search", debounce=Debounce("$.body.user", delay="100ms", mode="trailing")
        ),
        steps=[Step("call", call)],
    )
    database = tmp_path / "blok.db"
    async with Engine(workflows=[napping, debounced], database=database) as engine:
        burst = [await engine.enqueue("search", {"user": "ann", "n": n}) for n in range(3)]
        for job_id in burst:
            await engine.wait_for_job(job_id, timeout=10)
        await engine.enqueue("napping", {})
        with anyio.fail_after(10):
            while not await engine.count_runs(RunFilter.of("waiting")):  # noqa: ASYNC110
                await anyio.sleep(0.02)
        await engine.pause("napping")
        await engine.enqueue("napping", {})  # queued: the paused queue starts nothing
        await engine.flush()
        table = await anyio.to_thread.run_sync(lambda: blok("queues", "--db", database))
        as_json = await anyio.to_thread.run_sync(
            lambda: blok_json("queues", "--json", "--db", database)
        )
    header = table.stdout.splitlines()[0].split()
    assert header[5:] == [
        "QUEUED",
        "RUNNING",
        "WAITING",
        "DELAYED",
        "THROTTLED",
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "DEBOUNCED",
        "DEAD",
    ], header
    naps = dict(zip(header, row(table.stdout, "napping").split(), strict=True))
    assert (naps["QUEUED"], naps["WAITING"], naps["DELAYED"]) == ("1", "1", "0"), table
    search = dict(zip(header, row(table.stdout, "search").split(), strict=True))
    assert (search["COMPLETED"], search["CANCELLED"], search["DEBOUNCED"]) == ("1", "0", "2")
    queues = {queue["name"]: queue for queue in as_json}
    assert (queues["napping"]["waiting"], queues["napping"]["delayed"]) == (1, 1)  # contract's
    assert queues["search"]["cancelled"] == 2  # the contract's: jobs by state
    assert queues["napping"]["runs"] == {
        "queued": 1,
        "running": 0,
        "waiting": 1,
        "delayed": 0,
        "throttled": 0,
        "completed": 0,
        "failed": 0,
        "cancelled": 0,
        "debounced": 0,
        "dead": 0,
    }, queues
    assert (queues["search"]["runs"]["cancelled"], queues["search"]["runs"]["debounced"]) == (0, 2)


def quick_workflow() -> Workflow:
    """One queue, `quick`, whose one step returns at once."""

    def call(ctx: object) -> int:
        return 1

    return Workflow(name="quick", trigger=WorkerTrigger(queue="quick"), steps=[Step("c", call)])


@pytest.mark.anyio
async def test_the_runs_hint_keeps_to_one_line_of_the_terminal(tmp_path: Path) -> None:
    # "3 of 8 runs shown (newest first; --limit N, or filter with --workflow/--queue/--text/
    # --since)" went over two lines of an 80-column terminal. Into a pipe it stays whole.
    from engine import Engine

    database = tmp_path / "blok.db"
    async with Engine(workflows=[quick_workflow()], database=database) as engine:
        for _ in range(2):
            await engine.wait_for_job(await engine.enqueue("quick", {}), timeout=10)
    lines = await terminal_lines(tmp_path, "runs", "--limit", "1", "--db", "blok.db", width=80)
    assert lines[-1] == "blok-tui: 1 of 2 runs shown (newest first; --limit N)", lines
    piped = blok("runs", "--limit", "1", "--db", database).stderr
    assert "or filter with --status/--workflow/--queue/--text/--since)" in piped, piped


@pytest.mark.anyio
async def test_a_followers_lines_keep_to_the_terminal_and_go_on_under_their_text(
    tmp_path: Path,
) -> None:
    # `enqueue --follow`'s first line alone is some 110 characters: an 80-column terminal
    # broke it, and most of `runs --follow`'s, mid-word, and went on under the times.
    from engine import Engine

    command = ("enqueue", "quick", "{}", "--follow", "--db", "blok.db")
    async with Engine(workflows=[quick_workflow()], database=tmp_path / "blok.db"):
        lines = await terminal_lines(tmp_path, *command, width=80)
    assert max(len(line) for line in lines) <= 80, lines
    opening = next(n for n, line in enumerate(lines) if " is run" in line)
    assert lines[opening + 1].startswith(" " * 14), lines  # under the text, not the time
    assert "(ctrl-c stops following)" in " ".join(lines[opening : opening + 3]), lines


@pytest.mark.anyio
async def test_healthy_wraps_between_words_on_a_terminal_and_is_one_line_into_a_pipe(
    tmp_path: Path,
) -> None:
    # "healthy: database .blok/blok.db ok, 1 worker alive, no job waiting; 26 dead letter(s)
    # (blok-tui dead QUEUE)" broke mid-word ("lett" / "er(s)") at 80 columns.
    import anyio

    from engine import Engine

    async with Engine(workflows=[quick_workflow()], database=tmp_path / "blok.db"):
        lines = await terminal_lines(tmp_path, "health", "--db", "blok.db", width=50)
        piped = await anyio.to_thread.run_sync(
            lambda: blok("health", "--db", "blok.db", cwd=tmp_path)
        )
    assert len(lines) > 1 and max(len(line) for line in lines) <= 50, lines
    assert all(line.startswith(" " * 9) for line in lines[1:]), lines
    assert piped.stdout.count("\n") == 1 and piped.stdout.startswith("healthy: database ")
    assert " ".join(" ".join(lines).split()) == " ".join(piped.stdout.split())


def test_runs_stuck_with_no_factor_takes_the_engines_default(tmp_path: Path) -> None:
    # The default factor is read from the engine only when `--stuck` is given without one.
    parser = build_parser()
    assert _stuck_factor(parser.parse_args(["runs", "--stuck"]).stuck) == STUCK_FACTOR
    assert _stuck_factor(parser.parse_args(["runs", "--stuck", "5"]).stuck) == 5.0
    assert _stuck_factor(parser.parse_args(["runs"]).stuck) is None
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"))
    try:
        assert blok_json("runs", "--stuck", "--json", "--db", database) == []
        assert blok("runs", "--stuck", "--db", database).stdout.startswith("no runs running")
    finally:
        assert worker.stop() == 0, worker.stderr()


@pytest.mark.anyio
async def test_runs_says_when_a_throttled_run_may_start_in_this_machines_time(
    tmp_path: Path,
) -> None:
    # The ERROR column printed "runs started in the last 20.0s …; may start at
    # 2026-12-06T16:02:47.806059+00:00" where every other time is this machine's, to the second.
    import anyio

    from engine import Engine, RateLimit, RunFilter, Step, WorkerTrigger, Workflow

    async def call(ctx: object) -> int:
        return 1

    limited = Workflow(
        name="limited",
        trigger=WorkerTrigger(queue="limited", rate_limit=RateLimit(limit=1, period="20s")),
        steps=[Step("call", call)],
    )
    database = tmp_path / "blok.db"
    async with Engine(workflows=[limited], database=database) as engine:
        first = await engine.enqueue("limited", {})
        await engine.enqueue("limited", {})
        await engine.wait_for_job(first, timeout=10)
        with anyio.fail_after(10):
            while not await engine.count_runs(RunFilter.of("throttled")):  # noqa: ASYNC110
                await anyio.sleep(0.02)
        [held] = await engine.runs(status="throttled")
        await engine.flush()
        listed = await anyio.to_thread.run_sync(lambda: blok("runs", "--db", database))
        queues = await anyio.to_thread.run_sync(lambda: blok("queues", "--db", database))
        as_json = await anyio.to_thread.run_sync(
            lambda: blok_json("queues", "--json", "--db", database)
        )
    # `queues` counts it throttled, not delayed, as the console does (an operator looked for a
    # backoff), in the table and in its JSON.
    header = queues.stdout.splitlines()[0].split()
    cells = row(queues.stdout, "limited").split()
    assert header.index("THROTTLED") == header.index("DELAYED") + 1, header
    delayed = cells[-len(header) + header.index("DELAYED") :][:2]
    assert delayed == ["0", "1"], queues.stdout  # DELAYED, THROTTLED
    assert (as_json[0]["delayed"], as_json[0]["throttled"]) == (1, 1), as_json
    [row_] = [line for line in listed.stdout.splitlines() if line.startswith(held.id)]
    assert "runs started in the last 20s; may start at " in row_, row_
    assert row_.endswith(held.run_at.astimezone().strftime("may start at %H:%M:%S")), row_


def test_a_workers_log_line_is_cut_where_a_run_wrote_megabytes() -> None:
    # A run's error that quoted a 5 MB response body went into the worker's log whole, one
    # line a log shipper splits or drops; the run's record keeps it all.
    import logging

    from blok_tui.cli import _Printable

    record = logging.LogRecord(
        "blok.runs", logging.WARNING, __file__, 1, "failed: %s\nnext", ("z" * 10_000,), None
    )
    line = _Printable("%(message)s").format(record)
    assert line == "failed: " + "z" * 1_992 + "… (8,008 more characters)\nnext"


NOISY = """
from engine import Step, WorkerTrigger, Workflow


async def shout(ctx):
    ctx.logger.info("body: %s", "y" * 100_000)
    raise ValueError("bad row: " + "z" * 100_000)


workflow = Workflow(name="noisy", trigger=WorkerTrigger(queue="noisy"), steps=[Step("shout", shout)])
"""


def test_a_runs_very_long_error_is_cut_by_the_commands_that_print_it(tmp_path: Path) -> None:
    # `enqueue --wait` printed the whole error, `show` each of its copies, the worker's log it
    # too: megabytes on a terminal. `show --json` keeps all of it.
    from cli_helpers import serve

    database, worker = serve(tmp_path, {"noisy.py": NOISY})
    try:
        failed = blok("enqueue", "noisy", "{}", "--wait", "--db", database)
        assert failed.returncode == 1 and len(failed.stderr) < 3_000, len(failed.stderr)
        assert "… (98,1" in failed.stderr and "more characters: blok-tui show --json has them)" in (
            failed.stderr
        )
        run_id = failed.stderr.split()[3]
        shown = blok("show", run_id, "--db", database)
        assert shown.returncode == 0 and len(shown.stdout) < 12_000, len(shown.stdout)
        for listing in (("runs",), ("dead", "noisy")):  # into a pipe: each row one line
            listed = blok(*listing, "--db", database)
            assert listed.returncode == 0 and len(listed.stdout) < 3_000, len(listed.stdout)
            assert "more characters: blok-tui show --json has them)" in listed.stdout
        whole = blok_json("show", run_id, "--json", "--db", database)
        assert len(whole["error"]) > 100_000
    finally:
        assert worker.stop() == 0
    assert max(len(line) for line in worker.stderr().splitlines()) < 2_200


def test_a_very_long_error_is_cut_to_a_line_without_measuring_all_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The queues view's recent failures measured every cell of each 5 MB error at every
    # refresh: the console at full CPU while it showed them.
    import rich.cells

    from blok_tui.plain_text import one_line, one_line_keeping_where

    measured: list[int] = []
    real = rich.cells.cell_len
    monkeypatch.setattr(
        rich.cells, "cell_len", lambda text: measured.append(len(text)) or real(text)
    )
    place = " (at workflows/noisy.py:6)"
    error = "[step 1/1] shout failed: bad row: " + "z" * 5_000_000 + place
    short = "[step 1/1] shout failed: bad row: " + "z" * 100 + place
    assert one_line_keeping_where(error, 60) == one_line_keeping_where(short, 60)
    assert one_line_keeping_where(error, 60).endswith("z…" + place)
    assert (
        one_line(error, 60)
        == one_line(short, 60)
        == "[step 1/1] shout failed: bad row: " + "z" * 25 + "…"
    )
    assert measured and max(measured) < 1_000, max(measured)
