"""Rate limits: `WorkerTrigger(rate_limit=RateLimit(limit=10, period="1m", key="$.body.tenant"))`.

At most `limit` runs of the workflow start in any sliding window of `period` (per value of
`key`, when it is given), across every process on the database. A run over the limit waits as
`throttled` until a start leaves the window; it does not use its retries. The gate is in
engine/gates.py; the starts each window counts are the backend's shared state.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from . import expressions
from .durations import Duration, format_duration
from .errors import WorkflowDefinitionError
from .explain import explain

MAX_RATE_LIMIT = 1_000_000


def _in_its_terms(given: dict[str, Any], item: ErrorDetails) -> str | None:
    """A window or a count out of range, in a rate limit's words."""
    if item["loc"] == ("period",) and item["type"] == "greater_than_equal":
        return f"a window of at least 1ms, not {given.get('period')!r}"
    if item["loc"] == ("limit",):
        return f"a whole number of starts, 1 to {MAX_RATE_LIMIT:,}, not {given.get('limit')!r}"
    return None


class RateLimit(BaseModel):
    """At most `limit` starts per sliding window of `period`, per value of `key` (a "$.body…"
    expression, a callable taking the context, or None for one window for all runs)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True, extra="forbid")

    limit: int = Field(ge=1, le=MAX_RATE_LIMIT, strict=True)  # True is no limit of 1
    period: Duration = Field(ge=1)
    key: Any = None

    def __init__(self, limit: int | None = None, period: Any = None, **data: Any) -> None:
        if limit is not None:
            data["limit"] = limit
        if period is not None:
            data["period"] = period
        try:
            super().__init__(**data)
        except ValidationError as error:
            problems = explain(error, RateLimit, functools.partial(_in_its_terms, data))
            raise WorkflowDefinitionError(f"RateLimit: {problems}") from None
        if not (self.key is None or callable(self.key) or expressions.is_expression(self.key)):
            # A constant would put every run in one window, as key=None does, while reading as
            # a key per value: "body.user" for "$.body.user" is a typo, not a choice.
            raise WorkflowDefinitionError(
                f"RateLimit.key: {self.key!r} is not an expression: write one such as "
                "'$.body.user_id', a callable taking the context, or None (one window for all "
                "runs)"
            )
        if expressions.is_expression(self.key):
            try:
                parts = expressions.parse(self.key)
            except expressions.ExpressionError as error:
                raise WorkflowDefinitionError(f"RateLimit.key: {error}") from None
            if parts[0] == "state":
                raise WorkflowDefinitionError(
                    f"RateLimit.key: {self.key} reads $.state, which is empty before the run "
                    "starts; use $.body, $.headers or $.params"
                )

    def describe(self) -> str:
        return f"{self.limit} start(s) per {format_duration(self.period)}"
