"""``nn.Embedding`` (token models): a masked lookup table whose output features are units; see
docs/architectures.md, "Layers"."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from espn.layers.base import (
    ConvertError,
    ExportError,
    Placement,
    WeightAdapter,
    holding,
    register,
)
from espn.supernet.layers import MaskedLayer


class MaskedEmbedding(MaskedLayer):
    """``nn.Embedding`` whose table (stored transposed, ``(embedding_dim, num_embeddings)``)
    is multiplied by the active task's mask."""

    #: a lookup: FlopCounterMode counts nothing (see :func:`espn.supernet.flops.layer_cost`)
    counts_flops = False

    def __init__(self, table: nn.Embedding, out_units: str | None, out_unit_size: int) -> None:
        super().__init__()
        self.num_embeddings = table.num_embeddings
        self.embedding_dim = table.embedding_dim
        self.padding_idx = table.padding_idx
        self.weight = nn.Parameter(table.weight.detach().t().contiguous())
        self._init_masks(None, out_units, out_size=out_unit_size)

    def forward(self, x: Tensor) -> Tensor:
        return F.embedding(x, self.masked_weight().t(), self.padding_idx)


@register
class EmbeddingAdapter(WeightAdapter):
    source = (nn.Embedding,)
    exports = (MaskedEmbedding,)
    token_outputs = True

    def check(self, name: str, m: nn.Module) -> None:
        assert isinstance(m, nn.Embedding)
        if m.max_norm is not None or m.sparse:
            raise ConvertError(
                f"Embedding {name!r} has max_norm or sparse=True (max_norm rewrites the table "
                "in place, which would change frozen rows); supported: a plain nn.Embedding"
            )

    def width(self, m: nn.Module, out_side: bool) -> int:
        assert isinstance(m, nn.Embedding)
        return m.embedding_dim if out_side else m.num_embeddings

    @torch.no_grad()
    def masked(self, m: nn.Module, place: Placement) -> nn.Module:
        assert isinstance(m, nn.Embedding)
        if place.gated and place.task_affine:
            raise ConvertError(
                f"Embedding {place.name!r} would get a per-task shift (task_affine), which an "
                "exported table has no bias for; use task_affine=False or a LayerNorm after it"
            )
        return MaskedEmbedding(m, place.out_group, place.out_unit)

    @torch.no_grad()
    def plain(self, m: nn.Module) -> nn.Module:
        assert isinstance(m, MaskedEmbedding)
        table = nn.Embedding(m.num_embeddings, m.embedding_dim, padding_idx=m.padding_idx)
        return holding(table, m.masked_weight().t().contiguous())

    def resize(self, m: nn.Module) -> None:
        assert isinstance(m, MaskedEmbedding)
        m.embedding_dim = m.weight.shape[0]

    @torch.no_grad()
    def fold_affine(self, layer: nn.Module, scale: Tensor | None, shift: Tensor | None) -> None:
        """A gate's scale multiplies the table's columns (its features)."""
        assert isinstance(layer, nn.Embedding)
        if shift is not None:
            raise ExportError("a per-task shift cannot be folded into an nn.Embedding")
        if scale is not None:
            layer.weight.mul_(scale.view(1, -1))
