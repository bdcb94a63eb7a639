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
    """A method by registered name or class, with keyword settings: run options that shape
    training (``gamma``, ``alpha``, ``epochs``, ``warmup``, ... under their ``espn run``
    names) and the method's own :attr:`Strategy.options`; those left out take their defaults
    as a run resolves them (:class:`espn.runs.config.RunConfig`: the method's recipe, then the
    ``mnist`` regime's, unless ``recipe=`` names another). Given to
    :class:`espn.ContinualLearner`, the settings given here count as given there.

    A setting the method does not accept, or a value out of range, raises
    :class:`MethodSettingError` (an :class:`~espn.errors.EspnError` and ValueError) naming it
    and what is accepted. Example: ``create_method("supsup", supsup_k=0.3, epochs=(1, 1, 1))``.
    """
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
    check_names(cls, settings, extra=("recipe",))
    own = cls.option_names()
    values = {"benchmark": "tensors", "method": cls.name, "recipe": "mnist"} | settings
    cfg = make_config(cls, **values)
    strategy = cls(cfg.method_config())
    #: the settings given here (the learner resolves the rest for its network)
    strategy.given = dict(settings)
    own_given = {k for k in own if settings.get(k) is not None}
    cls.check_given(strategy.settings, own_given)
    return strategy
