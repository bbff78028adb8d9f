"""The redesign's rule for `engine/`: one module, one idea, and none over 900 lines (the old
`Engine` class alone was 1,539). Import boundaries are import-linter's contracts in pyproject."""

from __future__ import annotations

from pathlib import Path

import engine

LIMIT = 900


def test_no_engine_module_is_over_900_lines() -> None:
    root = Path(engine.__file__).parent
    sizes = {
        str(path.relative_to(root)): len(path.read_text(encoding="utf-8").splitlines())
        for path in root.rglob("*.py")
    }
    assert len(sizes) > 20  # the package was found
    assert {name: n for name, n in sizes.items() if n > LIMIT} == {}
