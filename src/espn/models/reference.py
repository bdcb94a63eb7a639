"""Models named by an import reference, ``"package.module:Factory(key=value, ...)"``, and which
of them a run directory may make espn build: see docs/reliability.md ("Which models a run
directory may name")."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn

from espn.errors import EspnError
from espn.models.checks import check_plain_model
from espn.models.convert import to_supernet
from espn.models.registry import MODELS, ModelSpec
from espn.supernet.layers import MaskedLayer
from espn.utils.limits import MAX_MODEL_VALUES

_REFERENCE = re.compile(
    r"(?P<module>[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_][\w.]*)(?:\((?P<args>.*)\))?", re.S
)


class ModelReferenceError(EspnError, ValueError):
    """A model reference cannot be resolved or is not allowed; the message says why."""


#: factories (``module:attr``) the user named in this process (outside a run directory)
_TRUSTED: set[str] = set()
#: modules a run directory's reference may make espn import: espn's models, torchvision's
_BUILDER_MODULES = re.compile(r"(espn\.models|torchvision\.models)(\..*)?")
#: arguments that fetch weights (a download, a file) when set: refused from a run directory
_WEIGHT_ARGUMENTS = re.compile(r".*(weights|pretrained).*")
#: the run directory whose references are being read (None: the user's own references)
_READING: ContextVar[str | None] = ContextVar("espn_reading_run", default=None)
#: whether the user opted in to the code of the run directory being read
_TRUSTING: ContextVar[bool] = ContextVar("espn_trusting_run", default=False)


@contextmanager
def reading_run(where: object, trust_code: bool = False) -> Iterator[None]:
    """Within: model references come from the run directory ``where`` (data, not code), so
    a module that is not imported yet is not imported, unless ``trust_code`` (which holds
    for this run directory only: its factories are not remembered as the user's)."""
    token = _READING.set(str(where))
    trusting = _TRUSTING.set(trust_code)
    try:
        yield
    finally:
        _TRUSTING.reset(trusting)
        _READING.reset(token)


@functools.cache
def builtin_builders() -> tuple[Any, ...]:
    """The model builders a run directory may name without an opt-in: espn's model classes
    and torchvision's classification model functions (a fixed list; ``get_model``, which
    builds any model by name, is not one of them)."""
    from torchvision import models as tv

    from espn.models.fc import FCNet
    from espn.models.mobilenet import MobileNetV2Small
    from espn.models.resnet import ResNet
    from espn.models.vit import ViT

    torchvision = [tv.get_model_builder(n) for n in tv.list_models(module=tv)]
    return (FCNet, MobileNetV2Small, ResNet, ViT, *torchvision)


def _untrusted(where: str, name: str, key: str) -> ModelReferenceError:
    return ModelReferenceError(
        f"{where} names the model {name!r}, whose factory {key!r} is neither one of espn's "
        "model builders nor one given to espn in this process; espn does not run code a run "
        "directory names: if you trust that code, pass --trust-model-code (espn evaluate/export), "
        "trust_model_code=True or model=... (espn.load) or --model with the same reference "
        "(espn run)"
    )


def _check_read(where: str, name: str, key: str, factory: Any, kwargs: dict[str, Any]) -> None:
    """For a reference read from run directory ``where`` (not opted in): refuse a factory that
    is neither a builtin builder nor the user's, arguments asking for pretrained weights, and a
    model beyond :data:`MAX_MODEL_VALUES` (counted on the ``meta`` device, before any
    memory is allocated)."""
    builtin = any(factory is b for b in builtin_builders())
    if not builtin and key not in _TRUSTED:
        raise _untrusted(where, name, key)
    fetch = sorted(k for k, v in kwargs.items() if _WEIGHT_ARGUMENTS.fullmatch(k) and v)
    if fetch:
        raise ModelReferenceError(
            f"{where} names the model {name!r}, whose argument(s) {', '.join(fetch)} would "
            "load pretrained weights (a download or a file): a run directory's model is rebuilt "
            "from its checkpoint alone; drop them, or pass --trust-model-code if you trust it"
        )
    # the user's own factory may not build on "meta": then it is not counted
    check_model_size(where, name, lambda: factory(**kwargs), strict=builtin)


def check_model_size(
    where: object, name: str, build: Callable[[], nn.Module], strict: bool = True
) -> None:
    """Build the model ``build`` makes on the ``meta`` device (no memory) and refuse it when
    it holds more than :data:`MAX_MODEL_VALUES` parameters and buffers; a model that cannot
    be built there is refused if ``strict`` (espn's builders all can), else let through."""
    try:
        with torch.device("meta"):
            probe = build()
        values = sum(t.numel() for t in (*probe.parameters(), *probe.buffers()))
    except Exception as exc:
        if not strict:
            return
        reason = (str(exc).splitlines() or [""])[0]
        raise ModelReferenceError(
            f"{where} names the model {name!r}, which cannot be built from what it records "
            f"({type(exc).__name__}: {reason})"
        ) from None
    if values > MAX_MODEL_VALUES:
        raise ModelReferenceError(
            f"{where} names the model {name!r} of {values} parameters and buffers, more than "
            f"the {MAX_MODEL_VALUES} espn builds for a run directory; refused"
        )


def is_reference(name: str) -> bool:
    """Whether ``name`` has the form of an import reference (``module:attr(...)``)."""
    return _REFERENCE.fullmatch(name) is not None


def check_factory(obj: Any, where: str) -> Callable[..., nn.Module]:
    """``obj`` if it builds an ``nn.Module`` (a subclass, or a function annotated to return
    one); else :class:`ModelReferenceError`."""
    if inspect.isclass(obj) and issubclass(obj, nn.Module):
        return obj
    try:
        ret = typing.get_type_hints(obj).get("return") if inspect.isfunction(obj) else None
    except Exception:  # unresolvable annotations: not provably a model factory
        ret = None
    if inspect.isclass(ret) and issubclass(ret, nn.Module):
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


def factory_of(name: str) -> tuple[Callable[..., nn.Module], dict[str, Any]]:
    """Import the reference's factory (if allowed, see :func:`reading_run`: a module that may
    hold no builtin builder is not imported for a factory the user did not name in this
    process, and one the user names is remembered as theirs) and check it (see
    :func:`check_factory`), calling nothing; with its keyword arguments."""
    module_name, attr, kwargs = parse(name)
    key = f"{module_name}:{attr}"
    where = None if _TRUSTING.get() else _READING.get()
    if _READING.get() is None:
        _TRUSTED.add(key)
    elif where is not None and key not in _TRUSTED and not _BUILDER_MODULES.fullmatch(module_name):
        raise _untrusted(where, name, key)
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ModelReferenceError(f"model {name!r} cannot be imported here: {exc}") from None
    factory = check_factory(obj, key)
    if where is not None:
        _check_read(where, name, key, factory, kwargs)
    return factory, kwargs


def build(name: str) -> nn.Module:
    """The model a reference names: its checked factory called with its arguments; arguments
    that do not fit its signature, or a factory that fails, end in one
    :class:`ModelReferenceError` naming the reference (the cause kept for ``--debug``)."""
    factory, kwargs = factory_of(name)
    try:
        inspect.signature(factory).bind(**kwargs)
    except ValueError:  # no signature to check (a builtin): the call says
        pass
    except TypeError as exc:  # a missing or unknown argument: named before any call
        raise ModelReferenceError(f"model {name!r}: {exc}") from None
    try:
        model = factory(**kwargs)
    except EspnError:  # already one line saying what to do
        raise
    except Exception as exc:
        reason = (str(exc).splitlines() or [""])[0]
        raise ModelReferenceError(
            f"model {name!r} cannot be built: {type(exc).__name__}: {reason}"
        ) from exc
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
    check_plain_model(model, example_input)
    return to_supernet(model, example_input, multi_head, task_affine)


def resolve(name: str) -> str:
    """``name`` once ``MODELS.get(name)`` builds it: a registered model as it is, an import
    reference registered (its factory imported, if allowed, and checked now; called, and
    the model converted, only when built); anything else refused with the known names."""
    if name not in MODELS and is_reference(name):
        factory_of(name)

        def factory(spec: ModelSpec) -> nn.Module:
            example = torch.zeros(2, *spec.input_shape)
            return supernet_ready(build(name), example, spec.multi_head, spec.task_affine)

        factory.__doc__ = f"{name}: built from its import reference"
        MODELS.register(name)(factory)
    MODELS.get(name)
    return name
