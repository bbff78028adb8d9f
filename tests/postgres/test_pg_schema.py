"""The PostgreSQL schema: migrations from empty, again, at once from many processes, and from a
newer blok; what the schema promises about the data it keeps."""

from __future__ import annotations

import json

import anyio
import pytest
from pg import NO_DRIVER

asyncpg = pytest.importorskip("asyncpg", reason=NO_DRIVER)

from engine.backends.postgres import sql
from engine.backends.postgres.schema import MIGRATIONS, SCHEMA_VERSION, SchemaError, migrate

from .rows import job, run

pytestmark = pytest.mark.anyio

TABLES = {
    "schema_version",
    "runs",
    "steps",
    "attempts",
    "logs",
    "idempotency",
    "jobs",
    "control",
    "workers",
    "worker_catalog",
    "paused_queues",
    "concurrency_slots",
    "debounce_windows",
    "leader_leases",
}


async def tables(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return {row["tablename"] for row in rows}


async def test_migrations_apply_from_empty(pg_url: str) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        assert await tables(conn) == set()
        assert await migrate(conn) == SCHEMA_VERSION
        assert await tables(conn) == TABLES
        versions = await conn.fetch("SELECT version FROM schema_version ORDER BY version")
        assert [row["version"] for row in versions] == list(range(1, SCHEMA_VERSION + 1))
        assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))

        columns = {
            row["column_name"]: (row["data_type"], row["is_nullable"], row["column_default"])
            for row in await conn.fetch(
                "SELECT column_name, data_type, is_nullable, column_default"
                " FROM information_schema.columns WHERE table_name = 'jobs'"
            )
        }
        assert columns["epoch"] == ("bigint", "NO", "0")
        assert columns["signal"][0] == "jsonb"
        assert columns["taken_from"][0] == "text"
        assert columns["force"][:2] == ("boolean", "NO")
        assert columns["lease_until"][0] == "double precision"

        indexes = {
            row["indexname"]: row["indexdef"]
            for row in await conn.fetch("SELECT indexname, indexdef FROM pg_indexes")
        }
        assert "(queue, priority DESC, seq) WHERE (state = ANY" in indexes["jobs_ready"]
        assert "(lease_until) WHERE (state = 'active'" in indexes["jobs_leases"]
    finally:
        await conn.close()


async def test_migrations_are_idempotent_and_keep_the_data(pg_url: str) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        await migrate(conn)
        await conn.execute(sql.INSERT_JOB, *job("j1"))
        assert await migrate(conn) == SCHEMA_VERSION
        assert await conn.fetchval("SELECT count(*) FROM schema_version") == SCHEMA_VERSION
        assert await conn.fetchval("SELECT id FROM jobs") == "j1"
    finally:
        await conn.close()


async def test_processes_starting_together_migrate_once(pg_url: str) -> None:
    conns = [await asyncpg.connect(pg_url) for _ in range(4)]
    try:
        async with anyio.create_task_group() as tg:
            for conn in conns:
                tg.start_soon(migrate, conn)
        assert await conns[0].fetchval("SELECT count(*) FROM schema_version") == SCHEMA_VERSION
        assert await tables(conns[0]) == TABLES
    finally:
        for conn in conns:
            await conn.close()


async def test_a_database_from_a_newer_blok_is_refused_in_one_line(pg_url: str) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        await migrate(conn)
        await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", SCHEMA_VERSION + 1)
        with pytest.raises(SchemaError) as raised:
            await migrate(conn)
        message = str(raised.value)
        assert "\n" not in message
        assert f"schema {SCHEMA_VERSION + 1}" in message and "upgrade blok-tui" in message
        assert pg_url.rsplit("/", 1)[1] in message
    finally:
        await conn.close()


async def test_user_data_comes_back_as_it_went_in(pg_schema: str) -> None:
    """Payloads and outputs are `json`: key order and NUL characters survive, as with SQLite
    (`jsonb` would sort the keys and refuse "\\u0000")."""
    conn = await asyncpg.connect(pg_schema)
    try:
        value = json.dumps({"zeta": 1, "alpha": {"b": 2, "a": "x\u0000y"}})
        await conn.execute(sql.INSERT_JOB, *job("j1", payload=value))
        await conn.execute(sql.UPSERT_RUN, *run("r1", "j1", output=value), "j1", 0)
        assert await conn.fetchval("SELECT payload::text FROM jobs") == value
        stored = await conn.fetchval("SELECT output::text FROM runs")
        assert list(json.loads(stored)) == ["zeta", "alpha"]
        assert json.loads(stored) == json.loads(value)
    finally:
        await conn.close()
