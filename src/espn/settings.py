"""Every training setting, declared once, and the one precedence that resolves them.

:class:`TrainingSettings` holds each setting of how tasks are learned with its one default:
the run configuration (:class:`espn.config.RunConfig`, both front doors) takes its fields'
defaults from it, the learner and the methods receive it. :func:`layered` is the precedence
both doors apply, through :func:`espn.config.make_config`: what the user gave, then the
method's recipe, then a preset, then the recipe of the data's regime
(:mod:`espn.recipes`), then these defaults.

This module imports nothing else of espn, so every package may use it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: steps between two losses the experiment loggers record unless the user chooses (Lightning's
#: default too); here, where the command line reads it without importing the loggers
DEFAULT_LOG_EVERY = 50


@dataclass(frozen=True)
class TrainingSettings:
    """The settings of how tasks are learned, each with its one default (docs/recipes.md has
    the table). A recipe (:mod:`espn.recipes`) sets some of them for a data regime; None
    means "unset": ``finetune_lr`` None is the run's ``lr``, ``reference_size`` None trains
    by the epochs as given.

    ``method_options`` holds the values of the method's own options (see
    :attr:`espn.methods.Strategy.options`); those left out take their declared defaults.
    """

    #: FLOPs budget per task, in (0, 1] (the paper's ESPN-0.2); a method without a FLOP
    #: constraint has 1 (its recipe says so, see ``Strategy.run_defaults``)
    gamma: float = 0.2
    #: weight allocation per task, in (0, 1]: ceil(alpha x free weights) new weights
    alpha: float = 0.1
    #: pre-train, prune and fine-tune epochs per task, stated for ``reference_size``
    epochs: tuple[int, int, int] = (3, 4, 3)
    #: sgd, nesterov, adam or rmsprop
    optimizer: str = "adam"
    lr: float = 1e-3
    batch_size: int = 128
    #: never reaches frozen weights
    weight_decay: float = 0.0
    #: of SGD and RMSprop
    momentum: float = 0.0
    #: Adam's
    betas: tuple[float, float] = (0.9, 0.999)
    #: warm-up epochs (free weights only, lr ramp), taken from the pre-training epochs
    warmup: int = 0
    #: None: the run's ``lr``
    finetune_lr: float | None = None
    #: cosine or constant
    finetune_schedule: str = "cosine"
    #: beyond the paper: per-task unit scale and shift, a per-task bias on a shared head
    task_affine: bool = False
    #: pruning steps per pruning epoch
    prune_updates_per_epoch: int = 4
    #: how espn's ResNets build their residual streams: per-conv (the authors') or coupled
    stream_pruning: str = "per-conv"
    #: evaluate every K-th task (and the last)
    eval_every: int = 1
    #: initialisation, batch order and augmentation
    seed: int = 0
    #: mixed precision (bfloat16 autocast; float16 + loss scaling on a GPU without it)
    amp: bool = False
    #: compile the training step with torch.compile (CUDA graphs on CUDA)
    compile: bool = False
    #: fine-tune on a physically slimmed copy of the task's sub-network where exact
    slim_training: bool = True
    #: prepare every task for prediction without the task id (see espn.inference.routing)
    task_agnostic: bool = False
    #: the size rule: a task smaller than ``reference_size`` trains as many steps as the
    #: epochs take on the reference size
    step_floor: bool = True
    #: training images per task the epochs are stated for (None: epochs as given)
    reference_size: int | None = None
    device: str = "cpu"
    method_options: Mapping[str, Any] = field(default_factory=dict)


#: the defaults: ``DEFAULTS.lr`` is the learning rate nothing else sets
DEFAULTS = TrainingSettings()
#: the names of the training settings, in declaration order
SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainingSettings))
#: the settings a recipe may set (the others are the user's choice alone: how to run, not
#: how the method learns)
RECIPE_SETTINGS: tuple[str, ...] = (
    "alpha",
    "epochs",
    "optimizer",
    "lr",
    "batch_size",
    "weight_decay",
    "momentum",
    "betas",
    "warmup",
    "finetune_lr",
    "finetune_schedule",
    "reference_size",
)


#: the settings a method reads itself (its phases and budgets; the others are the engine's):
#: a strategy built by hand from :class:`TrainingSettings` runs with its own values of these
METHOD_READS: tuple[str, ...] = (
    "gamma",
    "alpha",
    "epochs",
    "prune_updates_per_epoch",
    "warmup",
    "finetune_lr",
    "finetune_schedule",
    "task_affine",
)


def default(name: str) -> Any:
    """The default of setting ``name`` (a fresh copy of a mapping)."""
    value = getattr(DEFAULTS, name)
    return dict(value) if isinstance(value, Mapping) else value


def layered(
    given: Mapping[str, Any],
    *,
    method: Mapping[str, Any] = {},
    preset: Mapping[str, Any] = {},
    recipe: Mapping[str, Any] = {},
) -> dict[str, Any]:
    """The one precedence of both front doors: every option ``given`` (None: not given)
    over the ``method``'s recipe, over the ``preset``'s options, over the ``recipe`` of the
    data's regime; training settings none of them sets are left out (their default is
    :data:`DEFAULTS`, see :func:`complete`).

    Two settings come in pairs with the epochs: a recipe's ``reference_size`` (the data size
    its epochs are stated for) applies only when the epochs are a recipe's too (not given,
    nor a preset's), and a recipe's ``warmup`` is a share of the recipe's pre-training
    epochs: with epochs given, it is scaled to them (rounded, half up; at least 1 where the
    recipe has one), and it always leaves at least one full pre-training epoch.
    """
    stated = {k: v for k, v in given.items() if v is not None}
    values = dict(recipe) | dict(preset) | dict(method) | stated
    # set by the user or the preset, not by a recipe
    chosen = {k for k in values if k in stated or (k in preset and k not in method)}
    if "epochs" in chosen and "reference_size" not in chosen:
        values.pop("reference_size", None)
    if "warmup" not in chosen and "warmup" in values:
        pre = _pre_epochs(values.get("epochs", DEFAULTS.epochs))
        if pre is not None:
            warmup = int(values["warmup"])
            own = _pre_epochs((dict(recipe) | dict(method)).get("epochs", DEFAULTS.epochs))
            if "epochs" in chosen and own:  # the recipe's share of the epochs given
                warmup = max(min(warmup, 1), int(warmup * pre / own + 0.5))
            values["warmup"] = max(0, min(warmup, pre - 1))
    return values


def complete(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every training setting still unset (missing or None) at its
    default, except those whose unset state means something (``finetune_lr``: the lr;
    ``reference_size``: epochs as given)."""
    keep_unset = ("finetune_lr", "reference_size")
    filled = {n: default(n) for n in SETTING_NAMES if values.get(n) is None and n not in keep_unset}
    return dict(values) | filled


def explicit(settings: TrainingSettings) -> dict[str, Any]:
    """The settings of ``settings`` that differ from their defaults: what a
    :class:`TrainingSettings` built by hand gives (the rest follows the precedence)."""
    return {
        n: getattr(settings, n)
        for n in SETTING_NAMES
        if n != "method_options" and getattr(settings, n) != default(n)
    }


def _pre_epochs(epochs: Any) -> int | None:
    """The pre-training epochs of ``epochs`` as any layer gives them (a sequence, or the
    command line's ``"3,4,3"``); None when they cannot be read (validation says why)."""
    try:
        first = epochs.split(",")[0] if isinstance(epochs, str) else epochs[0]
        return int(first)
    except (TypeError, ValueError, IndexError):
        return None
