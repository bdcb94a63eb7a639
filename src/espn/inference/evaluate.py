"""Measuring task-agnostic prediction on every task's test data: accuracy with the task
given, without it per sample and per batch, how often the task is picked right, the
task-confusion matrix and the inference cost."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from espn.data.tasks import Task
from espn.inference.outputs import InferenceError, batched_states, head_name, task_outputs
from espn.inference.predict import CHUNK, get_rule, pick
from espn.inference.routing import named_rules
from espn.inference.rule import OutputRule, Rule
from espn.inference.statistics import statistics_bytes
from espn.supernet.layers import TaskHead
from espn.supernet.supernet import Supernet

#: the batch of test samples from one task that the per-batch figures assume
BATCH = 32


def flops_ratios(supernet: Supernet) -> list[float]:
    """Each task's sub-network FLOPs relative to the dense supernet."""
    return [supernet.flops(m.units) / supernet.dense_flops for m in supernet.masks]


@torch.no_grad()
def _task_scores(
    supernet: Supernet, rules: Sequence[Rule], task: Task, states: dict[str, Tensor] | None
) -> tuple[list[Tensor], Tensor, Tensor]:
    """Over ``task``'s test set: each rule's scores (N, T), every task's predicted class
    (T, N) and the labels (N,); the tasks' outputs are computed once for all the rules (as
    one batched pass given the tasks' ``states``)."""
    features = any(isinstance(r, OutputRule) and r.uses_features for r in rules)
    head = head_name(supernet) if features else None
    everything = range(len(supernet.masks))
    scores: list[list[Tensor]] = [[] for _ in rules]
    preds, labels = [], []
    for x, y in task.batches("test", CHUNK):
        out = task_outputs(supernet, x, everything, head, states)
        for i, rule in enumerate(rules):
            if isinstance(rule, OutputRule):
                scores[i].append(rule.score_outputs(supernet, out, x).cpu())
            else:
                scores[i].append(rule.scores(supernet, x)[0].cpu())
        preds.append(torch.stack([z.argmax(1) for z in out.logits]).cpu())
        labels.append(y.cpu())
    return [torch.cat(s) for s in scores], torch.cat(preds, 1), torch.cat(labels)


def _right(preds: Tensor, picked: Tensor, y: Tensor, task: int, per_task_heads: bool) -> Tensor:
    """Which samples of task ``task`` are classified right by the tasks ``picked`` for them
    (with one head per task, only by their own task)."""
    right = preds.gather(0, picked[None])[0] == y
    return right & (picked == task) if per_task_heads else right


def _percent(hits: Tensor) -> float:
    """Percent of true entries, computed as the run's accuracies are (so equal to them)."""
    return 100.0 * int(hits.sum()) / max(len(hits), 1)


def evaluate_task_agnostic(
    supernet: Supernet,
    tasks: Sequence[Task],
    rule: str | Rule | None = None,
    batch: int = BATCH,
) -> dict[str, Any]:
    """Per task ``j`` of ``tasks`` (task ``j`` of the supernet, on its test data): accuracy
    (%) with the task given, task-agnostic accuracy per sample and per batch of ``batch``
    consecutive test samples (with one head per task, a sample counts as right only if its
    own task is picked: a class is a task's label), and how often the task is picked right (per sample, per batch);
    the task-confusion matrix (counts, rows: true task, columns: picked task, per sample); the
    rule's inference FLOPs per sample in dense passes; each task's stored statistics' bytes."""
    return evaluate_rules(supernet, tasks, [rule], batch)[0]


def evaluate_rules(
    supernet: Supernet,
    tasks: Sequence[Task],
    rules: Sequence[str | Rule | None],
    batch: int = BATCH,
) -> list[dict[str, Any]]:
    """:func:`evaluate_task_agnostic` of several rules, running the tasks' sub-networks once."""
    found = [get_rule(r, supernet) for r in rules]
    if batch < 1:
        raise InferenceError(f"batch must be at least 1, got {batch}")
    n = len(supernet.masks)
    if len(tasks) != n:
        raise InferenceError(f"{len(tasks)} tasks' data given for {n} learned tasks")
    # with one head per task a class is a (task, label) pair: a sample given to another
    # task's head is wrong whatever label that head predicts; with a shared head the label
    # means the same class in every task
    per_task_heads = any(isinstance(m, TaskHead) for m in supernet.task_modules.values())
    confusion = [torch.zeros(n, n, dtype=torch.long) for _ in found]
    rows: list[list[dict[str, Any]]] = [[] for _ in found]
    states = batched_states(supernet, range(n))  # all sub-networks in one pass where it can
    for j, task in enumerate(tasks):
        all_scores, preds, y = _task_scores(supernet, found, task, states)
        groups = torch.arange(len(y)) // batch
        for i, scores in enumerate(all_scores):
            picked = pick(scores, same_task=False)
            size = int(groups.max()) + 1 if len(y) else 0
            summed = torch.zeros(size, n).index_add_(0, groups, scores)
            batch_picked = summed.argmin(1)[groups] if len(y) else picked
            confusion[i][j] += torch.bincount(picked, minlength=n)
            rows[i].append(
                {
                    "task": j,
                    "given": _percent(preds[j] == y),
                    "per_sample": _percent(_right(preds, picked, y, j, per_task_heads)),
                    "per_batch": _percent(_right(preds, batch_picked, y, j, per_task_heads)),
                    "task_picked": _percent(picked == j),
                    "task_picked_per_batch": _percent(batch_picked == j),
                    "test_samples": len(y),
                }
            )
    keys = ("given", "per_sample", "per_batch", "task_picked", "task_picked_per_batch")
    ratios = flops_ratios(supernet)
    return [
        {
            "rule": rule.name,
            "batch": batch,
            "flops_passes": rule.passes(ratios),
            "statistics_bytes": [statistics_bytes(m.stats) for m in supernet.masks],
            "tasks": rows[i],
            "average": {k: sum(r[k] for r in rows[i]) / max(len(rows[i]), 1) for k in keys},
            "confusion": confusion[i].tolist(),
        }
        for i, rule in enumerate(found)
    ]


def evaluate_named(
    supernet: Supernet, tasks: Sequence[Task], rule: str | None = None, batch: int = BATCH
) -> list[dict[str, Any]]:
    """:func:`evaluate_task_agnostic` of the rule named ``rule`` (None: the default), or of
    every rule the run can use for ``"all"``; each document says whether its rule is the
    run's default (``"default"``)."""
    default = get_rule(None, supernet).name
    docs = evaluate_rules(supernet, tasks, named_rules(rule, supernet), batch)
    return [doc | {"default": doc["rule"] == default} for doc in docs]
