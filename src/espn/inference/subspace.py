"""Rule ``input-subspace``: the task under whose input density the sample is most likely, the
density of each class being a Gaussian with a principal subspace (probabilistic PCA).

``input-gaussian``'s per-class Gaussians are diagonal: they see how bright each pixel of a
class is, not which pixels vary together, and tell a T-shirt from a pullover poorly. Here each
class of a task keeps, when the task is committed with the ``task_agnostic`` option, its
:data:`K` leading principal directions and their variances, and one variance for the rest of
the input space (Tipping & Bishop's probabilistic PCA, fitted by a singular value decomposition of
the class's centred inputs): ``4 C (K D + K + 1)`` bytes next to the class means ``input-gaussian``
stores (31 KiB a class for 784 inputs). A sample goes to the task whose equal mixture of class
densities gives it the highest likelihood; like ``input-gaussian``, no sub-network runs to
infer the task, only the chosen one to classify.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from espn.inference.outputs import InferenceError, TaskOutputs
from espn.inference.rule import RULES, Rule
from espn.inference.statistics import VARIANCE_FLOOR
from espn.supernet.supernet import Supernet

#: principal directions kept per class
K = 10
#: the tensors a task stores for this rule (besides ``input_means``)
KEYS = ("input_basis", "input_eigen", "input_noise")


def fit_subspaces(x: Tensor, y: Tensor, means: Tensor) -> dict[str, Tensor]:
    """Per class of the flattened inputs ``x`` (float64, labels ``y``, class means
    ``means``): its :data:`K` leading principal directions ``input_basis`` (C, K, D), their
    variances ``input_eigen`` (C, K) and the mean variance of the other directions
    ``input_noise`` (C,), floored at :data:`VARIANCE_FLOOR` x the class's mean variance. A
    class with fewer samples than K + 1 pads its directions with zeros whose variance is the
    rest's (the same density)."""
    n_classes, dim = means.shape
    basis = torch.zeros(n_classes, K, dim, dtype=torch.float64)
    eigen = torch.ones(n_classes, K, dtype=torch.float64)
    noise = torch.ones(n_classes, dtype=torch.float64)
    for c in range(n_classes):
        rows = x[y == c] - means[c]
        if len(rows) < 2:
            continue
        _, singular, directions = torch.linalg.svd(rows, full_matrices=False)  # descending
        k = min(K, len(rows) - 1, dim - 1)
        total = (rows * rows).sum() / len(rows)
        floor = VARIANCE_FLOOR * total / dim + 1e-12
        top = (singular[:k] ** 2 / len(rows)).clamp_min(floor)
        rest = ((total - top.sum()) / max(dim - k, 1)).clamp_min(floor)
        basis[c, :k] = directions[:k]
        eigen[c, :k], eigen[c, k:], noise[c] = top, rest, rest
    return {
        "input_basis": basis.float(),
        "input_eigen": eigen.float(),
        "input_noise": noise.float(),
    }


def subspace_nll(x: Tensor, stats: dict[str, Tensor]) -> Tensor:
    """Negative log-likelihood per input dimension of each flattened sample of ``x`` under the
    task's equal mixture of class densities (the constant ``log 2 pi`` left out)."""
    f = x.flatten(1).float()
    means, basis = stats["input_means"].to(f.device), stats["input_basis"].to(f.device)
    eigen, noise = stats["input_eigen"].to(f.device), stats["input_noise"].to(f.device)
    dim = f.shape[1]
    log_p = []
    for c in range(len(means)):
        d = f - means[c]
        proj = d @ basis[c].T  # (N, K)
        resid = ((d * d).sum(1) - (proj * proj).sum(1)).clamp_min(0.0)
        q = (proj * proj / eigen[c]).sum(1) + resid / noise[c]
        log_det = eigen[c].log().sum() + (dim - basis.shape[1]) * noise[c].log()
        log_p.append(-0.5 * (q + log_det))
    mix = torch.logsumexp(torch.stack(log_p, 1), 1) - math.log(len(means))
    return -mix / max(dim, 1)


@RULES.register("input-subspace")
class InputSubspace(Rule):
    """The highest likelihood of the input under the task's class densities (principal
    subspace + isotropic rest)."""

    name = "input-subspace"
    summary = (
        "highest likelihood of the input under the task's per-class principal-subspace "
        "Gaussians of its inputs (stored with task_agnostic); only the chosen sub-network runs"
    )
    needs_statistics: ClassVar[bool] = True

    def check(self, supernet: Supernet) -> None:
        super().check(supernet)
        missing = [t for t, m in enumerate(supernet.masks) if not set(KEYS) <= set(m.stats)]
        if missing:
            raise InferenceError(
                f"rule {self.name!r} reads the input subspaces a task stores when it is "
                f"learned with the task_agnostic option, and tasks {missing} have none; use "
                "rule 'input-gaussian', or learn the tasks with task_agnostic=True"
            )

    def scores(self, supernet: Supernet, x: Tensor) -> tuple[Tensor, TaskOutputs | None]:
        return torch.stack([subspace_nll(x, m.stats) for m in supernet.masks], 1), None

    def passes(self, flops_ratios: list[float]) -> float:
        """One pass of the chosen task's sub-network (on average over the tasks; the
        densities' own cost, ``2 C K D`` per task, is left out as ``input-gaussian``'s)."""
        return sum(flops_ratios) / max(len(flops_ratios), 1)
