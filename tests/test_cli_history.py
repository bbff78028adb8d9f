"""What a walkthrough on a database with a long history found of the `blok-tui` command: lists
cut at their limit (1,000 dead letters of 4,499, 50 runs of 16,500) without a word, and no way
to list the older dead letters. Real subprocesses on a real SQLite file, a few rows each."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_helpers import Worker, blok, blok_json, eventually, start_worker, write_workflows

from engine import Engine, EngineError

DEAD = 3  # dead letters on the queue `naps`
COMPLETED = 5  # runs that completed on the queue `single`


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A database with a few dead letters on `naps` and a few completed runs on `single`."""
    root = tmp_path_factory.mktemp("history")
    database = root / "blok.db"
    worker: Worker = start_worker(database, write_workflows(root / "workflows"))
    try:
        for _ in range(DEAD):  # a bad input fails the nap; no retries: a dead letter
            assert blok("enqueue", "naps", '{"seconds": "later"}', "--db", database).returncode == 0
        for _ in range(COMPLETED):
            assert blok("enqueue", "single", '{"seconds": 0}', "--db", database).returncode == 0

        def settled() -> bool:
            queues = {q["name"]: q for q in blok_json("queues", "--json", "--db", database)}
            return queues["naps"]["dead"] == DEAD and queues["single"]["completed"] == COMPLETED

        eventually(settled, timeout=30)
    finally:
        assert worker.stop() == 0, worker.stderr()
    yield database


def _rows(stdout: str) -> list[str]:
    """The table's rows, its header left out."""
    return stdout.splitlines()[1:]


# ---- 1: dead letters --------------------------------------------------------------------------
def test_dead_says_when_the_list_is_cut_and_limit_lists_more(history: Path) -> None:
    # `blok-tui dead boom` listed 1,000 dead letters and stopped, while `queues` said 4,499
    # dead: no word that the list was cut, and no way to list the older ones.
    every = blok_json("dead", "naps", "--json", "--db", history)
    assert len(every) == DEAD
    cut = blok("dead", "naps", "--limit", "2", "--db", history)
    assert cut.returncode == 0, cut.stderr
    assert [row.split()[0] for row in _rows(cut.stdout)] == [job["id"] for job in every[:2]]
    assert cut.stderr == (
        f"blok-tui: showing the newest 2 of {DEAD} dead letters on 'naps' (--limit N for more)\n"
    )
    # JSON stays a plain list on stdout; the note goes to stderr there too.
    as_json = blok("dead", "naps", "--json", "--limit", "2", "--db", history)
    assert as_json.returncode == 0, as_json.stderr
    assert [job["id"] for job in json.loads(as_json.stdout)] == [job["id"] for job in every[:2]]
    assert as_json.stderr == cut.stderr
    # All of them listed (the default, or a limit that takes them all): nothing to say.
    for args in ((), ("--limit", str(DEAD))):
        whole = blok("dead", "naps", *args, "--db", history)
        assert (whole.returncode, whole.stderr) == (0, ""), whole.stderr
        assert len(_rows(whole.stdout)) == DEAD


@pytest.mark.parametrize("given", ["0", "-1", "many"])
def test_dead_refuses_a_limit_that_is_not_a_whole_number_from_1(history: Path, given: str) -> None:
    done = blok("dead", "naps", "--limit", given, "--db", history)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("blok-tui: error: argument --limit: "), line


def test_the_engines_dead_letters_take_a_limit(history: Path) -> None:
    # The operator API read at most 1,000 dead letters, whatever the caller needed.
    async def main() -> tuple[list[Any], list[Any], list[Any]]:
        async with Engine(database=history, create=False, follow=False) as engine:
            with pytest.raises(EngineError, match="limit must be a whole number from 0 up"):
                await engine.dead_letters("naps", limit=-1)
            return (
                await engine.dead_letters("naps", limit=1),
                await engine.dead_letters("naps", limit=None),
                await engine.dead_letters("naps"),
            )

    one, every, default = anyio.run(main)
    assert len(one) == 1 and len(every) == len(default) == DEAD
    assert one[0].id == every[0].id


# ---- 2: runs ----------------------------------------------------------------------------------
def test_runs_says_on_stderr_when_more_match_than_it_printed(history: Path) -> None:
    # `blok-tui runs` printed its 50 rows of 16,500 with no word that the list was cut.
    total = DEAD + COMPLETED
    cut = blok("runs", "--limit", "3", "--db", history)
    assert cut.returncode == 0, cut.stderr
    assert len(_rows(cut.stdout)) == 3  # stdout is the table alone: pipes keep working
    assert cut.stderr == (
        f"blok-tui: 3 of {total} runs shown (newest first; --limit N, or filter with "
        "--status/--workflow/--queue/--text/--since)\n"
    )
    # Counted with the same filter; the hint leaves out the filters already given.
    failed = blok("runs", "--status", "failed", "--limit", "2", "--db", history)
    assert failed.stderr == (
        f"blok-tui: 2 of {DEAD} runs shown (newest first; --limit N, or filter with "
        "--workflow/--queue/--text/--since)\n"
    )
    single = blok("runs", "--queue", "single", "--limit", "3", "--db", history)
    assert single.stderr == (
        f"blok-tui: 3 of {COMPLETED} runs shown (newest first; --limit N, or filter with "
        "--status/--workflow/--text/--since)\n"
    )
    # Within a window (these runs were all made in the last day), counted in it.
    recent = blok("runs", "--since", "1d", "--limit", "3", "--db", history)
    assert recent.stderr == (
        f"blok-tui: 3 of {total} runs shown (newest first; --limit N, or filter with "
        "--status/--workflow/--queue/--text)\n"
    )

    # Nothing left out, or a script reading the JSON: nothing said.
    for args in (
        ("--limit", "3", "--json"),
        ("--limit", str(total)),
        ("--status", "failed", "--limit", str(DEAD)),
    ):
        done = blok("runs", *args, "--db", history)
        assert (done.returncode, done.stderr) == (0, ""), (args, done.stderr)


def test_runs_text_finds_the_runs_that_hold_it(history: Path) -> None:
    # No way to find an order's run from the command line but paging through `runs`.
    held = blok_json("runs", "--text", "LATER", "--json", "--db", history)  # any case
    assert len(held) == DEAD and all(run["input"] == {"seconds": "later"} for run in held)
    table = blok("runs", "--text", "later", "--limit", "2", "--db", history)
    assert len(_rows(table.stdout)) == 2
    assert table.stderr.startswith(f"blok-tui: 2 of {DEAD} runs shown"), table.stderr
    none = blok("runs", "--text", "no-such-order", "--db", history)
    assert (none.returncode, none.stdout) == (0, "no runs holding 'no-such-order'\n")
    follow = blok("runs", "--text", "later", "--follow", "--db", history)
    assert follow.returncode == 2 and "--text lists the runs that hold it" in follow.stderr


def test_dead_into_a_pipe_prints_each_error_whole(history: Path) -> None:
    # Cut at 70 characters, piped too: the order and the file and line were lost for grep.
    listed = blok("dead", "naps", "--db", history).stdout  # a pipe, not a terminal
    errors = [job["error"] for job in blok_json("dead", "naps", "--json", "--db", history)]
    assert errors and all(" ".join(error.split()) in listed for error in errors), listed


def test_runs_status_dead_points_at_the_dead_letters_by_queue(history: Path) -> None:
    # The on-call walkthrough typed `runs --status dead` for the dead letters and was told
    # only the twelve run statuses: "dead" is a job's state, listed by `blok-tui dead QUEUE`.
    done = blok("runs", "--status", "dead", "--db", history)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines()[0] == (
        "blok-tui: error: dead is not a run status: a job that used up its retries is a dead "
        "letter, and its last run failed (blok-tui runs --status failed); they are listed by "
        f"queue: blok-tui dead naps ({DEAD}) (see blok-tui runs --help)"
    )
    none = blok("runs", "--status", "dead", "--queue", "single", "--db", history)
    assert none.returncode == 2
    assert none.stderr.splitlines()[0].endswith(
        "they are listed by queue (queue single has none) (see blok-tui runs --help)"
    )
