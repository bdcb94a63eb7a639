"""Grouped convolutions (ResNeXt blocks, depthwise with a channel multiplier) and GroupNorm:
a unit is a whole conv group / whole GroupNorm groups, with the guarantees of the ResNets
(zero forgetting, FLOPs equal to FlopCounterMode on the exported slim model, export equal
to the supernet, exact resume) and one-line refusals of group counts that cannot be met."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torchvision
from torch import nn

from espn import wrap
from espn.evaluation import task_logits
from espn.export.export import export_task, measured_flops
from espn.export.slim import slim_copy
from espn.layers.groupnorm import TaskGroupNorm
from espn.methods.base import METHODS, MethodConfig
from espn.models.convert import ConvertError, to_supernet
from espn.supernet import Supernet
from espn.training import Engine
from helpers.arch import (
    OPTIMIZERS,
    assert_random_task_exports_exactly,
    assert_resumes_exactly,
    check_two_tasks,
    registered_run,
)
from helpers.deploy import tiny_sequence
from helpers.images import random_task


class TinyResNeXt(nn.Module):
    """A GroupNorm stem and one ResNeXt bottleneck: 1x1 conv, 3x3 conv with 4 groups of
    width 2 (GroupNorm of 4 groups after it), 1x1 conv with a bias into a GroupNorm of 2
    groups, a residual add; pooled head."""

    def __init__(self, n_classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.gn0 = nn.GroupNorm(4, 8)
        self.reduce = nn.Conv2d(8, 8, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=4, bias=False)
        self.gn2 = nn.GroupNorm(4, 8)
        self.expand = nn.Conv2d(8, 8, 1)
        self.gn3 = nn.GroupNorm(2, 8)
        self.head = nn.Linear(8, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.relu(self.gn0(self.stem(x)))
        h = torch.relu(self.bn1(self.reduce(s)))
        h = torch.relu(self.gn2(self.grouped(h)))
        s = torch.relu(s + self.gn3(self.expand(h)))
        return self.head(s.mean((2, 3)))


class Multiplier(nn.Module):
    """A depthwise conv with a channel multiplier (8 groups, 8 in and 16 out channels) and a
    grouped conv widening 16 to 24 channels (4 groups) into an affine-free GroupNorm."""

    def __init__(self, n_classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 16, 3, padding=1, groups=8, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.wide = nn.Conv2d(16, 24, 3, stride=2, groups=4, bias=False)
        self.gn = nn.GroupNorm(8, 24, affine=False)
        self.fc = nn.Linear(24, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn2(self.dw(torch.relu(self.bn(self.conv(x))))))
        return self.fc(torch.relu(self.gn(self.wide(h))).mean((2, 3)))


NETS = {"resnext": TinyResNeXt, "multiplier": Multiplier}


def supernet_of(kind: str, multi_head: bool = True, task_affine: bool = False) -> Supernet:
    torch.manual_seed(0)
    x = torch.zeros(2, 1, 8, 8)
    model = to_supernet(NETS[kind](), x, multi_head=multi_head, task_affine=task_affine)
    return Supernet(model, x)


def test_a_unit_is_whole_conv_groups_and_groupnorm_groups():
    """The grouped conv's input and output groups are one unit group of 4 units (2 channels
    each side); the stream, normalised by GroupNorms of 4 and 2 groups, has 2 units of 4
    channels; a depthwise conv with a multiplier couples 1 input with its 2 outputs."""
    sn = supernet_of("resnext")
    assert sn.group_sizes == {"stem": 2, "reduce": 4}
    grouped = sn.layers["grouped"]
    assert (grouped.in_units, grouped.out_units, grouped.out_unit_size) == (None, "reduce", 2)
    assert (sn.layers["reduce"].out_unit_size, sn.layers["reduce"].in_unit_size) == (2, 4)
    assert (sn.layers["expand.0"].in_units, sn.layers["expand.0"].out_units) == ("reduce", "stem")
    norms = {n: m for n, m in sn.task_modules.items() if isinstance(m, TaskGroupNorm)}
    assert {n: (m.group, m.unit_size) for n, m in norms.items()} == {
        "gn0": ("stem", 4),
        "gn2": ("reduce", 2),
        "gn3": ("stem", 4),
    }
    mult = supernet_of("multiplier")
    assert mult.group_sizes == {"conv": 4}  # gcd of 8 channels, 8 and 4 conv groups, 8 GN groups
    assert [mult.layers[n].out_unit_size for n in ("conv", "dw", "wide")] == [2, 4, 6]


def _zero_blocks(out: torch.Tensor, size: int) -> int:
    """Blocks of ``size`` consecutive channels that are exactly zero everywhere."""
    blocks = out.transpose(0, 1).reshape(out.shape[1] // size, -1)
    return int((blocks == 0).all(1).sum())


@torch.no_grad()
def _norm_outputs(
    sn: Supernet, norms: dict[str, nn.Module], x: torch.Tensor, task: int
) -> dict[str, torch.Tensor]:
    """What each of ``norms`` outputs when task ``task`` runs on ``x``."""
    outputs: dict[str, torch.Tensor] = {}
    hooks = [
        m.register_forward_hook(lambda mod, i, o, n=n: outputs.__setitem__(n, o))
        for n, m in norms.items()
    ]
    try:
        sn(x, task=task)
    finally:
        for h in hooks:
            h.remove()
    return outputs


@pytest.mark.parametrize("task_affine", [False, True], ids=["gates", "affine-gates"])
@pytest.mark.parametrize("kind", list(NETS))
def test_flops_equal_measured_flops_and_export_equals_supernet(kind, task_affine):
    """Under random unit masks: the analytic FLOPs equal FlopCounterMode on the slim copy,
    whose grouped convs and GroupNorms keep one group per alive group; the supernet's dead
    GroupNorm groups output exactly zero (counted on the activations), and the slim copy
    computes what the supernet computes (gates over whole groups folded, with their shifts
    under ``task_affine``)."""
    sn = supernet_of(kind, multi_head=kind != "multiplier", task_affine=task_affine)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 1, 8, 8, generator=gen)
    norms = {n: m for n, m in sn.model.named_modules() if isinstance(m, TaskGroupNorm)}
    for t, keep in enumerate((0.0, 0.5, 0.8)):
        random_task(sn, 3, x, gen, keep)
        slim = slim_copy(sn, t, x[:1])
        sn.use_task(t)
        sn.eval()
        assert measured_flops(slim, x) == sn.flops(), f"task {t}, keep {keep}"
        if keep == 0.0:
            assert sn.flops() < sn.dense_flops
        torch.testing.assert_close(slim(x), sn(x, task=t), rtol=1e-5, atol=1e-5)
        outputs = _norm_outputs(sn, norms, x, t)
        for name, norm in norms.items():
            plain = slim.get_submodule(name)
            assert isinstance(plain, nn.GroupNorm)
            per_group = norm.num_channels // norm.num_groups
            dead = _zero_blocks(outputs[name], per_group)
            assert plain.num_groups == norm.num_groups - dead
            assert plain.num_channels == plain.num_groups * per_group
        for name, layer in sn.layers.items():
            if getattr(layer, "groups", 1) != 1:
                conv = slim.get_submodule(name)
                per_group = layer.out_channels // layer.groups
                assert conv.groups * per_group == conv.out_channels
                assert conv.in_channels == conv.groups * layer.in_channels // layer.groups


@pytest.mark.parametrize("kind", list(NETS))
def test_unit_flops_is_the_cost_of_one_unit(kind):
    """FLOP_l(m) with the ``total`` load is exactly what removing one unit (whole conv
    groups on both sides of a grouped conv) saves."""
    sn = supernet_of(kind)
    sn.begin_task(3)
    units = {g: torch.ones(s, dtype=torch.bool) for g, s in sn.group_sizes.items()}
    units[next(iter(units))][-1] = False
    sn.set_unit_masks(units)
    total, base = sn.unit_flops("total"), sn.flops()
    for g, alive in units.items():
        fewer = dict(units)
        fewer[g] = alive.clone()
        fewer[g][alive.nonzero()[0]] = False
        assert base - sn.flops(fewer) == total[g], g


@pytest.mark.parametrize("optim", OPTIMIZERS, ids=lambda o: o.optimizer)
@pytest.mark.parametrize("kind", list(NETS))
def test_task_zero_logits_bit_identical_after_task_one(kind, optim, tmp_path):
    """ESPN-0.5: after task 1 (SGD with momentum or Adam, weight decay), task 0's logits and
    frozen weights are bit-identical, each task meets its FLOP and weight budgets, and the
    written slim model has the FLOPs counted and the supernet's outputs."""
    check_two_tasks(NETS[kind], optim, tmp_path)


def test_grouped_convs_and_groupnorm_resume_exactly(tmp_path, monkeypatch):
    """Killed mid-task and resumed: the same results, task files and final state."""
    with registered_run("tiny-resnext", "tiny-grouped", TinyResNeXt) as benchmark:
        assert_resumes_exactly(tmp_path, monkeypatch, benchmark=benchmark)


def tiny_torchvision_resnext() -> nn.Module:
    """torchvision's ResNet with ResNeXt bottlenecks (4 groups of width 4), one block per
    stage."""
    return torchvision.models.resnet.ResNet(
        torchvision.models.resnet.Bottleneck,
        [1, 1, 1, 1],
        num_classes=3,
        groups=4,
        width_per_group=4,
    )


def test_torchvision_resnext_wraps_trains_without_forgetting_and_exports_exactly(tmp_path):
    """``espn.wrap`` on torchvision's ResNeXt-style bottlenecks: a random sub-network has
    FLOPs equal to FlopCounterMode on its slim copy, which computes what the supernet does,
    and a 2-task ESPN run (SGD, momentum, weight decay) keeps task 0 bit-identical and
    exports task 1 with the FLOPs counted."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    sn = wrap(tiny_torchvision_resnext(), x)
    assert sn.layers["layer1.0.conv2"].groups == 4
    assert_random_task_exports_exactly(sn, x, 3)

    seq = tiny_sequence(n_tasks=2)  # 1x8x8 images, given to the ResNet as 3 equal channels
    tasks = [replace(t, transform=lambda x, train: x.repeat(1, 3, 1, 1)) for t in seq.tasks]
    torch.manual_seed(0)
    sn = wrap(tiny_torchvision_resnext(), torch.zeros(2, 3, 8, 8))
    strategy = METHODS.get("espn")(MethodConfig(gamma=0.5, alpha=0.5, epochs=(1, 1, 1)))
    engine = Engine(sn, strategy, OPTIMIZERS[0], batch_size=16, seed=0)
    engine.train_task(tasks[0], 0)
    logits = task_logits(sn, tasks[0], 0)
    engine.train_task(tasks[1], 1)
    assert torch.equal(task_logits(sn, tasks[0], 0), logits)
    images = tasks[1].test.x.repeat(1, 3, 1, 1)
    report = export_task(sn, 1, [images], tmp_path / "task1.pt2", also_onnx=False)
    assert report.flops == sn.flops(sn.masks[1].units) <= 0.5 * sn.dense_flops


class InputGrouped(nn.Module):
    """A grouped conv reading a conv's output plus the model input (its groups could not be
    removed from the input)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.grouped = nn.Conv2d(4, 4, 3, groups=2, bias=False)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.grouped(self.conv(x) + x.repeat(1, 4, 1, 1))
        return self.fc(h.mean((2, 3)))


@pytest.mark.parametrize(
    ("net", "message"),
    [
        (
            nn.Sequential(
                nn.Conv2d(1, 12, 3),
                nn.Conv2d(12, 12, 3, groups=4),
                nn.GroupNorm(3, 12),
                nn.Flatten(),
                nn.Linear(12 * 16, 3),
            ),
            "the channels of '0' cannot be pruned in whole groups: conv '1' (groups=4) and "
            "GroupNorm '2' (3 groups) leave",
        ),
        (
            nn.Sequential(
                nn.Conv2d(1, 8, 3), nn.Conv2d(8, 4, 3, groups=4), nn.Flatten(), nn.Linear(64, 3)
            ),
            "conv '1' has one output channel per group (groups=4, 8 in and 4 out channels)",
        ),
        (
            InputGrouped(),
            "grouped conv 'grouped' reads channels that come partly from the model input or a "
            "bare parameter, so its groups could not be removed",
        ),
    ],
    ids=["conflicting-groups", "one-output-per-group", "grouped-input"],
)
def test_group_counts_without_a_common_divisor_are_refused_in_one_line(net, message):
    with pytest.raises(ConvertError) as info:
        wrap(net, torch.zeros(2, 1, 8, 8))
    text = str(info.value)
    assert text.startswith(message) and "\n" not in text


def test_channels_a_groupnorm_of_one_group_normalises_are_kept_whole():
    """``GroupNorm(1, C)`` (MobileViTv2's) takes its statistics over all channels, so cutting
    one would change every other's: its channels are one unit, never pruned; the next conv's
    are pruned one by one. (wrap checks a random task's slim copy and its FLOPs.)"""
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.GroupNorm(1, 4),
        nn.Conv2d(4, 8, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 16, 3),
    )
    sn = wrap(net, torch.zeros(2, 1, 8, 8))
    assert sn.group_sizes == {"0": 1, "2": 8}
