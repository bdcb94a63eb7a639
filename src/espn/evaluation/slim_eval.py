"""Evaluating learned tasks through slim copies, each built once per task and checked on its
first batch against the masked supernet (docs/performance.md, "Evaluation through slim
copies")."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from espn.data.tasks import Task
from espn.evaluation.metrics import Shares, split_accuracy
from espn.export.export import TOLERANCE
from espn.export.slim import slim_copy
from espn.layers import ExportError
from espn.supernet.masks import TaskMask
from espn.supernet.supernet import Supernet


class SlimEvaluator:
    """Accuracy and logits of learned tasks through cached slim copies (``enabled`` False:
    through the masked supernet, as :func:`espn.evaluation.metrics.task_accuracy`)."""

    def __init__(self, supernet: Supernet, enabled: bool = True) -> None:
        self.supernet = supernet
        self.enabled = enabled
        #: per task: the stored sub-network the copy was built from, and the copy (None:
        #: the task is evaluated through the masked supernet)
        self.cache: dict[int, tuple[TaskMask, nn.Module | None]] = {}
        #: data-parallel ranks sharing out the batches (None: this process evaluates all)
        self.ranks: Shares | None = None

    def _copy(self, t: int, x: Tensor) -> nn.Module | None:
        """Task ``t``'s slim copy, built and checked on batch ``x`` when not cached."""
        mask = self.supernet.masks[t]
        known = self.cache.get(t)
        if known is not None and known[0] is mask:
            return known[1]
        model: nn.Module | None
        try:
            # the copy's new layers draw initial values from the global generator, which
            # training must not see (a resumed run builds copies an uninterrupted one had cached)
            with torch.random.fork_rng(devices=[]):
                model = slim_copy(self.supernet, t, x[:2])
        except (ExportError, RuntimeError, ValueError):
            model = None
        if model is not None:
            want = self.supernet(x, task=t)
            got = model(x)
            scale = max(1.0, float(want.abs().max()))
            if got.shape != want.shape or not float((got - want).abs().max()) <= TOLERANCE * scale:
                model = None
        self.cache[t] = (mask, model)
        return model

    @torch.no_grad()
    def logits(self, x: Tensor, t: int) -> Tensor:
        """Logits of task ``t`` on batch ``x``."""
        self.supernet.eval()
        model = self._copy(t, x) if self.enabled else None
        return self.supernet(x, task=t) if model is None else model(x)

    @torch.no_grad()
    def accuracy(self, task: Task, t: int, split: str = "test", batch_size: int = 1024) -> float:
        """Top-1 accuracy in percent of task ``t`` on ``split`` of ``task`` (see
        :func:`~espn.evaluation.metrics.split_accuracy`; shared out over :attr:`ranks`)."""
        return split_accuracy(lambda x: self.logits(x, t), task, split, batch_size, self.ranks)
