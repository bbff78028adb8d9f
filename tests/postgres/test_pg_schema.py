"""The PostgreSQL schema: migrations from empty, again, at once from many processes, and from a
newer blok; blok's tables beside an application's own; what the schema keeps of the data."""

from __future__ import annotations

import json

import anyio
import pytest
from pg import NO_DRIVER

asyncpg = pytest.importorskip("asyncpg", reason=NO_DRIVER)

from backends.builders import a_run, job_and_run, line

from engine import DatabaseError
from engine.backends import open_backend
from engine.backends.postgres.schema import MIGRATIONS, SCHEMA, SCHEMA_VERSION, SchemaError, migrate

from .conftest import connect

pytestmark = pytest.mark.anyio

TABLES = {
    "schema_version",
    "runs",
    "steps",
    "attempts",
    "logs",
    "idempotency",
    "jobs",
    "workers",
    "worker_catalog",
    "paused_queues",
    "concurrency_slots",
    "debounce_windows",
    "leader_leases",
    "events",
    "event_waiters",
    "schedules",
    "rate_starts",
    "writer_marks",
}


async def tables(conn: asyncpg.Connection, schema: str = SCHEMA) -> set[str]:
    rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)
    return {row["tablename"] for row in rows}


async def test_migrations_apply_from_empty(pg_url: str) -> None:
    conn = await connect(pg_url)
    try:
        assert await tables(conn) == set()
        assert await migrate(conn) == SCHEMA_VERSION
        assert await tables(conn) == TABLES
        assert await tables(conn, "public") == set()
        versions = await conn.fetch("SELECT version FROM schema_version ORDER BY version")
        assert [row["version"] for row in versions] == list(range(1, SCHEMA_VERSION + 1))
        assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))

        columns = {
            row["column_name"]: (row["data_type"], row["is_nullable"], row["column_default"])
            for row in await conn.fetch(
                "SELECT column_name, data_type, is_nullable, column_default"
                " FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'jobs'",
                SCHEMA,
            )
        }
        assert columns["epoch"] == ("bigint", "NO", "0")
        assert columns["signals"][0] == "jsonb"
        assert columns["payload"][0] == "json"
        assert columns["lease_until"][0] == "double precision"

        indexes = {
            row["indexname"]: row["indexdef"]
            for row in await conn.fetch(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1", SCHEMA
            )
        }
        # Schema 11: the waiting jobs in claim order, the delayed ones by their time.
        assert "(queue, priority DESC, seq) WHERE (state = 'waiting'" in indexes["jobs_ready"]
        assert "(queue, run_at) WHERE (state = 'delayed'" in indexes["jobs_due_at"]
        assert "(queue, lease_until) WHERE (state = 'active'" in indexes["jobs_active"]
        assert "jobs_run" not in indexes  # schema 4: no query reads jobs by run id
    finally:
        await conn.close()


async def test_migrations_are_idempotent_and_keep_the_data(pg_url: str) -> None:
    job, run = job_and_run()
    async with open_backend(pg_url) as backend:
        await backend.queue(None).add([job], [run])
    conn = await connect(pg_url)
    try:
        assert await migrate(conn) == SCHEMA_VERSION
        assert await conn.fetchval("SELECT count(*) FROM schema_version") == SCHEMA_VERSION
        assert await conn.fetchval("SELECT id FROM jobs") == job.id
    finally:
        await conn.close()


async def test_processes_starting_together_migrate_once(pg_url: str) -> None:
    opened = 0

    async def start() -> None:
        nonlocal opened
        async with open_backend(pg_url):
            opened += 1

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(start)
    assert opened == 4
    conn = await connect(pg_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM schema_version") == SCHEMA_VERSION
        assert await tables(conn) == TABLES
    finally:
        await conn.close()


async def test_a_database_from_a_newer_blok_is_refused_in_one_line(pg_url: str) -> None:
    conn = await connect(pg_url)
    try:
        await migrate(conn)
        await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", SCHEMA_VERSION + 1)
        with pytest.raises(SchemaError):
            await migrate(conn)
    finally:
        await conn.close()
    with pytest.raises(DatabaseError) as raised:
        async with open_backend(pg_url):
            pass
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(pg_url)
    assert f"schema {SCHEMA_VERSION + 1}" in message and "upgrade blok-tui" in message


async def test_a_read_only_command_does_not_install_blok(pg_url: str) -> None:
    with pytest.raises(DatabaseError, match="not a blok database") as raised:
        async with open_backend(pg_url, create=False):
            pass
    assert "blok-tui worker --db" in str(raised.value)
    conn = await connect(pg_url)
    try:
        assert await conn.fetchval("SELECT to_regnamespace($1)", SCHEMA) is None
    finally:
        await conn.close()


async def test_blok_lives_beside_an_applications_own_tables(pg_url: str) -> None:
    """A database that already has `runs` and `jobs` tables of its own (the application's)
    takes blok's beside them, untouched."""
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("CREATE TABLE public.jobs (id INTEGER PRIMARY KEY, title TEXT)")
        await conn.execute("CREATE TABLE public.runs (x TEXT)")
        await conn.execute("INSERT INTO public.jobs VALUES (1, 'the app''s own')")
        job, run = job_and_run()
        async with open_backend(pg_url) as backend:
            assert await backend.queue(None).add([job], [run]) == [job.id]
            assert (await backend.queue(None).get_job(job.id)) is not None
        assert await conn.fetch("SELECT * FROM public.jobs") == [(1, "the app's own")]
        assert await conn.fetchval("SELECT count(*) FROM public.runs") == 0
        assert await conn.fetchval(f"SELECT id FROM {SCHEMA}.jobs") == job.id
    finally:
        await conn.close()


async def test_user_data_comes_back_as_it_went_in(pg_url: str) -> None:
    """Payloads and outputs are `json`: key order and NUL characters inside JSON survive, as
    with SQLite; a NUL in plain text (an error message, a log line), which PostgreSQL's text
    cannot hold, is kept as the four characters \\x00 instead of failing the write."""
    value = {"zeta": 1, "alpha": {"b": 2, "a": "x\u0000y"}}
    job, run = job_and_run(payload=value)
    odd = a_run(output=value, error="bad\x00byte")
    async with open_backend(pg_url) as backend:
        await backend.queue(None).add([job], [run])
        backend.runs.save_run(odd)
        backend.runs.add_log(odd.id, line("nul\x00here"))
        await backend.runs.flush()
        stored_job = await backend.queue(None).get_job(job.id)
        stored = await backend.runs.get_run(odd.id)
    assert stored_job is not None and stored is not None
    assert list(stored_job.payload) == ["zeta", "alpha"]
    assert stored_job.payload == value
    assert list(stored.output) == ["zeta", "alpha"] and stored.output == value
    assert stored.error == "bad\\x00byte"
    assert [entry.message for entry in stored.logs] == ["nul\\x00here"]
    conn = await connect(pg_url)
    try:
        text = await conn.fetchval("SELECT payload::text FROM jobs")
        assert text == json.dumps(value)
    finally:
        await conn.close()


async def test_the_row_types_of_the_bulk_statements_match_the_row_codecs(pg_url: str) -> None:
    """The writer sends a table's rows as one array of a schema type (migration 5), the row
    codecs' tuples as they are: each type must list its table's columns in the codecs' order,
    with the columns' own types, and a fenced row's fence after them."""
    from engine.backends.rows import ATTEMPT_COLUMNS, JOB_COLUMNS, RUN_COLUMNS, STEP_COLUMNS

    conn = await connect(pg_url)
    try:
        await migrate(conn)
        found: dict[str, list[tuple[str, str]]] = {}  # a type's fields, a table's columns
        for name in [
            *("fenced_run", "fenced_step", "fenced_attempt", "fenced_log", "job_settle"),
            *("new_job", "new_run", "runs", "steps", "attempts", "logs", "jobs"),
        ]:
            rows = await conn.fetch(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
                " JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n"
                " ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2"
                " AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                SCHEMA,
                name,
            )
            found[name] = [(r[0], r[1]) for r in rows]
    finally:
        await conn.close()

    def of(table: str, columns: tuple[str, ...]) -> list[tuple[str, str]]:
        """The columns in the codecs' order, each with its type in the table."""
        types = dict(found[table])
        return [(c, types[c]) for c in columns]

    fence = [("fence_job", "text"), ("fence_epoch", "bigint")]
    assert found["fenced_run"] == of("runs", RUN_COLUMNS) + fence
    assert found["fenced_step"] == of("steps", STEP_COLUMNS) + fence
    assert found["fenced_attempt"] == of("attempts", ATTEMPT_COLUMNS) + fence
    assert found["new_job"] == of("jobs", JOB_COLUMNS)
    assert found["new_run"] == of("runs", RUN_COLUMNS)
    # The log and settle rows are INSERT_LOG's and UPDATE_JOB's parameters, in their order.
    logged = ("run_id", "step_idx", "ts", "level", "message")
    assert found["fenced_log"] == of("logs", logged) + fence
    settle = ("state", "run_id", "run_at", "resume", "error", "meta")
    settle_after = ("forced", "headers", "id", "epoch")
    assert found["job_settle"] == [
        *of("jobs", settle),
        ("fresh", "boolean"),  # a flag of the update, not a column
        *of("jobs", settle_after),
    ]
