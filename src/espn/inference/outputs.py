"""Every task's sub-network run on one batch: its logits and its penultimate features.

The *head* is the last costed layer (masked linear or task head) a forward pass runs; its input
is the sub-network's penultimate representation. Only the features of the head's alive input
units are kept (a pruned unit's feature is exactly zero), so the features of task ``t`` are
the inputs of its slim exported head, in the same order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from espn.errors import EspnError
from espn.supernet.layers import MaskedLayer, TaskHead, expand_units, is_costed, with_unions
from espn.supernet.supernet import Supernet


class InferenceError(EspnError, ValueError):
    """Task-agnostic prediction cannot run as asked (no task learned, an unknown rule, a rule
    whose statistics the run does not hold); the message says what would work."""


@dataclass
class TaskOutputs:
    """One batch through every task: ``logits[t]`` (N, C_t) and ``features[t]`` (N, k_t), the
    alive penultimate features of task ``t`` (empty when not asked for)."""

    logits: list[Tensor]
    features: list[Tensor]


def head_name(supernet: Supernet) -> str:
    """The name of the last costed layer a forward pass runs (the classifier head)."""
    order: list[str] = []
    hooks = []
    for name, module in supernet.model.named_modules():
        if is_costed(module):
            hooks.append(module.register_forward_hook(lambda *_, n=name: order.append(n)))
    example = torch.zeros(
        1, *supernet.input_shape, dtype=supernet.input_dtype, device=_device(supernet)
    )
    try:
        with torch.no_grad(), _eval(supernet):
            supernet(example, task=0)
    finally:
        for h in hooks:
            h.remove()
    if not order:
        raise InferenceError("the supernet ran no masked layer or head")
    return order[-1]


def head_of(supernet: Supernet, name: str) -> MaskedLayer | TaskHead:
    """The head module ``name`` of ``supernet``'s model."""
    module = supernet.model.get_submodule(name)
    if not isinstance(module, MaskedLayer | TaskHead):
        raise InferenceError(f"module {name!r} is not a masked layer or task head")
    return module


def alive_features(supernet: Supernet, task: int, head: str) -> Tensor:
    """Indices of the head's inputs that are alive in task ``task`` (all when the head's input
    is not a unit group)."""
    module = head_of(supernet, head)
    width = int(module.weight.shape[1])
    group = module.in_units
    if group is None:
        return torch.arange(width)
    units = with_unions(supernet.masks[task].units, supernet.unions)[group]
    return expand_units(units.cpu(), module.in_unit_size).nonzero().flatten()


def _device(supernet: Supernet) -> torch.device:
    return next(supernet.parameters()).device


@contextmanager
def _eval(module: nn.Module) -> Iterator[None]:
    was = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was)


@torch.no_grad()
def task_outputs(
    supernet: Supernet, x: Tensor, tasks: Sequence[int], head: str | None = None
) -> TaskOutputs:
    """Logits of each task in ``tasks`` on ``x`` and, given the ``head``'s name, their alive
    penultimate features: one forward pass of each task's sub-network over the whole batch."""
    captured: list[Tensor] = []
    hook = None
    if head is not None:
        module = supernet.model.get_submodule(head)
        hook = module.register_forward_pre_hook(lambda _, inp: captured.append(inp[0]))
    logits, features = [], []
    try:
        with _eval(supernet):
            for t in tasks:
                captured.clear()
                logits.append(supernet(x, task=t))
                if head is not None:
                    keep = alive_features(supernet, t, head).to(x.device)
                    features.append(captured[-1].flatten(1).index_select(1, keep))
    finally:
        if hook is not None:
            hook.remove()
    return TaskOutputs(logits, features)
