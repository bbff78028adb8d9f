"""A node's parameter annotated with a pydantic model is given that model: its input (a dict
from the payload, or what a step before returned, stored as JSON) validated into it, as a
FastAPI handler's body is. A step that returns a model and one that takes it round-trip
through the database, on any worker. An input that does not validate fails its step as a bad
input, in one line naming the fields."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ValidationError

from .explain import explain
from .workflow import node_callee

Models = tuple[tuple[str, type[BaseModel]], ...]  # (parameter, model), in the signature's order


class InputModelError(ValueError):
    """An input that is not a valid instance of the model its parameter is annotated with."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.input = name


def _find(node: Callable[..., Any]) -> Models:
    code, _ = node_callee(node)
    if inspect.isclass(code):
        return ()  # a class as a node: its fields are its own to validate
    try:
        hints = typing.get_type_hints(code)
    except Exception:
        return ()  # its inputs are given as they are, as they always were
    return tuple(
        (name, hint)
        for name, hint in hints.items()
        if name != "return" and inspect.isclass(hint) and issubclass(hint, BaseModel)
    )


_cached = lru_cache(maxsize=4096)(_find)


def input_models(node: Callable[..., Any]) -> Models:
    """The parameters of `node` annotated with a pydantic model, found once per node."""
    try:
        return _cached(node)
    except TypeError:  # a callable object that cannot be hashed: looked at each call
        return _find(node)


def typed_inputs(node: Callable[..., Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """`inputs` as `node` is called with them: each whose parameter is annotated with a model
    validated into it (`inputs` itself where there is none: the common case costs a lookup)."""
    models = input_models(node)
    if not models:
        return inputs
    given = dict(inputs)
    for name, model in models:
        if name in given and not isinstance(given[name], model):
            try:
                given[name] = model.model_validate(given[name])
            except ValidationError as error:
                said = explain(error, model)
                raise InputModelError(name, f"not a valid {model.__name__}: {said}") from None
    return given
