"""ShuffleNet v2's channel split and channel shuffle (torchvision's own blocks): the channels a
split or shuffle passes on are kept whole (one unit group of one unit, never pruned), the convs
inside each branch are pruned; zero forgetting, FLOPs equal to FlopCounterMode on the slim
copy, any batch size. Tiny 1x8x8 models, seconds each."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torchvision.models import shufflenet_v2_x0_5
from torchvision.models.shufflenetv2 import InvertedResidual

from espn.models.convert import to_supernet
from espn.supernet import Supernet
from helpers.arch import OPTIMIZERS, assert_random_task_exports_exactly, check_two_tasks


class TinyShuffleNet(nn.Module):
    """A stem, a stride-2 ShuffleNet v2 block (both branches concatenated, then shuffled) and
    a stride-1 one (half the channels split off and passed on, the other half transformed),
    pooled into a classifier."""

    def __init__(self, n_classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.blocks = nn.Sequential(InvertedResidual(8, 16, 2), InvertedResidual(16, 16, 1))
        self.fc = nn.Linear(16, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.blocks(torch.relu(self.stem(x))).mean((2, 3)))


def test_passed_on_channels_are_one_unit_and_the_branches_are_pruned() -> None:
    """What a shuffle or split passes on (each block's branch outputs) is one unit group of
    one unit that spans each layer's channels, and its readers read every input; the stem,
    read whole by the stride-2 block, and the convs inside the branches keep a unit per
    channel."""
    x = torch.zeros(2, 1, 8, 8)
    sn = Supernet(to_supernet(TinyShuffleNet(), x), x)
    layers = sn.layers
    kept = layers["blocks.0.branch1.2"].out_units
    assert sn.group_sizes[kept] == 1
    for block in ("blocks.0.branch1.2", "blocks.0.branch2.5", "blocks.1.branch2.5"):
        assert layers[block].out_units == kept and layers[block].out_unit_size == 8
    assert layers["blocks.1.branch2.0"].in_units is None  # the split-off half of a shuffle
    assert sn.model.fc.in_units is None  # the task head
    assert sn.group_sizes[layers["stem.0"].out_units] == 8
    assert layers["blocks.0.branch2.0"].in_units == layers["blocks.0.branch1.0"].out_units
    for block in ("blocks.0", "blocks.1"):
        inner = layers[f"{block}.branch2.0"].out_units
        assert sn.group_sizes[inner] == 8 and layers[f"{block}.branch2.5"].in_units == inner


def _shuffle(x: Tensor) -> Tensor:
    b, c, h, w = x.shape
    return x.view(b, 2, c // 2, h, w).transpose(1, 2).reshape(b, c, h, w)


class ShuffledBeside(nn.Module):
    """Shuffled channels concatenated with a conv's output, both read by one conv."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.conv = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.mix, self.fc = nn.Conv2d(16, 8, 1), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        return self.fc(self.mix(torch.cat([_shuffle(x), self.conv(x)], 1)).mean((2, 3)))


def test_a_map_read_beside_kept_channels_is_kept_whole_too() -> None:
    """A layer reads its inputs whole or by unit groups: a conv's output concatenated with
    shuffled channels joins their one kept unit; the reader's own output is pruned."""
    x = torch.zeros(2, 1, 8, 8)
    sn = Supernet(to_supernet(ShuffledBeside(), x), x)
    stem, conv, mix = (sn.layers[f"{n}.0"] for n in ("stem", "conv", "mix"))  # gated
    assert conv.out_units == stem.out_units and sn.group_sizes[stem.out_units] == 1
    assert mix.in_units is None and sn.group_sizes[mix.out_units] == 8


def test_random_task_slim_copy_costs_what_espn_counts() -> None:
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    sn = Supernet(to_supernet(TinyShuffleNet(), x[:2]), x[:2])
    assert_random_task_exports_exactly(sn, x, 3)


def test_task_zero_logits_bit_identical_after_task_one(tmp_path) -> None:
    """ESPN-0.5 with SGD and momentum: task 0's logits and frozen weights bit-identical after
    task 1, both tasks within their budgets, task 1's written slim model as counted."""
    check_two_tasks(TinyShuffleNet, OPTIMIZERS[0], tmp_path)


@pytest.mark.slow  # about 20 s on 2 cores: wrap's probed task exports the whole network
def test_torchvision_shufflenet_keeps_its_shuffled_channels_and_prunes_its_branches() -> None:
    """Torch-Pruning cannot infer the widths of the shuffle's views (it divides by zero):
    the graph is kept with those views mapped as identities, their channels kept whole.
    Pruned: the stem and conv5 (read without a split) and every branch's inner channels."""
    x = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    sn = Supernet(to_supernet(shufflenet_v2_x0_5(num_classes=3), x[:2]), x[:2])
    kept = sn.layers["stage2.0.branch2.5"].out_units
    outputs = [n for n in sn.layers if n.endswith(("branch1.2", "branch2.5"))]
    assert sn.group_sizes[kept] == 1 and len(outputs) == 16 + 3  # 16 blocks, 3 of stride 2
    assert {sn.layers[n].out_units for n in outputs} == {kept}
    inner = {sn.layers[n].out_units for n in sn.layers if n.endswith("branch2.0")}
    assert len(inner) == 16 and all(sn.group_sizes[g] > 1 for g in inner)
    assert sn.group_sizes[sn.layers["conv1.0"].out_units] == 24
    assert_random_task_exports_exactly(sn, x, 3)
