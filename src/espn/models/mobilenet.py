"""A MobileNetV2-style supernet for small images (28/32 pixels): inverted residual blocks
with depthwise convolutions (Sandler et al. 2018) whose stem keeps the resolution (stride 1),
as in the CIFAR variants, converted by :func:`espn.models.convert.to_supernet`."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from espn.models.checks import image_channels
from espn.models.convert import to_supernet
from espn.models.registry import MODELS, ModelSpec

#: (expansion t, output channels c, blocks n, stride of the first block s) per stage
SMALL_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2), (6, 64, 2, 2), (6, 96, 1, 1))


def conv_bn_act(c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Module:
    """Conv (no bias, "same" padding), BatchNorm and ReLU6."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    """1x1 expansion (skipped for t = 1), 3x3 depthwise, linear 1x1 projection; a residual
    add when input and output have the same width and resolution."""

    def __init__(self, c_in: int, c_out: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = c_in * expansion
        layers: list[nn.Module] = []
        if expansion != 1:
            layers.append(conv_bn_act(c_in, hidden, 1))
        layers += [
            conv_bn_act(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, c_out, 1, bias=False),
            nn.BatchNorm2d(c_out),
        ]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2Small(nn.Module):
    """The plain MobileNetV2-style network (``width``: channel multiplier)."""

    def __init__(
        self,
        in_channels: int,
        n_classes: int,
        width: float = 1.0,
        setting: tuple[tuple[int, int, int, int], ...] = SMALL_SETTING,
        last_channels: int = 320,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        stem = max(8, round(32 * width))
        layers: list[nn.Module] = [conv_bn_act(in_channels, stem, 3)]
        c_in = stem
        for t, c, n, s in setting:
            c_out = max(8, round(c * width))
            for i in range(n):
                layers.append(InvertedResidual(c_in, c_out, s if i == 0 else 1, t))
                c_in = c_out
        layers.append(conv_bn_act(c_in, last_channels, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last_channels, n_classes))

    def forward(self, x: Tensor) -> Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1).flatten(1)
        return self.classifier(x)


@MODELS.register("mobilenetv2-small")
def mobilenetv2_small(spec: ModelSpec) -> nn.Module:
    """MobileNetV2-style net for 28/32-pixel images: stride-1 stem, 8 inverted residual
    blocks with depthwise convs (stages 16-24-32-64-96), 1x1 conv to 320, pooled head."""
    plain = MobileNetV2Small(image_channels(spec, "MobileNets"), spec.n_classes)
    example = torch.zeros(2, *spec.input_shape)
    return to_supernet(plain, example, spec.multi_head, spec.task_affine)
