"""What each task stores for task-agnostic prediction, computed when it is committed from one
pass of its sub-network over its own training data (docs/task-agnostic.md, "The rules")."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from espn.data.tasks import Task
from espn.inference.outputs import head_name, task_outputs
from espn.supernet.supernet import Supernet

#: the raw scores every task calibrates, in the rows of ``calibration``: softmax entropy
#: relative to its largest value ``log C`` (so that heads of different sizes compare), energy, Mahalanobis distance of the penultimate features to the nearest class mean, and
#: the negative log-likelihood per input dimension of the input under the task's Gaussians
SCORES = ("entropy", "energy", "distance", "input")
#: a feature's variance is at least this fraction of the mean variance
VARIANCE_FLOOR = 1e-2
#: the names of the tensors a task stores
STAT_KEYS = ("class_means", "variance", "input_means", "input_variance", "calibration")


def entropy(logits: Tensor) -> Tensor:
    """Entropy (nats) of each row's softmax."""
    logp = torch.log_softmax(logits.float(), dim=1)
    return -(logp.exp() * logp).sum(1)


def relative_entropy(logits: Tensor) -> Tensor:
    """Entropy of each row's softmax divided by ``log C`` (C: the row's width), in [0, 1]: a
    2-class head's entropy is at most log 2 and a 10-class head's log 10, so raw entropies
    favour the task with the fewest classes whatever the sample."""
    return entropy(logits) / math.log(max(logits.shape[1], 2))


def energy(logits: Tensor) -> Tensor:
    """The energy score ``-logsumexp(logits)`` of each row (lower: more in distribution)."""
    return -torch.logsumexp(logits.float(), dim=1)


def _squared(features: Tensor, means: Tensor, variance: Tensor) -> Tensor:
    """Squared Mahalanobis distances (N, C) of each row to each class mean (diagonal)."""
    inv = variance.to(features.device).reciprocal()
    m = means.to(features.device)
    f = features.float()
    # |f - m|^2_inv = f^2.inv - 2 f.(m inv) + m^2.inv, for all classes at once
    return ((f * f) @ inv)[:, None] - 2.0 * f @ (m * inv).T + ((m * m) @ inv)[None, :]


def distance(features: Tensor, class_means: Tensor, variance: Tensor) -> Tensor:
    """Squared Mahalanobis distance (diagonal covariance) of each row of ``features`` to the
    nearest class mean, divided by the number of features."""
    d = _squared(features, class_means, variance)
    return d.min(1).values.clamp_min(0.0) / max(features.shape[1], 1)


def input_nll(x: Tensor, means: Tensor, variance: Tensor) -> Tensor:
    """Negative log-likelihood per dimension of each flattened input under an equal mixture
    of the classes' diagonal Gaussians (the constant ``log 2 pi`` left out): comparable across
    tasks, as every task's inputs have the same dimensions."""
    f = x.flatten(1)
    d = _squared(f, means, variance).clamp_min(0.0)
    log_det = torch.log(variance.to(f.device)).sum()
    n_classes = means.shape[0]
    log_mix = torch.logsumexp(-0.5 * d, 1) - math.log(n_classes) - 0.5 * log_det
    return -log_mix / max(f.shape[1], 1)


def raw_scores(
    logits: Tensor | None, features: Tensor | None, stats: dict[str, Tensor], x: Tensor | None
) -> Tensor:
    """The raw scores of :data:`SCORES` of one task on a batch, stacked (N, 4); a score whose
    inputs are not given (``None``) is NaN."""
    given = x.flatten(1) if x is not None else logits
    assert given is not None, "raw scores of neither outputs nor inputs"
    nan = torch.full_like(given[:, 0], float("nan"), dtype=torch.float32)  # batch kept dynamic
    cols = [relative_entropy(logits), energy(logits)] if logits is not None else [nan, nan]
    cols.append(
        distance(features, stats["class_means"], stats["variance"]) if features is not None else nan
    )
    cols.append(
        input_nll(x, stats["input_means"], stats["input_variance"]) if x is not None else nan
    )
    return torch.stack(cols, 1)


def class_gaussians(f: Tensor, y: Tensor, n_classes: int) -> tuple[Tensor, Tensor]:
    """Per-class means (C, k) of the rows of ``f`` (float64) with labels ``y``, and their
    pooled within-class variance (k,), floored (see :data:`VARIANCE_FLOOR`)."""
    counts = torch.bincount(y, minlength=n_classes).double()
    sums = torch.zeros(n_classes, f.shape[1], dtype=torch.float64).index_add_(0, y, f)
    means = sums / counts.clamp_min(1.0)[:, None]
    centred = f - means[y]
    var = (centred * centred).sum(0) / max(len(f) - int((counts > 0).sum()), 1)
    return means, var + VARIANCE_FLOOR * var.mean() + 1e-12


def _outputs(
    supernet: Supernet, task: int, data: Task, head: str, batch_size: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Over ``data``'s training split (unaugmented): task ``task``'s alive penultimate
    features (float64), the labels, its logits and the flattened inputs (float64)."""
    feats, labels, logits, inputs = [], [], [], []
    for x, y in data.batches("train", batch_size, augment=False):
        out = task_outputs(supernet, x, [task], head)
        feats.append(out.features[0].double().cpu())
        logits.append(out.logits[0].cpu())
        labels.append(y.cpu())
        inputs.append(x.flatten(1).double().cpu())
    return torch.cat(feats), torch.cat(labels), torch.cat(logits), torch.cat(inputs)


@torch.no_grad()
def task_statistics(
    supernet: Supernet,
    task: int,
    data: Task,
    batch_size: int = 1024,
    calibrate_on: Task | None = None,
) -> dict[str, Tensor]:
    """The statistics task ``task`` stores, from its training data ``data`` (unaugmented);
    the calibration from ``calibrate_on``'s training split where given (samples held out of
    training: a sub-network scores the data it fitted more confidently than unseen data)."""
    head = head_name(supernet)
    f, y, z, x_all = _outputs(supernet, task, data, head, batch_size)
    n_classes = max(int(supernet.masks[task].n_classes), int(y.max()) + 1 if len(y) else 1)
    means, var = class_gaussians(f, y, n_classes)
    input_means, input_var = class_gaussians(x_all, y, n_classes)
    stats = {
        "class_means": means.float(),
        "variance": var.float(),
        "input_means": input_means.float(),
        "input_variance": input_var.float(),
    }
    if calibrate_on is not None and len(calibrate_on.train):
        f, _, z, x_all = _outputs(supernet, task, calibrate_on, head, batch_size)
    scores = raw_scores(z, f.float(), stats, x_all.float()).double()
    stats["calibration"] = torch.stack(
        [scores.mean(0), scores.std(0, unbiased=False).clamp_min(1e-6)], 1
    ).float()
    return stats


def statistics_bytes(stats: dict[str, Tensor]) -> int:
    """Bytes a task's statistics take."""
    return sum(v.numel() * v.element_size() for v in stats.values())
