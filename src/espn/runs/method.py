"""Building one method by name with its settings, checked as a run checks them
(:func:`create_method`, exported as ``espn.create_method``)."""

from __future__ import annotations

from typing import Any

from espn.errors import EspnError
from espn.methods.base import METHODS, MethodSettingError, Strategy
from espn.runs.config import ConfigError, make_config
from espn.runs.given import check_names


def method_class(method: object, lead: str, tail: str) -> type[Strategy]:
    """The class of a method given by registered name or as a Strategy subclass; anything
    else is a TypeError in the caller's words: ``{lead} a method name (...){tail}, got ...``."""
    if isinstance(method, str):
        return METHODS.get(method)
    if isinstance(method, type) and issubclass(method, Strategy):
        return method
    raise TypeError(f"{lead} a method name ({', '.join(METHODS.names())}){tail}, got {method!r}")


def create_method(name_or_class: str | type[Strategy], **settings: Any) -> Strategy:
    """A method by registered name or class, with the training settings under their ``espn
    run`` names and the method's own options (see docs/python.md); those left out resolve as a
    run's do (the ``mnist`` regime unless ``recipe=``). A setting not accepted raises
    :class:`MethodSettingError` naming it. E.g. ``create_method("supsup", supsup_k=0.3)``."""
    cls = method_class(name_or_class, "create_method takes", " or a Strategy subclass")
    try:
        return _create(cls, settings)
    except ConfigError as exc:  # a setting's check, as a run makes it
        raise MethodSettingError(str(exc)) from None
    except EspnError:
        raise
    except ValueError as exc:
        raise MethodSettingError(str(exc)) from None


def _create(cls: type[Strategy], settings: dict[str, Any]) -> Strategy:
    check_names(cls, settings.keys(), extra=("recipe",))
    own = cls.option_names()
    values = {"benchmark": "tensors", "method": cls.name, "recipe": "mnist"} | settings
    cfg = make_config(cls, **values)
    strategy = cls(cfg.method_config())
    #: the settings given here (the learner resolves the rest for its network)
    strategy.given = dict(settings)
    own_given = {k for k in own if settings.get(k) is not None}
    cls.check_given(strategy.settings, own_given)
    return strategy
