"""What a user's walk through the operator API found unchecked, on every backend alike (memory,
SQLite, PostgreSQL): `runs(limit=...)`, `enqueue(job_id=...)` (its type, and an id another queue
has), `enqueue_many`'s payloads, a lookup by a non-string id, and the message of a queue
provider the database does not have."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support import DATABASES, a_database

from engine import Engine, EngineError, Step, UnknownRun, WorkerTrigger, Workflow
from engine.backends.providers import provider_refusal

pytestmark = pytest.mark.anyio


def echo(ctx: Any) -> Any:
    return ctx.body


WORKFLOWS = [
    Workflow(name="first", trigger=WorkerTrigger(queue="first"), steps=[Step("echo", echo)]),
    Workflow(name="second", trigger=WorkerTrigger(queue="second"), steps=[Step("echo", echo)]),
]


@pytest.fixture(params=DATABASES)
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Engine]:
    async with (
        a_database(request.param, tmp_path) as database,
        Engine(workflows=WORKFLOWS, database=database) as engine,
    ):
        yield engine


# ---- runs(limit=...) ------------------------------------------------------------------------
async def test_runs_limit_none_is_every_run_and_a_bad_limit_is_one_clear_error(
    engine: Engine,
) -> None:
    for n in range(3):
        await engine.wait_for_job(await engine.enqueue("first", {"n": n}), timeout=10)
    assert len(await engine.runs(limit=None)) == 3
    assert len(await engine.runs(limit=1)) == 1
    assert await engine.runs(limit=0) == []
    assert len(await engine.runs(limit=None, offset=1)) == 2
    refused = {
        -1: "limit must be a whole number from 0 up, not -1",
        True: "limit must be a whole number from 0 up or None, not True",
        1.5: "limit must be a whole number from 0 up or None, not 1.5",
        "10": "limit must be a whole number from 0 up or None, not '10'",
        2**63: f"limit {2**63} is above {2**63 - 1}: pass None for no limit",
    }
    for limit, message in refused.items():
        with pytest.raises(EngineError) as raised:
            await engine.runs(limit=limit)  # type: ignore[arg-type]
        assert str(raised.value) == message
    with pytest.raises(EngineError) as raised:
        await engine.runs(offset=-1)
    assert str(raised.value) == "offset must be a whole number from 0 up, not -1"
    with pytest.raises(EngineError) as raised:
        await engine.stuck_runs(limit=-5)
    assert str(raised.value) == "limit must be a whole number from 0 up, not -5"


# ---- enqueue(job_id=...) --------------------------------------------------------------------
async def test_a_job_id_that_is_not_a_plain_string_is_refused_and_nothing_is_added(
    engine: Engine,
) -> None:
    refused = {
        5: "job id must be a string, not 5",
        "": "job id is empty",
        "   ": "job id '   ' is only whitespace",
        " a": "job id ' a' starts or ends with whitespace",
        "a\nb": "job id 'a\\nb' holds a control character (U+000A)",
        "x" * 256: "job id is 256 characters long, above the limit of 255",
    }
    for job_id, message in refused.items():
        with pytest.raises(EngineError) as raised:
            await engine.enqueue("first", {}, job_id=job_id)  # type: ignore[arg-type]
        assert str(raised.value) == message
    assert await engine.runs() == []
    assert await engine.enqueue("first", {}, job_id="x" * 255) == "x" * 255


async def test_a_job_id_another_queue_has_is_refused_and_the_same_queue_adds_it_once(
    engine: Engine,
) -> None:
    assert await engine.enqueue("first", {"v": 1}, job_id="shared") == "shared"
    with pytest.raises(EngineError) as raised:
        await engine.enqueue("second", {"v": 2}, job_id="shared")
    assert str(raised.value) == "job id 'shared' is already a job of queue 'first'"
    assert await engine.runs(queue="second") == []
    # The same queue: the job it has stays as it is, and its id comes back.
    assert await engine.enqueue("first", {"v": 3}, job_id="shared") == "shared"
    run = await engine.wait_for_job("shared", timeout=10)
    assert (run.queue, run.input) == ("first", {"v": 1})
    assert len(await engine.runs(queue="first")) == 1


async def test_a_job_id_enqueued_again_with_another_payload_is_said_to_drop_it(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # An order's id reused for another order added nothing and said nothing: the second
    # order's payload went nowhere. The same payload again (a retried enqueue, a tuple for
    # the list stored) is the dedupe promised, and says nothing.
    assert await engine.enqueue("first", {"items": ["a", "b"], "n": 1}, job_id="order-7") == (
        "order-7"
    )
    with caplog.at_level(logging.WARNING, logger="blok.operator"):
        assert await engine.enqueue("first", {"n": 1, "items": ("a", "b")}, job_id="order-7")
        assert caplog.records == []
        assert await engine.enqueue("first", {"items": ["c"], "n": 2}, job_id="order-7")
    [said] = [record.getMessage() for record in caplog.records]
    assert said.startswith("job id 'order-7' is already a job of queue 'first' ("), said
    # Where the payloads differ, not their values (a payload may hold what a log must not).
    assert said.endswith(
        " whose payload differs at $.body.items, $.body.n: that job stays as it is, and this "
        "payload is not enqueued (a new job needs a new id)"
    ), said
    run = await engine.wait_for_job("order-7", timeout=10)
    assert run.input == {"items": ["a", "b"], "n": 1}


# ---- enqueue_many's payloads ----------------------------------------------------------------
async def test_enqueue_many_refuses_one_payload_in_place_of_a_list(engine: Engine) -> None:
    refused: list[tuple[Any, str]] = [
        ("abc", "not a str"),
        (b"abc", "not a bytes"),
        ({"a": 1}, "not a dict"),
        (5, "not 5"),
    ]
    for payloads, what in refused:
        with pytest.raises(EngineError) as raised:
            await engine.enqueue_many("first", payloads)  # type: ignore[arg-type]
        assert str(raised.value).startswith("payloads must be a list of payloads (one job each)")
        assert what in str(raised.value)
    assert await engine.runs() == []
    jobs = await engine.enqueue_many("first", (n for n in range(2)))  # type: ignore[arg-type]
    runs = [await engine.wait_for_job(job, timeout=10) for job in jobs]
    assert [run.input for run in runs] == [0, 1]


# ---- lookups --------------------------------------------------------------------------------
async def test_a_lookup_by_something_else_than_a_string_says_so(engine: Engine) -> None:
    with pytest.raises(EngineError) as raised:
        await engine.get_run(None)  # type: ignore[arg-type]
    assert str(raised.value) == "run id must be a string, not None"
    with pytest.raises(EngineError) as raised:
        await engine.get_job(5)  # type: ignore[arg-type]
    assert str(raised.value) == "job id must be a string, not 5"


async def test_a_job_id_given_for_a_run_id_names_the_jobs_run(engine: Engine) -> None:
    run = await engine.wait_for_job(await engine.enqueue("first", {}, job_id="order-1"))
    with pytest.raises(UnknownRun) as raised:
        await engine.cancel("order-1")
    assert str(raised.value) == (
        f"unknown run 'order-1' ('order-1' is a job id: its run is {run.id})"
    )
    with pytest.raises(UnknownRun) as unknown:
        await engine.get_run("run_nope")
    assert str(unknown.value) == "unknown run 'run_nope'"


# ---- queue providers ------------------------------------------------------------------------
def one_workflow(provider: Any) -> Workflow:
    return Workflow(
        name="w", trigger=WorkerTrigger(queue="q", provider=provider), steps=[Step("echo", echo)]
    )


async def test_a_provider_the_memory_engine_lacks_says_what_it_needs_or_that_it_is_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(EngineError) as raised:
        async with Engine(workflows=[one_workflow("postgres")]):
            pass
    assert str(raised.value) == (
        "provider 'postgres' needs a postgresql:// database: pass "
        "database='postgresql://user@host/dbname' to Engine (or use provider='memory')"
    )
    monkeypatch.setenv("BLOK_WORKER_ADAPTER", "redis")
    with pytest.raises(EngineError) as raised:
        async with Engine(workflows=[one_workflow(None)]):
            pass
    # Named in no code: the message says where it came from.
    assert str(raised.value) == (
        "BLOK_WORKER_ADAPTER='redis': unknown queue provider 'redis': the providers are "
        "'memory', 'sqlite' and 'postgres'"
    )


async def test_a_provider_a_database_does_not_fit_is_refused_in_the_same_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SQLite engine said 'unknown queue provider' of postgres, a provider it knows."""
    with pytest.raises(EngineError) as raised:
        async with Engine(workflows=[one_workflow("postgres")], database=tmp_path / "a.db"):
            pass
    assert str(raised.value) == provider_refusal("postgres", "sqlite")
    monkeypatch.setenv("BLOK_WORKER_ADAPTER", "postgres")
    with pytest.raises(EngineError) as raised:
        async with Engine(workflows=[one_workflow(None)], database=tmp_path / "b.db"):
            pass
    assert str(raised.value) == "BLOK_WORKER_ADAPTER='postgres': " + provider_refusal(
        "postgres", "sqlite"
    )


def test_a_provider_refusal_tells_an_unknown_name_from_a_known_one_that_does_not_fit() -> None:
    assert provider_refusal("redis", "sqlite") == (
        "unknown queue provider 'redis': the providers are 'memory', 'sqlite' and 'postgres'"
    )
    assert provider_refusal("postgres", "sqlite") == (
        "provider 'postgres' needs a postgresql:// database, not a SQLite file (use 'sqlite', "
        "'memory' or leave it unset)"
    )
    assert provider_refusal("sqlite", "postgres") == (
        "provider 'sqlite' needs a SQLite file, not a PostgreSQL database (use 'postgres', "
        "'memory' or leave it unset)"
    )
    assert provider_refusal("sqlite", "memory") == (
        "provider 'sqlite' needs a SQLite file: pass database='path/to/blok.db' to Engine "
        "(or use provider='memory')"
    )
