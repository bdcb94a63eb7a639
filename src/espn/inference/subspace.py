"""Rule ``input-subspace``: per task a mixture of probabilistic-PCA Gaussians of the input's
:func:`edges`, fitted at commit with ``task_agnostic`` (docs/task-agnostic.md, "The rules")."""

from __future__ import annotations

import torch
from torch import Tensor

from espn.inference.outputs import TaskOutputs
from espn.inference.rule import RULES, Rule
from espn.inference.statistics import VARIANCE_FLOOR
from espn.supernet.supernet import Supernet

#: principal directions kept per component
K = 10
#: most components per class
COMPONENTS = 3
#: a class gets one component per this many samples (at least one)
PER_COMPONENT = 150
#: the tensors a task stores for this rule, Q components each
KEYS = ("input_centres", "input_basis", "input_eigen", "input_noise", "input_weight")


def edges(x: Tensor) -> Tensor:
    """The flattened input beside its absolute differences to the next value along every
    spatial axis (those of ``x`` (N, C, *spatial) after the channel; none for flat or token
    inputs), zero at the far edge: (N, D (1 + spatial axes))."""
    f = x.double()
    ends = [f.diff(dim=a, append=f.narrow(a, -1, 1)).abs() for a in range(2, f.dim())]
    return torch.cat([f.flatten(1), *(e.flatten(1) for e in ends)], 1)


def _clusters(rows: Tensor, n: int, steps: int = 20) -> Tensor:
    """k-means assignments of ``rows`` to ``n`` clusters (seeded by evenly spaced rows:
    deterministic, so a resumed run fits the same)."""
    centres = rows[torch.linspace(0, len(rows) - 1, n).long()]
    for _ in range(steps):
        assign = torch.cdist(rows, centres).argmin(1)
        centres = torch.stack(
            [rows[assign == q].mean(0) if (assign == q).any() else centres[q] for q in range(n)]
        )
    return torch.cdist(rows, centres).argmin(1)


def _ppca(rows: Tensor, floor: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Centre, :data:`K` leading directions (zero-padded), their variances and the mean
    variance of the other directions of ``rows`` (padded directions get the rest's),
    variances at least ``floor`` (a component of one sample: an isotropic Gaussian)."""
    centre = rows.mean(0)
    centred = rows - centre
    n, dim = centred.shape
    basis = torch.zeros(K, dim, dtype=torch.float64)
    eigen = torch.empty(K, dtype=torch.float64)
    total = (centred * centred).sum() / n
    _, singular, directions = torch.linalg.svd(centred, full_matrices=False)  # descending
    k = min(K, n - 1, dim - 1)
    top = (singular[:k] ** 2 / n).clamp_min(floor)
    rest = ((total - top.sum()) / max(dim - k, 1)).clamp_min(floor)
    basis[:k], eigen[:k], eigen[k:] = directions[:k], top, rest
    return centre, basis, eigen, rest


def fit_subspaces(x: Tensor, y: Tensor) -> dict[str, Tensor]:
    """The task's input mixture from its training inputs ``x`` (N, *input shape) with labels
    ``y``: per component (Q in all) its centre ``input_centres`` (Q, E), directions
    ``input_basis`` (Q, K, E), their variances ``input_eigen`` (Q, K), the rest's variance
    ``input_noise`` (Q,) and its share of the samples ``input_weight`` (Q,), E being the size
    of :func:`edges`. Variances are floored at :data:`VARIANCE_FLOOR` x the task's mean."""
    f = edges(x)
    floor = VARIANCE_FLOOR * f.var(0, unbiased=False).mean() + 1e-12
    parts = []
    for c in y.unique():
        rows = f[y == c]
        n = max(1, min(COMPONENTS, len(rows) // PER_COMPONENT))
        assign = _clusters(rows, n) if n > 1 else torch.zeros(len(rows), dtype=torch.long)
        parts += [rows[assign == q] for q in range(n) if (assign == q).any()]
    centres, basis, eigen, noise = (
        torch.stack(t) for t in zip(*(_ppca(p, floor) for p in parts), strict=True)
    )
    weight = torch.tensor([len(p) for p in parts], dtype=torch.float64) / len(f)
    return {
        "input_centres": centres.float(),
        "input_basis": basis.float(),
        "input_eigen": eigen.float(),
        "input_noise": noise.float(),
        "input_weight": weight.float(),
    }


def subspace_nll(x: Tensor, stats: dict[str, Tensor]) -> Tensor:
    """Negative log-likelihood per dimension of :func:`edges` of each sample of ``x`` under
    the task's mixture (the constant ``log 2 pi`` left out)."""
    f = edges(x).float()
    dev = f.device
    centres, basis = stats["input_centres"].to(dev), stats["input_basis"].to(dev)
    eigen, noise = stats["input_eigen"].to(dev), stats["input_noise"].to(dev)
    dim = f.shape[1]
    log_p = []
    for q in range(len(centres)):
        d = f - centres[q]
        proj = d @ basis[q].T  # (N, K)
        resid = ((d * d).sum(1) - (proj * proj).sum(1)).clamp_min(0.0)
        distance = (proj * proj / eigen[q]).sum(1) + resid / noise[q]
        log_det = eigen[q].log().sum() + (dim - K) * noise[q].log()
        log_p.append(-0.5 * (distance + log_det))
    mix = torch.logsumexp(torch.stack(log_p, 1) + stats["input_weight"].to(dev).log(), 1)
    return -mix / max(dim, 1)


@RULES.register("input-subspace")
class InputSubspace(Rule):
    """The highest likelihood of the input under the task's mixture of principal-subspace
    Gaussians of its inputs' edges."""

    summary = (
        "highest likelihood of the input under the task's mixture of principal-subspace "
        "Gaussians of its inputs and edges (stored with task_agnostic); only the chosen "
        "sub-network runs"
    )
    needs = KEYS
    instead = "use rule 'input-gaussian', or learn the tasks with task_agnostic=True"

    def scores(self, supernet: Supernet, x: Tensor) -> tuple[Tensor, TaskOutputs | None]:
        return torch.stack([subspace_nll(x, m.stats) for m in supernet.masks], 1), None
