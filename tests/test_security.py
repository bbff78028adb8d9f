"""Security, tried: an owner-only database, secret headers kept out of the store and the logs,
and payloads that stay data."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from support import raised_at

from engine import Engine, RunStatus, Step, WorkerTrigger, Workflow
from engine.redact import REDACTED, redact_headers, redact_text, secret_values

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    return None if request.param == "memory" else tmp_path / "blok.db"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def noop(ctx: Any) -> dict[str, bool]:
    return {"ok": True}


NOOP = Workflow(name="noop", trigger=WorkerTrigger(queue="noop"), steps=[Step("noop", noop)])


# ---- file modes -------------------------------------------------------------------------------
@pytest.fixture(params=[0o022, 0o000], ids=["umask-022", "umask-000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


async def test_the_database_and_its_new_folder_are_readable_by_the_owner_only(
    tmp_path: Path, umask: int
) -> None:
    folder = tmp_path / ".blok"
    path = folder / "blok.db"
    for opening in range(2):  # SQLite removes -wal and -shm on close and makes them again
        async with Engine(workflows=[NOOP], database=path) as engine:
            run = await engine.wait_for_job(await engine.enqueue("noop", {}), timeout=10)
            assert run.status is RunStatus.COMPLETED
            files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
            assert all(f.exists() for f in files), opening
            assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}, opening
            assert mode(folder) == 0o700
    assert mode(path) == 0o600 and mode(folder) == 0o700


async def test_an_existing_folder_keeps_its_mode(tmp_path: Path) -> None:
    # The user's own project folder is not ours to lock down; only the file is.
    tmp_path.chmod(0o755)
    async with Engine(workflows=[NOOP], database=tmp_path / "blok.db"):
        pass
    assert mode(tmp_path) == 0o755
    assert mode(tmp_path / "blok.db") == 0o600


# ---- secret headers ---------------------------------------------------------------------------
HEADERS = {
    "Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.bearer-credentials",
    "Cookie": "session=cookie-session-0123456789; theme=dark",
    "X-Api-Token": "tok_live_abcdef123456",
    "X-Client-Secret": "client-secret-xyz789",
    "X-Api-Key": "key_0987654321",
    "Content-Type": "application/json",
    "X-Request-Id": "req-42-visible",
}
SECRETS = [
    "eyJhbGciOiJIUzI1NiJ9.bearer-credentials",
    "cookie-session-0123456789",
    "tok_live_abcdef123456",
    "client-secret-xyz789",
    "key_0987654321",
]
SECRET_NAMES = {"Authorization", "Cookie", "X-Api-Token", "X-Client-Secret", "X-Api-Key"}


def secret_flow(received: list[dict[str, str]]) -> Workflow:
    async def call_api(ctx: Any) -> dict[str, str]:
        received.append(dict(ctx.headers))
        ctx.logger.info("calling the API with headers %s", ctx.headers)
        token = ctx.headers["Authorization"].removeprefix("Bearer ")
        ctx.logger.warning("token in use: %s", token)
        try:
            raise PermissionError(f"the API refused key {ctx.headers['X-Api-Key']}")
        except PermissionError:
            ctx.logger.exception("first try failed")
        ctx.logger.info("request %s", ctx.headers["X-Request-Id"])
        return {"status": "sent"}

    return Workflow(
        name="api", trigger=WorkerTrigger(queue="api"), steps=[Step("call_api", call_api)]
    )


def stored_text(database: Path) -> list[str]:
    """Every text cell of the tables a console reads, for a run that has ended."""
    cells: list[str] = []
    with closing(sqlite3.connect(database)) as conn:
        for table in ("runs", "steps", "attempts", "logs", "jobs"):
            for row in conn.execute(f"SELECT * FROM {table}"):
                cells.extend(cell for cell in row if isinstance(cell, str))
    return cells


async def test_secret_headers_are_redacted_in_the_store_and_logs_but_reach_the_node(
    database: Path | None, caplog: pytest.LogCaptureFixture
) -> None:
    received: list[dict[str, str]] = []
    caplog.set_level(logging.INFO, logger="blok.run")
    async with Engine(workflows=[secret_flow(received)], database=database) as engine:
        job = await engine.enqueue("api", {"to": "crm"}, headers=HEADERS)
        run = await engine.wait_for_job(job, timeout=10)
        assert run.status is RunStatus.COMPLETED, run.error
        assert received == [HEADERS]  # the node works with the real values

        stored = await engine.get_run(run.id)
        assert stored.headers == {
            name: (REDACTED if name in SECRET_NAMES else value) for name, value in HEADERS.items()
        }
        logs = [line.message for step in stored.steps for line in step.logs]
        logs += [line.message for line in stored.logs]
        text = "\n".join(logs)
        assert "calling the API with headers" in text and "first try failed" in text
        assert "Traceback (most recent call last)" in text  # the traceback is kept, redacted
        assert "req-42-visible" in text and "application/json" in text  # not over-redacted
        assert REDACTED in text
        for secret in SECRETS:
            assert secret not in text, secret
    # …and so in the console, which shows what the store holds, and in log handlers.
    handled = "\n".join(record.getMessage() for record in caplog.records)
    assert "token in use: [redacted]" in handled
    for secret in SECRETS:
        assert secret not in handled, secret
    if database is not None:
        cells = stored_text(database)
        assert any(REDACTED in cell for cell in cells)
        for secret in SECRETS:
            assert not any(secret in cell for cell in cells), secret


async def test_a_secret_header_passed_into_a_step_is_stored_redacted(
    database: Path | None,
) -> None:
    # The node gets the real value; the run's record (step input and output, state, the run's
    # output) holds it nowhere, as a whole, inside a longer string, or as a key.
    seen: list[str] = []

    async def call(ctx: Any, auth: str, key: str) -> dict[str, Any]:
        seen.append(auth)
        return {"auth": auth, "said": [f"sent {key} upstream"], key: "as a key"}

    flow = Workflow(
        name="passes",
        trigger=WorkerTrigger(queue="passes"),
        steps=[
            Step(
                "call",
                call,
                inputs={"auth": "$.headers.Authorization", "key": "$.headers.X-Api-Key"},
            ),
            Step("after", noop),
        ],
    )
    async with Engine(workflows=[flow], database=database) as engine:
        job = await engine.enqueue("passes", {}, headers=HEADERS)
        run = await engine.get_run((await engine.wait_for_job(job, timeout=10)).id)
    assert run.status is RunStatus.COMPLETED, run.error
    assert seen == [HEADERS["Authorization"]]
    recorded = run.model_dump_json()
    assert REDACTED in recorded
    for secret in SECRETS:
        assert secret not in recorded, secret
    if database is not None:
        for secret in SECRETS:
            assert not any(secret in cell for cell in stored_text(database)), secret


async def test_a_node_error_that_quotes_a_secret_header_is_stored_redacted(
    database: Path | None,
) -> None:
    async def refuse(ctx: Any) -> None:
        raise PermissionError(f"the API refused key {ctx.headers['X-Api-Key']}")

    flow = Workflow(
        name="refused", trigger=WorkerTrigger(queue="refused"), steps=[Step("call", refuse)]
    )
    async with Engine(workflows=[flow], database=database) as engine:
        job = await engine.enqueue("refused", {}, headers=HEADERS)
        run = await engine.get_run((await engine.wait_for_job(job, timeout=10)).id)
    assert run.status is RunStatus.FAILED
    attempt = run.steps[0].attempts[0]
    assert run.error == (
        f"[step 1/1] call failed: PermissionError: the API refused key [redacted] "
        f"(at {raised_at(refuse)})"
    )
    assert attempt.error == "the API refused key [redacted]"
    assert attempt.traceback is not None and "PermissionError" in attempt.traceback
    for text in (run.error, run.steps[0].error, attempt.error, attempt.traceback):
        assert "key_0987654321" not in (text or "")


def test_which_header_names_look_secret() -> None:
    names = ["authorization", "Proxy-Authorization", "COOKIE", "Set-Cookie", "x-auth-token",
             "X-Webhook-Secret", "X-API-KEY", "api_key", "password"]  # fmt: skip
    assert all(redact_headers({n: "v"}) == {n: REDACTED} for n in names)
    plain = {"Content-Type": "text/plain", "Accept": "*/*", "X-Request-Id": "abc", "Host": "h"}
    assert redact_headers(plain) == plain


def test_short_fragments_are_not_searched_for_in_log_text() -> None:
    secrets = secret_values({"Cookie": "a=1; theme=dark; sid=0123456789abcdef", "X-Key": "xyz"})
    assert "0123456789abcdef" in secrets and "1" not in secrets and "dark" not in secrets
    assert redact_text("theme dark, sid 0123456789abcdef", secrets) == "theme dark, sid [redacted]"


# ---- payloads are data ------------------------------------------------------------------------
async def test_payloads_are_data_and_never_evaluated(database: Path | None, tmp_path: Path) -> None:
    marker = tmp_path / "evaluated"
    payload = {
        "looks_like_a_reference": "$.state.first",
        "looks_like_code": f"__import__('pathlib').Path({str(marker)!r}).touch()",
        "format_string": "{ctx.headers}",
        "nested": ["$.headers.Authorization", {"$.body": "$.params.queue"}],
    }
    seen: list[Any] = []

    async def first(ctx: Any, value: Any) -> Any:
        seen.append((ctx.body, value))
        return value

    async def second(ctx: Any, value: Any, whole: Any) -> dict[str, Any]:
        seen.append((value, whole))
        return {"value": value}

    flow = Workflow(
        name="data",
        trigger=WorkerTrigger(queue="data"),
        steps=[
            Step("first", first, inputs={"value": "$.body.looks_like_a_reference"}),
            Step("second", second, inputs={"value": "$.state.first", "whole": "$.body.nested"}),
        ],
    )
    headers = {"Authorization": "Bearer never-looked-up-by-the-payload"}
    async with Engine(workflows=[flow], database=database) as engine:
        run = await engine.wait_for_job(
            await engine.enqueue("data", payload, headers=headers), timeout=10
        )
        assert run.status is RunStatus.COMPLETED, run.error
        assert seen == [
            (payload, "$.state.first"),
            ("$.state.first", ["$.headers.Authorization", {"$.body": "$.params.queue"}]),
        ]
        assert run.output == {"value": "$.state.first"}
        assert (await engine.get_run(run.id)).input == payload
    assert not marker.exists()


async def test_the_console_shows_secret_headers_redacted(tmp_path: Path) -> None:
    # Imported here so the engine's checks above still run while the console is being changed.
    from textual.widgets import Static

    from blok_tui.app import BlokApp
    from blok_tui.run_screen import RunScreen
    from tests.console.helpers import command, settled, text_of, until

    received: list[dict[str, str]] = []
    async with Engine(
        workflows=[secret_flow(received)], database=tmp_path / "blok.db", grace_period=0.5
    ) as engine:
        run = await engine.wait_for_job(
            await engine.enqueue("api", {"to": "crm"}, headers=HEADERS), timeout=10
        )
        assert run.status is RunStatus.COMPLETED and received == [HEADERS]
        app = BlokApp(engine)
        async with app.run_test(size=(150, 45)) as pilot:
            await settled(pilot)
            await command(pilot, "runs api")
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunScreen))
            await settled(pilot)
            shown = "\n".join(text_of(widget) for widget in app.screen.query(Static))
    assert "calling the API with headers" in shown and REDACTED in shown
    for secret in SECRETS:
        assert secret not in shown, secret


def test_text_that_would_drive_or_reorder_the_terminal_is_escaped() -> None:
    """Bidirectional overrides and isolates from a payload (U+202E) were printed raw by show:
    they make what follows them read as something else ("Trojan Source")."""
    from engine.text import printable

    assert printable("ok\x1b[2J\u202egnp.exe\u2066x\u2069") == (
        "ok\\x1b[2J\\u202egnp.exe\\u2066x\\u2069"
    )
    # What shows as itself stays: tabs, newlines, and joiners inside an emoji.
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    assert printable(f"a\tb\n{family}") == f"a\tb\n{family}"
