"""Swin's window attention (``helpers.constructs.Swin``: shifted windows by ``torch.roll`` and
a mask, the projections' weights passed to ``F.linear``, a per-head relative position bias,
PatchMerging, an NHWC map): its attention's channels are kept whole with the stream they
read, its products counted as measured, the MLPs pruned. Two ESPN tasks with task 0
bit-identical, and a task's export costing what espn counts (FlopCounterMode) at batch 1 and
3. Seconds."""

from __future__ import annotations

import pytest
import torch

from espn.layers.parameters import TaskParameters
from espn.models.convert import to_supernet
from espn.supernet import Supernet
from espn.supernet.flops import ProductCost
from helpers.arch import OPTIMIZERS, assert_random_task_exports_exactly, check_two_tasks
from helpers.constructs import Swin


def swin() -> Swin:
    return Swin(channels=1, patch=2, classes=3)


@pytest.mark.parametrize("optim", OPTIMIZERS, ids=lambda o: o.optimizer)
def test_two_tasks_bit_identical_and_export_counted_exactly(optim, tmp_path):
    check_two_tasks(swin, optim, tmp_path, export=optim.optimizer == "sgd")


@pytest.mark.parametrize("batch", [1, 3])
def test_a_task_exports_with_the_attention_products_counted(batch):
    torch.manual_seed(0)
    x = torch.randn(2, 1, 8, 8)
    sn = Supernet(to_supernet(swin(), x), x)
    # the MLPs' hidden features are units; the window attention and the streams, kept whole,
    # are one unit never pruned, their products the FLOPs FlopCounterMode measured on them
    assert sn.group_sizes == {
        "patches": 1,
        "blocks.0.mlp.0": 64,
        "blocks.1.mlp.0": 64,
        "last.mlp.0": 128,
    }
    products = {c.name for c in sn.costs if isinstance(c, ProductCost)}
    assert products == {"blocks.0.attn", "blocks.1.attn", "last.attn"}
    held = next(m for m in sn.model.modules() if isinstance(m, TaskParameters))
    assert held.targets == [f"{b}.attn.bias_table" for b in ("blocks.0", "blocks.1", "last")]
    assert held.groups == [None, None, None]  # per task, never cut
    assert_random_task_exports_exactly(sn, torch.randn(batch, 1, 8, 8), 3)
