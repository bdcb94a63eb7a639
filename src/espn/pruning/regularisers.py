"""Sparsity regularisers on unit saliencies (gates or BatchNorm gamma), each averaged over
the alive saliencies as in the authors' code (docs/fidelity.md, the penalty weights' row).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import Tensor

from espn.settings.methods import POLARIZATION_T
from espn.supernet.supernet import Supernet


def flop_aware_lambdas(unit_flops: dict[str, float]) -> dict[str, float]:
    """lambda_l = sqrt(FLOP_l(m)) / sum_i sqrt(FLOP_i(m)): costly units are pushed down harder."""
    roots = {g: f**0.5 for g, f in unit_flops.items()}
    total = sum(roots.values())
    if total == 0:
        return dict.fromkeys(roots, 0.0)
    return {g: r / total for g, r in roots.items()}


class _NormOverLayers(torch.autograd.Function):
    """``||concat(w_l m_l)||_2 / sqrt(n)`` over layers in a few fused passes; the backward
    sends the divisor ``d = ||w m|| sqrt(n) / grad`` (the gradient is ``w m / d``).

    Each layer comes as ``values[l]``, the tensor whose norm counts (masked by ``masks[l]``
    unless None), and ``inputs[l]``, what the gradient goes to: the weight, which gets
    ``w_l m_l / d``, or the 0-d sink of the step's masked product (``MaskedLayer.step_parts``),
    which gets ``d`` alone and adds ``w_l / d`` in one ``addcdiv_`` pass, bit for bit
    autograd's (why a divisor: docs/changelog.md, "The masked-L2 gradient in one pass")."""

    @staticmethod
    def forward(
        ctx: Any,
        count: Tensor,
        masks: list[Tensor | None],
        values: list[Tensor],
        sinks: list[bool],
        *inputs: Tensor,
    ) -> Tensor:
        masked = [v if m is None else v * m for v, m in zip(values, masks, strict=True)]
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(masked)))
        scale = count.clamp_min(1.0).rsqrt()
        ctx.sinks = sinks
        copied = [m for m, sink in zip(masked, sinks, strict=True) if not sink]
        ctx.save_for_backward(total, scale, *copied)
        return total * scale

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        total, scale, *masked = ctx.saved_tensors
        # d/dw ||w m|| = w m / ||w m|| (0 where the norm is 0, as torch's norm gradient: an
        # infinite divisor)
        divisor = torch.where(
            total > 0, total / (grads[0] * scale), torch.full_like(total, math.inf)
        )
        copies = iter(torch._foreach_div(masked, divisor) if masked else [])
        out = [divisor if sink else next(copies) for sink in ctx.sinks]
        return (None, None, None, None, *out)


def masked_weight_l2(supernet: Supernet) -> Tensor:
    """The authors' L2 term on the active sub-network's weights: ``||w m||_2 / sqrt(nnz(m))``
    over the masked layers that produce units (CtRL's cells; the head is left out), with
    ``m`` the weight masks the phase trains under (docs/fidelity.md). No host sync; a masked
    weight the step's forward computed is read, not multiplied again (``_NormOverLayers``)."""
    layers = [layer for layer in supernet.layers.values() if layer.out_units is not None]
    count = torch.stack([layer.mask_count() for layer in layers]).sum()
    values: list[Tensor] = []
    masks: list[Tensor | None] = []
    inputs: list[Tensor] = []
    sinks: list[bool] = []
    for layer in layers:
        parts = layer.step_parts()
        if parts is not None:
            product, sink = parts
            values.append(product.detach())
            masks.append(None)
            inputs.append(sink)
            sinks.append(True)
        else:
            values.append(layer.weight)
            masks.append(None if layer.mask_is_ones() else layer.weight_mask)
            inputs.append(layer.weight)
            sinks.append(False)
    result: Tensor = _NormOverLayers.apply(count, masks, values, sinks, *inputs)
    return result


class Regulariser(ABC):
    """A penalty added to the task loss while pruning; ``refresh`` follows the sub-network."""

    #: whether the penalty and :meth:`after_step` read only ``supernet.groups`` (each
    #: module's saliencies, a dead unit's zero or masked out) and the state :meth:`refresh`
    #: set: a slim copy of the working sub-network then gets the same penalty and gradients
    #: (its groups hold the alive entries, in the supernet's order of groups and modules)
    slim_exact: ClassVar[bool] = False

    def __init__(self, strength: float) -> None:
        self.strength = strength

    def refresh(self, supernet: Supernet) -> None:
        """Recompute whatever depends on the current sub-network (called after each prune)."""

    def after_step(self, supernet: Supernet) -> None:
        """Called after every optimizer step of a task that prunes units (e.g. to clamp)."""

    def state_dict(self) -> dict[str, float | dict[str, float]]:
        """What the penalty depends on besides the supernet (saved with a task in training)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""

    @abstractmethod
    def __call__(self, supernet: Supernet) -> Tensor: ...


class WeightedL1(Regulariser):
    """``sum_l lambda_l ||Gamma_l||_1`` with one effective per-unit lambda per unit group.

    ``lambdas`` are the effective weights the loss uses: ``strength * w_l / n`` with ``n`` the
    alive saliencies and ``w_l`` the regulariser's relative weight of group ``l``.
    """

    slim_exact = True

    def __init__(self, strength: float) -> None:
        super().__init__(strength)
        self.lambdas: dict[str, float] = {}
        #: the lambdas as one tensor (a module's per entry), with the dict and device it was
        #: built from (a new dict after every refresh rebuilds it, into the same tensor where
        #: it fits: a compiled step reads it as an input that no prune event replaces)
        self._per_module: tuple[dict[str, float], torch.device, Tensor] | None = None

    def __call__(self, supernet: Supernet) -> Tensor:
        weights = [m.weight for mods in supernet.groups.values() for m in mods]
        # one fused L1 pass over every saliency vector, then one dot product with the lambdas
        return torch.stack(torch._foreach_norm(weights, 1)) @ self._lambda_tensor(supernet)

    def _lambda_tensor(self, supernet: Supernet) -> Tensor:
        """:attr:`lambdas` per gate/BatchNorm as one tensor on the saliencies' device, rebuilt
        after the dict changed (in place where the old one fits, so its identity stays)."""
        weight = next(m.weight for mods in supernet.groups.values() for m in mods)
        cached = self._per_module
        if cached is None or cached[0] is not self.lambdas or cached[1] != weight.device:
            values = [self.lambdas[g] for g, mods in supernet.groups.items() for _ in mods]
            fresh = torch.tensor(values, dtype=weight.dtype, device=weight.device)
            if cached is not None and cached[2].shape == fresh.shape and cached[1] == weight.device:
                fresh = cached[2].copy_(fresh)
            cached = self._per_module = (self.lambdas, weight.device, fresh)
        return cached[2]

    @abstractmethod
    def relative_weights(self, supernet: Supernet) -> dict[str, float]:
        """w_l of every unit group in the current sub-network."""

    def refresh(self, supernet: Supernet) -> None:
        n = max(supernet.alive_unit_entries(), 1)
        weights = self.relative_weights(supernet)
        self.lambdas = {g: self.strength * w / n for g, w in weights.items()}
        self._lambda_tensor(supernet)  # here, at the prune event, not inside a compiled step

    def state_dict(self) -> dict[str, float | dict[str, float]]:
        return {"lambdas": dict(self.lambdas)}

    def load_state_dict(self, state: dict) -> None:
        self.lambdas = {g: float(v) for g, v in state["lambdas"].items()}


class FlopAwareL1(WeightedL1):
    """The paper's FLOP-aware L1 penalty: ``w_l = sqrt(FLOP_l(m)) / mean_i sqrt(FLOP_i(m))``,
    i.e. the paper's ``lambda_l`` times the number of groups (the authors' normalisation),
    recomputed from the current sub-network after every prune step."""

    def __init__(self, strength: float, load: str = "output") -> None:
        super().__init__(strength)
        self.load = load

    def relative_weights(self, supernet: Supernet) -> dict[str, float]:
        lambdas = flop_aware_lambdas(supernet.unit_flops(self.load))
        return {g: lam * len(lambdas) for g, lam in lambdas.items()}


class UniformL1(WeightedL1):
    """Network slimming (Liu et al. 2017): the same lambda on every |gamma|."""

    def relative_weights(self, supernet: Supernet) -> dict[str, float]:
        return dict.fromkeys(supernet.groups, 1.0)


class Polarization(Regulariser):
    """Polarization (Zhuang et al. 2020):
    ``strength / n * sum_l sum_i (t |gamma_li| - |gamma_li - mean(gamma)|)``.

    The sum runs over every gate/BatchNorm ``l`` and its alive units ``i``; ``mean`` is the
    mean over all ``n`` alive saliencies of the network. After every optimizer step the
    saliencies are clamped to [0, 1] (docs/methods.md, the pruners).
    """

    slim_exact = True

    def __init__(self, strength: float, t: float = POLARIZATION_T) -> None:
        super().__init__(strength)
        self.t = t

    def __call__(self, supernet: Supernet) -> Tensor:
        mods = [m for group in supernet.groups.values() for m in group]
        gammas = torch.cat([m.weight for m in mods])
        alive = torch.cat([m.entry_mask() for m in mods]).to(gammas.dtype)
        n = alive.sum().clamp_min(1.0)
        mean = (gammas * alive).sum() / n
        polar = self.t * gammas.abs() - (gammas - mean).abs()
        return self.strength * (polar * alive).sum() / n

    @torch.no_grad()
    def after_step(self, supernet: Supernet) -> None:
        for mods in supernet.groups.values():
            for m in mods:
                m.weight.clamp_(0.0, 1.0)
