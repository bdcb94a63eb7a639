"""One small model per construct that the converter must follow (issue 47, item 2), each with
an example batch of 2 inputs; each is the smallest network that has the construct between
maskable layers, written as research code writes it."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

CLASSES = 4


def _conv_bn(cin: int, cout: int, k: int = 3) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, padding=k // 2, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
    )


class Concat(nn.Module):
    """DenseNet/GoogLeNet: two branches concatenated along channels with the input kept, read
    by a conv (GoogLeNet) and by a BatchNorm (DenseNet); the classifier reads their outputs
    concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.a, self.b = _conv_bn(3, 8), _conv_bn(8, 8, 1), _conv_bn(8, 8)
        self.mix = _conv_bn(24, 16)
        self.dense = nn.Sequential(nn.BatchNorm2d(24), nn.ReLU(), nn.Conv2d(24, 8, 3, padding=1))
        self.fc = nn.Linear(24, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        x = torch.cat([x, self.a(x), self.b(x)], dim=1)
        x = torch.cat([self.mix(x), self.dense(x)], dim=1)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class SplitShuffle(nn.Module):
    """ShuffleNet V2: split the channels in two, transform one half (by convs, as its branch
    does), concatenate, shuffle."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.head = _conv_bn(3, 16), _conv_bn(16, 16, 1)
        self.branch = nn.Sequential(_conv_bn(8, 16, 1), _conv_bn(16, 8))
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        keep, change = x.chunk(2, dim=1)
        x = torch.cat([keep, self.branch(change)], dim=1)
        b, c, h, w = x.shape
        x = x.view(b, 2, c // 2, h, w).transpose(1, 2).reshape(b, c, h, w)
        return self.fc(self.head(x).mean((2, 3)))


class TokenMixer(nn.Module):
    """MLP-Mixer: a Linear across the token axis (the token axis is not a unit axis)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 8, 8)
        self.norm = nn.LayerNorm(16)
        self.tokens = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.channels = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)  # (batch, 16 tokens, 16 channels)
        x = x + self.tokens(self.norm(x).transpose(1, 2)).transpose(1, 2)
        x = x + self.channels(x)
        return self.fc(x.mean(1))


class FunctionalAttention(nn.Module):
    """Attention as Swin writes it (without its windows): its projections' weights passed to
    ``F.linear``."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(32, 96), nn.Linear(32, 32)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = F.linear(x, self.qkv.weight, self.qkv.bias).chunk(3, dim=-1)
        return F.linear(F.scaled_dot_product_attention(q, k, v), self.proj.weight, self.proj.bias)


class FunctionalWeight(nn.Module):
    """Swin: modules' weights used through a function, the modules themselves never called
    (an attention, an MLP and the classifier)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(48, 32)
        self.attn = FunctionalAttention()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 32, bias=False)
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(F.pixel_unshuffle(x, 4).flatten(2).transpose(1, 2))  # (batch, 16, 32)
        x = x + self.attn(x)
        x = x + F.linear(F.gelu(F.linear(x, self.fc1.weight, self.fc1.bias)), self.fc2.weight)
        return F.linear(x.mean(1), self.fc.weight, self.fc.bias)


class WindowAttention(nn.Module):
    """Swin's (shifted) window attention as torchvision writes it, on an NHWC map: windows of
    ``window`` x ``window`` tokens, shifted by ``torch.roll`` with a mask, the projections'
    weights passed to ``F.linear``, q, k and v cut into heads, and a per-head relative
    position bias table indexed by a fixed buffer, added to the attention logits."""

    def __init__(self, dim: int, heads: int, window: int = 2, shift: int = 0) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.heads, self.window, self.shift = heads, window, shift
        self.bias_table = nn.Parameter(0.02 * torch.randn((2 * window - 1) ** 2, heads))
        grid = torch.stack(torch.meshgrid(*[torch.arange(window)] * 2, indexing="ij")).flatten(1)
        rel = (grid[:, :, None] - grid[:, None, :]).permute(1, 2, 0) + window - 1
        self.register_buffer("index", rel[..., 0] * (2 * window - 1) + rel[..., 1])

    def _windows(self, x: Tensor) -> Tensor:
        b, h, w, c = x.shape
        s = self.window
        return x.view(b, h // s, s, w // s, s, c).transpose(2, 3).reshape(-1, s * s, c)

    def forward(self, x: Tensor) -> Tensor:
        b, h, w, c = x.shape
        s, n, shift = self.window, self.heads, self.shift
        x = self._windows(torch.roll(x, (-shift, -shift), (1, 2)))
        qkv = F.linear(x, self.qkv.weight, self.qkv.bias).reshape(len(x), s * s, 3, n, c // n)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attn = (q * (c // n) ** -0.5) @ k.transpose(-2, -1)
        attn = attn + self.bias_table[self.index].permute(2, 0, 1)
        # tokens rolled in from the other side of the map attend only to their own region
        rows, cols = (
            (torch.arange(m, device=x.device) >= m - s).long()
            + (torch.arange(m, device=x.device) >= m - shift).long()
            for m in (h, w)
        )
        region = self._windows((rows[:, None] * 3 + cols[None, :]).view(1, h, w, 1).float())
        mask = (region != region.transpose(1, 2)).to(attn) * -100.0  # (windows, s*s, s*s)
        attn = (attn.view(b, -1, n, s * s, s * s) + mask[None, :, None]).view_as(attn)
        x = (attn.softmax(-1) @ v).transpose(1, 2).reshape(len(x), s * s, c)
        x = F.linear(x, self.proj.weight, self.proj.bias)
        x = x.view(b, h // s, w // s, s, s, c).transpose(2, 3).reshape(b, h, w, c)
        return torch.roll(x, (shift, shift), (1, 2))


class SwinBlock(nn.Module):
    def __init__(self, dim: int, heads: int, shift: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), WindowAttention(dim, heads, shift=shift)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Swin(nn.Module):
    """Swin: a patch conv, an NHWC map with LayerNorms on its last axis, a block of window
    attention and one of shifted windows, PatchMerging (a cat of 4 strided slices on the
    channel axis, a LayerNorm and a Linear 4C -> 2C), a block, a pooled classifier."""

    def __init__(self, channels: int = 3, patch: int = 4, classes: int = CLASSES) -> None:
        super().__init__()
        self.patches = nn.Conv2d(channels, 16, patch, stride=patch)
        self.norm = nn.LayerNorm(16)
        self.blocks = nn.Sequential(SwinBlock(16, 2, 0), SwinBlock(16, 2, 1))
        self.merge_norm, self.reduction = nn.LayerNorm(64), nn.Linear(64, 32, bias=False)
        self.last = SwinBlock(32, 4, 0)
        self.final_norm, self.fc = nn.LayerNorm(32), nn.Linear(32, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.blocks(self.norm(self.patches(x).permute(0, 2, 3, 1)))
        parts = [x[:, i::2, j::2] for j in (0, 1) for i in (0, 1)]
        x = self.last(self.reduction(self.merge_norm(torch.cat(parts, -1))))
        return self.fc(self.final_norm(x).mean((1, 2)))


class LayerScale(nn.Module):
    """ConvNeXt/CaiT: a per-channel parameter multiplying a residual branch elementwise."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.conv = _conv_bn(3, 16), nn.Conv2d(16, 16, 3, padding=1)
        self.gamma = nn.Parameter(1e-2 * torch.ones(16, 1, 1))
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        x = x + self.gamma * self.conv(x)
        return self.fc(x.mean((2, 3)))


class ClassToken(nn.Module):
    """A ViT's bare class token and position embedding, the batch read with ``len(x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, 16, 8, 8)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 16))
        self.pos_embedding = nn.Parameter(0.02 * torch.randn(1, 17, 16))
        self.mlp = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1) + self.pos_embedding
        x = x + self.mlp(x)
        return self.fc(x[:, 0])


class QkvAttention(nn.Module):
    """Self-attention as research code writes it: q, k and v cut from one projection, by
    ``reshape(B, N, 3, H, d)`` and ``unbind`` with the products written out, or by
    ``chunk(3, -1)`` into ``F.scaled_dot_product_attention``; widths read from ``x.shape``."""

    def __init__(self, dim: int, heads: int, chunk: bool) -> None:
        super().__init__()
        self.heads, self.chunk = heads, chunk
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        if self.chunk:
            q, k, v = (
                t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1)
            )
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)
            x = ((q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5).softmax(-1) @ v
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class QkvSplit(nn.Module):
    """A ViT block's attention (:class:`QkvAttention`) on patch tokens, mean-pooled."""

    def __init__(self, chunk: bool = False) -> None:
        super().__init__()
        self.patches, self.norm = nn.Conv2d(3, 16, 8, 8), nn.LayerNorm(16)
        self.attn = QkvAttention(16, 4, chunk)
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = x + self.attn(self.norm(x))
        return self.fc(x.mean(1))


class PatchAttention(nn.Module):
    """MobileViT: a conv map unfolded into 2x2 patches, attention among the patches at each
    pixel position of a patch (a batch of ``B * 4`` sequences), folded back, projected, and
    fused with the block's input by a conv reading both concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.local = _conv_bn(3, 8), nn.Conv2d(8, 16, 1, bias=False)
        self.norm, self.attn = nn.LayerNorm(16), QkvAttention(16, 2, chunk=True)
        self.proj, self.fusion = _conv_bn(16, 8, 1), _conv_bn(16, 8)
        self.fc = nn.Linear(8, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        shortcut = x = self.stem(F.max_pool2d(x, 4))
        x = self.local(x)
        b, c, h, w = x.shape
        x = x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 3, 5, 2, 4, 1).reshape(b * 4, -1, c)
        x = x + self.attn(self.norm(x))
        x = x.reshape(b, 2, 2, h // 2, w // 2, c).permute(0, 5, 3, 1, 4, 2).reshape(b, c, h, w)
        x = self.fusion(torch.cat([shortcut, self.proj(x)], dim=1))
        return self.fc(x.mean((2, 3)))


class LinearAttention(nn.Module):
    """MobileViTv2: one 1x1 conv's output split into a query of 1 channel (softmax over the
    patches: context scores), keys and values; the output projection reads the values times
    the context vector; ``GroupNorm(1, C)`` normalises the residual stream before it and
    before a 1x1-conv MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.norm = _conv_bn(3, 16), nn.GroupNorm(1, 16)
        self.qkv, self.out = nn.Conv2d(16, 33, 1), nn.Conv2d(16, 16, 1)
        self.mlp = nn.Sequential(
            nn.GroupNorm(1, 16), nn.Conv2d(16, 64, 1), nn.SiLU(), nn.Conv2d(64, 16, 1)
        )
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(F.max_pool2d(x, 4))
        b, c, h, w = x.shape
        x = x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, c, 4, -1)
        query, key, value = self.qkv(self.norm(x)).split([1, c, c], dim=1)
        context = (key * query.softmax(-1)).sum(-1, keepdim=True)
        x = x + self.out(F.relu(value) * context.expand_as(value))
        x = x + self.mlp(x)
        return self.fc(x.mean((2, 3)))


class LayerNorm2d(nn.LayerNorm):
    """timm's LayerNorm2d: LayerNorm over the channels of an NCHW map."""

    def forward(self, x: Tensor) -> Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ChannelNorm(nn.Module):
    """ConvNeXt's stem: convolutions with a channel-wise LayerNorm on the NCHW maps."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.norm = nn.Conv2d(3, 16, 4, 4), LayerNorm2d(16)
        self.conv, self.norm2 = nn.Conv2d(16, 32, 3, padding=1), LayerNorm2d(32)
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = F.gelu(self.norm2(self.conv(self.norm(self.stem(x)))))
        return self.fc(x.mean((2, 3)))


class ConvNeXtBlock(nn.Module):
    """torchvision's CNBlock: a depthwise 7x7 conv, channels last, a LayerNorm and a Linear
    MLP, channels first again, a layer scale, a residual add."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.layer_scale = nn.Parameter(0.1 * torch.ones(dim, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        return x + self.layer_scale * self.fc2(F.gelu(self.fc1(y))).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """ConvNeXt: a patchify stem and a downsampling conv each with a :class:`LayerNorm2d`, a
    block at each width, the pooled map normalised before the classifier."""

    def __init__(self, in_channels: int = 3, classes: int = CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 8, 2, 2), LayerNorm2d(8))
        self.block1, self.block2 = ConvNeXtBlock(8), ConvNeXtBlock(16)
        self.down = nn.Sequential(LayerNorm2d(8), nn.Conv2d(8, 16, 2, 2))
        self.norm, self.fc = LayerNorm2d(16), nn.Linear(16, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.block2(self.down(self.block1(self.stem(x))))
        return self.fc(self.norm(F.adaptive_avg_pool2d(x, 1)).flatten(1))


class ConvHead(nn.Module):
    """SqueezeNet: the classifier is a 1x1 convolution, then global average pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(_conv_bn(3, 16), nn.MaxPool2d(2), _conv_bn(16, 32))
        self.classifier = nn.Sequential(
            nn.Conv2d(32, CLASSES, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x)).flatten(1)


class TwoHeads(nn.Module):
    """Distilled DeiT: two heads on two tokens, their outputs averaged."""

    def __init__(self) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, 16, 8, 8)
        self.tokens = nn.Parameter(torch.zeros(1, 2, 16))
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.head, self.head_dist = nn.Linear(16, CLASSES), nn.Linear(16, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.tokens.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + self.mlp(x)
        return (self.head(x[:, 0]) + self.head_dist(x[:, 1])) / 2


class Embedding(nn.Module):
    """Token ids (int64) into an ``nn.Embedding``, mean-pooled, an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, CLASSES))

    def forward(self, ids: Tensor) -> Tensor:
        return self.mlp(self.embed(ids).mean(1))


_IMAGE = torch.zeros(2, 3, 32, 32)

#: construct -> (model class, example batch)
CONSTRUCTS: dict[str, tuple[Callable[[], nn.Module], Tensor]] = {
    "concatenation": (Concat, _IMAGE),
    "split-shuffle": (SplitShuffle, _IMAGE),
    "token-mixing": (TokenMixer, _IMAGE),
    "functional-weight": (FunctionalWeight, _IMAGE),
    "layer-scale": (LayerScale, _IMAGE),
    "qkv-split": (QkvSplit, _IMAGE),
    "qkv-chunk": (lambda: QkvSplit(chunk=True), _IMAGE),
    "patch-attention": (PatchAttention, _IMAGE),
    "linear-attention": (LinearAttention, _IMAGE),
    "class-token": (ClassToken, _IMAGE),
    "layernorm2d": (ChannelNorm, _IMAGE),
    "convnext": (ConvNeXt, _IMAGE),
    "conv-head": (ConvHead, _IMAGE),
    "two-heads": (TwoHeads, _IMAGE),
    "swin": (Swin, _IMAGE),
    "embedding": (Embedding, torch.zeros(2, 12, dtype=torch.long)),
}
