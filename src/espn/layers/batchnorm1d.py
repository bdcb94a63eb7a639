"""``nn.BatchNorm1d`` (after a linear layer in an MLP, or a ``Conv1d`` on sequences): a task
BatchNorm over dimension 1, as :mod:`espn.layers.batchnorm2d`, folded on export into the
linear layer or 1-D convolution before it."""

from __future__ import annotations

from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval, fuse_linear_bn_eval

from espn.layers.base import register
from espn.layers.batchnorm2d import BatchNormAdapter, TaskBatchNorm


class TaskBatchNorm1d(TaskBatchNorm, nn.BatchNorm1d):
    """A task BatchNorm over dimension 1 of ``(N, C)`` or ``(N, C, L)``."""


@register
class BatchNorm1dAdapter(BatchNormAdapter):
    source = (nn.BatchNorm1d,)
    exports = (TaskBatchNorm1d,)
    task_type = TaskBatchNorm1d
    plain_type = nn.BatchNorm1d
    folds_into = (nn.Linear, nn.Conv1d)

    def _fuse(self, layer: nn.Module, norm: nn.Module) -> nn.Module:
        assert isinstance(norm, nn.BatchNorm1d)
        if isinstance(layer, nn.Linear):
            return fuse_linear_bn_eval(layer, norm)
        assert isinstance(layer, nn.Conv1d)
        return fuse_conv_bn_eval(layer, norm)
