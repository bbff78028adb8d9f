"""A SQLite file that another process locks, a full disk, a damaged file, a file others can read,
another program's file (issue 15, items 3, 4, 5 and 12): real files, real processes."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from contextlib import closing
from pathlib import Path

import pytest
from cli_helpers import blok, cli_env
from support import until

from engine import DatabaseError, Engine, RunStatus, Step, WorkerTrigger, Workflow
from engine.backends.sqlite import refusals

pytestmark = pytest.mark.anyio


async def echo(ctx) -> object:
    return ctx.body


ECHO = Workflow(name="echo", trigger=WorkerTrigger(queue="echo"), steps=[Step("echo", echo)])

HOLDER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")  # the write lock, as a VACUUM or a migration holds it
    print("held", flush=True)
    sys.stdin.readline()
    conn.execute("COMMIT")
    print("released", flush=True)
    """
)


def hold_write_lock(db: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def release(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "released"
    holder.wait(timeout=10)


def start_command(stderr: Path, *args: str) -> subprocess.Popen[str]:
    """`blok-tui ARGS`, started (its stderr written to a file the test can read as it grows)."""
    with stderr.open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "blok_tui", *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=cli_env(),
        )


# ---- busy (item 3) -------------------------------------------------------------------------------
async def test_a_write_lock_held_past_the_busy_timeout_is_waited_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("BLOK_SQLITE_BUSY_TIMEOUT_MS", "200")  # a 10 s default, made short
    caplog.set_level(logging.WARNING, logger="blok.sqlite")
    db = tmp_path / "blok.db"
    async with Engine(workflows=[ECHO], database=db) as worker:  # idle, claiming
        await worker.flush()
        holder = hold_write_lock(db)
        stderr = tmp_path / "enqueue.stderr"
        try:
            enqueue = start_command(stderr, "enqueue", "echo", '{"n": 1}', "--db", str(db))
            # The command waits for the lock (and says so) instead of giving up.
            await until(lambda: "is busy" in stderr.read_text(), timeout=20)
            # The idle worker met the lock too (its claims, its heartbeat): it waits, alive.
            await until(lambda: "is busy" in caplog.text, timeout=20)
            assert enqueue.poll() is None
        finally:
            release(holder)
        out, _ = enqueue.communicate(timeout=30)
        assert enqueue.returncode == 0, stderr.read_text()
        job = out.strip()
        run = await worker.wait_for_job(job, timeout=20)
        assert run.status is RunStatus.COMPLETED and run.output == {"n": 1}
    said = stderr.read_text()
    assert "not a usable SQLite database" not in said and "Traceback" not in said
    assert "written again after" in caplog.text  # and it says when it is over


# ---- damage (item 5) -----------------------------------------------------------------------------
async def damaged_database(tmp_path: Path) -> Path:
    db = tmp_path / "blok.db"
    async with Engine(workflows=[ECHO], database=db, consume=False) as engine:
        await engine.enqueue_many("echo", [{"n": n, "pad": "x" * 300} for n in range(3000)])
    size = db.stat().st_size
    with db.open("r+b") as file:  # pages in the middle, not the header
        file.seek(size // 2 - (size // 2) % 4096)
        file.write(os.urandom(4 * 4096))
    return db


async def test_a_damaged_file_is_refused_on_open_in_one_line(tmp_path: Path) -> None:
    db = await damaged_database(tmp_path)
    for args in (("runs",), ("enqueue", "echo", "{}")):
        done = blok(*args, "--db", db)
        assert done.returncode == 1, done
        assert done.stdout == ""
        [line] = done.stderr.splitlines()
        assert line.startswith(f"blok-tui: error: {db}: the database file is damaged")
    with pytest.raises(DatabaseError, match="the database file is damaged"):
        async with Engine(workflows=[ECHO], database=db):
            pass  # a worker does not serve it


async def test_a_large_file_is_read_whole_only_by_the_workers_that_serve_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite's quick_check reads the whole file: every command, console start and `health`
    # took 2 s on a 130 MB database, 34 s on a 600 MB one after the page cache was dropped.
    db = tmp_path / "blok.db"
    async with Engine(workflows=[ECHO], database=db, consume=False) as engine:
        await engine.enqueue("echo", {"n": 1})
    with closing(sqlite3.connect(db)) as conn:  # pages at the end that blok never reads
        conn.execute("CREATE TABLE filler (x BLOB)")
        conn.executemany("INSERT INTO filler VALUES (?)", [(os.urandom(3000),)] * 1000)
        conn.commit()
    size = db.stat().st_size
    with db.open("r+b") as file:
        file.seek(size - size % 4096 - 64 * 4096)
        file.write(os.urandom(16 * 4096))
    monkeypatch.setattr(refusals, "QUICK_CHECK_MAX_BYTES", size - 1)
    async with Engine(database=db, create=False) as client:  # a command, the console
        assert (await client.health()).database["ok"]  # not read whole either
    with pytest.raises(DatabaseError, match="the database file is damaged"):
        async with Engine(workflows=[ECHO], database=db):
            pass  # a worker still does not serve it


# ---- permissions (item 12) -----------------------------------------------------------------------
async def test_a_database_others_can_read_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="blok.sqlite")
    db = tmp_path / "blok.db"
    async with Engine(workflows=[ECHO], database=db):
        pass
    assert db.stat().st_mode & 0o777 == 0o600
    assert "readable by" not in caplog.text
    async with Engine(workflows=[ECHO], database=db):
        pass
    assert "readable by" not in caplog.text
    db.chmod(0o644)
    async with Engine(database=db, create=False):
        pass
    assert f"{db} is readable by group and others (mode 0o644)" in caplog.text
    assert f"chmod 600 {db}" in caplog.text
    done = blok("runs", "--db", db)  # the command line says it too
    assert done.returncode == 0 and "is readable by group and others" in done.stderr


def test_a_command_leaves_another_programs_database_exactly_as_it_was(tmp_path: Path) -> None:
    import sqlite3

    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.commit()
    conn.close()
    before = hashlib.sha256(other.read_bytes()).hexdigest()
    for args in (("runs",), ("enqueue", "echo", "{}"), ("pause", "echo")):
        done = blok(*args, "--db", other)
        assert done.returncode == 1
        [line] = done.stderr.splitlines()
        assert "not a blok database (it holds 1 other table(s); blok will not add its own)" in line
    # Not a table added, not even the journal mode changed: the same bytes.
    assert hashlib.sha256(other.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.sqlite"]


# ---- disk full (item 4) --------------------------------------------------------------------------
DISK_FULL_DRIVER = textwrap.dedent(
    """
    import json, sys, threading, time, anyio
    from pathlib import Path
    from engine import Engine, Step, WorkerTrigger, Workflow

    async def echo(ctx):
        return ctx.body["n"]

    wf = Workflow(name="echo", trigger=WorkerTrigger(queue="echo", concurrency=4),
                  steps=[Step("echo", echo)])

    async def main():
        mount = Path(sys.argv[1])
        async with Engine(workflows=[wf], database=mount / "blok.db") as engine:
            first = [await engine.enqueue("echo", {"n": n}) for n in range(5)]
            for job in first:
                await engine.wait_for_job(job, timeout=10)
            full = threading.Event()

            def hog():  # takes every byte that frees up, until told to stop
                with open(mount / "filler", "wb", buffering=0) as filler:
                    while not (mount / "stop").exists():
                        try:
                            filler.write(b"x" * 4096)
                        except OSError:
                            full.set()
                            time.sleep(0.005)
                (mount / "filler").unlink()

            threading.Thread(target=hog, daemon=True).start()
            full.wait()
            print("full", flush=True)
            jobs = []
            async with anyio.create_task_group() as tg:
                async def add(n):
                    jobs.append(await engine.enqueue("echo", {"n": n, "pad": "y" * 20000}))
                for n in range(5, 25):
                    tg.start_soon(add, n)
            runs = [await engine.wait_for_job(job, timeout=30) for job in first + jobs]
            print(json.dumps([[run.job_id, str(run.status), run.output] for run in runs]))
            everything = await engine.runs(limit=1000)
            print(json.dumps(sorted(run.job_id for run in everything)), flush=True)

    anyio.run(main)
    """
)


def test_a_full_disk_is_said_in_one_line_waited_out_and_loses_nothing(tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        env = {**cli_env(), "PYTHONPATH": os.pathsep.join(sys.path)}
        driver = subprocess.Popen(
            [sys.executable, "-c", DISK_FULL_DRIVER, str(mount)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert driver.stdout is not None and driver.stderr is not None
        assert driver.stdout.readline().strip() == "full"
        said = ""
        deadline = time.monotonic() + 30
        while "disk full" not in said and time.monotonic() < deadline:
            said += driver.stderr.readline()
        assert "disk full" in said, said
        (mount / "stop").touch()  # space again
        out, rest = driver.communicate(timeout=60)
        said += rest
        assert driver.returncode == 0, said
        results, stored = (line for line in out.splitlines() if line.strip())
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        shutil.rmtree(mount, ignore_errors=True)
    import json

    runs = json.loads(results)
    assert len(runs) == 25
    assert all(status == "completed" for _, status, _ in runs)
    assert sorted(output for _, _, output in runs) == list(range(25))  # nothing lost
    assert sorted(json.loads(stored)) == sorted(job for job, _, _ in runs)  # nothing twice
    errors = [line for line in said.splitlines() if "disk full" in line]
    assert len(errors) == 1, said  # one line, not a traceback per attempt
    assert str(mount / "blok.db") in errors[0]
    assert "Traceback" not in said and "cannot rollback" not in said
    assert "written again after" in said  # and when it is over
