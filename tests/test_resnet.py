"""Residual supernets and the converter: shapes, coupled channel groups (checked against
Torch-Pruning's dependency graph on torchvision's models), FLOPs, and what is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import espn.models.convert as convert_module
from espn.export.slim import slim_copy
from espn.layers.batchnorm2d import TaskBatchNorm2d
from espn.layers.conv2d import MaskedConv2d
from espn.models import MODELS, ModelSpec
from espn.models.convert import ConvertError, register_converted, to_supernet
from espn.models.resnet import BasicBlock, ResNet
from espn.registry import Registry
from espn.supernet import MaskedLayer, Supernet, TaskBias, TaskHead, UnitGate, UnitModule


def measured_flops(model: nn.Module, x: torch.Tensor) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    return counter.get_total_flops()


def partition(model: nn.Module) -> set[frozenset[tuple[str, str]]]:
    """The coupled channel groups of a supernet-ready model, as sets of (role, module name)
    (independent of the groups' names)."""
    groups: dict[str, set[tuple[str, str]]] = {}
    for name, m in model.named_modules():
        if isinstance(m, MaskedLayer | TaskHead):
            for role, g in (("in", m.in_units), ("out", m.out_units)):
                if g is not None:
                    groups.setdefault(g, set()).add((role, name))
        if isinstance(m, UnitModule):
            groups.setdefault(m.group, set()).add(("unit", name))
    return {frozenset(v) for v in groups.values()}


@pytest.mark.parametrize(
    ("name", "shape", "width"),
    [("resnet18-reduced", (3, 32, 32), 160), ("resnet18", (3, 32, 32), 512)],
)
def test_cifar_resnets_shapes_and_groups(name, shape, width):
    model = MODELS.get(name)(ModelSpec(shape, 5, multi_head=True, stream_pruning="coupled"))
    sn = Supernet(model, torch.zeros(2, *shape))
    nf = width // 8
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)
    assert isinstance(model.fc, TaskHead) and model.fc.in_features == width
    assert sn.forward_working(torch.zeros(2, *shape)).shape == (2, 5)
    # one residual stream per stage, and one inner group per block
    assert {g: s for g, s in sn.group_sizes.items() if "." not in g} == {
        "layer1": nf,
        "layer2": 2 * nf,
        "layer3": 4 * nf,
        "layer4": 8 * nf,
    }
    assert len(sn.group_sizes) == 4 + 8
    # the stem, every block's last conv and the downsample shortcut write into the stream
    writers = sorted(n for n, m in sn.layers.items() if m.out_units == "layer1")
    assert writers == ["conv1", "layer1.0.conv2", "layer1.1.conv2"]
    writers = sorted(n for n, m in sn.layers.items() if m.out_units == "layer2")
    assert writers == ["layer2.0.conv2", "layer2.0.downsample.0", "layer2.1.conv2"]
    assert model.layer2[0].downsample[0].in_units == "layer1"


def test_resnet18_reduced_is_gems():
    """GEM's reduced ResNet18: nf=20, BasicBlocks [2, 2, 2, 2], about 1.1M conv weights."""
    model = MODELS.get("resnet18-reduced")(
        ModelSpec((3, 32, 32), 5, multi_head=True, stream_pruning="coupled")
    )
    sn = Supernet(model, torch.zeros(1, 3, 32, 32))
    plain = torchvision.models.resnet18(num_classes=5)
    plain.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    plain.maxpool = nn.Identity()
    n_conv = sum(m.weight.numel() for m in plain.modules() if isinstance(m, nn.Conv2d))
    # the same topology at (20/64)^2 of the weights
    assert sn.total_weights == pytest.approx(n_conv * (20 / 64) ** 2, rel=0.01)
    # and exactly GEM's count, by hand: a 3x3 stem, two BasicBlocks per stage (four 3x3
    # convs), a 1x1 downsample where the width doubles
    widths, k = [20, 40, 80, 160], 9
    by_hand = 3 * 20 * k
    for c_in, c_out in zip([20, *widths[:-1]], widths, strict=True):
        by_hand += (c_in * c_out + 3 * c_out * c_out) * k + (c_in * c_out if c_in != c_out else 0)
    assert sn.total_weights == by_hand == 1_090_140
    # the analytic dense FLOPs equal FlopCounterMode on the model itself
    assert sn.dense_flops == measured_flops(model.eval(), torch.zeros(1, 3, 32, 32))


def test_resnet50_matches_torchvision_layout():
    model = MODELS.get("resnet50")(
        ModelSpec((3, 64, 64), 10, multi_head=True, stream_pruning="coupled")
    )
    tv = torchvision.models.resnet50(num_classes=10)
    ours = {n: tuple(p.shape) for n, p in model.named_parameters()}
    theirs = {n: tuple(p.shape) for n, p in tv.named_parameters()}
    assert ours == theirs
    # torchvision's weights load into it by name (masks and frozen flags are extra buffers)
    missing, unexpected = model.load_state_dict(tv.state_dict(), strict=False)
    assert not unexpected
    assert all(k.endswith(("weight_mask", "frozen", "unit_mask")) for k in missing)
    x = torch.randn(1, 3, 64, 64)
    sn = Supernet(model, x)
    assert sn.dense_flops == measured_flops(tv.eval(), x)
    assert sn.group_sizes["conv1"] == 64 and sn.group_sizes["layer1"] == 256
    assert model.layer1[0].downsample[0].in_units == "conv1"


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_converter_finds_the_same_groups_as_the_hand_built_models(name):
    """Torch-Pruning's dependency graph on the torchvision model couples exactly the channels
    our hand-built ResNets put in one unit group (residual streams, shortcuts, stem)."""
    if name == "resnet50":
        plain, shape = torchvision.models.resnet50(num_classes=5), (3, 32, 32)
    else:
        plain, shape = torchvision.models.resnet18(num_classes=5), (3, 32, 32)
        plain.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        plain.maxpool = nn.Identity()
    x = torch.randn(2, *shape)
    converted = to_supernet(plain, x)
    ours = (
        ResNet(BasicBlock, [2, 2, 2, 2], 64, 3, 5, True, streams="coupled")
        if name != "resnet50"
        else None
    )
    ours = ours or MODELS.get("resnet50")(
        ModelSpec(shape, 5, multi_head=True, stream_pruning="coupled")
    )
    assert partition(converted) == partition(ours)
    assert Supernet(converted, x).dense_flops == Supernet(ours, x).dense_flops
    # the original is untouched and the copy computes the same function (eval mode)
    assert isinstance(plain.conv1, nn.Conv2d) and not isinstance(plain.conv1, MaskedLayer)
    assert torch.equal(converted.eval()(x), plain.eval()(x))


def test_converter_keeps_trained_batchnorm_and_supports_a_shared_head():
    plain = torchvision.models.resnet18(num_classes=4)
    with torch.no_grad():
        plain.train()(torch.randn(8, 3, 16, 16))  # move the BatchNorm statistics
    x = torch.randn(3, 3, 16, 16)
    for multi_head in (True, False):
        # --task-affine: a shared head keeps the classifier's bias as the per-task bias
        converted = to_supernet(plain, x, multi_head=multi_head, task_affine=True).eval()
        assert torch.equal(converted(x), plain.eval()(x))
        head_types = [type(m) for m in converted.fc.modules()]
        assert (TaskHead in head_types) == multi_head and (TaskBias in head_types) != multi_head


class BiasNet(nn.Module):
    """Convs with biases and no BatchNorm, a BatchNorm after an add, an intermediate linear."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)  # bias, no BatchNorm: needs a gate
        self.b = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.c = nn.Conv2d(8, 8, 1)  # bias, followed by a BatchNorm: bias absorbed
        self.bn = nn.BatchNorm2d(8)
        self.hidden = nn.Linear(8, 12)
        self.out = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.a(x))
        h = F.relu(h + self.b(h))  # a and b coupled through the add
        h = F.relu(self.bn(self.c(h)))
        h = F.relu(self.hidden(F.adaptive_avg_pool2d(h, 1).flatten(1)))
        return self.out(h)


def test_converter_gates_layers_whose_channels_batchnorm_cannot_silence():
    x = torch.randn(4, 3, 8, 8)
    converted = to_supernet(BiasNet(), x)
    assert isinstance(converted.a, nn.Sequential) and isinstance(converted.a[1], UnitGate)
    assert isinstance(converted.b, nn.Sequential)  # its group has no BatchNorm: a gate too
    assert converted.a[1].group == converted.b[1].group == converted.a[0].out_units
    assert isinstance(converted.c, MaskedConv2d)  # its bias is absorbed by the BatchNorm
    assert isinstance(converted.bn, TaskBatchNorm2d) and converted.bn.group == "c"
    assert isinstance(converted.hidden[1], UnitGate) and converted.hidden[0].in_units == "c"
    assert isinstance(converted.out, TaskHead) and converted.out.in_units == "hidden"

    sn = Supernet(converted, x)
    gen = torch.Generator().manual_seed(0)
    sn.begin_task(3)
    units = {g: torch.rand(s, generator=gen) < 0.5 for g, s in sn.group_sizes.items()}
    for alive in units.values():
        alive[0] = True
    sn.set_unit_masks(units)
    sn.eval()
    sn.commit_task()
    # dead channels of the gated residual group are exactly zero after the add
    seen = {}
    converted.b.register_forward_hook(lambda m, i, o: seen.update(b=o))
    sn(x, task=0)
    dead = ~units[converted.b[1].group]
    assert torch.equal(seen["b"][:, dead], torch.zeros_like(seen["b"][:, dead]))
    # the analytic count follows the gates and equals the slim copy's measured FLOPs
    slim = slim_copy(sn, 0, x[:1])
    sn.use_task(0)
    assert measured_flops(slim, x[:1]) == sn.flops()
    torch.testing.assert_close(slim(x), sn(x, task=0), rtol=1e-5, atol=1e-5)


class Concatenating(nn.Module):
    """Concatenates the model input with a conv's output: the input's channels cannot be
    pruned (a concatenation of layers' outputs converts, see test_convert_coupling)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.fc = nn.Linear(7, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([x, self.a(x)], 1).mean((2, 3)))


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1, bias=False)
        self.again = self.conv
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.again(self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (Concatenating(), "layer 'fc' reads a concatenation of which 3 of its 7 channels come"),
        (Shared(), "module 'conv' is used again as 'again'"),
        (
            nn.Sequential(nn.Conv2d(3, 4, 3), nn.InstanceNorm2d(4, affine=True)),
            "module '1' is a InstanceNorm2d with parameters",
        ),
        (
            nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Conv2d(4, 2, 1)),
            "classifier '2' has 2 outputs but the model outputs [1, 2, 1, 1]",
        ),
        (
            nn.Sequential(nn.Flatten(), nn.Linear(192, 4), nn.BatchNorm1d(4)),
            "found '2', a BatchNorm1d",
        ),
    ],
)
def test_converter_refuses_what_it_cannot_express(model, message):
    with pytest.raises(ConvertError, match=None) as err:
        to_supernet(model, torch.randn(1, 3, 8, 8))
    assert message in str(err.value)


def test_register_converted_makes_a_model_name(monkeypatch):
    models: Registry = Registry("model")  # what it registers leaves with the test
    monkeypatch.setattr(convert_module, "MODELS", models)

    def build(spec: ModelSpec) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(spec.input_shape[0], 6, 3, padding=1, bias=False),
            nn.BatchNorm2d(6),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(6, spec.n_classes),
        )

    register_converted("tiny-conv", build)
    assert models.names() == ["tiny-conv"] and "tiny-conv" not in MODELS
    model = models.get("tiny-conv")(ModelSpec((1, 8, 8), 3, multi_head=True))
    sn = Supernet(model, torch.zeros(2, 1, 8, 8))
    assert sn.group_sizes == {"0": 6}
    assert isinstance(model[5], TaskHead)
