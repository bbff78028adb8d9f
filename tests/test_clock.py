"""A backend's clock: this process's, moved onto the server's by a reading of it. A reading is
only as exact as its round trip, so a skew within that is no skew (a server on this machine
must not move every time the engine records by the noise of its readings)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from engine.clock import AGREE_S, Clock


def test_a_clock_never_read_is_this_processs() -> None:
    clock = Clock()
    before = datetime.now(UTC)
    assert clock.skew == 0.0
    assert before <= clock.now() <= datetime.now(UTC)
    assert abs(clock.time() - time.time()) < 0.5


def test_a_server_two_minutes_ahead_moves_the_clock_two_minutes() -> None:
    clock = Clock()
    sent = time.time()
    clock.measured(sent, sent + 0.002 + 120.0, sent + 0.004)  # read half way, 2 ms each way
    assert abs(clock.skew - 120.0) < 1e-6
    assert abs(clock.time() - (time.time() + 120.0)) < 0.5
    assert abs(clock.now().timestamp() - (time.time() + 120.0)) < 0.5


def test_a_server_behind_moves_it_back() -> None:
    clock = Clock()
    sent = time.time()
    clock.measured(sent, sent - 45.0, sent)
    assert abs(clock.skew + 45.0) < 1e-6
    assert abs(clock.now().timestamp() - (time.time() - 45.0)) < 0.5


def test_a_skew_within_the_round_trip_is_no_skew() -> None:
    clock = Clock()
    clock.measured(100.0, 200.0, 110.0)  # 95 s ahead
    sent = time.time()
    # Off by 3 ms with a 10 ms round trip: the server may have read its clock at any point of
    # it, so the clocks may agree exactly.
    clock.measured(sent, sent + 0.005 + 0.003, sent + 0.010)
    assert clock.skew == 0.0
    # Just past the round trip and AGREE_S: a skew.
    clock.measured(sent, sent + 0.005 + 0.005 + AGREE_S * 1.5, sent + 0.010)
    assert clock.skew > 0.0
