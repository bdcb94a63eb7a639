"""Rule ``supsup-oneshot``: SupSup's one-shot task inference (Wortsman et al. 2020, "GN");
see docs/task-agnostic.md, "The rules"."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from espn.inference.outputs import InferenceError, TaskOutputs
from espn.inference.rule import RULES, Rule
from espn.inference.statistics import entropy
from espn.layers.conv2d import MaskedConv2d
from espn.layers.linear import MaskedLinear
from espn.supernet.layers import TaskHead
from espn.supernet.supernet import Supernet


def _superposable(supernet: Supernet) -> None:
    """Refuse tasks that differ in anything but their weight masks and heads."""
    first = supernet.masks[0]
    heads = {n for n, m in supernet.task_modules.items() if isinstance(m, TaskHead)}
    for t, mask in enumerate(supernet.masks[1:], start=1):
        if mask.own or first.own:
            raise InferenceError(
                "rule 'supsup-oneshot' superposes masks over shared weights; these tasks keep "
                "their own weights (Individual): use rule 'entropy' or 'mahalanobis'"
            )
        units = all(torch.equal(mask.units[g], first.units[g]) for g in first.units)
        state = all(
            torch.equal(v, first.state[k])
            for k, v in mask.state.items()
            if k.split(".")[0] not in heads and k.rsplit(".", 1)[0] not in heads
        )
        if not units or not state or mask.n_classes != first.n_classes:
            raise InferenceError(
                f"rule 'supsup-oneshot' superposes the tasks' masks, so tasks may differ only in "
                f"their weight masks and heads (SupSup); task {t} also differs from task 0 in "
                "its units, gates/BatchNorm or class count: use rule 'entropy' or 'mahalanobis'"
            )


def _task_weights(supernet: Supernet, name: str, module: nn.Module) -> tuple[Tensor, Tensor | None]:
    """Every task's weight (T, ...) of one costed layer, and its biases (T, out) if any."""
    device = next(supernet.parameters()).device
    if isinstance(module, TaskHead):
        weights = torch.stack([m.state[f"{name}.weight"].to(device) for m in supernet.masks])
        biases = torch.stack([m.state[f"{name}.bias"].to(device) for m in supernet.masks])
        return weights, biases
    assert isinstance(module, MaskedLinear | MaskedConv2d)
    w = module.weight.detach()
    masks = torch.stack([m.weight_mask(name, device).to(w.dtype) for m in supernet.masks])
    return w[None] * masks, None


def _superposed(
    module: nn.Module, weights: Tensor, biases: Tensor | None, alpha: Tensor
) -> Callable:
    """A forward hook making ``module`` output ``sum_t alpha[n, t] layer_t(a_n)``."""

    def hook(mod: nn.Module, inp: tuple[Tensor, ...], out: Tensor) -> Tensor:
        a = inp[0]
        if isinstance(mod, nn.Conv2d):
            t, o = weights.shape[:2]
            per_task = mod._conv_forward(a, weights.flatten(0, 1), None)  # (N, T*O, H, W)
            per_task = per_task.unflatten(1, (t, o))
            return torch.einsum("nt,nto...->no...", alpha, per_task)
        per_task = torch.einsum("n...i,toi->nt...o", a, weights)
        if biases is not None:
            per_task = per_task + biases.view(1, biases.shape[0], *([1] * (a.dim() - 2)), -1)
        return torch.einsum("nt,nt...->n...", alpha, per_task)

    return hook


@RULES.register("supsup-oneshot")
class SupSupOneShot(Rule):
    """The most negative gradient of the superposed network's entropy wrt the mixing
    coefficients."""

    summary = (
        "SupSup's one-shot inference: one entropy gradient wrt the coefficients of the "
        "superposed masks (SupSup runs only)"
    )

    def check(self, supernet: Supernet) -> None:
        super().check(supernet)
        _superposable(supernet)

    def scores(self, supernet: Supernet, x: Tensor) -> tuple[Tensor, TaskOutputs | None]:
        n_tasks = len(supernet.masks)
        alpha = torch.full((len(x), n_tasks), 1.0 / n_tasks, device=x.device, requires_grad=True)
        hooks = []
        was = supernet.training
        supernet.eval()
        supernet.use_task(0)  # gates and norms: the same in every task (checked)
        try:
            for name, module in supernet.model.named_modules():
                if isinstance(module, MaskedLinear | MaskedConv2d | TaskHead):
                    weights, biases = _task_weights(supernet, name, module)
                    hooks.append(
                        module.register_forward_hook(_superposed(module, weights, biases, alpha))
                    )
            with torch.enable_grad():
                logits = supernet.model(x)
                (grad,) = torch.autograd.grad(entropy(logits).sum(), alpha)
        finally:
            for h in hooks:
                h.remove()
            supernet.train(was)
        return grad.detach(), None

    def passes(self, flops_ratios: list[float]) -> float:
        """Every task's masked layers forward and backward (2 T dense passes), then the
        chosen task's sub-network."""
        return 2.0 * len(flops_ratios) + max(flops_ratios, default=0.0)
