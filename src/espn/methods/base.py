"""The strategy interface: what a continual-learning method adds to the training engine."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from espn.data.tasks import Task, TaskSequence
from espn.errors import EspnError
from espn.pruning.regularisers import masked_weight_l2
from espn.pruning.weights import new_weight_target, prune_weights
from espn.registry import Registry
from espn.settings.methods import declared, resolve_settings
from espn.settings.options import Option
from espn.settings.training import TrainingSettings
from espn.supernet.supernet import Supernet

if TYPE_CHECKING:
    from espn.settings.training import OptimConfig


class Ranks(Protocol):
    """The processes of a data-parallel run as a method sees them
    (:class:`espn.training.distributed.Ranks`): counts summed over every rank."""

    def total(self, *counts: int) -> list[int]:
        """``counts`` summed over the ranks."""
        ...


def fresh_weights(weight: Tensor, how: str, generator: torch.Generator) -> Tensor:
    """New values (on the CPU) for a layer's free weights, as CtRL's ``init_weights``: for
    ``kaiming``, convolutions Kaiming normal in fan-out mode (std ``sqrt(2 / fan_out)``), linear
    layers uniform in ``+-1/sqrt(fan_in)`` (PyTorch's ``kaiming_uniform_(a=sqrt(5))``); zeros
    for ``zero``."""
    if how == "zero":
        return torch.zeros(weight.shape, dtype=weight.dtype)
    fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(weight)
    if weight.dim() > 2:
        std = math.sqrt(2.0 / max(fan_out, 1))
        return torch.randn(weight.shape, generator=generator, dtype=weight.dtype) * std
    bound = 1.0 / math.sqrt(max(fan_in, 1))
    uniform = torch.rand(weight.shape, generator=generator, dtype=weight.dtype)
    return (2.0 * uniform - 1.0) * bound


#: a method's recipe: per regime, the run options it sets (see :attr:`Strategy.recipe`)
Recipes = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Phase:
    """A stretch of training of one task.

    ``prune_updates`` prune steps are spread evenly over the phase, the last one at its end
    (all at once when the phase has no epochs); ``schedule`` shapes the learning rate over
    the phase, starting from ``lr`` (None: the optimizer's) times ``lr_scale``: ``constant``;
    ``cosine`` decay to zero; ``ramp``: epoch e of E at (e + 1) / E of the rate (the authors'
    warm-up); ``step``: x0.1 after half and again after 80% (CPG's epochs 50 and 80 of 100).
    ``regularise`` adds the strategy's penalty to the loss; ``free_only`` runs the phase on the
    free weights alone (frozen weights masked out of the forward pass: the authors' warm-up).
    """

    name: str
    epochs: int
    schedule: str = "constant"
    lr: float | None = None
    regularise: bool = False
    prune_updates: int = 0
    free_only: bool = False
    lr_scale: float = 1.0


#: a method's settings are the training settings (kept under this name for code written
#: against it; the settings are declared once, in :mod:`espn.settings.training`)
MethodConfig = TrainingSettings


class Strategy(ABC):
    """A continual-learning method as hooks over the one training engine."""

    name: ClassVar[str]
    #: whether the method trains task-specific unit scales and shifts (BatchNorm affine
    #: parameters, affine gates) without ``task_affine``; heads are always trained
    trains_unit_affine: ClassVar[bool] = True
    #: whether the method takes a FLOPs budget gamma
    uses_gamma: ClassVar[bool] = True
    #: whether the method takes a weight allocation alpha (if not, alpha is 1)
    uses_alpha: ClassVar[bool] = True
    #: how tasks hold their weights (see ``Supernet.commit_task``): "shared" (trained, then
    #: frozen for later tasks), "own" (each task trains and keeps its own copy), "fixed"
    #: (never trained: the shared weights get no gradient, a task is its masks and state)
    weights: ClassVar[str] = "shared"
    #: whether the first task may be adopted from pretrained weights (``init_weights``)
    accepts_pretrained: ClassVar[bool] = True
    #: the method's own settings: each becomes an ``espn run`` flag, is validated, and is
    #: recorded under ``method_options`` in results.json (see :class:`Option`)
    options: ClassVar[tuple[Option, ...]] = ()
    #: the method's recipe per regime (``"mnist"``, ``"cifar"``): run options that replace the
    #: benchmark's where the user leaves them out; empty: the benchmark's (docs/recipes.md)
    recipe: ClassVar[Recipes] = {}
    #: how the method's own parameters (:meth:`extra_parameters`) train, apart from the
    #: supernet weights; None: with the weights, in one optimizer
    own_optim: ClassVar[OptimConfig | None] = None
    #: the option holding the learning rate of :attr:`own_optim` (None: its own)
    own_lr: ClassVar[str | None] = None
    #: whether the method's fine-tuning trains the weights through the default forward, loss
    #: and masked-L2 term alone, so that a physically slimmed copy of the task's sub-network
    #: trains them exactly (see :mod:`espn.training.slim_step`)
    trains_slim: ClassVar[bool] = False
    #: the attribute holding the method's own parameters by layer (:meth:`extra_parameters`,
    #: e.g. SupSup's ``scores``) and the state key listing their layers; a checkpoint stores
    #: each as ``<attribute>.<layer>``. None: it has none
    own_parameters: ClassVar[tuple[str, str] | None] = None

    def __init__(self, cfg: TrainingSettings) -> None:
        self.cfg = cfg
        #: the values of :attr:`options`, checked and completed with their defaults
        self.settings: dict[str, Any] = resolve_settings(
            self.name, self.options, cfg.method_options
        )
        self.layer_budgets: dict[str, int] = {}
        self.layer_free: dict[str, int] = {}
        self.weight_budget = 0
        #: the settings given to :func:`create_method` (None: built from ``cfg`` directly)
        self.given: dict[str, Any] | None = None
        #: the data-parallel ranks training with it (None: one process), for what a method
        #: counts over the training batches (see :mod:`espn.training.distributed`)
        self.ranks: Ranks | None = None

    @classmethod
    def option_names(cls) -> list[str]:
        """The names of the method's own options, in declaration order."""
        return [o.name for o in cls.options]

    @classmethod
    def check_config(cls, cfg: TrainingSettings) -> None:
        """Refuse (ValueError naming the value and what is accepted) general settings this
        method cannot run with (each setting's own bounds are its declaration's, see
        :data:`espn.settings.training.OPTIONS`); methods with further needs extend it."""
        for what, value, used, budget in (
            ("gamma", cfg.gamma, cls.uses_gamma, "FLOP constraint"),
            ("alpha", cfg.alpha, cls.uses_alpha, "weight budget"),
        ):
            if not used and value != 1.0:
                raise ValueError(
                    f"method {cls.name!r} has no {budget}; {what} must be 1 or unset, got {value}"
                )
        epochs = tuple(cfg.epochs)
        if sum(epochs) < 1:
            raise ValueError(
                "epochs must be three non-negative counts (pre-train, prune, fine-tune) with at "
                f"least one epoch, got {','.join(map(str, epochs))}"
            )
        if not 0 <= cfg.warmup <= epochs[0]:
            raise ValueError(
                f"warmup must be in [0, {epochs[0]}] (the pre-training epochs it is taken "
                f"from), got {cfg.warmup}"
            )

    @classmethod
    def check_given(cls, settings: Mapping[str, Any], given: set[str]) -> None:
        """Refuse (ValueError) an own option the user set explicitly (``given``: their names)
        that cannot apply with the method's resolved ``settings``; the docs promise that an
        option which would be ignored is refused. Methods with such options extend it."""

    @classmethod
    def run_defaults(cls, regime: str) -> dict[str, Any]:
        """The run options this method's recipe sets for a benchmark of ``regime`` (over a
        preset's and the regime's recipe; under those the user gives): its :attr:`recipe`,
        and no FLOP constraint (gamma 1) or weight budget (alpha 1) where it has none."""
        budgets = {"gamma": 1.0} if not cls.uses_gamma else {}
        budgets |= {"alpha": 1.0} if not cls.uses_alpha else {}
        return budgets | dict(cls.recipe.get(regime, {}))

    @classmethod
    def takes_recipe_alpha(cls) -> bool:
        """Whether a recipe's (preset's, benchmark's) alpha applies to this method: not to
        one without a weight budget, nor to one whose own recipe sets it (Individual)."""
        return cls.uses_alpha and not any("alpha" in r for r in cls.recipe.values())

    def own_optimizer(self) -> OptimConfig | None:
        """The optimizer of :meth:`extra_parameters` (None: the weights'): :attr:`own_optim`
        at the learning rate of the option :attr:`own_lr`."""
        if self.own_optim is None or self.own_lr is None:
            return self.own_optim
        return replace(self.own_optim, lr=self.settings[self.own_lr])

    @torch.no_grad()
    def init_free_weights(self, supernet: Supernet, generator: torch.Generator) -> None:
        """Set the free weights of a task after the first as the ``free_init`` option says
        (methods without it keep them); frozen weights are never touched. Draws come from
        ``generator`` (the engine's, checkpointed), so a resumed run is identical."""
        how = self.settings.get("free_init", "keep")
        if how == "keep" or self.weights != "shared" or not supernet.masks:
            return
        for layer in supernet.layers.values():
            w = layer.weight
            w.copy_(torch.where(layer.frozen, w, fresh_weights(w, how, generator).to(w.device)))

    @property
    def zeroes_pruned(self) -> bool:
        """Whether a prune event may zero the free weights it prunes, and their optimizer
        state (see ``Supernet.zero_pruned``; the steps then skip the mask product): no
        forward pass of the task reads them, and none of a later task does before they are
        set anew: by ``free_init`` kaiming or zero, or, for a method whose every task keeps
        its own weights (Individual), by the initial weights it starts from. Not with
        ``free_init`` keep, whose next task starts from the values the pruned weights have."""
        if self.weights == "own":
            return True
        return self.weights == "shared" and self.settings.get("free_init", "keep") != "keep"

    @property
    def train_unit_affine(self) -> bool:
        """Whether BatchNorm affine parameters and affine gates are trained this run."""
        return self.trains_unit_affine or self.cfg.task_affine

    @property
    def prunes_units(self) -> bool:
        """Whether the method prunes neurons/channels (then non-affine gates are trained as
        saliencies until pruning ends)."""
        return False

    @property
    def prunes_slim(self) -> bool:
        """Whether a prune phase may train a slim copy between prune events (see
        :mod:`espn.training.slim_step`): the method's penalty and :meth:`after_step` read
        only the ``groups`` and ``layers`` of the network they are given, each module's
        alive entries alone, and its prune events change only the supernet."""
        return False

    @abstractmethod
    def phases(self) -> list[Phase]:
        """The phases every task goes through, in order."""

    def warmup_phases(self) -> list[Phase]:
        """The authors' warm-up: the first ``cfg.warmup`` pre-training epochs train the free
        weights alone (no penalty), the learning rate ramping up epoch by epoch."""
        if self.cfg.warmup <= 0:
            return []
        free_only = self.weights == "shared"
        return [Phase("warmup", self.cfg.warmup, schedule="ramp", free_only=free_only)]

    def finetune_phase(self, epochs: int) -> Phase:
        """Fine-tuning with the run's fine-tune learning rate and schedule."""
        return Phase(
            "finetune", epochs, schedule=self.cfg.finetune_schedule, lr=self.cfg.finetune_lr
        )

    def gradual_phases(self, regularise: bool = False) -> list[Phase]:
        """Warm-up, pre-training, gradual pruning (``prune_updates_per_epoch`` prune steps per
        pruning epoch) and fine-tuning; ``regularise``: the penalty in pre-training and pruning."""
        pre, prune, fine = self.cfg.epochs
        updates = max(1, prune * self.cfg.prune_updates_per_epoch)
        return [
            *self.warmup_phases(),
            Phase("pretrain", pre - self.cfg.warmup, regularise=regularise),
            Phase("prune", prune, regularise=regularise, prune_updates=updates),
            self.finetune_phase(fine),
        ]

    def joint_phases(
        self, name: str, regularise: bool = False, then: Sequence[Phase] = ()
    ) -> list[Phase]:
        """Warm-up, one phase ``name`` over the pre-training and pruning epochs, the phases
        ``then`` and fine-tuning."""
        pre, prune, fine = self.cfg.epochs
        return [
            *self.warmup_phases(),
            Phase(name, pre + prune - self.cfg.warmup, regularise=regularise),
            *then,
            self.finetune_phase(fine),
        ]

    def capacity_hint(self) -> str:
        """What to change when the earlier tasks took every weight (the run stops before
        the next task, see ``espn.training.engine``); methods with their own rule extend it."""
        return (
            "use a smaller --alpha so that each task leaves weights free, fewer --tasks or a "
            "wider model"
        )

    def report(self) -> dict[str, Any]:
        """Per-task facts for ``results.json`` beyond FLOPs and weights (e.g. penalty lambdas)."""
        return {}

    def begin_task(self, supernet: Supernet) -> None:
        """Called after the supernet opened a new working sub-network."""
        self.weight_budget = supernet.weight_budget(self.cfg.alpha)
        self.layer_free = {n: int((~m.frozen).sum()) for n, m in supernet.layers.items()}
        self.layer_budgets = {n: math.floor(self.cfg.alpha * f) for n, f in self.layer_free.items()}
        if not self.prunes_units:  # no step trains a scale-only gate: fix them at one now
            supernet.release_gates()

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state that a task resumed mid-way needs (checkpoints); methods that keep
        more state between ``begin_task`` and the end of a task extend it."""
        state: dict[str, Any] = {
            "weight_budget": self.weight_budget,
            "layer_budgets": dict(self.layer_budgets),
            "layer_free": dict(self.layer_free),
        }
        if self.own_parameters is not None:
            attribute, layers = self.own_parameters
            own: dict[str, nn.Parameter] = getattr(self, attribute)
            state[layers] = list(own)
            state |= {f"{attribute}.{n}": p.detach() for n, p in own.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (in place of ``begin_task`` on resume)."""
        self.weight_budget = int(state["weight_budget"])
        self.layer_budgets = {k: int(v) for k, v in state["layer_budgets"].items()}
        self.layer_free = {k: int(v) for k, v in state["layer_free"].items()}
        if self.own_parameters is not None:
            attribute, layers = self.own_parameters
            own = {
                n: nn.Parameter(state[f"{attribute}.{n}"].detach().clone()) for n in state[layers]
            }
            setattr(self, attribute, own)

    def attach(self, supernet: Supernet) -> None:
        """Called once when the engine is built, before any task is trained or a checkpoint
        restored: the supernet holds its freshly initialised weights."""

    def training_tasks(self, seq: TaskSequence) -> Sequence[Task]:
        """What the engine trains, in order: one task per entry of ``seq`` by default; each
        entry is committed by :meth:`commit` into one or more of ``seq``'s tasks (a lazy
        sequence stays lazy)."""
        return seq.tasks

    def extra_parameters(self) -> list[nn.Parameter]:
        """Trainable tensors the method owns besides the supernet's (:attr:`own_parameters`)."""
        return (
            [] if self.own_parameters is None else [*getattr(self, self.own_parameters[0]).values()]
        )

    def skips(self, phase: Phase) -> bool:
        """Whether the engine leaves ``phase`` out when it comes to it (a decision taken
        during the task, e.g. CPG ends its compacting rounds once the accuracy goal fails)."""
        return False

    def forward(self, supernet: Supernet, x: Tensor) -> Tensor:
        """Training-time logits of the working sub-network."""
        return supernet.forward_working(x)

    def loss(self, logits: Tensor, y: Tensor) -> Tensor:
        """Training loss of a batch (before the penalty)."""
        return F.cross_entropy(logits, y)

    def after_step(self, supernet: Supernet) -> None:
        """Called after every optimizer step (e.g. to clamp saliencies)."""

    def commit(self, supernet: Supernet, task: Task) -> None:
        """Store the trained working sub-network as the next task(s) of the supernet."""
        supernet.commit_task(self.weights)

    def penalty(self, supernet: Supernet) -> Tensor | None:
        """A regulariser added to the loss in phases with ``regularise=True``."""
        return None

    def weight_penalty(self, supernet: Supernet) -> Tensor | None:
        """A regulariser added to the loss in every phase: the authors' L2 term on the masked
        weights, at the ``masked_l2`` strength (None for methods without the option or at 0)."""
        strength = float(self.settings.get("masked_l2", 0.0))
        return strength * masked_weight_l2(supernet) if strength > 0 else None

    def prune_step(self, supernet: Supernet, progress: float) -> None:
        """Shrink the working sub-network; ``progress`` reaches 1.0 at the last step."""

    def prune_weights(self, supernet: Supernet, progress: float, reuse: str) -> None:
        """Magnitude-prune every layer towards its new-weight budget at ``progress``.

        A layer's budget is ``floor(alpha * its free weights)``, so that the task's new
        weights never exceed ``ceil(alpha * all free weights)``.
        """
        n_new = {
            name: new_weight_target(progress, self.layer_free[name], self.layer_budgets[name])
            for name in supernet.layers
        }
        prune_weights(supernet, n_new, reuse)


METHODS: Registry[type[Strategy]] = Registry("method", names=True)


class MethodSettingError(EspnError, ValueError):
    """A method setting is not accepted; the message names it and the accepted values."""


def declared_options() -> dict[str, tuple[Option, list[str]]]:
    """Every option the registered methods declare: name -> (declaration, its methods);
    see :func:`espn.settings.methods.declared`."""
    return declared({name: METHODS.get(name).options for name in METHODS})
