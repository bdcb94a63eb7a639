"""CPG (Hung et al. 2019): compacting, picking and growing, growing disabled."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.func import functional_call

from espn.data.tasks import Task
from espn.methods.base import METHODS, Phase, Recipes, Strategy
from espn.pruning.weights import prune_weights
from espn.settings.methods import METHOD_OPTIONS
from espn.settings.training import OptimConfig, TrainingSettings
from espn.supernet.supernet import Supernet

#: sparsity of the task's own weights after each compacting round (CPG's schedule: steps
#: of 0.1, then 0.05); when rounds stop is ``cpg_stop``'s rule
SPARSITIES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
#: learning rate of the compacting rounds and of retraining, relative to the run's (CPG: 1e-3
#: after training at 1e-2)
LR_SCALE = 0.1
#: CPG's real-valued picking mask: initial value and binarisation threshold
PICK_INIT = 1e-2
PICK_THRESHOLD = 5e-3


class _Binarise(torch.autograd.Function):
    """1 where the real mask exceeds the threshold, else 0; the gradient passes straight through."""

    @staticmethod
    def forward(ctx: Any, scores: Tensor, threshold: float) -> Tensor:
        # compared into a float tensor: a bool result converted costs several times more
        return torch.gt(scores, threshold, out=torch.empty_like(scores))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def _check_rounds(epochs: tuple[int, int, int]) -> None:
    if epochs[1] < 1:
        raise ValueError(
            f"method 'cpg' compacts in rounds of PRUNE epochs, so epochs PRE,PRUNE,FINE "
            f"needs PRUNE >= 1, got {','.join(map(str, epochs))}"
        )


@METHODS.register("cpg")
class CPG(Strategy):
    """Each task picks among the frozen weights and compacts its own, growing disabled: phases
    ``train``, up to ten compacting rounds (:data:`SPARSITIES`) and ``retrain``, stopped by
    ``cpg_stop``; the phases, the stop rule and the recipe are described in docs/methods.md,
    where it differs from ivclab/CPG in docs/fidelity.md."""

    uses_gamma = False
    uses_alpha = False
    recipe: ClassVar[Recipes] = {
        regime: {
            "optimizer": "nesterov",
            "lr": 1e-2,
            "momentum": 0.9,
            "weight_decay": 4e-5,
            "batch_size": 32,
            "warmup": 0,
        }
        for regime in ("mnist", "cifar")
    }
    own_optim = OptimConfig("adam", 5e-4, 0.0, 0.0, (0.9, 0.999), schedule="phase")
    own_lr = "cpg_mask_lr"
    own_parameters = ("scores", "score_layers")
    options = METHOD_OPTIONS["cpg"]

    @classmethod
    def check_config(cls, cfg: TrainingSettings) -> None:
        """Compacting runs in rounds of PRUNE epochs, so PRUNE must be at least 1."""
        super().check_config(cfg)
        _check_rounds(cfg.epochs)

    @classmethod
    def check_given(cls, settings: Mapping[str, Any], given: set[str]) -> None:
        """``cpg_train_acc`` is the reference stop rule's: refused with ``cpg_stop`` goal."""
        if settings.get("cpg_stop") == "goal" and "cpg_train_acc" in given:
            raise ValueError(
                "cpg_train_acc applies to cpg_stop reference only (compacting continues while "
                f"the training accuracy exceeds it); cpg_stop goal ignores it, so leave it "
                f"unset (got {settings['cpg_train_acc']!r})"
            )

    def capacity_hint(self) -> str:
        """CPG keeps every weight of a task whose compacting keeps no round."""
        return (
            "a CPG task keeps all the free weights when no compacting round is kept: with "
            "cpg_stop reference, rounds run only while the training accuracy exceeds "
            f"--cpg-train-acc ({self.settings['cpg_train_acc']:g}%); train longer, lower "
            "--cpg-train-acc, or use fewer --tasks or a wider model"
        )

    def __init__(self, cfg: TrainingSettings) -> None:
        super().__init__(cfg)
        _check_rounds(cfg.epochs)
        self.scores: dict[str, nn.Parameter] = {}
        self._reset()

    def _reset(self) -> None:
        self.stage = "train"  # then "compact", then "retrain"
        self.round = 0  # compacting rounds kept so far (run on from)
        self.stopped = False  # compacting is over (the stop rule said so or last round done)
        self.accuracies: list[float | None] = []  # of each compacting round that ran
        self.kept = 0  # rounds in the snapshot (the state compacting returns to)
        self.goal: float | None = None
        self.measuring = False
        self._frozen: dict[str, Tensor] = {}  # a picking layer's frozen weights as 1.0, else 0.0
        #: the blended masks while compacting (picking fixed), dropped at every prune step
        self._blended: dict[str, Tensor] = {}
        self.correct: int | Tensor = 0
        self.seen = 0
        self.snapshot: dict[str, Tensor] = {}

    def _updates(self, epochs: int) -> int:
        return max(2, epochs * self.cfg.prune_updates_per_epoch)

    def phases(self) -> list[Phase]:
        pre, prune, fine = self.cfg.epochs
        rounds = [
            Phase(f"compact {s:g}", prune, prune_updates=self._updates(prune), lr_scale=LR_SCALE)
            for s in SPARSITIES
        ]
        return [
            Phase("train", pre, schedule="step", prune_updates=self._updates(pre)),
            *rounds,
            Phase("retrain", fine, schedule="cosine", lr_scale=LR_SCALE),
        ]

    def skips(self, phase: Phase) -> bool:
        return self.stopped and phase.name.startswith("compact")

    def begin_task(self, supernet: Supernet) -> None:
        super().begin_task(supernet)
        self._reset()
        self.scores = {
            n: nn.Parameter(torch.full_like(layer.weight, PICK_INIT))
            for n, layer in supernet.layers.items()
            if bool(layer.frozen.any())
        }

    def state_dict(self) -> dict[str, Any]:
        """Budgets, stage, goal, the accuracy being measured, the picking masks and the
        snapshot a failed round returns to (tensors, which the checkpoint stores apart)."""
        state = super().state_dict() | {
            "stage": self.stage,
            "round": self.round,
            "stopped": self.stopped,
            "accuracies": list(self.accuracies),
            "kept": self.kept,
            "goal": self.goal,
            "measuring": self.measuring,
            "correct": int(self.correct),
            "seen": self.seen,
            "snapshot_keys": list(self.snapshot),
        }
        return state | {f"snapshot.{k}": v for k, v in self.snapshot.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.stage = str(state["stage"])
        self.round = int(state["round"])
        self.stopped = bool(state["stopped"])
        self.accuracies = [None if a is None else float(a) for a in state.get("accuracies", [])]
        self.kept = int(state.get("kept", self.round))
        self.goal = None if state["goal"] is None else float(state["goal"])
        self.measuring = bool(state["measuring"])
        self.correct, self.seen = int(state["correct"]), int(state["seen"])
        self.snapshot = {k: state[f"snapshot.{k}"].clone() for k in state["snapshot_keys"]}
        self._frozen, self._blended = {}, {}

    def forward(self, supernet: Supernet, x: Tensor) -> Tensor:
        if not self.scores:
            return supernet.forward_working(x)
        masks = self._blended or self._blend(supernet)
        if self.stage == "compact":  # picking fixed: the masks hold until the next prune step
            self._blended = masks
        return functional_call(supernet.model, masks, (x,))

    def _blend(self, supernet: Supernet) -> dict[str, Tensor]:
        """Each picking layer's mask: the picking mask on frozen weights, the task's own on
        free ones (through the picking mask's straight-through estimator, unless compacting)."""
        masks = {}
        for n, s in self.scores.items():
            layer = supernet.layers[n]
            pick = _Binarise.apply(s.detach() if self.stage == "compact" else s, PICK_THRESHOLD)
            if n not in self._frozen:
                self._frozen[n] = layer.frozen.to(pick.dtype)
            # frozen weights take the picking mask, free ones the task's: a blend by exact
            # 0/1 weights, several times faster on the CPU than a boolean where
            masks[f"{n}.weight_mask"] = torch.lerp(layer.weight_mask, pick, self._frozen[n])
        return masks

    def loss(self, logits: Tensor, y: Tensor) -> Tensor:
        if self.measuring:
            self.correct = self.correct + (logits.detach().argmax(1) == y).sum()
            self.seen += int(y.numel())
        return super().loss(logits, y)

    def _measured(self) -> float | None:
        """Accuracy (%) of the training batches since measuring started (None: no batch)."""
        self.measuring = False
        correct, seen = int(self.correct), self.seen
        if self.ranks is not None:  # each rank saw its slice of the batches
            correct, seen = self.ranks.total(correct, seen)
        return None if seen == 0 else 100.0 * correct / seen

    def _measure(self) -> None:
        self.measuring, self.correct, self.seen = True, 0, 0

    @torch.no_grad()
    def _take_snapshot(self, supernet: Supernet) -> None:
        self.snapshot = {
            f"weight.{n}": m.weight.detach().clone() for n, m in supernet.layers.items()
        }
        self.snapshot |= {f"mask.{n}": m.bool().clone() for n, m in supernet.weight_masks().items()}
        self.snapshot |= {f"state.{k}": v for k, v in supernet.task_state().items()}

    @torch.no_grad()
    def _roll_back(self, supernet: Supernet) -> None:
        """Return to the snapshot: the task's own weights, its masks, its head/BatchNorm."""
        for n, layer in supernet.layers.items():
            saved = self.snapshot[f"weight.{n}"]
            layer.weight.copy_(torch.where(layer.frozen, layer.weight, saved))
        supernet.set_weight_masks({n: self.snapshot[f"mask.{n}"] for n in supernet.layers})
        for name, m in supernet.task_modules.items():
            prefix = f"state.{name}."
            m.load_task_state(
                {k[len(prefix) :]: v for k, v in self.snapshot.items() if k.startswith(prefix)}
            )

    def _compact(self, supernet: Supernet, sparsity: float) -> None:
        """Keep the largest ``1 - sparsity`` of each layer's free weights (among those kept)."""
        keep = {n: free - math.floor(sparsity * free) for n, free in self.layer_free.items()}
        prune_weights(supernet, keep, "all")

    def prune_step(self, supernet: Supernet, progress: float) -> None:
        """Of a phase's ``n`` updates, the first half prunes (compacting rounds: on the cubic
        schedule to the round's sparsity) and the second half measures the accuracy: the goal
        (``train``), or whether the round is kept or undone (compacting rounds)."""
        pre, prune, _ = self.cfg.epochs
        self._blended = {}  # the task's masks may change here
        if self.stage not in ("train", "compact"):
            return
        n = self._updates(pre if self.stage == "train" else prune)
        k, half = round(progress * n), n // 2
        if self.stage == "compact" and k <= half:
            start = SPARSITIES[self.round - 1] if self.round else 0.0
            end = SPARSITIES[self.round]
            self._compact(supernet, end + (start - end) * (1.0 - k / half) ** 3)
        if k == half:
            self._measure()
        if k < n:
            return
        acc = self._measured()
        if self.stage == "train":
            self.goal = None if acc is None else acc - self.settings["cpg_acc_loss"]
            self._take_snapshot(supernet)
            self.stage = "compact"
            return
        self.accuracies.append(acc)
        reached = self.goal is None or acc is None or acc >= self.goal  # nothing measured: no miss
        if self.settings["cpg_stop"] == "goal":
            go_on = reached
        else:  # the reference: prune on while training accuracy stays high, goal or not
            go_on = acc is None or acc > self.settings["cpg_train_acc"]
        if go_on:
            self.round += 1
            if reached:
                self._take_snapshot(supernet)
                self.kept = self.round
        self.stopped = not go_on or self.round == len(SPARSITIES)
        if self.stopped:
            if self.kept != self.round or not go_on:
                self._roll_back(supernet)  # to the largest sparsity that reached the goal
            self.snapshot = {}
            self.stage = "retrain"

    def report(self) -> dict[str, Any]:
        """The task's compacting: its goal, each round's accuracy and the sparsity kept."""
        return {
            "compacting": {
                "goal": self.goal,
                "accuracies": list(self.accuracies),
                "kept_sparsity": SPARSITIES[self.kept - 1] if self.kept else 0.0,
            }
        }

    @torch.no_grad()
    def commit(self, supernet: Supernet, task: Task) -> None:
        """Store the task: its picked frozen weights and its compacted own weights."""
        masks = {}
        for n, layer in supernet.layers.items():
            kept = layer.weight_mask.bool()
            if n in self.scores:
                kept = torch.where(layer.frozen, self.scores[n] > PICK_THRESHOLD, kept)
            masks[n] = kept
            if self.settings["cpg_zero_released"]:
                layer.weight.masked_fill_(~layer.frozen & ~kept, 0.0)
        supernet.set_weight_masks(masks)
        supernet.commit_task(self.weights)
