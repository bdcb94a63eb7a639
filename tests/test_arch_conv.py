"""Depthwise convolutions, squeeze-excitation blocks, flatten-into-linear heads and ConvNeXt
(depthwise conv, channels-last LayerNorm and Linear MLP, layer scale): the same
guarantees as ResNets (zero forgetting, FLOPs equal to FlopCounterMode on the exported slim
model, export equal to the supernet, exact resume) and one-line refusals of what is not
supported (grouped convolutions and GroupNorm: ``test_arch_grouped.py``)."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn
from torchvision.ops import SqueezeExcitation

from espn import wrap
from espn.export.export import measured_flops
from espn.export.slim import slim_copy
from espn.models import MODELS, ModelSpec
from espn.models.convert import ConvertError, to_supernet
from espn.models.mobilenet import MobileNetV2Small
from espn.supernet import Supernet
from helpers.arch import (
    OPTIMIZERS,
    assert_random_task_exports_exactly,
    assert_resumes_exactly,
    check_two_tasks,
    registered_run,
)
from helpers.constructs import ConvNeXt, ConvNeXtBlock
from helpers.images import random_task


def tiny_mobilenet(n_classes: int = 3) -> nn.Module:
    """Two stages of inverted residuals (expansion 1 and 2, one residual add)."""
    return MobileNetV2Small(
        1, n_classes, width=1.0, setting=((1, 8, 1, 1), (2, 8, 2, 2)), last_channels=12
    )


class TinySE(nn.Module):
    """An MBConv block: 1x1 expansion, 5x5 depthwise conv, a squeeze-excitation block with
    biased convs and a hard-sigmoid scale, Hardswish, projection, a residual add under
    stochastic depth; pooled head."""

    def __init__(self, n_classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.expand = nn.Sequential(nn.Conv2d(8, 12, 1, bias=False), nn.BatchNorm2d(12))
        self.dw = nn.Conv2d(12, 12, 5, padding=2, groups=12, bias=False)
        self.bn = nn.BatchNorm2d(12)
        self.se = SqueezeExcitation(12, 4, scale_activation=nn.Hardsigmoid)
        self.project = nn.Conv2d(12, 8, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.drop = torchvision.ops.StochasticDepth(0.2, "row")
        self.act = nn.Hardswish()
        self.head = nn.Sequential(nn.Dropout(0.1), nn.Linear(8, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.act(self.stem(x))
        h = self.se(self.act(self.bn(self.dw(self.act(self.expand(s))))))
        s = s + self.drop(self.bn2(self.project(h)))
        return self.head(nn.functional.adaptive_avg_pool2d(s, 1).flatten(1))


class TinyVGG(nn.Module):
    """Conv-BN-ReLU-pool twice, then the feature map flattened into a two-layer classifier."""

    def __init__(self, n_classes: int = 3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 3, padding=1),
            nn.BatchNorm2d(6),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 10, 3, padding=1),
            nn.BatchNorm2d(10),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(10 * 2 * 2, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, n_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class FlattenHead(nn.Module):
    """A feature map flattened straight into the classifier (the head reads it per channel)."""

    def __init__(self, n_classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6 * 4 * 4, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


NETS = {
    "mobilenet": tiny_mobilenet,
    "se": TinySE,
    "vgg": TinyVGG,
    "flatten-head": FlattenHead,
    "convnext": lambda: ConvNeXt(in_channels=1, classes=3),
}


def supernet_of(kind: str, multi_head: bool = True) -> Supernet:
    torch.manual_seed(0)
    x = torch.zeros(2, 1, 8, 8)
    return Supernet(to_supernet(NETS[kind](), x, multi_head=multi_head), x)


def test_unit_groups_couple_depthwise_squeeze_excitation_and_flatten():
    """A depthwise conv's channels are the channels it convolves (its expansion group); the
    excitation conv scales that group; a flattened map's linear reads H*W inputs per channel."""
    sn = supernet_of("se")
    dw, fc2 = sn.layers["dw"], sn.layers["se.fc2.0"]
    assert (dw.out_units, dw.in_units, dw.groups) == ("expand.0", None, 12)
    assert fc2.out_units == "expand.0" and fc2.in_units == "se.fc1"
    assert sn.layers["project"].out_units == "stem.0"  # the residual stream
    vgg = supernet_of("vgg")
    linear = vgg.layers["classifier.0.0"]
    assert (linear.in_units, linear.in_unit_size) == ("features.4", 4)


@pytest.mark.parametrize("kind", list(NETS))
def test_flops_equal_measured_flops_and_export_equals_supernet(kind):
    """Under random unit masks, the analytic FLOPs equal FlopCounterMode on the slim copy
    (depthwise convs counted per group, squeeze-excitation convs included), which is really
    narrower (a depthwise conv's groups and a layer scale cut to the alive channels) and
    computes what the supernet computes."""
    sn = supernet_of(kind, multi_head=kind != "flatten-head")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 1, 8, 8, generator=gen)
    for t, keep in enumerate((0.0, 0.4, 0.8)):
        random_task(sn, 3, x, gen, keep)
        slim = slim_copy(sn, t, x[:1])
        sn.use_task(t)
        sn.eval()
        assert measured_flops(slim, x) == sn.flops(), f"task {t}, keep {keep}"
        widths = {g: int(a.sum()) for g, a in sn.masks[t].units.items()}
        if keep == 0.0:  # one unit per group: really smaller
            assert sn.flops() < sn.dense_flops
            assert sum(p.numel() for p in slim.parameters()) < sum(
                p.numel() for p in sn.model.parameters() if p.requires_grad
            )
        torch.testing.assert_close(slim(x), sn(x, task=t), rtol=1e-5, atol=1e-5)
        for name, layer in sn.layers.items():
            if getattr(layer, "groups", 1) != 1:  # a depthwise conv keeps one group per channel
                conv = slim.get_submodule(name)
                assert conv.groups == conv.in_channels == widths[layer.out_units]
        if kind == "convnext":  # a layer scale keeps its block's alive channels
            for block in (slim.block1, slim.block2):
                assert block.layer_scale.shape == (block.dw[0].out_channels, 1, 1)


@pytest.mark.parametrize("kind", list(NETS))
def test_unit_flops_is_the_cost_of_one_unit(kind):
    """FLOP_l(m) with the ``total`` load is exactly what removing one unit saves: a depthwise
    channel with its expansion, a scaled channel with its excitation row, a flattened channel
    with its H*W columns; the paper's ``output`` load is the producing part of it."""
    sn = supernet_of(kind)
    gen = torch.Generator().manual_seed(2)
    sn.begin_task(3)
    units = {g: torch.rand(s, generator=gen) < 0.7 for g, s in sn.group_sizes.items()}
    for alive in units.values():
        alive[:2] = True
    sn.set_unit_masks(units)
    total, output = sn.unit_flops("total"), sn.unit_flops()
    base = sn.flops()
    for g, alive in units.items():
        fewer = dict(units)
        fewer[g] = alive.clone()
        fewer[g][alive.nonzero()[0]] = False
        assert base - sn.flops(fewer) == total[g], g
        assert 0 < output[g] <= total[g]


@pytest.mark.parametrize("optim", OPTIMIZERS, ids=lambda o: o.optimizer)
@pytest.mark.parametrize("kind", ["mobilenet", "se", "vgg", "convnext"])
def test_task_zero_logits_bit_identical_after_task_one(kind, optim, tmp_path):
    """ESPN-0.5: after task 1 (SGD with momentum or Adam, weight decay), task 0's logits and
    frozen weights are bit-identical, each task meets its FLOP and weight budgets, and the
    written slim model of each task has the FLOPs counted and the supernet's outputs."""
    check_two_tasks(NETS[kind], optim, tmp_path, export=optim.optimizer == "adam")


def test_depthwise_and_squeeze_excitation_resume_exactly(tmp_path, monkeypatch):
    """Killed mid-task and resumed: the same results, task files and final state."""
    with registered_run("tiny-mobile", "tiny-conv-arch", TinySE) as benchmark:
        assert_resumes_exactly(tmp_path, monkeypatch, benchmark=benchmark)


class LearnedActivation(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 8)
        self.norm = nn.PReLU(8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(self.fc1(x.flatten(1))))


class Branching(nn.Module):
    """A forward that branches on the data: it runs, but torch.export cannot capture it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, bias=False)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        if h.sum() > 0:
            h = h * 2
        return self.fc(h.mean((2, 3)))


class ChannelsLast(FlattenHead):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).permute(0, 2, 3, 1).flatten(1))


class GlobalResponseNorm(nn.Module):
    """ConvNeXt V2's GRN on a channels-last map: each channel scaled by its spatial L2 norm
    over the mean of all channels' norms (a statistic over the channels)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = x.norm(p=2, dim=(1, 2), keepdim=True)
        return x + self.weight * x * (g / (g.mean(-1, keepdim=True) + 1e-6)) + self.bias


class GRNBlock(ConvNeXtBlock):
    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.grn = GlobalResponseNorm(4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.grn(nn.functional.gelu(self.fc1(self.norm(self.dw(x).permute(0, 2, 3, 1)))))
        return x + self.layer_scale * self.fc2(y).permute(0, 3, 1, 2)


class ConvNeXtV2(ConvNeXt):
    def __init__(self) -> None:
        super().__init__(in_channels=1, classes=3)
        self.block1 = GRNBlock(8)


@pytest.mark.parametrize(
    ("net", "message"),
    [
        (ChannelsLast, "linear layer 'fc' reads a flattened feature map whose inputs are not"),
        (Branching, "a task's sub-network of Branching cannot be captured by torch.export"),
        (LearnedActivation, "module 'norm' is a PReLU with parameters; the converter supports"),
        (
            ConvNeXtV2,
            "a task's sub-network of ConvNeXtV2 computes other outputs once its dead units "
            "are removed (batch of 1): module 'block1.grn' (GlobalResponseNorm) mixes features",
        ),
    ],
)
def test_unsupported_modules_refused_in_one_line(net, message):
    with pytest.raises(ConvertError) as info:
        wrap(net(), torch.zeros(2, 1, 8, 8))
    text = str(info.value)
    assert text.startswith(message) and "\n" not in text


def test_registry_mobilenet_builds_for_grayscale_and_colour_images():
    """``mobilenetv2-small``: depthwise channels coupled with their expansion, one stream group
    per stage, and exact FLOPs on the slim copy of a random sub-network."""
    for shape in ((1, 28, 28), (3, 32, 32)):
        torch.manual_seed(0)
        spec = ModelSpec(shape, 5, multi_head=True)
        sn = Supernet(MODELS.get("mobilenetv2-small")(spec), torch.zeros(2, *shape))
        depthwise = [n for n, m in sn.layers.items() if getattr(m, "groups", 1) != 1]
        assert len(depthwise) == 8  # one per inverted residual block
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(2, *shape, generator=gen)
        random_task(sn, 5, x, gen, 0.5)
        slim = slim_copy(sn, 0, x[:1])
        sn.use_task(0)
        assert measured_flops(slim, x) == sn.flops() < sn.dense_flops


@pytest.mark.parametrize(
    "name",
    [
        "mobilenet_v3_small",  # a few seconds: squeeze-excitation, Hardswish, depthwise convs
        pytest.param("mobilenet_v2", marks=pytest.mark.slow),
        pytest.param("efficientnet_b0", marks=pytest.mark.slow),
        pytest.param("resnext50_32x4d", marks=pytest.mark.slow),  # grouped 3x3 convs
        pytest.param("vgg11_bn", marks=pytest.mark.slow),  # 132 M weights: minutes, ~5 GB
    ],
)
def test_torchvision_models_wrap_and_export_exactly(name):
    """torchvision's MobileNets, EfficientNet-B0 (squeeze-excitation, stochastic depth) and
    VGG11-BN (flattened 7x7 map into the classifier) on 32x32 inputs."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    sn = wrap(getattr(torchvision.models, name)(num_classes=5), x)
    assert_random_task_exports_exactly(sn, x, 5)
