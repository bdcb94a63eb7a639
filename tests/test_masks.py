"""Bit-packed masks: exact round trips and honest byte counts."""

from __future__ import annotations

import pytest
import torch

from espn.layers.batchnorm2d import TaskBatchNorm2d
from espn.layers.conv2d import MaskedConv2d
from espn.layers.linear import MaskedLinear
from espn.supernet import TaskMask, pack_bits, unpack_bits
from espn.supernet.layers import MaskedLayer


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (13, 5), (4, 3, 3, 3), (1024, 784)])
def test_pack_unpack_round_trip(shape):
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(1)) > 0.5
    packed = pack_bits(mask)
    assert packed.dtype == torch.uint8
    assert packed.numel() == (mask.numel() + 7) // 8
    assert torch.equal(unpack_bits(packed, shape), mask)


def test_task_mask_counts_and_bytes():
    weights = {"a": torch.rand(30, 20) > 0.7, "b": torch.rand(10, 30) > 0.2}
    units = {"g": torch.tensor([True, False, True])}
    state = {"gate.weight": torch.ones(3)}
    mask = TaskMask.from_dense(weights, units, state, n_classes=10, new_weights=5)
    assert mask.nnz() == int(weights["a"].sum() + weights["b"].sum())
    assert torch.equal(mask.weight_mask("a"), weights["a"])
    nbytes = mask.nbytes()
    assert nbytes["weight_masks"] == (600 + 7) // 8 + (300 + 7) // 8
    assert nbytes["state"] == 3 * 4
    # a copy, not a view: later edits of the source do not leak into the stored mask
    weights["a"].fill_(False)
    assert mask.nnz() > int(weights["b"].sum())


@pytest.mark.parametrize(
    "layer",
    [MaskedLinear(5, 3, "a", "b"), MaskedConv2d(2, 4, 3, in_units="a", out_units=None)],
    ids=["linear", "conv"],
)
def test_masked_layer_state_is_its_weight_and_declared_buffers(layer):
    assert [name for name, _ in layer.named_buffers()] == list(MaskedLayer.BUFFERS)
    assert list(layer.state_dict()) == ["weight", *MaskedLayer.BUFFERS]
    assert layer.weight_mask.dtype == layer.weight.dtype and layer.frozen.dtype == torch.bool
    assert layer.weight_mask.shape == layer.frozen.shape == layer.weight.shape
    assert bool(layer.weight_mask.all()) and not bool(layer.frozen.any())


@pytest.mark.parametrize("momentum", [0.1, None])
def test_task_batchnorm_keeps_running_statistics_as_torch_does(momentum):
    gen = torch.Generator().manual_seed(0)
    ours, ref = TaskBatchNorm2d(3, "g"), torch.nn.BatchNorm2d(3, momentum=momentum)
    ours.momentum = momentum  # a converted model's BatchNorm may average cumulatively
    for _ in range(3):
        x = torch.randn(4, 3, 5, 5, generator=gen)
        torch.testing.assert_close(ours(x), ref(x))
    torch.testing.assert_close(ours.running_mean, ref.running_mean)
    torch.testing.assert_close(ours.running_var, ref.running_var)
    assert int(ours.num_batches_tracked) == 3
