"""Every task's sub-network run on one batch: its logits and the features of its head's alive
input units (the inputs of its slim exported head, in the same order)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from espn.errors import EspnError
from espn.layers.attention import MaskedAttention
from espn.layers.base import call_hooked
from espn.layers.linear import MaskedLinear
from espn.supernet import fast
from espn.supernet.layers import (
    MaskedLayer,
    TaskHead,
    expand_units,
    is_costed,
    with_unions,
)
from espn.supernet.supernet import Supernet


class InferenceError(EspnError, ValueError):
    """Task-agnostic prediction cannot run as asked (no task learned, an unknown rule, a rule
    whose statistics the run does not hold); the message says what would work."""


#: the most bytes the tasks' stacked tensors of a batched pass may take (beyond: one pass
#: per task)
BATCHED_BYTES = 2**30


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
    with torch.no_grad(), eval_mode(supernet):
        call_hooked(supernet, hooks, example, task=0)
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
    units = with_unions(supernet.masks[task].units, supernet.unions, supernet.concats)[group]
    return expand_units(units.cpu(), module.in_unit_size).nonzero().flatten()


def _device(supernet: Supernet) -> torch.device:
    return next(supernet.parameters()).device


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode for the block, then back in the mode it was in."""
    was = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was)


@torch.no_grad()
def task_outputs(
    supernet: Supernet,
    x: Tensor,
    tasks: Sequence[int],
    head: str | None = None,
    states: dict[str, Tensor] | None = None,
) -> TaskOutputs:
    """Logits of each task in ``tasks`` on ``x`` and, given the ``head``'s name, their alive
    penultimate features: one forward pass of each task's sub-network over the whole batch,
    or, given the tasks' ``states`` (:func:`batched_states` of ``tasks``), all of them as one
    batched pass (``vmap``)."""
    captured: list[Tensor] = []
    hook = None
    if head is not None:
        module = supernet.model.get_submodule(head)
        hook = module.register_forward_pre_hook(lambda _, inp: captured.append(inp[0]))
    try:
        with eval_mode(supernet):
            if states is None:
                logits, penultimate = [], []
                for t in tasks:
                    captured.clear()
                    logits.append(supernet(x, task=t))
                    penultimate.extend(captured[-1:])
            else:

                def one(state: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
                    captured.clear()
                    out = functional_call(supernet.model, state, (x,))
                    return out, captured[-1] if captured else out

                with fast.enabled(False):  # no cache of one task's tensors may answer
                    stacked, inputs = vmap(one)(states)
                logits, penultimate = list(stacked.unbind()), list(inputs.unbind())
    finally:
        if hook is not None:
            hook.remove()
    features = []
    if head is not None:
        for t, f in zip(tasks, penultimate, strict=True):
            keep = alive_features(supernet, t, head).to(x.device)
            features.append(f.flatten(1).index_select(1, keep))
    return TaskOutputs(logits, features)


def batched_states(supernet: Supernet, tasks: Sequence[int]) -> dict[str, Tensor] | None:
    """Every parameter and buffer of the model as each task in ``tasks`` loads it, stacked along a
    new first axis (task), for one pass of all sub-networks at once; None where that is not exact
    or not possible (docs/task-agnostic.md, "The rules": which networks run batched)."""
    model = supernet.model
    size = sum(v.numel() * v.element_size() for v in chain(model.parameters(), model.buffers()))
    linear = all(isinstance(layer, MaskedLinear) for layer in supernet.layers.values())
    attention = any(isinstance(m, MaskedAttention) for m in model.modules())
    if len(tasks) < 2 or size * len(tasks) > BATCHED_BYTES or not linear or attention:
        return None
    per_task = []
    for t in tasks:
        supernet.use_task(t)
        named = chain(model.named_parameters(), model.named_buffers())
        per_task.append({k: v.detach().clone() for k, v in named})
    if any(s[k].shape != per_task[0][k].shape for s in per_task for k in s):
        return None
    return {k: torch.stack([s[k] for s in per_task]) for k in per_task[0]}
