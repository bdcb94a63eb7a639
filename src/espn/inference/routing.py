"""Training that prepares a task for prediction without the task id (``task_agnostic``); see
docs/task-agnostic.md, "Preparing the tasks"."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from espn.data.tasks import Split, Task
from espn.data.tensors import split_tensors
from espn.inference.outputs import InferenceError
from espn.inference.rule import RULES
from espn.inference.statistics import task_statistics
from espn.inference.subspace import KEYS, fit_subspaces
from espn.supernet.supernet import Supernet

#: every this-many-th training sample of a task is held out for its calibration
HELD_OUT_EVERY = 10
#: the rules a task measures on its held-out samples when committed, in the order of its
#: ``held_out_picked`` statistic (SupSup's one-shot, 2 T passes a sample, is left out)
CANDIDATES = (
    "input-gaussian",
    "input-subspace",
    "entropy",
    "energy",
    "mahalanobis",
    "entropy-mahalanobis",
)
#: what a task learned with the option stores besides :data:`~espn.inference.statistics.STAT_KEYS`
OPTION_KEYS = (*KEYS, "held_out_picked")
#: what ``rule="all"`` names: every rule the run can use
ALL = "all"


def held_out(task: Task) -> tuple[Task, Task]:
    """``task`` without every :data:`HELD_OUT_EVERY`-th training sample, and those samples
    alone (as its training split; deterministic, so a resumed run holds out the same)."""
    split = task.train
    rows = torch.arange(len(split), device=split.index.device)
    out = rows % HELD_OUT_EVERY == HELD_OUT_EVERY - 1

    def part(keep: Tensor) -> Task:
        return dataclasses.replace(task, train=Split(split.x, split.index[keep], split.y[keep]))

    return part(~out), part(out)


def statistics(supernet: Supernet, task: int, data: Task, task_agnostic: bool) -> dict[str, Tensor]:
    """The statistics task ``task`` stores when it is committed, from its data ``data``: with
    ``task_agnostic``, fitted on the samples it trained on, calibrated on those held out, and
    with its input mixture (rule ``input-subspace``)."""
    if not task_agnostic:
        return task_statistics(supernet, task, data)
    fit, held = held_out(data)
    stats = task_statistics(supernet, task, fit, calibrate_on=held)
    x, y = split_tensors(fit, "train")
    stats |= fit_subspaces(x.cpu(), y.cpu())
    held_x = split_tensors(held, "train")[0]
    none = torch.full((len(CANDIDATES),), float("nan"))  # fewer than ten samples: none held
    picked = held_out_picked(supernet, task, stats, held_x) if len(held_x) else none
    return stats | {"held_out_picked": picked}


@torch.no_grad()
def held_out_picked(supernet: Supernet, task: int, stats: dict[str, Tensor], x: Tensor) -> Tensor:
    """Per rule of :data:`CANDIDATES`: the share of task ``task``'s held-out inputs ``x`` it
    routes to ``task`` among the tasks learned so far (``0..task``; ``stats``: the task's own,
    not yet stored), NaN for a rule that cannot run. Exemplar-free: each task measures its
    own samples against the tasks before it, never the other way round."""
    masks = supernet.masks
    kept = masks[task].stats
    supernet.masks, masks[task].stats = masks[: task + 1], stats
    shares = []
    try:
        device = next(supernet.parameters()).device
        for name in CANDIDATES:
            if not usable(name, supernet):
                shares.append(float("nan"))
                continue
            rule = RULES.get(name)()
            scores = torch.cat([rule.scores(supernet, c.to(device))[0] for c in x.split(1024)])
            shares.append(float((scores.argmin(1) == task).double().mean()))
    finally:
        supernet.masks, masks[task].stats = masks, kept
    return torch.tensor(shares, dtype=torch.float32)


def best_rule(supernet: Supernet) -> str | None:
    """Of :data:`CANDIDATES`, the rule that routed the tasks' own held-out samples right most
    often on average (ties: the first), where every task measured them (learned with
    ``task_agnostic``); else None."""
    picked = [m.stats.get("held_out_picked") for m in supernet.masks]
    valid = [p for p in picked if p is not None and p.shape == (len(CANDIDATES),)]
    if not valid or len(valid) < len(picked):
        return None
    mean = torch.stack([p.double() for p in valid]).mean(0)
    if bool(mean.isnan().all()):
        return None
    return CANDIDATES[int(mean.nan_to_num(-1.0).argmax())]


def usable(rule: str, supernet: Supernet) -> bool:
    """Whether the rule named ``rule`` can run on ``supernet``'s tasks."""
    try:
        RULES.get(rule)().check(supernet)
    except InferenceError:
        return False
    return True


def named_rules(rule: str | None, supernet: Supernet) -> list[str | None]:
    """The rules ``rule`` names: every rule ``supernet`` can use for :data:`ALL`, else itself."""
    return [name for name in RULES if usable(name, supernet)] if rule == ALL else [rule]
