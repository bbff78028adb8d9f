"""The hint an unknown name gets: a close name, or the names it is the first part of."""

from __future__ import annotations

from engine.expressions import did_you_mean


def test_a_typo_gets_the_close_name() -> None:
    assert did_you_mean("echoo", ["echo", "naps"]) == "; did you mean 'echo'?"
    assert did_you_mean("zzz", ["echo", "naps"]) == ""


def test_the_first_part_of_a_name_gets_the_name_too_far_for_a_close_match() -> None:
    # "shop" is 0.57 of "shop.order" by difflib, below its cutoff: `runs --workflow shop` said
    # nothing of the demo's "shop.order".
    assert did_you_mean("shop", ["shop.order", "emails.send"]) == "; did you mean 'shop.order'?"
    assert did_you_mean("shop", ["shopkeepers"]) == ""  # a part ends at a separator


def test_the_first_part_of_several_names_names_them_all() -> None:
    names = ["test.nap", "test.single", "test_c", "test-d", "other"]
    assert did_you_mean("test", names, prefix="$.") == (
        "; did you mean one of '$.test-d', '$.test.nap', '$.test.single', …?"
    )
