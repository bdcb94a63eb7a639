"""Task BatchNorm statistics recomputed under the task's final sub-network before it is
committed: the momentum-averaged ones lag behind weights that moved fast and the last prune
steps, which can leave a task at chance although its weights are fine (docs/fidelity.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from espn.data.tasks import Task
from espn.supernet.supernet import Supernet

#: training batches (in order, no augmentation) the statistics are averaged over; the whole
#: training split of a task when it has fewer
RECALIBRATION_BATCHES = 100


@torch.no_grad()
def recalibrate_batchnorm(
    supernet: Supernet,
    task: Task,
    batch_size: int,
    max_batches: int = RECALIBRATION_BATCHES,
    take: Callable[[int], bool] | None = None,
) -> int:
    """Reset the working sub-network's BatchNorm statistics and recompute them over (at most
    ``max_batches`` batches of) ``task``'s training data; returns the batches used (0 when
    the supernet has no BatchNorm). ``take``: which of those batches (by number) this
    process uses (a data-parallel rank its share, see :mod:`espn.training.distributed`).

    Batch ``k`` enters with momentum ``1/k``: the running statistics end as the plain mean of
    the batches' means and (unbiased) variances, as ``nn.BatchNorm2d(momentum=None)`` computes.
    """
    norms = [
        m for m in supernet.task_modules.values() if isinstance(m, nn.modules.batchnorm._BatchNorm)
    ]
    if not norms:
        return 0
    saved = [(m.momentum, m.training) for m in norms]
    was_training = supernet.training
    supernet.eval()
    for m in norms:
        m.reset_running_stats()
        m.train()
    used = 0
    try:
        for k, (x, _) in enumerate(task.batches("train", batch_size, augment=False)):
            if k == max_batches:
                break
            if take is not None and not take(k):
                continue
            used += 1
            for m in norms:
                m.momentum = 1.0 / used
            supernet.forward_working(x)
    finally:
        for m, (momentum, training) in zip(norms, saved, strict=True):
            m.momentum = momentum
            m.train(training)
        supernet.train(was_training)
    return used
