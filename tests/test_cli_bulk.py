"""`blok-tui cancel` and `blok-tui replay` on many runs, as an operator after an incident types
them: the runs the filters choose (each job once, asked first), or several ids.

Before, both took one run id: "cancel what is queued on naps" was a loop of `runs --json`, `jq`
and one process a run, and "replay what failed in the last hour" the same; the console's bulk
actions had no command-line form."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_helpers import (
    Worker,
    answered_on_a_terminal,
    eventually,
    start_worker,
    write_workflows,
)

from blok_tui.cli import main

Blok = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, Worker]]:
    database = tmp_path / "blok.db"
    worker = start_worker(database, write_workflows(tmp_path / "workflows"))
    yield database, worker
    worker.stop()


@pytest.fixture
def blok(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Blok:
    """`blok-tui ARGS` in this process (its `main`, as the command runs it, without the second
    a Python process takes to start here: this module runs some thirty commands), with no
    terminal: what a script sees. The question on a terminal is asked of a real process."""
    monkeypatch.delenv("BLOK_DB", raising=False)
    monkeypatch.delenv("BLOK_WORKER_ADAPTER", raising=False)

    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        code = main([str(arg) for arg in args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    return run


def _statuses(blok: Blok, database: Path, queue: str) -> dict[str, str]:
    """The queue's runs, by id: their status."""
    runs = json.loads(blok("runs", "--queue", queue, "--json", "--db", database).stdout)
    return {run["id"]: run["status"] for run in runs}


def _enqueued(blok: Blok, database: Path, queue: str, payload: str, n: int) -> set[str]:
    """Enqueue `n` jobs: their runs' ids."""
    before = set(_statuses(blok, database, queue))
    for _ in range(n):
        assert blok("enqueue", queue, payload, "--db", database).returncode == 0
    return set(_statuses(blok, database, queue)) - before


def test_cancel_takes_every_run_the_filters_choose_once_confirmed_or_several_ids(
    served: tuple[Path, Worker], blok: Blok
) -> None:
    database, _ = served
    assert blok("pause", "naps", "--db", database).returncode == 0
    queued = _enqueued(blok, database, "naps", '{"seconds": 0}', 3)
    [other] = _enqueued(blok, database, "single", '{"seconds": 30}', 1)  # on another queue

    # A script has no terminal to be asked on: --yes, or nothing is done.
    unasked = blok("cancel", "--queue", "naps", "--db", database)
    assert unasked.returncode == 2 and unasked.stdout == "", unasked.stderr
    assert unasked.stderr == (
        "blok-tui: error: runs chosen by filters are cancelled only when confirmed: there is "
        "no terminal to ask on, add --yes (see blok-tui cancel --help)\n"
    )
    # On a terminal: what is chosen, asked; "n" keeps them.
    status, out, shown = answered_on_a_terminal(
        "cancel", "--queue", "naps", "--db", database, answer="n"
    )
    assert (status, out) == (1, ""), shown
    assert "Cancel 3 runs? Every run of queue 'naps' that has not ended. [y/N] " in shown
    assert "blok-tui: error: nothing cancelled" in shown
    assert set(_statuses(blok, database, "naps").values()) == {"queued"}

    done = blok("cancel", "--queue", "naps", "--yes", "--db", database)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == sorted(f"{run_id} cancelled" for run_id in queued)
    assert done.stderr == "blok-tui: 3 of 3 run(s) cancelled\n"
    assert set(_statuses(blok, database, "naps").values()) == {"cancelled"}
    assert _statuses(blok, database, "single")[other] in ("queued", "running")  # not chosen

    again = blok("cancel", "--queue", "naps", "--yes", "--db", database)
    assert (again.returncode, again.stdout) == (0, "")
    assert again.stderr == (
        "blok-tui: every run of queue 'naps' that has not ended: no run to cancel.\n"
    )
    # Several ids: each on its own, a refused one said, the rest done.
    first, second = sorted(_enqueued(blok, database, "naps", '{"seconds": 0}', 2))
    several = blok("cancel", first, first, "run_nope", second, other, "--db", database)
    assert several.returncode == 1
    assert several.stdout == f"{first} cancelled\n{second} cancelled\n{other} cancelled\n"
    assert several.stderr.splitlines() == [
        "blok-tui: error: unknown run 'run_nope'",
        "blok-tui: error: 3 of 4 run(s) cancelled, 1 refused",
    ]
    for args, says in (
        (["--status", "completed"], "a completed run has ended: cancel takes runs that have not"),
        ([first, "--queue", "naps"], "give run ids or filters (--queue), not both"),
        ([], "give run ids, or filters that choose the runs (--status, --workflow, "),
    ):
        refused = blok("cancel", *args, "--yes", "--db", database)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
    typo = blok("cancel", "--queue", "nap", "--yes", "--db", database)
    assert typo.returncode == 1 and "unknown queue 'nap'" in typo.stderr, typo.stderr


def test_replay_takes_every_failed_run_once_and_never_a_run_replayed_already(
    served: tuple[Path, Worker], blok: Blok
) -> None:
    """Run twice, a bulk replay of "what failed" replayed the first replays' sources again
    beside the replays themselves (each failed input twice more: a charge twice)."""
    database, _ = served
    sources = set()
    for _ in range(2):
        failed = blok("enqueue", "naps", '{"seconds": "later"}', "--wait", "--db", database)
        sources.add(failed.stderr.split()[3])
    fine = blok("enqueue", "naps", '{"seconds": 0}', "--wait", "--db", database)
    assert fine.returncode == 0

    first = blok("replay", "--queue", "naps", "--yes", "--db", database)
    assert first.returncode == 0, first.stderr
    replays = {}
    for line in first.stdout.splitlines():
        source, _, _, _, _, _, new = line.split()
        replays[source] = new
    assert set(replays) == sources  # the failed runs, not the completed one
    assert first.stderr == (
        "blok-tui: 2 are dead letters, and stay in the dead-letter queue once replayed.\n"
        "blok-tui: 2 of 2 run(s) replayed\n"
    )
    # Same input, same code: failed again.
    eventually(
        lambda: {_statuses(blok, database, "naps")[new] for new in replays.values()} == {"failed"}
    )

    second = blok("replay", "--queue", "naps", "--yes", "--db", database)
    assert second.returncode == 0, second.stderr
    again = {line.split()[0] for line in second.stdout.splitlines()}
    assert again == set(replays.values())  # each line's newest run, once
    assert "Left out, by job: 2 replayed already." in second.stderr
    assert second.stderr.endswith("blok-tui: 2 of 2 run(s) replayed\n")

    status, out, shown = answered_on_a_terminal(
        "replay", "--status", "failed", "--db", database, answer="n"
    )
    assert (status, out) == (1, ""), shown
    assert "Replay 2 runs? Every failed run. Left out, by job: 4 replayed already." in shown

    running = blok("replay", "--status", "running", "--db", database)
    assert running.returncode == 2
    assert "a running run has not ended: replay takes runs that have" in running.stderr
    new_input = blok("replay", "--queue", "naps", "--input", "{}", "--db", database)
    assert new_input.returncode == 2
    assert "--input gives one run a new input: give its RUN_ID, not filters" in new_input.stderr
