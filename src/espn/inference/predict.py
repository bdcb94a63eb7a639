"""Prediction without the task: infer each sample's task (or one per batch), then let that
task's sub-network classify it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from espn.inference.outputs import InferenceError, eval_mode
from espn.inference.routing import best_rule
from espn.inference.rule import RULES, Rule
from espn.supernet.supernet import Supernet

#: the rule used when none is named and the run does not name its best (see
#: :func:`espn.inference.routing.best_rule`), chosen by measurement (docs/task-agnostic.md)
DEFAULT_RULE = "input-gaussian"
#: samples per forward pass
CHUNK = 1024


def get_rule(rule: str | Rule | None, supernet: Supernet) -> Rule:
    """The rule named ``rule`` (default: the run's best on its tasks' held-out samples where
    it measured them, else :data:`DEFAULT_RULE`), checked against ``supernet``."""
    if isinstance(rule, Rule):
        found = rule
    else:
        name = (best_rule(supernet) or DEFAULT_RULE) if rule is None else rule
        if not isinstance(name, str):
            raise InferenceError(f"rule must be a rule name, got {rule!r}")
        found = RULES.get(name)()  # an unknown name: UnknownNameError, listing the rules
    found.check(supernet)
    return found


@dataclass
class Inferred:
    """Per sample: the inferred task, the class its sub-network predicts, the scores (N, T)."""

    tasks: Tensor
    classes: Tensor
    scores: Tensor


def pick(scores: Tensor, same_task: bool) -> Tensor:
    """The task of each row of ``scores`` (lowest score); with ``same_task``, the task of the
    lowest summed score, for every row."""
    if same_task:
        return scores.sum(0).argmin().expand(len(scores)).clone()
    return scores.argmin(1)


@torch.no_grad()
def infer(
    supernet: Supernet, x: Tensor, rule: str | Rule | None = None, same_task: bool = False
) -> Inferred:
    """Infer the task of every sample of ``x`` with ``rule`` (one task for all of them with
    ``same_task``) and classify each with its inferred task's sub-network.

    A sample's class is the one its inferred task ``t`` predicts: for a rule that runs every
    sub-network, the argmax of the very logits ``supernet(x, task=t)`` gives for it (over the
    same chunks of :data:`CHUNK` samples); otherwise task ``t``'s sub-network then runs on
    the samples given to it. Either way it is the class predicted with the task given
    wherever the inferred task is right."""
    found = get_rule(rule, supernet)
    if len(x) == 0:
        empty = torch.zeros(0, dtype=torch.long, device=x.device)
        return Inferred(empty, empty.clone(), torch.zeros(0, len(supernet.masks)))
    scores, outputs = [], []
    for chunk in x.split(CHUNK):
        s, out = found.scores(supernet, chunk)
        scores.append(s)
        outputs.append(None if out is None else torch.stack([z.argmax(1) for z in out.logits]))
    all_scores = torch.cat(scores)
    tasks = pick(all_scores, same_task)
    if all(o is not None for o in outputs):
        per_task = torch.cat([o for o in outputs if o is not None], 1)  # (T, N)
        classes = per_task.gather(0, tasks[None]).squeeze(0)
    else:
        classes = predict_given(supernet, x, tasks)
    return Inferred(tasks, classes, all_scores)


@torch.no_grad()
def predict_given(supernet: Supernet, x: Tensor, tasks: Tensor | int) -> Tensor:
    """Classes of ``x`` with the task given: one task for all, or one per sample (each task's
    sub-network runs on its own samples only)."""
    if isinstance(tasks, int):
        with eval_mode(supernet):
            return torch.cat([supernet(c, task=tasks).argmax(1) for c in x.split(CHUNK)])
    classes = torch.zeros(len(x), dtype=torch.long, device=x.device)
    for t in tasks.unique().tolist():
        rows = (tasks == t).nonzero().flatten()
        classes[rows] = predict_given(supernet, x[rows], int(t))
    return classes
