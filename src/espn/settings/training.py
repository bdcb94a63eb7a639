"""Every training setting, declared once (:class:`TrainingSettings`); docs/recipes.md,
"Training settings", has the table and the precedence (:func:`espn.runs.config.layered`).
Imports nothing of espn but :mod:`espn.settings.options` (no torch, no
pydantic), so the command line may use it before it loads anything heavy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args, get_origin, get_type_hints

from espn.settings.options import Option

#: steps between two losses the experiment loggers record unless the user chooses (Lightning's
#: default too); here, where the command line reads it without importing the loggers
DEFAULT_LOG_EVERY = 50


#: the largest count a setting accepts (batch size, images per task, ...): what a C int holds
MAX_COUNT = 2**31 - 1
#: the largest seed (the per-task generators mix seed and task index in 64 bits)
MAX_SEED = 2**32 - 1
#: where the table of the settings is (the help of every flag points to it)
TABLE = "docs/recipes.md, Training settings"


def setting(
    default: Any, help: str, *, recipe: bool = False, method: bool = False, **check: Any
) -> Any:
    """The declaration of one training setting, a field of :class:`TrainingSettings`: its
    ``default``, its ``help`` (the CLI flag's and the run configuration's description),
    whether a ``recipe`` (a data regime's, a preset's or a method's) may set it, whether the
    ``method`` reads it itself (its phases and budgets; the others are the engine's), and
    its bounds or choices (the keywords of :class:`espn.settings.options.Option`)."""
    meta = {"help": help, "recipe": recipe, "method": method, "check": check}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class OptimizerSettings:
    """The training settings the optimizer reads (the first fields of
    :class:`TrainingSettings`): :func:`espn.training.optim.build_optimizer` takes the run's
    settings, or a method's own optimizer (:class:`OptimConfig`), as they are."""

    optimizer: str = setting(
        "adam",
        "sgd, nesterov, adam or rmsprop",
        recipe=True,
        choices=("sgd", "nesterov", "adam", "rmsprop"),
    )
    lr: float = setting(1e-3, "Learning rate", recipe=True, low=0.0, low_open=True)
    weight_decay: float = setting(
        0.0, "Weight decay (never reaches frozen weights)", recipe=True, low=0.0
    )
    momentum: float = setting(
        0.0, "Momentum of SGD and RMSprop", recipe=True, low=0.0, high=1.0, high_open=True
    )
    betas: tuple[float, float] = setting(
        (0.9, 0.999),
        "B1,B2: Adam's betas",
        recipe=True,
        low=0.0,
        high=1.0,
        high_open=True,
        form="two comma-separated numbers B1,B2",
        words="two numbers in [0, 1)",
    )


@dataclass(frozen=True)
class TrainingSettings(OptimizerSettings):
    """The settings of how tasks are learned, each declared once here (name, type, default,
    help, bounds), from which the flags, keywords and ``RunConfig`` fields are derived
    (docs/recipes.md); ``method_options`` holds the method's own options' values."""

    gamma: float = setting(
        0.2,
        "FLOPs budget per task, in (0, 1] (the paper's ESPN-0.2); methods without a FLOP "
        "constraint accept only 1",
        recipe=True,
        method=True,
        low=0.0,
        low_open=True,
        high=1.0,
    )
    alpha: float = setting(
        0.1,
        "Weight allocation per task, in (0, 1]: ceil(alpha x free weights) new weights; "
        "methods without a weight budget accept only 1",
        recipe=True,
        method=True,
        low=0.0,
        low_open=True,
        high=1.0,
    )
    epochs: tuple[int, int, int] = setting(
        (3, 4, 3),
        "PRE,PRUNE,FINE epochs per task, e.g. 3,4,3, stated for the reference size (see "
        "--step-floor)",
        recipe=True,
        method=True,
        low=0,
        form="three comma-separated integers PRE,PRUNE,FINE (e.g. 3,4,3)",
        words="three non-negative counts (pre-train, prune, fine-tune)",
    )
    batch_size: int = setting(128, "Batch size", recipe=True, low=1)
    shards: int | None = setting(
        None,
        "Slices each training batch is computed in and summed in order (docs/distributed.md); "
        "unset: the number of processes (1 alone). Any number of processes up to it gives "
        "the same run, bit for bit",
        low=1,
    )
    warmup: int = setting(
        0,
        "Warm-up epochs (free weights only, lr ramp), taken from pre-training",
        recipe=True,
        method=True,
        low=0,
    )
    finetune_lr: float | None = setting(
        None,
        "Fine-tuning learning rate; default: the recipe's; unset there: --lr",
        recipe=True,
        method=True,
        low=0.0,
        low_open=True,
    )
    finetune_schedule: str = setting(
        "cosine",
        "Fine-tuning schedule: 'cosine' or 'constant'",
        recipe=True,
        method=True,
        choices=("cosine", "constant"),
    )
    task_affine: bool = setting(
        False,
        "Beyond the paper: per-task unit scale and shift (FC gates, BatchNorm affine for "
        "every method) and a per-task bias on a shared head",
        method=True,
    )
    prune_updates_per_epoch: int = setting(
        4, "Pruning steps per pruning epoch (the schedule's granularity)", method=True, low=1
    )
    #: a method option of the methods that prune ResNet units (``--stream-pruning``)
    stream_pruning: str = setting(
        "per-conv",
        "How espn's ResNets build their residual streams: per-conv (the authors') or coupled",
        choices=("per-conv", "coupled"),
    )
    eval_every: int = setting(
        1,
        "Evaluate all tasks so far after every K-th task and the last (accuracy-matrix rows; "
        "skipped rows are null)",
        low=1,
    )
    seed: int = setting(
        0, "Seed of initialisation, batch order and augmentation", low=0, high=MAX_SEED
    )
    amp: bool = setting(
        False,
        "Mixed precision: bfloat16 autocast (float16 + loss scaling on a GPU without "
        "bfloat16); on a CPU it warns (rarely faster there)",
    )
    compile: bool = setting(
        False,
        "Compile the training step with torch.compile (on CUDA: CUDA graphs and "
        "channels_last convolutions): for a GPU, where a small network's step is "
        "launch-bound; the first steps of a run compile (see docs/performance.md)",
    )
    slim_training: bool = setting(
        True,
        "Fine-tune each task (and prune it between prune events, once units are dead) on a "
        "physically slimmed copy of its sub-network (alive units only) and evaluate learned "
        "tasks through cached slim copies, where that is exact (docs/performance.md); "
        "--no-slim-training: the masked supernet for both",
    )
    task_agnostic: bool = setting(
        False,
        "Prepare every task for prediction without the task id: train it to reject its own "
        "inputs shifted, calibrate its scores on a held-out tenth of its training data, and "
        "evaluate every task-inference rule at the end (docs/task-agnostic.md)",
    )
    step_floor: bool = setting(
        True,
        "The size rule: every phase of a task smaller than the reference size trains at "
        "least as many optimizer steps as its epochs take on the reference size (more "
        "passes over the task's data); off: train by the epochs as given",
    )
    reference_size: int | None = setting(
        None,
        "Training images per task that the epoch counts are stated for (the size rule's "
        "reference); unset: the recipe's when the epochs are the recipe's, none (epochs as "
        "given) when --epochs is given or the recipe states none",
        recipe=True,
        low=1,
    )
    device: str = setting("cpu", "cpu, cuda or cuda:N")
    method_options: Mapping[str, Any] = setting({}, "The method's own options")

    def floor_reference(self) -> int | None:
        """The reference data size the size rule applies (None: epochs as given); see
        :func:`espn.training.plan.plan_phase`."""
        return self.reference_size if self.step_floor else None


#: the defaults: ``DEFAULTS.lr`` is the learning rate nothing else sets
DEFAULTS = TrainingSettings()
#: the settings the optimizer reads (:class:`OptimizerSettings`)
OPTIMIZER_SETTINGS = tuple(f.name for f in dataclasses.fields(OptimizerSettings))
_FIELDS = {
    f.name: f
    for f in sorted(
        dataclasses.fields(TrainingSettings), key=lambda f: f.name in OPTIMIZER_SETTINGS
    )
}
#: the names of the training settings in declaration order, the optimizer's (declared first,
#: in the base class) after the others: the order of the flags and of the messages
SETTING_NAMES: tuple[str, ...] = tuple(_FIELDS)
#: the settings a recipe may set (the others are the user's choice alone: how to run, not
#: how the method learns)
RECIPE_SETTINGS = tuple(n for n, f in _FIELDS.items() if f.metadata["recipe"])
#: the settings a method reads itself (its phases and budgets; the others are the engine's):
#: a strategy built by hand from :class:`TrainingSettings` runs with its own values of these
METHOD_READS = tuple(n for n, f in _FIELDS.items() if f.metadata["method"])


#: each setting's type, as its declaration annotates it
HINTS: dict[str, Any] = get_type_hints(TrainingSettings)


def _option(name: str) -> Option:
    """The declaration of setting ``name`` as an :class:`Option` (its checks and words)."""
    hint = HINTS[name]
    args = [a for a in get_args(hint) if a is not type(None)]
    count = len(args) if get_origin(hint) is tuple else 0
    kind = args[0] if args else hint
    meta = _FIELDS[name].metadata
    optional = type(None) in get_args(hint)
    default = getattr(DEFAULTS, name)
    return Option(
        name, kind, default, meta["help"], count=count, optional=optional, **meta["check"]
    )


#: every training setting (but ``method_options``) as an option: its type, bounds and help
OPTIONS: dict[str, Option] = {n: _option(n) for n in SETTING_NAMES if n != "method_options"}


def describe(name: str) -> str:
    """The help of setting ``name`` as the CLI and the run configuration show it: its words,
    and for a setting a recipe may set, whose value it gets unless given."""
    option = OPTIONS[name]
    if not _FIELDS[name].metadata["recipe"]:
        return option.help + "."
    if option.default is None:
        return f"{option.help} (see {TABLE})."
    return f"{option.help}; default: the recipe's, else {option.default} (see {TABLE})."


def default(name: str) -> Any:
    """The default of setting ``name`` (a fresh copy of a mapping)."""
    value = getattr(DEFAULTS, name)
    return dict(value) if isinstance(value, Mapping) else value


def explicit(settings: TrainingSettings) -> dict[str, Any]:
    """The settings of ``settings`` that differ from their defaults: what a
    :class:`TrainingSettings` built by hand gives (the rest follows the precedence)."""
    return {
        n: getattr(settings, n)
        for n in SETTING_NAMES
        if n != "method_options" and getattr(settings, n) != default(n)
    }


@dataclass(frozen=True)
class OptimConfig(OptimizerSettings):
    """An optimizer's settings alone (a method's own, ``Strategy.own_optim``, or the engine's
    without a run) and, for a method's own parameters, ``schedule``: how their learning rate
    moves: ``phase``, as the weights' (the phase's schedule and scale); ``cosine``, decay to
    zero over all the task's epochs (SupSup); ``constant``."""

    schedule: str = "phase"
