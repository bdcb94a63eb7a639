"""What each task stores for task-agnostic prediction, computed when it is committed.

From one pass of the task's sub-network over its own training data (no data is kept):

* ``class_means`` (C, k): the mean alive penultimate feature of each class;
* ``variance`` (k,): the pooled within-class variance of each feature (a diagonal covariance
  shared by the classes), floored at :data:`VARIANCE_FLOOR` x its mean so that a feature
  constant on the training data does not dominate;
* ``calibration`` (3, 2): mean and standard deviation over the training data of the task's
  three raw scores (:data:`SCORES`: softmax entropy, energy, Mahalanobis distance to the
  nearest class mean), so that scores of different sub-networks can be compared.

``k`` is the number of alive inputs of the task's head (about 200-450 for FC1024 at gamma
0.2, 1024 for a dense FC1024), so a task stores ``4 (C + 1) k + 24`` bytes: 18 KiB for 10
classes over 400 features. Everything is float32, computed in float64 on the CPU from the
sub-network's outputs, hence the same on every resume.
"""

from __future__ import annotations

import torch
from torch import Tensor

from espn.data.tasks import Task
from espn.inference.outputs import head_name, task_outputs
from espn.supernet.supernet import Supernet

#: the raw scores every task calibrates, in the rows of ``calibration``
SCORES = ("entropy", "energy", "distance")
#: a feature's variance is at least this fraction of the mean variance
VARIANCE_FLOOR = 1e-2
#: the names of the tensors a task stores
STAT_KEYS = ("class_means", "variance", "calibration")


def entropy(logits: Tensor) -> Tensor:
    """Entropy (nats) of each row's softmax."""
    logp = torch.log_softmax(logits.float(), dim=1)
    return -(logp.exp() * logp).sum(1)


def energy(logits: Tensor) -> Tensor:
    """The energy score ``-logsumexp(logits)`` of each row (lower: more in distribution)."""
    return -torch.logsumexp(logits.float(), dim=1)


def distance(features: Tensor, class_means: Tensor, variance: Tensor) -> Tensor:
    """Squared Mahalanobis distance (diagonal covariance) of each row of ``features`` to the
    nearest class mean, divided by the number of features."""
    inv = variance.to(features.device).reciprocal()
    means = class_means.to(features.device)
    f = features.float()
    # |f - m|^2_inv = f^2.inv - 2 f.(m inv) + m^2.inv, for all classes at once
    d = ((f * f) @ inv)[:, None] - 2.0 * f @ (means * inv).T + ((means * means) @ inv)[None, :]
    return d.min(1).values.clamp_min(0.0) / max(features.shape[1], 1)


def raw_scores(logits: Tensor, features: Tensor | None, stats: dict[str, Tensor] | None) -> Tensor:
    """The raw scores of :data:`SCORES` of one task's outputs, stacked (N, 3); the distance
    is NaN without features or statistics."""
    cols = [entropy(logits), energy(logits)]
    if features is None or not stats:
        cols.append(torch.full_like(cols[0], float("nan")))
    else:
        cols.append(distance(features, stats["class_means"], stats["variance"]))
    return torch.stack(cols, 1)


@torch.no_grad()
def task_statistics(
    supernet: Supernet, task: int, data: Task, batch_size: int = 1024
) -> dict[str, Tensor]:
    """The statistics task ``task`` stores, from its training data ``data`` (unaugmented)."""
    head = head_name(supernet)
    feats, labels, logits = [], [], []
    for x, y in data.batches("train", batch_size, augment=False):
        out = task_outputs(supernet, x, [task], head)
        feats.append(out.features[0].double().cpu())
        logits.append(out.logits[0].cpu())
        labels.append(y.cpu())
    f, y, z = torch.cat(feats), torch.cat(labels), torch.cat(logits)
    n_classes = max(int(supernet.masks[task].n_classes), int(y.max()) + 1 if len(y) else 1)
    counts = torch.bincount(y, minlength=n_classes).double()
    sums = torch.zeros(n_classes, f.shape[1], dtype=torch.float64).index_add_(0, y, f)
    means = sums / counts.clamp_min(1.0)[:, None]
    centred = f - means[y]
    var = (centred * centred).sum(0) / max(len(f) - int((counts > 0).sum()), 1)
    var = var + VARIANCE_FLOOR * var.mean() + 1e-12
    stats = {"class_means": means.float(), "variance": var.float()}
    scores = raw_scores(z, f.float(), stats).double()
    stats["calibration"] = torch.stack(
        [scores.mean(0), scores.std(0, unbiased=False).clamp_min(1e-6)], 1
    ).float()
    return stats


def statistics_bytes(stats: dict[str, Tensor]) -> int:
    """Bytes a task's statistics take."""
    return sum(v.numel() * v.element_size() for v in stats.values())
