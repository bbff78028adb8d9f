"""Bad input, tried: each one ends in a clear message naming what was wrong, never a traceback,
and the engine goes on serving everything else."""

from __future__ import annotations

import gc
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import warnings
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from support import marked_line

from engine import (
    DatabaseError,
    Engine,
    EngineError,
    JobState,
    Retry,
    RunStatus,
    Step,
    StepStatus,
    UnknownQueue,
    WorkerTrigger,
    Workflow,
    WorkflowDefinitionError,
    wait,
)

NOBODY = 65534


@pytest.fixture(params=["memory", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    return None if request.param == "memory" else tmp_path / "blok.db"


async def echo(ctx: Any) -> Any:
    return ctx.body


def echo_flow(queue: str = "echo") -> Workflow:
    return Workflow(name=queue, trigger=WorkerTrigger(queue=queue), steps=[Step("echo", echo)])


GOOD_FILE = """
from engine import Step, WorkerTrigger, Workflow


async def echo(ctx):
    return ctx.body


workflow = Workflow(name="good", trigger=WorkerTrigger(queue="good"), steps=[Step("echo", echo)])
"""


async def serves(engine: Engine, queue: str) -> None:
    """The engine still runs jobs on `queue` end to end."""
    job = await engine.enqueue(queue, {"still": "serving"})
    run = await engine.wait_for_job(job, timeout=10)
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.output == {"still": "serving"}


# ---- workflow files ---------------------------------------------------------------------------
@pytest.mark.anyio
async def test_a_workflow_file_that_raises_on_import_is_reported_with_file_and_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "good.py").write_text(GOOD_FILE)
    bad = tmp_path / "broken.py"
    bad.write_text("import os\n\nraise RuntimeError('the config service is down')\n")
    async with Engine(workflows=tmp_path) as engine:
        key = str(bad.resolve())
        assert engine.reload_errors == {key: f"{key}:3: RuntimeError: the config service is down"}
        assert [w.name for w in await engine.workflows()] == ["good"]
        await serves(engine, "good")


@pytest.mark.anyio
async def test_a_workflow_file_with_a_bad_definition_points_at_the_line(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(GOOD_FILE)
    bad = tmp_path / "slow_charge.py"
    bad.write_text(
        textwrap.dedent(
            """
            from engine import Step, WorkerTrigger, Workflow


            async def charge(ctx):
                return 1


            workflow = Workflow(
                name="slow",
                trigger=WorkerTrigger(queue="slow"),
                steps=[
                    Step("charge", charge, max_duration="10 parsecs"),
                ],
            )
            """
        )
    )
    async with Engine(workflows=tmp_path) as engine:
        key = str(bad.resolve())
        message = engine.reload_errors[key]
        assert message.startswith(f"{key}:13: WorkflowDefinitionError: step 'charge': ")
        assert "max_duration: cannot parse duration '10 parsecs'" in message
        await serves(engine, "good")


@pytest.mark.anyio
async def test_a_workflow_defined_twice_in_one_file_points_at_both_lines(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(GOOD_FILE)
    twice = tmp_path / "twice.py"
    twice.write_text(
        textwrap.dedent(
            """
            from engine import Step, WorkerTrigger, Workflow

            workflows = [
                Workflow(name="x", trigger=WorkerTrigger(queue="a"), steps=[Step("s", print)]),
                Workflow(
                    name="x",
                    trigger=WorkerTrigger(queue="b"),
                    steps=[Step("s", print)],
                ),
            ]
            """
        )
    )
    # In another file than the first: the lines of both too.
    (tmp_path / "other.py").write_text(GOOD_FILE.replace('queue="good"', 'queue="other"'))
    async with Engine(workflows=tmp_path) as engine:
        key, other = str(twice.resolve()), str((tmp_path / "other.py").resolve())
        assert engine.reload_errors == {
            key: f"{key}:6: workflow 'x' is defined twice in this file (first at line 5)",
            other: f"{other}:9: workflow 'good' is already defined in "
            f"{(tmp_path / 'good.py').resolve()}:9",
        }
        await serves(engine, "good")


LOOPING_FILE = """
from engine import Step, WorkerTrigger, Workflow

ticks = 0
while True:
    ticks += 1
"""

LOOP_SCRIPT = """
import json
import sys

import anyio

from engine import Engine


async def main() -> None:
    engine = Engine(workflows=sys.argv[1])
    engine.import_timeout = 0.5
    async with engine:
        job = await engine.enqueue("good", {"n": 1})
        run = await engine.wait_for_job(job, timeout=10)
        print(json.dumps({"errors": engine.reload_errors, "status": str(run.status)}))


anyio.run(main)
"""


def test_a_workflow_file_that_never_finishes_importing_times_out(tmp_path: Path) -> None:
    # In a subprocess: a runaway import cannot be killed, only abandoned, and it would keep
    # spinning in this test process for the rest of the session.
    folder = tmp_path / "workflows"
    folder.mkdir()
    (folder / "good.py").write_text(GOOD_FILE)
    looping = folder / "looping.py"
    looping.write_text(LOOPING_FILE)
    script = tmp_path / "load.py"
    script.write_text(LOOP_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(folder)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    key = str(looping.resolve())
    message = report["errors"][key]
    assert message.split(": ", 1)[0] in (f"{key}:5", f"{key}:6")  # the line it was stuck on
    assert "import did not finish within 0.5s" in message
    assert report["status"] == "completed"  # the other file serves; the process could exit


# ---- what a node returns ----------------------------------------------------------------------
class Opaque:
    pass


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("returned", "named"),
    [
        (Opaque(), "Opaque"),
        # What pydantic makes JSON of is stored so (test_json_values.py); beside what it cannot,
        # the first value that is not JSON is named.
        ({"when": datetime(2026, 1, 1, tzinfo=UTC), "what": Opaque()}, "$.when is a datetime"),
        ([{1, 2}, Opaque()], "$[0] is a set"),
    ],
)
async def test_a_node_returning_something_unserialisable_fails_its_step_clearly(
    database: Path | None, returned: object, named: str
) -> None:
    async def make(ctx: Any) -> object:
        return returned

    # Every attempt would return the same kind of value: neither budget is spent on it.
    flow = Workflow(
        name="maker",
        trigger=WorkerTrigger(queue="maker", retries=2, delay="10ms"),
        steps=[Step("make", make, retry=Retry(max_attempts=3)), Step("after", echo)],
    )
    async with Engine(workflows=[flow, echo_flow()], database=database) as engine:
        job_id = await engine.enqueue("maker", {})
        run = await engine.wait_for_job(job_id, timeout=10)
        assert (await engine.get_job(job_id)).state is JobState.DEAD
        assert len(run.steps[0].attempts) == 1 and run.job_attempt == 1
        assert run.status is RunStatus.FAILED
        assert run.error_step == "make"
        assert run.error is not None
        assert run.error.startswith("[step 1/2] make failed: the return value of make is not")
        assert "JSON-serialisable" in run.error and named in run.error
        make_step, after_step = run.steps
        assert make_step.status is StepStatus.FAILED and make_step.output is None
        assert make_step.attempts[-1].error_type == "UnstorableOutput"
        assert after_step.status is StepStatus.PENDING
        await serves(engine, "echo")


async def forgot_await(ctx: Any) -> Any:
    return echo(ctx)  # a coroutine: `await` forgotten


async def forgot_await_inside(ctx: Any) -> Any:
    return {"label": echo(ctx)}  # in a dict: the more common slip, and it said no more


def yields(ctx: Any) -> Any:
    return (n for n in range(3))  # a generator: a list was meant


def looks_up(ctx: Any) -> Any:
    return ctx.body["amount"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("node", "said"),
    [
        (forgot_await, "is a coroutine (echo) that was never awaited: did you forget `await`?"),
        (
            forgot_await_inside,
            "$.label is a coroutine (echo) that was never awaited: did you forget `await`?",
        ),
        (yields, "is a generator (yields.<locals>.<genexpr>): a node returns its value"),
        (looks_up, "n failed: KeyError: 'amount' (at "),
    ],
)
async def test_a_nodes_mistake_is_named_in_its_one_line(
    database: Path | None, node: Any, said: str
) -> None:
    """A forgotten `await` read "$ is a coroutine" (and Python warned of a coroutine never
    awaited, pointing into the engine); a KeyError read "'amount'", its type left out."""
    flow = Workflow(name="oops", trigger=WorkerTrigger(queue="oops"), steps=[Step("n", node)])
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")  # a coroutine never awaited warns, pointing at us
        async with Engine(workflows=[flow], database=database) as engine:
            run = await engine.wait_for_job(await engine.enqueue("oops", {}), timeout=10)
            gc.collect()
    assert not [w for w in warned if "'echo' was never awaited" in str(w.message)]
    assert run.status is RunStatus.FAILED
    assert said in (run.error or ""), run.error


# ---- payloads ---------------------------------------------------------------------------------
async def assert_nothing_written(engine: Engine, database: Path | None, queue: str) -> None:
    stats = await engine.queue_stats(queue)
    assert (stats.waiting, stats.active, stats.delayed, stats.completed, stats.failed) == (
        0,
        0,
        0,
        0,
        0,
    )
    assert await engine.runs() == []
    assert await engine.count_runs() == 0
    if database is not None:
        with closing(sqlite3.connect(database)) as conn:
            assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)


TEN_MB = {"blob": "x" * 10 * 1024 * 1024}


@pytest.mark.anyio
async def test_a_10mb_payload_is_refused_with_the_cap_in_the_message(
    database: Path | None,
) -> None:
    async with Engine(workflows=[echo_flow()], database=database) as engine:
        with pytest.raises(EngineError) as refused:
            await engine.enqueue("echo", TEN_MB)
        message = str(refused.value)
        size = len(json.dumps(TEN_MB).encode())  # the payload as it would be stored
        assert f"payload is {size:,} bytes, above the 1,048,576-byte cap" in message
        assert "max_payload_bytes" in message
        with pytest.raises(EngineError, match="above the 1,048,576-byte cap"):
            await engine.enqueue_many("echo", [{"small": 1}, TEN_MB])
        await assert_nothing_written(engine, database, "echo")
        await serves(engine, "echo")


@pytest.mark.anyio
async def test_the_payload_cap_is_configurable(database: Path | None) -> None:
    async with Engine(
        workflows=[echo_flow()], database=database, max_payload_bytes=11 * 1024 * 1024
    ) as engine:
        run = await engine.wait_for_job(await engine.enqueue("echo", TEN_MB), timeout=20)
        assert run.status is RunStatus.COMPLETED
        assert run.output == TEN_MB
    async with Engine(workflows=[echo_flow()], max_payload_bytes=100) as engine:
        with pytest.raises(EngineError, match="above the 100-byte cap"):
            await engine.enqueue("echo", {"text": "y" * 200})


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda e: e.enqueue("nope", {}), "unknown queue 'nope' (queues: echo)"),
        (lambda e: e.enqueue("echo", {}, delay=-5), "delay: duration -5 is negative"),
        (lambda e: e.enqueue("echo", {}, delay="-5s"), "delay: duration '-5s' is negative"),
        (lambda e: e.enqueue("echo", {}, delay="soon"), "delay: cannot parse duration 'soon'"),
        (lambda e: e.enqueue("echo", object()), "payload is not JSON-serialisable"),
        # A datetime alone is stored in its JSON form; beside an object nothing makes JSON of,
        # refused, named as it was.
        (
            lambda e: e.enqueue("echo", {"at": datetime.now(UTC), "what": object()}),
            "payload is not JSON-serialisable: $.at is a datetime",
        ),
        (lambda e: e.enqueue("echo", b"{}"), "$ is a bytes (JSON text? json.loads() it first)"),
        # An int key is refused beside a datetime as it is alone (pydantic makes it a string).
        (
            lambda e: e.enqueue("echo", {"at": datetime.now(UTC), "x": {1: "a"}}),
            "has a key 1 (int) at $.x: JSON object keys are strings",
        ),
        # A set is stored as a list: one holding NaN is refused as a list holding it is.
        (lambda e: e.enqueue("echo", {"x": {float("nan")}}), "holds NaN at $.x[0]"),
        (lambda e: e.enqueue("echo", {}, headers={"x": 1}), "headers must be a dict of strings"),
        (lambda e: e.enqueue("echo", {}, priority="high"), "priority must be an integer"),
        (lambda e: e.enqueue_many("echo", [{}, object(), {}]), "payload is not JSON-serial"),
        (lambda e: e.enqueue_many("nope", [{}]), "unknown queue 'nope'"),
    ],
    ids=[
        "unknown-queue",
        "negative-delay",
        "negative-delay-string",
        "unparsable-delay",
        "object-payload",
        "datetime-beside-an-object",
        "bytes-payload",
        "int-key-beside-a-datetime",
        "set-holding-nan",
        "non-string-header",
        "string-priority",
        "one-bad-payload-in-a-batch",
        "batch-to-unknown-queue",
    ],
)
async def test_a_refused_enqueue_raises_engine_error_and_writes_nothing(
    database: Path | None, call: Callable[[Engine], Any], expected: str
) -> None:
    async with Engine(workflows=[echo_flow()], database=database) as engine:
        with pytest.raises(EngineError) as refused:
            await call(engine)
        assert expected in str(refused.value)
        assert "\n" not in str(refused.value)
        await assert_nothing_written(engine, database, "echo")


@pytest.mark.anyio
async def test_an_unknown_queue_is_its_own_error_type() -> None:
    async with Engine(workflows=[echo_flow()]) as engine:
        with pytest.raises(UnknownQueue):
            await engine.enqueue("nope", {})
        with pytest.raises(UnknownQueue):
            await engine.queue_stats("nope")


# ---- definitions ------------------------------------------------------------------------------
def test_bad_durations_are_refused_at_definition_naming_the_step() -> None:
    with pytest.raises(WorkflowDefinitionError) as bad:
        Step("charge", echo, max_duration="10 parsecs")
    assert str(bad.value).startswith("step 'charge': max_duration: cannot parse duration")
    assert "'10 parsecs'" in str(bad.value) and "'5s'" in str(bad.value)  # what would do
    with pytest.raises(WorkflowDefinitionError, match=r"^step 'charge': max_duration: duration"):
        Step("charge", echo, max_duration=-1)
    with pytest.raises(WorkflowDefinitionError, match=r"^Retry: min_timeout: cannot parse"):
        Retry(max_attempts=3, min_timeout="fast")
    with pytest.raises(WorkflowDefinitionError, match=r"^WorkerTrigger: delay: cannot parse"):
        WorkerTrigger(queue="q", delay="a while")
    with pytest.raises(WorkflowDefinitionError, match=r"^WorkerTrigger: timeout: cannot parse"):
        WorkerTrigger(queue="q", timeout="5 minutes")
    with pytest.raises(WorkflowDefinitionError, match=r"^wait.for_: cannot parse duration 'soon'"):
        wait.for_("soon")


def test_duplicate_step_names_are_refused_naming_workflow_and_step() -> None:
    with pytest.raises(WorkflowDefinitionError) as bad:
        Workflow(name="orders", steps=[Step("charge", echo), Step("charge", echo)])  # 2 charges
    first = marked_line(__file__, "# 2 charges")
    assert str(bad.value) == (
        f"workflow 'orders': step name 'charge' is used twice (first at {first})"
    )


def test_a_reference_to_a_step_that_does_not_run_before_is_refused() -> None:
    with pytest.raises(WorkflowDefinitionError) as bad:
        Workflow(
            name="orders",
            steps=[
                Step("charge", echo),
                Step("notify", echo, inputs={"receipt": "$.state.receipt.id"}),
                Step("receipt", echo),
            ],
        )
    assert str(bad.value) == (
        "workflow 'orders', step 'notify': $.state.receipt.id refers to step 'receipt', "
        "which does not run before it (earlier steps: charge)"
    )
    with pytest.raises(WorkflowDefinitionError, match=r"step 'wait_2': .*step 'later'"):
        Workflow(name="orders", steps=[Step("charge", echo), wait.until("$.state.later.at")])


def test_a_bad_expression_root_is_refused_naming_the_step() -> None:
    with pytest.raises(WorkflowDefinitionError) as bad:
        Step("charge", echo, inputs={"order": "$.bdoy.order_id"})
    assert str(bad.value).startswith("step 'charge': expression '$.bdoy.order_id' starts with")
    assert "$.body" in str(bad.value)
    with pytest.raises(WorkflowDefinitionError, match="empty path segment"):
        Step("charge", echo, inputs={"order": "$.body..id"})


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("until", "body", "could_not_parse"),
    [
        ("$.body.when", {"when": "2026-13-45T99:00"}, "'2026-13-45T99:00'"),
        ("$.body.when", {"when": {"day": 3}}, "{'day': 3}"),
    ],
    # A literal it cannot read is refused where the workflow is defined (test_definition_checks).
    ids=["expression-to-bad-string", "expression-to-dict"],
)
async def test_a_bad_wait_until_fails_the_step_with_what_it_could_not_parse(
    database: Path | None, until: str, body: dict[str, Any], could_not_parse: str
) -> None:
    flow = Workflow(
        name="sleepy",
        trigger=WorkerTrigger(queue="sleepy"),
        steps=[Step("first", echo), wait.until(until), Step("last", echo)],
    )
    async with Engine(workflows=[flow, echo_flow()], database=database) as engine:
        run = await engine.wait_for_job(await engine.enqueue("sleepy", body), timeout=10)
        assert run.status is RunStatus.FAILED
        assert run.error_step == "wait_2"
        assert run.error is not None
        assert run.error.startswith(
            f"[step 2/3] wait_2 failed: wait.until: cannot parse {could_not_parse}"
        )
        assert "ISO 8601" in run.error
        assert [s.status for s in run.steps] == [
            StepStatus.COMPLETED,
            StepStatus.FAILED,
            StepStatus.PENDING,
        ]
        await serves(engine, "echo")


# ---- the database file ------------------------------------------------------------------------
@pytest.mark.anyio
async def test_a_database_file_that_is_not_sqlite_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    content = b"these are my notes, not a database\n" * 200
    path.write_bytes(content)
    with pytest.raises(DatabaseError) as refused:
        async with Engine(workflows=[echo_flow()], database=path):
            pass
    assert str(refused.value) == f"{path}: not a usable SQLite database (file is not a database)"
    assert path.read_bytes() == content  # left exactly as it was
    assert not Path(f"{path}-wal").exists()


@pytest.mark.anyio
@pytest.mark.parametrize("create", [True, False])
async def test_a_folder_given_as_the_database_is_said_to_be_one(
    tmp_path: Path, create: bool
) -> None:
    # `--db workflows/` by mistake: "no such database (start a worker on it first)" sent the
    # user to a worker, which said "unable to open database file".
    with pytest.raises(DatabaseError) as refused:
        async with Engine(workflows=[echo_flow()], database=tmp_path, create=create):
            pass
    assert str(refused.value) == f"{tmp_path}: a folder, not a database file (--db FILE)"


@pytest.mark.anyio
async def test_a_folder_given_as_the_database_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError) as refused:
        async with Engine(workflows=[echo_flow()], database=tmp_path):
            pass
    assert str(refused.value).startswith(f"{tmp_path}: ")
    assert "\n" not in str(refused.value)


def open_engine_error(database: Path) -> str:
    """Open an engine on `database`; the error it refuses with, as "Type: message"."""

    async def attempt() -> str:
        try:
            async with Engine(workflows=[echo_flow()], database=database):
                return "opened"
        except DatabaseError as error:
            return f"{type(error).__name__}: {error}"

    return anyio.run(attempt)


def unprivileged(fn: Callable[[], str]) -> str:
    """`fn()` as a user that file modes apply to: root ignores them, so as root it runs in a
    forked child that has dropped to `nobody`."""
    if os.geteuid() != 0:
        return fn()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result = fn()
            os.write(write, result.encode())
            code = 0
        except BaseException as error:
            os.write(write, f"child failed: {type(error).__name__}: {error}".encode())
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        output = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, output
    return output


@contextmanager
def folder_for_unprivileged(tmp_path: Path) -> Iterator[Path]:
    """A folder the unprivileged user owns (and can reach: root's tmp_path is private)."""
    if os.geteuid() != 0:
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="blok-readonly-", dir="/tmp"))
    try:
        os.chown(folder, NOBODY, NOBODY)
        yield folder
    finally:
        for path in sorted(folder.rglob("*"), reverse=True):
            path.chmod(0o700)
        folder.chmod(0o700)
        for path in sorted(folder.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        folder.rmdir()


def give_away(folder: Path) -> None:
    if os.geteuid() == 0:
        for path in [folder, *folder.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)


def test_a_read_only_database_folder_is_a_clear_error(tmp_path: Path) -> None:
    with folder_for_unprivileged(tmp_path) as root:
        folder = root / "ro"
        folder.mkdir()
        give_away(root)
        folder.chmod(0o500)
        message = unprivileged(lambda: open_engine_error(folder / "blok.db"))
        assert message == (
            f"DatabaseError: {folder}: the database folder is not writable "
            "(SQLite needs to create its -wal and -shm files there)"
        )
        assert list(folder.iterdir()) == []


def test_an_existing_database_in_a_read_only_folder_is_a_clear_error(tmp_path: Path) -> None:
    with folder_for_unprivileged(tmp_path) as root:
        folder = root / "ro"
        folder.mkdir()
        assert open_engine_error(folder / "blok.db") == "opened"
        give_away(root)
        folder.chmod(0o500)
        message = unprivileged(lambda: open_engine_error(folder / "blok.db"))
        assert message.startswith(f"DatabaseError: {folder}: the database folder is not writable")


def test_a_read_only_database_file_is_a_clear_error(tmp_path: Path) -> None:
    with folder_for_unprivileged(tmp_path) as root:
        path = root / "blok.db"
        assert open_engine_error(path) == "opened"
        give_away(root)
        path.chmod(0o400)
        message = unprivileged(lambda: open_engine_error(path))
        assert message == f"DatabaseError: {path}: the database file is not writable"


def test_a_database_folder_that_cannot_be_created_is_a_clear_error(tmp_path: Path) -> None:
    with folder_for_unprivileged(tmp_path) as root:
        locked = root / "locked"
        locked.mkdir()
        give_away(root)
        locked.chmod(0o500)
        message = unprivileged(lambda: open_engine_error(locked / ".blok" / "blok.db"))
        assert message.startswith(f"DatabaseError: {locked / '.blok'}: cannot create folder (")
        assert "Permission denied" in message
