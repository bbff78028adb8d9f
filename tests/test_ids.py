"""The ids the engine makes: a job whose id is already taken is the job already there (an
enqueue with a given `job_id` is idempotent), so two made alike lose one job, and its caller
waits for the other's run."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from engine import ids


@pytest.fixture
def one_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ids' clock stopped: every id made from here on is made in the same millisecond,
    where only the random part tells ids apart."""
    frozen = time.time()
    monkeypatch.setattr(ids, "time", SimpleNamespace(time=lambda: frozen))


@pytest.mark.usefixtures("one_millisecond")
def test_ids_made_in_one_millisecond_do_not_collide() -> None:
    # 300,000 ids: with the 32 random bits ids used to have, a collision is all but certain
    # (1 - 3e-5); with 56, one in 1.6 million runs of this test sees one.
    made = [ids.new_id("job") for _ in range(300_000)]
    assert len(set(made)) == len(made)


def test_ids_sort_by_the_millisecond_they_were_made_in() -> None:
    first = ids.new_id("run")
    later = first
    while later[:15] == first[:15]:  # the prefix and the millisecond
        later = ids.new_id("run")
    assert first < later
    assert len(first) == len(later) == len("run_") + 11 + 2 * ids.ID_RANDOM_BYTES
