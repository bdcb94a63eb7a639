"""Models named by an import reference: ``"package.module:Factory(key=value, ...)"``.

A supernet built in Python from a class or factory function (``espn.wrap(Net, x,
width=8)``) is recorded in its checkpoint by such a reference, so that ``espn evaluate``,
``info`` and ``export`` (another process) can rebuild it. Only a reference to an
``nn.Module`` subclass, or to a function annotated to return one (torchvision's model
functions are), is ever called, and only with literal arguments (numbers, strings, booleans,
None, tuples, lists, dicts): a checkpoint cannot name an arbitrary callable to run.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import typing
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from espn.errors import EspnError
from espn.models.convert import to_supernet
from espn.models.registry import MODELS, ModelSpec
from espn.supernet.layers import MaskedLayer

_REFERENCE = re.compile(
    r"(?P<module>[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_][\w.]*)(?:\((?P<args>.*)\))?", re.S
)


class ModelReferenceError(EspnError, ValueError):
    """A model reference cannot be resolved or is not allowed; the message says why."""


def is_reference(name: str) -> bool:
    """Whether ``name`` has the form of an import reference (``module:attr(...)``)."""
    return _REFERENCE.fullmatch(name) is not None


def _returns_module(fn: Callable[..., Any]) -> bool:
    try:
        ret = typing.get_type_hints(fn).get("return")
    except Exception:  # unresolvable annotations: not provably a model factory
        return False
    return inspect.isclass(ret) and issubclass(ret, nn.Module)


def check_factory(obj: Any, where: str) -> Callable[..., nn.Module]:
    """``obj`` if it builds an ``nn.Module`` (a subclass, or a function annotated to return
    one); else :class:`ModelReferenceError`."""
    if inspect.isclass(obj) and issubclass(obj, nn.Module):
        return obj
    if inspect.isfunction(obj) and _returns_module(obj):
        return obj
    raise ModelReferenceError(
        f"{where} is not an nn.Module class nor a function annotated to return one "
        "(-> nn.Module); only such factories are called to rebuild a model"
    )


def reference_of(factory: Callable[..., nn.Module], kwargs: dict[str, Any]) -> str:
    """The reference that rebuilds ``factory(**kwargs)``; refused when the factory is not
    importable by name or an argument is not a literal."""
    check_factory(factory, f"{factory!r}")
    module, qualname = factory.__module__, factory.__qualname__
    if module == "__main__" or "<" in qualname:
        raise ModelReferenceError(
            f"{qualname} is defined in {'a script' if module == '__main__' else 'a function'}, "
            "so no other process can import it; move it into an importable module"
        )
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    name = f"{module}:{qualname}({args})"
    if parse(name)[2] != kwargs:
        raise ModelReferenceError(
            f"the arguments {kwargs!r} are not all literals (numbers, strings, booleans, None, "
            "tuples, lists, dicts), so they cannot be recorded"
        )
    return name


def parse(name: str) -> tuple[str, str, dict[str, Any]]:
    """Module, attribute path and keyword arguments of a reference."""
    match = _REFERENCE.fullmatch(name)
    if match is None:
        raise ModelReferenceError(
            f"model {name!r} is not a reference of the form 'package.module:Factory(key=value)'"
        )
    text = match["args"] or ""
    try:
        call = ast.parse(f"f({text})", mode="eval").body
        assert isinstance(call, ast.Call)
        if call.args or any(k.arg is None for k in call.keywords):
            raise ValueError("only key=value arguments")
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    except (SyntaxError, ValueError) as exc:
        raise ModelReferenceError(
            f"model {name!r}: the arguments must be key=literal pairs ({exc})"
        ) from None
    return match["module"], match["attr"], kwargs


def resolve(name: str) -> tuple[Callable[..., nn.Module], dict[str, Any]]:
    """Import the reference's factory and check it (see :func:`check_factory`), calling
    nothing; with its keyword arguments."""
    module_name, attr, kwargs = parse(name)
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ModelReferenceError(f"model {name!r} cannot be imported here: {exc}") from None
    return check_factory(obj, f"{module_name}:{attr}"), kwargs


def build(name: str) -> nn.Module:
    """The model a reference names: its checked factory called with its arguments."""
    factory, kwargs = resolve(name)
    model = factory(**kwargs)
    if not isinstance(model, nn.Module):
        raise ModelReferenceError(
            f"model {name!r} built a {type(model).__name__}, not an nn.Module"
        )
    return model


def supernet_ready(
    model: nn.Module, example_input: torch.Tensor, multi_head: bool, task_affine: bool
) -> nn.Module:
    """``model`` itself when it holds espn's masked layers, else its converted copy."""
    if any(isinstance(m, MaskedLayer) for m in model.modules()):
        return model
    return to_supernet(model, example_input, multi_head, task_affine)


def register_reference(name: str) -> None:
    """Make ``MODELS.get(name)`` build the referenced model (converted on the fly), so that a
    run configuration may name it; the factory is imported and checked now, called only
    when the model is built."""
    if name in MODELS:
        return
    resolve(name)

    def factory(spec: ModelSpec) -> nn.Module:
        example = torch.zeros(2, *spec.input_shape)
        return supernet_ready(build(name), example, spec.multi_head, spec.task_affine)

    factory.__doc__ = f"{name}: built from its import reference"
    MODELS.register(name)(factory)
