"""A small Vision Transformer supernet for 28- and 32-pixel images (patch size 4); its unit
groups and what each task owns: docs/transformers.md."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

from espn.errors import EspnError
from espn.layers import adapter_for, exported_adapter
from espn.layers.attention import MaskedAttention
from espn.layers.base import Keep, TokenGate, alive_index, alive_keep, exporter, hooked, take
from espn.layers.conv2d import MaskedConv2d
from espn.layers.layernorm import TaskLayerNorm
from espn.layers.linear import MaskedLinear, alive_linear, gated, model_head
from espn.layers.parameters import TaskTokens
from espn.models.registry import MODELS, ModelSpec
from espn.supernet.layers import TaskHead

STREAM = "stream"


class ViTShapeError(EspnError, ValueError):
    """Inputs a ViT cannot cut into patches; the message names the shape and patch size."""


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, dim: int, heads: int, hidden: int, name: str, task_affine: bool) -> None:
        super().__init__()
        mlp = f"{name}.mlp"
        self.norm1 = TaskLayerNorm(dim, STREAM, eps=1e-6)
        self.attn = MaskedAttention(dim, heads, f"{name}.heads", STREAM, task_affine=task_affine)
        self.norm2 = TaskLayerNorm(dim, STREAM, eps=1e-6)
        self.fc1 = MaskedLinear(dim, hidden, in_units=STREAM, out_units=mlp)
        self.gate = TokenGate(hidden, mlp, affine=task_affine)
        self.act = nn.GELU()
        self.fc2 = MaskedLinear(hidden, dim, in_units=mlp, out_units=STREAM)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(self.act(gated(self.fc1, self.gate, self.norm2(x))))

    def alive_forward(self, x: Tensor, keep: Keep) -> Tensor:
        """:meth:`forward` on the features ``keep`` says the task keeps: the stream's alive
        features and the MLP's alive neurons alone (see :meth:`ViT.alive_forward`)."""
        x = x + self.attn.alive_forward(self.norm1.alive_norm(x, keep), keep)
        hidden = alive_linear(self.fc1, self.norm2.alive_norm(x, keep), keep, self.gate)
        return x + alive_linear(self.fc2, self.act(hidden), keep)

    def has_dead_units(self) -> bool:
        """Whether the block's MLP neurons or attention heads have a dead unit (see
        :func:`alive_index`)."""
        gates = (self.gate, getattr(self.attn, "gate", None))
        return any(isinstance(g, TokenGate) and alive_index(g) is not None for g in gates)


class ViT(nn.Module):
    """Patch embedding (a masked conv of stride ``patch``), class token and position
    embeddings, ``depth`` pre-norm blocks, a final LayerNorm and a head on the class token."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        n_classes: int,
        multi_head: bool,
        dim: int = 64,
        depth: int = 4,
        heads: int = 4,
        mlp_ratio: float = 2.0,
        patch: int = 4,
        task_affine: bool = False,
    ) -> None:
        super().__init__()
        if len(input_shape) != 3 or input_shape[1] % patch or input_shape[2] % patch:
            raise ViTShapeError(
                f"a ViT with patch size {patch} needs (C, H, W) inputs with H and W multiples "
                f"of {patch}; got input shape {input_shape}"
            )
        channels, height, width = input_shape
        self.patch_embed = MaskedConv2d(channels, dim, patch, stride=patch, out_units=STREAM)
        self.tokens = TaskTokens((height // patch) * (width // patch), dim, STREAM)
        self.blocks = nn.Sequential(
            *(
                Block(dim, heads, int(dim * mlp_ratio), f"blocks.{i}", task_affine)
                for i in range(depth)
            )
        )
        self.norm = TaskLayerNorm(dim, STREAM, eps=1e-6)
        self.head = model_head(dim, n_classes, STREAM, multi_head, task_affine)

    def forward(self, x: Tensor) -> Tensor:
        if self.carries_alive_units():
            return self.alive_forward(x)
        x = self.tokens(self.patch_embed(x).flatten(2).transpose(1, 2))
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])

    def alive_forward(self, x: Tensor) -> Tensor:
        """:meth:`forward` carrying the alive units alone: the residual stream's alive
        features and each block's alive MLP neurons and attention heads. Dead units are zero
        in the masks and left out by the task LayerNorms, so the logits (and every gradient)
        are the same up to the order of float sums."""
        embed, norm, head = self.patch_embed, self.norm, self.head
        assert isinstance(embed, MaskedConv2d) and isinstance(norm, TaskLayerNorm)
        assert isinstance(head, TaskHead)
        blocks = [b for b in self.blocks if isinstance(b, Block)]
        keep = alive_keep(norm, *(g for b in blocks for g in (b.gate, b.attn.gate)))
        weight = take(embed.masked_weight(), exporter(embed).cuts(embed, keep)["weight"])
        x = embed._conv_forward(x, weight, None).flatten(2).transpose(1, 2)
        x = self.tokens(x, keep(STREAM, 1))
        for block in blocks:
            x = block.alive_forward(x, keep)
        x = norm.alive_norm(x, keep)[:, 0]
        return F.linear(x, take(head.weight, exporter(head).cuts(head, keep)["weight"]), head.bias)

    def carries_alive_units(self) -> bool:
        """Whether :meth:`forward` carries the alive units alone (:meth:`alive_forward`): in
        an eager training step (not compiled, not traced) of a task with a dead unit but a
        live stream, with the supernet's own modules in place (no plain layer) and no hook (a
        hook sees the whole width)."""
        if (
            not self.training
            or not torch.is_grad_enabled()
            or torch.compiler.is_compiling()
            or is_fx_symbolic_tracing()
            or not isinstance(self.norm, TaskLayerNorm)
        ):
            return False
        stream = alive_index(self.norm)  # first what is cached: a task with no dead unit
        if stream is not None and stream.numel() == 0:
            return False
        if stream is None and not any(
            isinstance(b, Block) and b.has_dead_units() for b in self.blocks
        ):
            return False
        return (
            isinstance(self.head, TaskHead)  # not a head shared by the tasks
            and all(isinstance(b, Block) for b in self.blocks)
            and not any(  # a plain layer: a plain copy's, in place of the supernet's own
                hooked(m) or (adapter_for(m) is not None and exported_adapter(m) is None)
                for m in self.modules()
            )
        )


@MODELS.register("vit-p4")
def vit_p4(spec: ModelSpec) -> ViT:
    """A 4-block ViT (dim 64, 4 heads of 16, MLP 128) on 4x4 patches for 28/32-pixel images."""
    return ViT(spec.input_shape, spec.n_classes, spec.multi_head, task_affine=spec.task_affine)
