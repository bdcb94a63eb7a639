"""What a user gives a run, checked by name: the keywords the learner and ``create_method``
accept (:func:`check_names`), and the options given that this run would ignore
(:func:`check_applicable`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from espn.runs.config import ConfigError
from espn.settings.methods import known_options
from espn.settings.training import SETTING_NAMES

if TYPE_CHECKING:
    from espn.methods.base import Strategy
    from espn.runs.config import RunConfig


#: the run options that shape how tasks are learned, whatever the data (the training settings
#: that are run options, and a preset): the settings of :class:`espn.ContinualLearner`
TRAINING_SETTINGS = (
    *(n for n in SETTING_NAMES if n not in ("stream_pruning", "device")),
    "preset",
)


def check_names(cls: type[Strategy], given: Iterable[str], extra: tuple[str, ...] = ()) -> None:
    """Refuse (ValueError) a keyword of ``create_method`` or the learner that is neither a
    training setting, one of ``extra``, nor an option of ``cls`` or another method."""
    accepted = [*TRAINING_SETTINGS, *extra, *cls.option_names()]
    foreign = known_options()
    for key in given:
        if key not in accepted and key not in foreign:
            raise ValueError(
                f"unknown setting {key!r} for method {cls.name!r}; accepted: {', '.join(accepted)}"
            )


def check_applicable(names: set[str], cfg: RunConfig) -> None:
    """Refuse options given explicitly (``names``: :func:`espn.runs.config.given_names`) that
    this run would ignore: ``reference_size`` with ``step_floor`` off, ``stream_pruning`` on a
    model it cannot apply to, a method's options left unused (:meth:`Strategy.check_given`)."""
    from espn.methods.base import METHODS
    from espn.models.resnet import STREAM_MODELS

    if "reference_size" in names and not cfg.step_floor:
        raise ConfigError(
            "reference_size: the size rule is off (step_floor false, --no-step-floor), so "
            "the reference size it is stated for cannot apply; leave --reference-size out or "
            "turn the size rule on"
        )
    if "stream_pruning" in names and cfg.model not in STREAM_MODELS:
        raise ConfigError(
            f"stream_pruning: it sets how espn's registered ResNets ({', '.join(STREAM_MODELS)}) "
            f"build their residual streams; model {cfg.model!r} has none it builds (a "
            "converted model's streams are coupled), so leave --stream-pruning out"
        )
    strategy = METHODS.get(cfg.method)
    try:
        strategy.check_given(cfg.method_options, names & set(strategy.option_names()))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
