"""Training a task's sub-network at its own cost: a physically slimmed copy of it
(:class:`SlimNet`), trained instead of the masked supernet once the task's units are fixed and
written back (:meth:`SlimPhase.write_back`); frozen weights never are, so zero forgetting stays
exact. When and how: docs/performance.md, "Training and evaluating at the sub-network's cost".
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor

from espn.layers.base import WHOLE, Cut, take
from espn.layers.conv2d import MaskedConv2d
from espn.methods.base import Phase, Strategy
from espn.settings.training import OptimizerSettings
from espn.supernet.supernet import Supernet
from espn.training.optim import FrozenGuard, TaskOptimizer
from espn.training.slim_net import SlimNet, SlimUnsupported, put

#: largest difference allowed between the slim copy's and the supernet's logits on a check
#: batch, relative to the largest logit (at least 1): float32 rounding of sums in another order
CHECK_TOLERANCE = 1e-4
#: buffers that describe the sub-network rather than train: never written back
_FIXED_BUFFERS = ("unit_mask", "weight_mask", "frozen", "released")


def slim_phase_applies(strategy: Strategy, phases: list[Phase], p: int) -> bool:
    """Whether phase ``p`` may train a slim copy: the method declares it exact
    (:attr:`Strategy.trains_slim`), the phase has no free-only forward, and either it is a
    fine-tuning (no prune event, no unit penalty, after a phase that pruned) or it prunes
    and the method declares :attr:`Strategy.prunes_slim` (docs/performance.md).
    """
    phase = phases[p]
    if not strategy.trains_slim or phase.free_only:
        return False
    if phase.prune_updates > 0:
        return strategy.prunes_slim
    return not phase.regularise and any(q.prune_updates > 0 for q in phases[:p])


#: what building a slim copy and writing it back costs, in optimizer steps, per masked weight
#: over the dense FLOPs of a batch (measured: docs/performance.md, "When a copy pays")
SLIM_REBUILD_COST = 512.0
#: what a copy's first step costs beyond the steps after it, per convolution, in FLOPs of a
#: dense step: the convolution library prepares its kernels for new channel counts (measured:
#: docs/performance.md, "When a copy pays")
SLIM_CONV_SETUP = 5e7


def rebuild_steps(supernet: Supernet, batch_size: int) -> float:
    """What a slim copy of ``supernet`` costs to build, write back and start (its first
    step's convolution set-up), in optimizer steps at ``batch_size`` (see
    :data:`SLIM_REBUILD_COST`, :data:`SLIM_CONV_SETUP`)."""
    weights = sum(layer.weight.numel() for layer in supernet.layers.values())
    convs = sum(isinstance(layer, MaskedConv2d) for layer in supernet.layers.values())
    cost = SLIM_REBUILD_COST * weights + SLIM_CONV_SETUP * convs
    return cost / (supernet.dense_flops * batch_size)


def slim_prune_pays(supernet: Supernet, steps: int, batch_size: int) -> bool:
    """Whether a prune phase trains a slim copy for the ``steps`` optimizer steps between two
    prune events: the steps it saves, each about the share of FLOPs the dead units take
    (``1 - flops / dense_flops``), at least pay for the copy (:func:`rebuild_steps`). Read
    from the supernet's unit masks, the events' spacing and the batch size alone, so that a
    resumed run decides as the run it continues."""
    saved = 1.0 - supernet.flops() / supernet.dense_flops
    return saved > 0 and steps * saved >= rebuild_steps(supernet, batch_size)


def _narrower(net: SlimNet, supernet: Supernet) -> bool:
    """Whether the copy removes units (fewer parameters than the supernet): a copy of the
    whole width only skips mask products, which measured slower than the masked step
    (PackNet's fine-tuning, FC1024, one thread: 1.54x a plain step against 1.41x)."""
    return sum(p.numel() for p in net.parameters()) < sum(
        p.numel() for p in supernet.model.parameters()
    )


@torch.no_grad()
def _check(net: SlimNet, supernet: Supernet) -> None:
    """Refuse a copy whose eval-mode logits on a random batch differ from the supernet's
    (a model whose forward depends on widths the copy changed)."""
    x = torch.randn(
        (4, *supernet.input_shape),
        generator=torch.Generator().manual_seed(0),
        dtype=next(supernet.parameters()).dtype,
    ).to(next(supernet.parameters()).device)
    was = supernet.training
    supernet.eval()
    net.eval()
    try:
        want = supernet.forward_working(x)
        got = net.forward_working(x)
    except (RuntimeError, ValueError) as exc:
        raise SlimUnsupported(f"the slim copy does not run: {exc}") from None
    finally:
        supernet.train(was)
        net.train(was)
    scale = max(1.0, float(want.abs().max()))
    if got.shape != want.shape or not float((got - want).abs().max()) <= CHECK_TOLERANCE * scale:
        raise SlimUnsupported("the slim copy's logits differ from the supernet's")


class SlimPhase:
    """A phase trained on a :class:`SlimNet`: its optimizer (the task's, its state sliced),
    its guard, and the write-back of everything it trained into the supernet."""

    def __init__(
        self,
        supernet: Supernet,
        config: OptimizerSettings,
        trainable: list[Tensor],
        optimizer: TaskOptimizer,
        previous: SlimPhase | None = None,
    ) -> None:
        self.supernet = supernet
        self.net = SlimNet(supernet).to(next(supernet.parameters()).device)
        # a copy cut like ``previous``, the last copy of this supernet (the same tensors cut,
        # narrower only where units died since: a prune phase's next copy), runs as that one
        # was checked to; a copy cut anew is checked (a forward pass of the masked supernet)
        if (
            previous is None
            or previous.supernet is not supernet
            or previous.net.cut_names() != self.net.cut_names()
        ):
            _check(self.net, supernet)
        names = {id(t): n for n, t in supernet.model.named_parameters()}
        if any(id(t) not in names for t in trainable) or optimizer.own is not None:
            raise SlimUnsupported("the method trains tensors outside the supernet's model")
        mine = dict(self.net.model.named_parameters())
        #: the supernet's trainable tensors and the copy's, in the optimizer's order
        self.full = list(trainable)
        self.names = [names[id(t)] for t in trainable]
        self.slim = [mine[n] for n in self.names]
        self.optimizer = TaskOptimizer(config, self.slim)
        self.optimizer.load_state_dict(self._sliced_state(optimizer.state_dict()))
        self.guard = FrozenGuard(self.net, restore=self.optimizer.decays)  # type: ignore[arg-type]

    def parts(self) -> tuple[TaskOptimizer, FrozenGuard, Supernet]:
        """What the engine's step takes: the copy's optimizer, guard, and the copy (it has
        the supernet's ``layers``, ``groups`` and ``forward_working``, all a step reads)."""
        return self.optimizer, self.guard, cast(Supernet, self.net)

    @classmethod
    def build(
        cls,
        supernet: Supernet,
        config: OptimizerSettings,
        trainable: list[Tensor],
        optimizer: TaskOptimizer,
        previous: SlimPhase | None = None,
    ) -> SlimPhase | None:
        """The slim phase, or None where a copy would not be exact or computes no less
        (``previous``: the phase's last copy, written back, see :meth:`__init__`)."""
        try:
            phase = cls(supernet, config, trainable, optimizer, previous)
        except SlimUnsupported:
            return None
        return phase if _narrower(phase.net, supernet) else None

    def _where(self, name: str) -> tuple[Cut, Tensor | None]:
        """Where tensor ``name`` of the copy sits in the supernet, and which of its entries
        the task trains (None: all)."""
        index = self.net.index.get(name, WHOLE)
        layer = name.rsplit(".", 1)[0] if name.endswith(".weight") else None
        return index, self.net.trains.get(layer) if layer is not None else None

    def _sliced_state(self, state: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for i, values in state.items():
            i = int(i)
            if i >= len(self.full):
                continue
            index, trains = self._where(self.names[i])
            out[i] = {}
            for key, value in values.items():
                if isinstance(value, Tensor) and value.shape == self.full[i].shape:
                    part = take(value, index)
                    if part is value:
                        part = part.clone()
                    if trains is not None:
                        part.mul_(trains)  # no state for what the task may not change
                    out[i][key] = part
                else:
                    out[i][key] = value.clone() if isinstance(value, Tensor) else value
        return out

    @torch.no_grad()
    def write_back(self, optimizer: TaskOptimizer) -> None:
        """Write the trained weights, task state and their optimizer state into the supernet
        and ``optimizer`` (the task's): what the task trains, never a frozen weight."""
        for full, part, name in zip(self.full, self.slim, self.names, strict=True):
            index, trains = self._where(name)
            value = part.detach()
            if trains is not None:
                value = torch.where(trains, value, take(full.detach(), index))
            put(full.data, index, value)
        named = dict(self.supernet.model.named_buffers())
        for name, buffer in self.net.model.named_buffers():
            if not name.endswith(_FIXED_BUFFERS):  # statistics: BatchNorm's running ones
                put(named[name], self.net.index.get(name, WHOLE), buffer)
        # the optimizer state, into the task optimizer's own tensors (the copy's optimizer is
        # the weights' one: see __init__)
        assert optimizer.weights is not None and self.optimizer.weights is not None
        live, mine = optimizer.weights.state, self.optimizer.weights.state
        for full, part, name in zip(self.full, self.slim, self.names, strict=True):
            values = mine.get(part)
            if not values:
                continue
            index, trains = self._where(name)
            target = live[full]
            for key, value in values.items():
                if isinstance(value, Tensor) and value.shape == part.shape:
                    into = target.get(key)
                    if into is None:
                        into = target[key] = torch.zeros_like(full)
                    if trains is not None:
                        value = torch.where(trains, value, take(into, index))
                    put(into, index, value)
                else:
                    target[key] = value.clone() if isinstance(value, Tensor) else value
