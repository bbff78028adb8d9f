"""What an operator types, tried as a clumsy or hostile one would: payloads from files and
stdin, out-of-range numbers, deep or non-standard JSON, bad queue names, and run text that
would drive the terminal. Real `blok-tui` subprocesses on a real SQLite file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import (
    Worker,
    blok,
    blok_json,
    cli_env,
    eventually,
    run_of,
    start_worker,
    write_workflows,
)

from engine.validation import MAX_DEPTH

WORKFLOWS = """
from engine import Step, Workflow, WorkerTrigger


async def echo(ctx):
    return ctx.body


async def shout(ctx):
    raise RuntimeError(ctx.body["text"])


workflows = [
    Workflow(name="test.echo", trigger=WorkerTrigger(queue="echo", concurrency=4),
             steps=[Step("echo", echo)]),
    Workflow(name="test.shout", trigger=WorkerTrigger(queue="shout"),
             steps=[Step("shout", shout)]),
]
"""
INT64_MAX = 2**63 - 1
# What a terminal acts on instead of showing (engine/text.py): no such byte may reach it.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Worker]]:
    root = tmp_path_factory.mktemp("cli-input")
    (root / "workflows").mkdir()
    (root / "workflows" / "flows.py").write_text(WORKFLOWS)
    database = root / "blok.db"
    worker = start_worker(database, root / "workflows")
    yield database, worker
    assert worker.stop() == 0, worker.stderr()


def blok_in(stdin: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """`blok-tui ARGS` with `stdin` on its standard input."""
    env = {k: v for k, v in os.environ.items() if k not in ("BLOK_DB", "BLOK_WORKER_ADAPTER")}
    return subprocess.run(
        [sys.executable, "-m", "blok_tui", *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


def one_error_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("blok-tui: error: "), done.stderr
    return lines[0]


def completed(database: Path, job_id: str) -> dict[str, Any]:
    return eventually(
        lambda: (r := run_of(database, job_id)) and r["status"] == "completed" and r, timeout=20
    )


def run_ids(database: Path) -> set[str]:
    return {run["id"] for run in blok_json("runs", "--json", "--limit", "1000", "--db", database)}


# ---- item 11: payloads from a file or stdin ---------------------------------------------------
def test_a_payload_too_big_for_the_command_line_comes_from_a_file(
    served: tuple[Path, Worker], tmp_path: Path
) -> None:
    database, _ = served
    payload = {"rows": ["x" * 100 for _ in range(2000)]}  # ~210 KB: above Linux's 128 KB per arg
    path = tmp_path / "big.json"
    path.write_text(json.dumps(payload))
    assert path.stat().st_size > 131_072
    done = blok("enqueue", "echo", f"@{path}", "--db", database)
    assert done.returncode == 0, done.stderr
    run = completed(database, done.stdout.strip())
    assert run["input"] == payload and run["output"] == payload


def test_a_payload_comes_from_stdin(served: tuple[Path, Worker]) -> None:
    database, _ = served
    payload = {"from": "stdin", "n": [1, 2, 3]}
    done = blok_in(json.dumps(payload), "enqueue", "echo", "-", "--db", database)
    assert done.returncode == 0, done.stderr
    assert completed(database, done.stdout.strip())["output"] == payload


def test_replay_takes_its_input_from_a_file(served: tuple[Path, Worker], tmp_path: Path) -> None:
    database, _ = served
    first = blok("enqueue", "echo", '{"v": 1}', "--db", database)
    assert first.returncode == 0, first.stderr
    run = completed(database, first.stdout.strip())
    (tmp_path / "other.json").write_text('{"v": 2}')
    again = blok("replay", run["id"], "--input", f"@{tmp_path / 'other.json'}", "--db", database)
    assert again.returncode == 0, again.stderr
    new_id = again.stdout.strip()
    replayed = eventually(
        lambda: next(
            (
                r
                for r in blok_json("runs", "--json", "--db", database)
                if r["id"] == new_id and r["status"] == "completed"
            ),
            None,
        ),
        timeout=20,
    )
    assert replayed["output"] == {"v": 2} and replayed["replay_of"] == run["id"]


def at(path: Path, text: str) -> str:
    """Write `text` to `path`; the argument that names it."""
    path.write_text(text)
    return f"@{path}"


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: f"@{d / 'missing.json'}", "cannot read {d}/missing.json: No such file"),
        (lambda d: f"@{d}", "cannot read {d}: Is a directory"),
        (lambda d: "@", "@ needs a file name"),
        (
            lambda d: at(d / "bad.json", '{"a": '),
            "not valid JSON in {d}/bad.json (Expecting value: line 1 column 7",
        ),
        (lambda d: at(d / "nan.json", '{"a": NaN}'), "{d}/nan.json: NaN is not standard JSON"),
    ],
    ids=["missing-file", "a-folder", "no-name", "bad-json-in-file", "nan-in-file"],
)
def test_a_payload_file_that_cannot_be_used_is_one_line_naming_it(
    tmp_path: Path, make: Any, says: str
) -> None:
    done = blok("enqueue", "echo", make(tmp_path), "--db", tmp_path / "blok.db")
    line = one_error_line(done, 2)
    assert "argument JSON: " + says.format(d=tmp_path) in line
    assert not (tmp_path / "blok.db").exists()  # refused before the database was opened


def test_bad_json_on_stdin_names_stdin(tmp_path: Path) -> None:
    done = blok_in("{oops", "enqueue", "echo", "-", "--db", tmp_path / "blok.db")
    assert "argument JSON: not valid JSON in stdin (Expecting property name" in one_error_line(
        done, 2
    )


def test_a_long_bad_payload_is_not_echoed_whole(tmp_path: Path) -> None:
    done = blok("enqueue", "echo", "{" + "x" * 5000, "--db", tmp_path / "blok.db")
    line = one_error_line(done, 2)
    assert "not valid JSON" in line and len(line) < 300


# ---- item 10: deep nesting, NaN/Infinity, delays ----------------------------------------------
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 256, 1000, 100_000])
def test_deeply_nested_json_is_refused_in_one_line(tmp_path: Path, depth: int) -> None:
    text = "[" * depth + "]" * depth
    path = tmp_path / "deep.json"
    path.write_text(text)
    argument = text if depth < 10_000 else f"@{path}"  # 200 KB does not fit in one argument
    done = blok("enqueue", "echo", argument, "--db", tmp_path / "blok.db")
    line = one_error_line(done, 2)
    assert f"nested deeper than {MAX_DEPTH} levels" in line, line


def test_json_at_the_depth_limit_is_accepted(served: tuple[Path, Worker]) -> None:
    database, _ = served
    payload: Any = "bottom"
    for _ in range(MAX_DEPTH):
        payload = {"d": payload}
    done = blok("enqueue", "echo", json.dumps(payload), "--db", database)
    assert done.returncode == 0, done.stderr
    assert completed(database, done.stdout.strip())["output"] == payload


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"x": NaN}', "NaN is not standard JSON"),
        ('{"x": [1, Infinity]}', "Infinity is not standard JSON"),
        ("[-Infinity]", "-Infinity is not standard JSON"),
        ('{"x": 1e400}', "payload holds Infinity at $.x"),  # overflows to a float infinity
        ('{"k": "\\ud800"}', "payload holds a lone surrogate at $.k"),
        ('{"k": ["\\u0000"]}', "payload holds a NUL character at $.k[0]"),  # jsonb refuses it
        ("[1" + "0" * 5000 + "]", "cannot read the JSON: Exceeds the limit (4300 digits)"),
    ],
    ids=["nan", "infinity", "minus-infinity", "1e400", "lone-surrogate", "nul", "5001-digits"],
)
def test_non_standard_json_is_refused(served: tuple[Path, Worker], text: str, says: str) -> None:
    database, _ = served
    before = run_ids(database)
    done = blok("enqueue", "echo", text, "--db", database)
    assert says in one_error_line(done, 2)
    assert run_ids(database) == before


@pytest.mark.parametrize(
    "delay", ["99999999d", "36600d", "9" * 400 + "s"], ids=["99999999d", "36600d", "400-digits"]
)
def test_a_delay_past_the_bound_is_refused(served: tuple[Path, Worker], delay: str) -> None:
    database, _ = served
    done = blok("enqueue", "echo", "{}", "--delay", delay, "--db", database)
    assert "argument --delay: " in one_error_line(done, 2)
    assert "longer than 100 years" in done.stderr


# ---- item 2: out-of-range priorities ----------------------------------------------------------
@pytest.mark.parametrize("priority", [2**63, -(2**63) - 1, 10**30])
def test_a_priority_outside_64_bits_is_refused_and_the_worker_keeps_serving(
    served: tuple[Path, Worker], priority: int
) -> None:
    database, worker = served
    before = run_ids(database)
    done = blok("enqueue", "echo", "{}", "--priority", str(priority), "--db", database)
    line = one_error_line(done, 2)
    assert f"argument --priority: priority {priority} is outside the signed 64-bit range" in line
    assert run_ids(database) == before  # nothing written
    assert worker.process.poll() is None, worker.stderr()
    ok = blok("enqueue", "echo", '{"after": true}', "--db", database)
    assert ok.returncode == 0, ok.stderr
    assert completed(database, ok.stdout.strip())["output"] == {"after": True}


# ---- a bad value of an enqueue option is a usage error, as the others are -------------------
BAD_ENQUEUE_OPTIONS = [
    (["--timeout", "0"], "argument --timeout: must be at least 1ms, not '0'"),
    (["--timeout", "0s"], "argument --timeout: must be at least 1ms, not '0s'"),
    (["--timeout", "0.4ms"], "argument --timeout: must be at least 1ms, not '0.4ms'"),
    (["--timeout=-1s"], "argument --timeout: duration '-1s' is negative"),
    # What a command line can give: not "or a timedelta", which only Python can.
    (
        ["--timeout", "soon"],
        "argument --timeout: cannot parse duration 'soon': use milliseconds, a string like "
        "'250ms', '5s', '2m', '1h', '1d' (see",
    ),
    (["--delay=-1s"], "argument --delay: duration '-1s' is negative"),
    (["--delay", "99999999d"], "argument --delay: duration '99999999d' is longer than"),
    (["--priority", "1.5"], "argument --priority: not a whole number: '1.5'"),
    (["--priority", str(2**63)], "argument --priority: priority 9223372036854775808 is"),
    (["--retries", "-1"], "argument --retries: must be between 0 and 1000, not -1"),
    (["--retries", "1001"], "argument --retries: must be between 0 and 1000, not 1001"),
    (["--retries", "two"], "argument --retries: not a whole number: 'two'"),
]


@pytest.mark.parametrize(
    ("option", "says"),
    BAD_ENQUEUE_OPTIONS,
    ids=[" ".join(option) for option, _ in BAD_ENQUEUE_OPTIONS],
)
def test_a_bad_enqueue_option_exits_2_with_the_usage_suffix(
    served: tuple[Path, Worker], option: list[str], says: str
) -> None:
    # `--timeout 0` reached the engine, which refused it: exit 1, no "(see ... --help)".
    database, _ = served
    before = run_ids(database)
    done = blok("enqueue", "echo", "{}", *option, "--db", database)
    line = one_error_line(done, 2)
    assert says in line
    assert line.endswith(" (see blok-tui enqueue --help)"), line
    assert run_ids(database) == before  # nothing written


def test_the_extreme_priorities_are_accepted(served: tuple[Path, Worker]) -> None:
    database, _ = served
    for priority in (INT64_MAX, -(2**63)):
        done = blok("enqueue", "echo", "{}", "--priority", str(priority), "--db", database)
        assert done.returncode == 0, done.stderr
        assert completed(database, done.stdout.strip())["priority"] == priority


# ---- item 14: queue names ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "queue name is empty"),
        ("   ", "queue name '   ' is only whitespace"),
        ("ec\x1bho", "queue name 'ec\\x1bho' holds a control character (U+001B)"),
        ("echo\u202e", "queue name 'echo\\u202e' holds a control character (U+202E)"),
    ],
    ids=["empty", "whitespace", "escape", "bidi-override"],
)
@pytest.mark.parametrize(
    "command",
    [
        ["enqueue", "{QUEUE}", "{}"],
        ["pause", "{QUEUE}"],
        ["resume", "{QUEUE}"],
        ["runs", "--queue", "{QUEUE}"],
    ],
    ids=["enqueue", "pause", "resume", "runs"],
)
def test_a_bad_queue_name_is_a_usage_error(
    tmp_path: Path, command: list[str], name: str, says: str
) -> None:
    args = [name if part == "{QUEUE}" else part for part in command]
    done = blok(*args, "--db", tmp_path / "blok.db")
    assert says in one_error_line(done, 2)
    assert not CONTROL.search(done.stderr)


# ---- item 14: --retention ---------------------------------------------------------------------
def test_the_worker_takes_a_retention(tmp_path: Path) -> None:
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "flows.py").write_text(WORKFLOWS)
    worker = start_worker(tmp_path / "blok.db", tmp_path / "workflows", "--retention", "36h")
    try:
        assert "runs that ended are kept for 36h (--retention)" in worker.stderr()
    finally:
        assert worker.stop() == 0, worker.stderr()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("7", "give a unit"),
        ("soon", "cannot parse duration 'soon'"),
        ("0d", "must be more than 0"),
        ("99999999d", "longer than 100 years"),
    ],
)
def test_a_bad_retention_is_a_usage_error(tmp_path: Path, value: str, says: str) -> None:
    done = blok("worker", "--retention", value, "--db", tmp_path / "blok.db")
    line = one_error_line(done, 2)
    assert "argument --retention: " in line and says in line
    assert not (tmp_path / "blok.db").exists()


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        # At 1ms each job was taken from its worker by the next claim, three times: dead.
        ("--lease", "1ms", "must be at least 1s, not '1ms'"),
        ("--lease", "999ms", "must be at least 1s"),
        # At 1ms an idle worker's janitor took 43 % of a core.
        ("--janitor-interval", "1ms", "must be at least 1s, not '1ms'"),
        # Every run deleted as soon as it ended.
        ("--retention", "5s", "must be at least 1m, not '5s'"),
        ("--grace", "1e9", "must be at most a day (86400), not 1e+09"),
    ],
)
def test_a_worker_setting_that_would_do_harm_is_a_usage_error(
    tmp_path: Path, option: str, value: str, says: str
) -> None:
    done = blok("worker", option, value, "--db", tmp_path / "blok.db")
    line = one_error_line(done, 2)
    assert f"argument {option}: {says}" in line
    assert not (tmp_path / "blok.db").exists()


@pytest.mark.parametrize("command", [("runs",), ("worker",), ("cancel", "run_1")])
def test_an_empty_db_is_refused_not_read_as_the_default(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """`--db "$DB"` with $DB unset acted on $BLOK_DB, or ./.blok/blok.db, without a word."""
    done = subprocess.run(
        [sys.executable, "-m", "blok_tui", *command, "--db", ""],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**cli_env(), "BLOK_DB": str(tmp_path / "other.db")},
        timeout=60,
    )
    line = one_error_line(done, 2)
    assert "argument --db: empty: give a SQLite file or a postgresql:// URL" in line
    assert list(tmp_path.iterdir()) == []


# ---- item 7: run text cannot drive the terminal -----------------------------------------------
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x9b31m"  # set the title, clear the screen, a C1 CSI


def test_run_errors_reach_the_terminal_escaped(served: tuple[Path, Worker]) -> None:
    database, worker = served
    done = blok("enqueue", "shout", json.dumps({"text": HOSTILE}), "--db", database)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    run = eventually(
        lambda: (r := run_of(database, job_id)) and r["status"] == "failed" and r, timeout=20
    )
    assert HOSTILE in run["error"]  # stored as it was: only what is printed is escaped

    table = blok("runs", "--queue", "shout", "--db", database)
    assert table.returncode == 0, table.stderr
    assert not CONTROL.search(table.stdout), repr(table.stdout)
    row = next(line for line in table.stdout.splitlines() if line.startswith(run["id"]))
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m" in row
    # The worker's own log too: a job's payload cleared its terminal and retitled its window.
    said = worker.stderr()
    assert f"[{run['id']} shout]: test.shout failed" in said
    assert not CONTROL.search(said) and "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m" in said


def test_runs_json_escapes_every_control_character(served: tuple[Path, Worker]) -> None:
    database, _ = served
    # Every C0 control but NUL (refused at enqueue: PostgreSQL cannot store it), DEL and C1.
    text = "".join(map(chr, range(1, 0x20))) + "\x7f" + "".join(map(chr, range(0x80, 0xA0)))
    done = blok("enqueue", "shout", json.dumps({"text": text}), "--db", database)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    eventually(lambda: (r := run_of(database, job_id)) and r["status"] == "failed" and r)
    listing = blok("runs", "--json", "--queue", "shout", "--db", database)
    assert listing.returncode == 0, listing.stderr
    assert not CONTROL.search(listing.stdout)
    assert any(text in run["error"] for run in json.loads(listing.stdout))


def test_an_error_line_is_escaped(tmp_path: Path) -> None:
    folder = tmp_path / "evil\x1b]0;pwned\x07"
    folder.mkdir()
    (folder / "blok.db").write_text("not a database, and a hostile name")
    done = blok("runs", "--db", folder / "blok.db")
    line = one_error_line(done, 1)
    assert not CONTROL.search(done.stderr), repr(done.stderr)
    assert "evil\\x1b]0;pwned\\x07" in line


def test_enqueue_takes_a_retry_budget_and_a_timeout_for_one_job(tmp_path: Path) -> None:
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"))
    try:
        done = blok(
            "enqueue",
            "naps",
            '{"seconds": 5}',
            "--retries",
            "4",
            "--timeout",
            "100ms",
            "--db",
            database,
        )
        assert done.returncode == 0, done.stderr
        job = done.stdout.strip()
        run = eventually(lambda: (r := run_of(database, job)) and r["status"] == "timed_out" and r)
        assert run["status"] == "timed_out"  # the job's own timeout, not the trigger's (none)
        refused = blok("enqueue", "naps", "{}", "--retries", "-1", "--db", database)
        assert refused.returncode == 2 and "--retries" in refused.stderr
    finally:
        assert worker.stop() == 0, worker.stderr()


def test_a_where_that_waits_for_no_answer_is_a_usage_error(tmp_path: Path) -> None:
    """`where --timeout 0` could get no answer, and blamed a live worker for it."""
    done = blok("where", "run_1", "--timeout", "0", "--db", tmp_path / "blok.db")
    assert "argument --timeout: must be more than 0, not '0'" in one_error_line(done, 2)
