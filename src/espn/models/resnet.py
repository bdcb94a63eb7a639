"""Residual supernets: the reduced ResNet18 of GEM, a CIFAR ResNet18 and torchvision's ResNet50.

Module names follow torchvision, so that a torchvision state dict loads with ``strict=False``;
how the convs writing a residual stream form unit groups (:data:`STREAM_PRUNING`,
:attr:`ResNet.unit_unions`) is described in docs/models.md."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from espn.layers.batchnorm2d import TaskBatchNorm2d
from espn.layers.conv2d import MaskedConv2d
from espn.layers.linear import model_head
from espn.models.checks import image_channels
from espn.models.registry import MODELS, ModelSpec


def conv_bn(
    c_in: int,
    c_out: int,
    kernel: int,
    stride: int,
    in_units: str | None,
    out_units: str,
) -> tuple[MaskedConv2d, TaskBatchNorm2d]:
    """A bias-free masked conv ("same" padding) and the task BatchNorm of its output group."""
    conv = MaskedConv2d(
        c_in,
        c_out,
        kernel,
        stride=stride,
        padding=kernel // 2,
        in_units=in_units,
        out_units=out_units,
    )
    return conv, TaskBatchNorm2d(c_out, out_units)


#: how the producers of a residual stream are pruned: each on its own, the stream alive where
#: any keeps a channel (the authors'), or all together as one unit group
STREAM_PRUNING = ("per-conv", "coupled")


def _downsample(c_in: int, c_out: int, stride: int, in_units: str, out_units: str) -> nn.Module:
    return nn.Sequential(*conv_bn(c_in, c_out, 1, stride, in_units, out_units))


def _stream_units(name: str, last: str, out_stream: str, per_conv: bool) -> tuple[str, str]:
    """The unit groups of a block's last conv and of its downsample shortcut."""
    if per_conv:
        return f"{name}.{last}", f"{name}.downsample"
    return out_stream, out_stream


class BasicBlock(nn.Module):
    """Two 3x3 convs and a residual add (ResNet18/34); the stride sits on the first conv.

    Each conv (``kernels``, the stride on conv ``strided``) has a task BatchNorm and a ReLU
    but the last, which writes into the output stream; a 1x1 downsample shortcut joins where
    the width, the resolution or (coupled streams) the stream's group changes."""

    expansion = 1
    kernels: tuple[int, ...] = (3, 3)
    strided = 0

    def __init__(
        self,
        c_in: int,
        width: int,
        stride: int,
        name: str,
        in_stream: str,
        out_stream: str,
        per_conv: bool = False,
    ) -> None:
        super().__init__()
        n, c_out = len(self.kernels), width * self.expansion
        last, short = _stream_units(name, f"conv{n}", out_stream, per_conv)
        groups = [in_stream, *(f"{name}.conv{i}" for i in range(1, n)), last]
        widths = [c_in, *[width] * (n - 1), c_out]
        for i, kernel in enumerate(self.kernels):
            step = stride if i == self.strided else 1
            conv, bn = conv_bn(widths[i], widths[i + 1], kernel, step, groups[i], groups[i + 1])
            self.add_module(f"conv{i + 1}", conv)
            self.add_module(f"bn{i + 1}", bn)
        self.downsample: nn.Module | None = None
        if stride != 1 or c_in != c_out or (not per_conv and in_stream != out_stream):
            self.downsample = _downsample(c_in, c_out, stride, in_stream, short)
        #: the unit groups this block writes into its output stream
        self.writes = (last,) if self.downsample is None else (short, last)

    def forward(self, x: Tensor) -> Tensor:
        out = x
        for i in range(1, len(self.kernels) + 1):
            out = getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(out))
            out = F.relu(out) if i < len(self.kernels) else out
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


class Bottleneck(BasicBlock):
    """1x1 reduce, 3x3 (carrying the stride, as torchvision's ResNet v1.5), 1x1 expand x4."""

    expansion = 4
    kernels = (1, 3, 1)
    strided = 1


class ResNet(nn.Module):
    """A residual supernet with task-specific BatchNorm and one head per task (or a shared,
    masked head with a per-task bias when ``multi_head`` is False). ``stem="cifar"``: one 3x3
    stride-1 conv; ``"imagenet"``: 7x7 stride-2 conv and 3x3 stride-2 max pooling
    (torchvision). Global average pooling before the head makes any input size work."""

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        blocks: list[int],
        nf: int,
        in_channels: int,
        n_classes: int,
        multi_head: bool,
        stem: str = "cifar",
        task_affine: bool = False,
        *,
        streams: str,
    ) -> None:
        super().__init__()
        if stem not in ("cifar", "imagenet"):
            raise ValueError(f"unknown stem {stem!r}; choose 'cifar' or 'imagenet'")
        if streams not in STREAM_PRUNING:
            raise ValueError(f"unknown streams {streams!r}; choose one of: {STREAM_PRUNING}")
        per_conv = streams == "per-conv"
        # the stem writes straight into stage 1's stream when the first block keeps its width
        stem_group = "layer1" if block.expansion == 1 and not per_conv else "conv1"
        kernel, stride = (3, 1) if stem == "cifar" else (7, 2)
        self.conv1, self.bn1 = conv_bn(in_channels, nf, kernel, stride, None, stem_group)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1) if stem == "imagenet" else nn.Identity()
        #: per-conv streams: the unit groups each stream is the union of (see the docstring)
        self.unit_unions: dict[str, tuple[str, ...]] = {}
        c_in, stream = nf, stem_group
        writers: tuple[str, ...] = (stem_group,)
        for i, n_blocks in enumerate(blocks):
            stage = f"layer{i + 1}"
            width = nf * 2**i
            layers = []
            for b in range(n_blocks):
                stride = 2 if i > 0 and b == 0 else 1
                name = f"{stage}.{b}"
                unit = block(c_in, width, stride, name, stream, stage, per_conv)
                layers.append(unit)
                c_in, stream = width * block.expansion, stage
                if per_conv:  # an identity shortcut carries the input stream's writers along
                    writers = unit.writes if unit.downsample is not None else writers + unit.writes
                    stream = f"{name}.out"
                    self.unit_unions[stream] = writers
            setattr(self, stage, nn.Sequential(*layers))
        self.n_stages = len(blocks)
        self.out_features = c_in
        self.fc = model_head(c_in, n_classes, stream, multi_head, task_affine)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, MaskedConv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def features(self, x: Tensor) -> Tensor:
        """The pooled representation fed to the head."""
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        for i in range(self.n_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return F.adaptive_avg_pool2d(x, 1).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


def _resnet(
    spec: ModelSpec,
    block: type[BasicBlock] | type[Bottleneck],
    blocks: list[int],
    nf: int,
    stem: str = "cifar",
) -> ResNet:
    """A registered ResNet built for ``spec`` (its ``stream_pruning`` sets ``streams``)."""
    return ResNet(
        block,
        blocks,
        nf,
        image_channels(spec, "ResNets"),
        spec.n_classes,
        spec.multi_head,
        stem=stem,
        task_affine=spec.task_affine,
        streams=spec.stream_pruning,
    )


@MODELS.register("resnet18-reduced")
def resnet18_reduced(spec: ModelSpec) -> ResNet:
    """Reduced ResNet18 of GEM (nf=20, 3x3 stem): the paper's SplitCIFAR100 supernet."""
    return _resnet(spec, BasicBlock, [2, 2, 2, 2], 20)


@MODELS.register("resnet18")
def resnet18(spec: ModelSpec) -> ResNet:
    """CIFAR-style ResNet18 (nf=64, 3x3 stride-1 stem, no max pooling)."""
    return _resnet(spec, BasicBlock, [2, 2, 2, 2], 64)


@MODELS.register("resnet50")
def resnet50(spec: ModelSpec) -> ResNet:
    """ResNet50 in torchvision's layout (7x7 stem, max pooling, bottlenecks [3, 4, 6, 3])."""
    return _resnet(spec, Bottleneck, [3, 4, 6, 3], 64, stem="imagenet")


#: the registered models whose residual streams ``stream_pruning`` builds (a converted
#: model's streams are coupled; models without streams have nothing it could change)
STREAM_MODELS = ("resnet18-reduced", "resnet18", "resnet50")
