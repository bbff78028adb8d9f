"""A node's parameter annotated with a pydantic model is given that model: its input (a dict
from the payload, or what a step before returned, stored as JSON) validated into it, as a
FastAPI handler's body is. A step that returns a model and one that takes it round-trip
through the database, on any worker. An input that does not validate fails its step as a bad
input, in one line naming the fields."""

from __future__ import annotations

import inspect
import typing
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, TypeGuard

from pydantic import BaseModel, PydanticSchemaGenerationError, TypeAdapter, ValidationError

from .explain import explain
from .loader import user_names
from .workflow import node_callee


class ModelParam(NamedTuple):
    """A parameter annotated with a model, or with a type that holds one."""

    name: str
    hint: Any  # `Order`, `list[Order]`
    model: type[BaseModel]  # the model in it
    adapter: TypeAdapter[Any]  # how its input becomes what it is annotated with

    @property
    def shown(self) -> str:
        """Its annotation as the user wrote it: "Order", "list[Order]"."""
        return self.model.__name__ if self.hint is self.model else user_names(repr(self.hint))


Models = tuple[ModelParam, ...]


def _is_model(hint: Any) -> TypeGuard[type[BaseModel]]:
    return inspect.isclass(hint) and issubclass(hint, BaseModel)


def _model_in(hint: Any) -> type[BaseModel] | None:
    """The pydantic model `hint` is or holds (`Order`, `list[Order]`, `Order | None`)."""
    if _is_model(hint):
        return hint
    for arg in typing.get_args(hint):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


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
    except Exception:  # a name only a type checker sees (under TYPE_CHECKING), a bad hint:
        return ()  # not a model this engine can make; its inputs are given as they are
    found: list[ModelParam] = []
    for name, hint in hints.items():
        model = _model_in(hint) if name != "return" else None
        if model is None:
            continue
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(hint)
        except PydanticSchemaGenerationError:  # `tuple[Order, Socket]`: given as it was
            continue
        found.append(ModelParam(name, hint, model, adapter))
    return tuple(found)


# Weakly: a node of a file's old version goes with it (a reload makes new functions, and a
# cache that held them held each old version's module).
_found: weakref.WeakKeyDictionary[Callable[..., Any], Models] = weakref.WeakKeyDictionary()


def input_models(node: Callable[..., Any]) -> Models:
    """The parameters of `node` annotated with a pydantic model (or a type that holds one:
    `list[Order]`, `Order | None`), found once per node."""
    try:
        return _found[node]
    except KeyError:
        models = _found[node] = _find(node)
        return models
    except TypeError:  # an object that cannot be hashed or weakly referred to: each call
        return _find(node)


def typed_inputs(node: Callable[..., Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """`inputs` as `node` is called with them: each whose parameter is annotated with a model
    validated into it (`inputs` itself where there is none: the common case costs a lookup)."""
    models = input_models(node)
    if not models:
        return inputs
    given = dict(inputs)
    for param in models:
        if param.name in given:
            try:
                given[param.name] = param.adapter.validate_python(given[param.name])
            except ValidationError as error:
                said = explain(error, param.model)
                message = f"not a valid {param.shown}: {said}"
                raise InputModelError(param.name, message) from None
    return given


def required_paths(model: type[BaseModel], below: str, depth: int = 3) -> list[str]:
    """The dotted paths under `below` that `model` requires: a required field that is a model
    itself by its own required fields, `depth` levels down ("$.body.customer.email")."""
    paths = []
    for field, info in model.model_fields.items():
        if not info.is_required():
            continue
        path = f"{below}.{info.alias or field}"
        inner = info.annotation
        if depth > 1 and _is_model(inner):
            paths += required_paths(inner, path, depth - 1) or [path]
        else:
            paths.append(path)
    return paths
