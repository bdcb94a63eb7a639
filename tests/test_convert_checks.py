"""What ``espn.wrap`` proves before it returns a converted model: its FLOPs counted as
FlopCounterMode counts them (attention on every path included), and a task's slim copy that
runs at any batch size, computes the supernet's outputs and costs what espn counts; or a
one-line refusal naming the module. Tiny models, seconds each."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import espn
from espn.export.export import load_exported, measured_flops
from espn.layers.layernorm import TaskLayerNorm
from espn.models.convert import ConvertError
from helpers.arch import OPTIMIZERS, check_two_tasks
from helpers.deploy import tiny_sequence


def attention_flops(tokens: int, dim: int, hidden: int) -> int:
    """FLOPs of one sample through a post-norm encoder layer, counted by hand: the q, k, v
    and output projections, QK^T and AV, the two MLP layers."""
    projections = 2 * tokens * dim * 4 * dim
    products = 2 * 2 * tokens * tokens * dim
    mlp = 2 * 2 * tokens * dim * hidden
    return projections + products + mlp


def test_measured_flops_count_the_fused_attention_paths():
    """nn.TransformerEncoderLayer in eval mode (torch's fused inference path without
    gradients) and F.scaled_dot_product_attention on the CPU: counted as written out."""
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    assert measured_flops(layer, torch.randn(3, 5, 16)) == attention_flops(5, 16, 32)

    class Fused(nn.Module):
        def forward(self, q: Tensor) -> Tensor:
            return nn.functional.scaled_dot_product_attention(q, q, q)

    q = torch.randn(1, 2, 5, 8)  # 2 heads of 8 features, 5 tokens
    assert measured_flops(Fused(), q) == 2 * (2 * 2 * 5 * 5 * 8)


class Attention(nn.Module):
    """Self-attention written by hand: q, k and v layers, heads reshaped, q @ k^T."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape

        def split(t: Tensor) -> Tensor:
            return t.reshape(b, n, self.heads, c // self.heads).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        a = (q @ k.transpose(-2, -1)).softmax(-1)
        return self.proj((a @ v).transpose(1, 2).reshape(b, n, c))


class HandAttentionNet(nn.Module):
    """Patches, two hand-written attention blocks, mean over tokens, a classifier."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.patch = nn.Conv2d(1, dim, 4, stride=4)
        self.blocks = nn.ModuleList([Attention(dim, 2), Attention(dim, 2)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = x + block(x)
        return self.head(self.norm(x).mean(1))


def test_products_espn_does_not_count_are_refused_naming_the_module():
    """A hand-written attention's q @ k^T and a @ v are FLOPs espn would not count (the
    ratio results.json reports would be wrong): refused at wrap, its first block named with
    FlopCounterMode's count and espn's (the 4-token products: 2 x 2 x 4 x 4 x 16 = 1024)."""
    x = torch.randn(2, 1, 8, 8)
    counted = 4 * 2 * 4 * 16 * 16
    with pytest.raises(
        ConvertError,
        match=rf"^module 'blocks.0' costs {counted + 1024} FLOPs per sample \(FlopCounterMode\) "
        rf"but espn counts {counted}: ",
    ):
        espn.wrap(HandAttentionNet(), x)


class GrayViT(nn.Module):
    """torchvision's VisionTransformer (which reshapes its patches with ``self.hidden_dim``)
    on 1x8x8 images, repeated to its three input channels."""

    def __init__(self) -> None:
        super().__init__()
        from torchvision.models import VisionTransformer

        self.vit = VisionTransformer(
            image_size=8,
            patch_size=4,
            num_layers=1,
            num_heads=2,
            hidden_dim=16,
            mlp_dim=32,
            num_classes=3,
            dropout=0.0,
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.vit(x.expand(-1, 3, -1, -1))


def test_a_width_written_into_forward_follows_the_slim_copy(tmp_path):
    """torchvision's ViT reshapes with its full width: two tasks (a short last batch of 8),
    task 0 bit-identical, and task 1's export, FLOPs as counted, answers at batch 1 and 3."""
    seq = tiny_sequence(n_tasks=2, n=40)
    sn = check_two_tasks(GrayViT, OPTIMIZERS[0], tmp_path, seq=seq)
    exported = load_exported(tmp_path / "task1.pt2")
    sn.eval()
    for batch in (1, 3):
        x = seq.tasks[1].test.x[:batch]
        with torch.no_grad():
            torch.testing.assert_close(exported(x), sn(x, task=1), rtol=1e-5, atol=1e-5)


def test_a_timm_vit_counts_what_flop_counter_counts_on_the_timm_model():
    """timm's ViT runs F.scaled_dot_product_attention, espn's copy two matmuls: the dense
    count of the copy equals FlopCounterMode on the timm model itself (the ratio results.json
    reports is against the model the user brought)."""
    timm = pytest.importorskip("timm")
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=8,
        patch_size=4,
        depth=1,
        embed_dim=16,
        num_heads=2,
        num_classes=3,
    )
    x = torch.randn(2, 3, 8, 8)
    tokens, dim = 5, 16
    by_hand = 2 * 3 * 16 * dim * 4 + attention_flops(tokens, dim, 4 * dim) + 2 * dim * 3
    assert measured_flops(model, x) == espn.wrap(model, x).dense_flops == by_hand


class ChannelNorm(nn.LayerNorm):
    """timm's LayerNorm2d as research code writes it: the channels of an NCHW map."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class SameLinear(nn.Linear):
    """A subclass with a forward of its own that computes nn.Linear's function."""

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


class ShiftedLinear(nn.Linear):
    """A subclass whose forward computes something else than nn.Linear's."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) + 1.0


def test_a_layer_subclass_computing_something_else_is_refused():
    net = nn.Sequential(nn.Flatten(), ShiftedLinear(64, 8), nn.ReLU(), nn.Linear(8, 3))
    with pytest.raises(
        ConvertError,
        match=r"^module '1' is a ShiftedLinear, a nn.Linear whose forward\(\) computes "
        r"something else than nn.Linear's",
    ):
        espn.wrap(net, torch.randn(2, 1, 8, 8))
    same = nn.Sequential(nn.Flatten(), SameLinear(64, 8), nn.ReLU(), nn.Linear(8, 3))
    assert espn.wrap(same, torch.randn(2, 1, 8, 8)).group_sizes == {"1": 8}


def test_a_channel_layer_norm_of_an_nchw_map_is_a_layer_norm_between_permutes():
    """LayerNorm2d: converted as a task LayerNorm of the conv's channels (end to end, two
    tasks and the export: test_constructs' layernorm2d)."""
    net = nn.Sequential(
        nn.Conv2d(1, 8, 3), ChannelNorm(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3)
    )
    x = torch.randn(2, 1, 8, 8)
    sn = espn.wrap(net, x)
    assert sn.group_sizes == {"0": 8}
    norms = [m for m in sn.model.modules() if isinstance(m, TaskLayerNorm)]
    assert [(m.group, m.normalized_shape) for m in norms] == [("0", (8,))]


class Shuffle(nn.Module):
    """A conv, a channel shuffle of two groups (ShuffleNet's), a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.bn(self.conv(x))
        b, c, hh, ww = h.shape
        h = h.view(b, 2, c // 2, hh, ww).transpose(1, 2).reshape(b, c, hh, ww)
        return self.fc(h.mean((2, 3)))


class Flipped(nn.Module):
    """A conv whose channels are read in reverse order (``flip(1)``) by another conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.fc = nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.conv2(self.bn(self.conv(x)).flip(1)).mean((2, 3)))


def test_a_channel_shuffle_keeps_its_channels_whole_and_a_reorder_is_refused_not_cut_wrong():
    """The dependency graph maps the shuffled channels to the wrong inputs of ``fc``: the
    shuffled channels are kept whole instead (one unit, never pruned) and ``fc`` reads all of
    them, which wrap's probed task confirms (its slim copy computes the supernet's outputs;
    torchvision's ShuffleNets: test_arch_shuffle.py). A reorder the graph maps as if channels
    stayed (``flip(1)``) is refused by that probe: its slim copy computes other outputs."""
    sn = espn.wrap(Shuffle(), torch.randn(2, 1, 8, 8))
    assert sn.group_sizes == {"conv": 1} and sn.layers["conv"].out_unit_size == 8
    assert sn.model.fc.in_units is None
    with pytest.raises(
        ConvertError, match=r"^a task's sub-network of Flipped computes other outputs"
    ):
        espn.wrap(Flipped(), torch.randn(2, 1, 8, 8))


class NormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d as research code writes it: a BatchNorm with its activation."""

    def __init__(self, channels: int) -> None:
        super().__init__(channels)
        self.act = nn.SiLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(super().forward(x))


def norm_act_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, bias=False),
        NormAct(8),
        nn.Conv2d(8, 8, 3, bias=False),
        NormAct(8),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 3),
    )


def test_a_norm_with_its_activation_becomes_the_norm_then_the_activation(tmp_path):
    """Converted as its BatchNorm followed by its own activation (not as a bare BatchNorm,
    which would drop the SiLU); two tasks keep task 0 bit-identical and export as counted."""
    sn = espn.wrap(norm_act_net(), torch.randn(4, 1, 8, 8))
    assert isinstance(sn.model.get_submodule("1.1"), nn.SiLU)
    check_two_tasks(norm_act_net, OPTIMIZERS[0], tmp_path)


def test_a_layer_scale_is_per_task_state_of_its_channels_and_the_conv_is_gated():
    """ConvNeXt's layer scale ``gamma * conv(x)``: the parameter is held per task in the
    conv's unit group (its channels on dimension 0), and the conv gets a gate (its output is
    features, not the excitation of a squeeze-excitation block)."""
    from espn.layers.parameters import TaskParameters
    from espn.supernet.layers import TaskChannelBias, UnitGate
    from helpers.constructs import LayerScale

    sn = espn.wrap(LayerScale(), torch.randn(2, 3, 32, 32))
    held = [m for m in sn.model.modules() if isinstance(m, TaskParameters)]
    assert [(h.targets, h.groups) for h in held] == [(["gamma"], ["stem.0"])]
    assert isinstance(sn.model.conv[1], UnitGate)
    assert not any(isinstance(m, TaskChannelBias) for m in sn.model.modules())
