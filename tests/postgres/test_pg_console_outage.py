"""An attached console while its PostgreSQL server is out of reach says so: a banner with
since when, and a view opened meanwhile says it is reading, not "no runs yet". It kept its
last picture ("3 alive", frozen counts) with nothing to say it was old.

The server is put out of reach by a relay between the console and it, in this process (the
server stays up for the other tests): its connections are cut, and new ones hung up on."""

from __future__ import annotations

import pytest
from pg import NO_DRIVER

pytest.importorskip("asyncpg", reason=NO_DRIVER)

from console.helpers import settled, text_of, until
from textual.widgets import Input, Static

from blok_tui.app import BlokApp
from blok_tui.runs_screen import RunsScreen
from blok_tui.widgets import DatabaseBanner
from engine import Engine
from engine.backends.postgres import listener as pg_listener

from .test_pg_writer import CuttingRelay

pytestmark = pytest.mark.anyio


async def test_an_attached_console_says_the_database_is_out_of_reach(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_listener, "KEEPALIVE_S", 0.2)  # the cut is found sooner
    async with CuttingRelay(pg_schema) as relay, Engine(database=relay.url) as engine:
        app = BlokApp(engine)
        async with app.run_test(size=(140, 40)) as pilot:
            await settled(pilot)
            banner = app.screen.query_one(DatabaseBanner)
            assert not banner.display
            relay.hanging_up = True
            for index in range(len(relay.sides)):
                relay.cut(index)
            await until(pilot, lambda: app.screen.query_one(DatabaseBanner).display)
            said = text_of(app.screen.query_one(DatabaseBanner))
            assert "the database is out of reach since" in said, said
            assert "what is shown is from before" in said, said
            await pilot.press("colon")  # `:runs`, not waiting for its read: it waits
            await until(pilot, lambda: bool(app.screen.query("#command")))
            app.screen.query_one("#command", Input).value = "runs"
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunsScreen))
            await until(pilot, lambda: app.screen.query_one(DatabaseBanner).display)
            filters = text_of(app.screen.query_one("#filters", Static))
            assert "reading…" in filters and "no runs yet" not in filters, filters
            # A cancel confirmed now waits for the server: said at once, not only once it lands.
            app.run_worker(app.cancel_run("run_nope"))

            def told(title: str) -> bool:
                return any(n.title == title for n in app._notifications)

            await until(pilot, lambda: told("Cancel waits"))
            assert not told("Cancel refused")
            relay.hanging_up = False
            await until(pilot, lambda: not app.screen.query_one(DatabaseBanner).display, timeout=20)
            await until(pilot, lambda: told("Cancel refused"), timeout=20)
