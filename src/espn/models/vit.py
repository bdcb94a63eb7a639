"""A small Vision Transformer supernet for 28- and 32-pixel images (patch size 4).

Unit groups (what is pruned together):

* ``stream``: the embedding dimension, the residual stream every block reads and writes: the
  patch embedding's outputs, every block's attention and MLP output projections, the inputs
  of q, k, v, the MLP and the head, and every LayerNorm (statistics over alive features only,
  see :class:`~espn.supernet.transformer.TaskLayerNorm`);
* ``blocks.I.heads``: the attention heads of block I (a head is its q, k, v rows and its
  output-projection columns, see :class:`~espn.supernet.transformer.MaskedAttention`);
* ``blocks.I.mlp``: the hidden neurons of block I's MLP.

Every task owns its LayerNorms, its class token and position embeddings, and its head.
"""

from __future__ import annotations

from torch import Tensor, nn

from espn.errors import EspnError
from espn.models.registry import MODELS, ModelSpec
from espn.supernet.layers import MaskedConv2d, MaskedLinear, TaskHead, shared_head
from espn.supernet.transformer import (
    MaskedAttention,
    TaskLayerNorm,
    TaskTokens,
    TokenGate,
    gated,
)

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
        if multi_head:
            self.head: nn.Module = TaskHead(dim, n_classes, in_units=STREAM)
        else:
            self.head = shared_head(dim, n_classes, STREAM, task_affine)

    def forward(self, x: Tensor) -> Tensor:
        x = self.tokens(self.patch_embed(x).flatten(2).transpose(1, 2))
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


@MODELS.register("vit-p4")
def vit_p4(spec: ModelSpec) -> ViT:
    """A 4-block ViT (dim 64, 4 heads of 16, MLP 128) on 4x4 patches for 28/32-pixel images."""
    return ViT(spec.input_shape, spec.n_classes, spec.multi_head, task_affine=spec.task_affine)
