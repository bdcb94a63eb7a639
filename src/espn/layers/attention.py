"""``nn.MultiheadAttention`` (self-attention): a masked self-attention whose heads are the units
of their own group (docs/architectures.md, "Layers"; docs/transformers.md)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from espn.layers.base import (
    ConvertError,
    Keep,
    LayerAdapter,
    Placement,
    TokenGate,
    register,
)
from espn.layers.linear import MaskedLinear, alive_linear, gated


class MaskedAttention(nn.Module):
    """Multi-head self-attention on ``(B, N, D)`` tokens whose units are its heads: a head is
    one unit of ``heads_group``, its ``head_dim`` rows of the masked q, k, v and columns of
    ``proj`` (docs/transformers.md), scaled by a :class:`TokenGate` on v. The head count is
    read from the tensors, so the traced graph runs unchanged with fewer heads."""

    def __init__(
        self,
        dim: int,
        heads: int,
        heads_group: str,
        in_units: str | None,
        head_dim: int | None = None,
        task_affine: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim or dim // heads
        #: the heads' unit group (``espn.supernet.flops`` counts a module with one as attention)
        self.heads_group = heads_group
        width = heads * self.head_dim
        self.q = MaskedLinear(dim, width, in_units, heads_group, out_unit_size=self.head_dim)
        self.k = MaskedLinear(dim, width, in_units, heads_group, out_unit_size=self.head_dim)
        self.v = MaskedLinear(dim, width, in_units, heads_group, out_unit_size=self.head_dim)
        self.gate = TokenGate(heads, heads_group, affine=task_affine, unit_size=self.head_dim)
        self.proj = MaskedLinear(width, dim, heads_group, in_units, in_unit_size=self.head_dim)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.attn_drop = nn.Dropout(dropout)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Each head's attention of ``q`` to ``k`` over ``v`` (``(B, N, heads * head_dim)``
        each), the heads' outputs side by side."""
        b, n, width = v.shape
        shape = (b, n, width // self.head_dim, self.head_dim)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attn = F.softmax(torch.matmul(q * self.scale, k.transpose(-2, -1)), dim=-1)
        attn = self.attn_drop(attn)
        return torch.matmul(attn, v).transpose(1, 2).reshape(b, n, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.attend(self.q(x), self.k(x), gated(self.v, self.gate, x)))

    def alive_forward(self, x: Tensor, keep: Keep) -> Tensor:
        """:meth:`forward` on the features ``keep`` says a task keeps (``x`` holds just those
        of its input stream), giving those of its output, through the alive heads alone (a
        dead head adds exactly nothing to the whole-width forward)."""
        q = alive_linear(self.q, x, keep)
        k = alive_linear(self.k, x, keep)
        v = alive_linear(self.v, x, keep, self.gate)
        return alive_linear(self.proj, self.attend(q, k, v), keep)


class MaskedSelfAttention(MaskedAttention):
    """A :class:`MaskedAttention` called like ``nn.MultiheadAttention`` for self-attention
    (``query``, ``key`` and ``value`` the same tensor, no masks), returning ``(out, None)``;
    with ``tokens_only`` it is called as :class:`SelfAttention` is, returning the tokens."""

    #: read by code written for ``nn.MultiheadAttention`` (``nn.TransformerEncoderLayer``)
    in_proj_bias = None
    _qkv_same_embed_dim = True

    @torch.no_grad()
    def __init__(self, m: nn.MultiheadAttention, place: Placement) -> None:
        """The masked self-attention placed at ``place`` holding ``m``'s projection weights
        (biases are dropped, as the converter drops every bias not absorbed by a norm)."""
        heads = f"{place.name}.heads" if place.name else "heads"
        super().__init__(
            m.embed_dim,
            m.num_heads,
            heads,
            place.in_group,
            task_affine=place.task_affine,
            dropout=float(m.dropout),
        )
        self.batch_first = bool(m.batch_first)
        self.tokens_only = isinstance(m, SelfAttention)
        self.num_heads = m.num_heads
        self.embed_dim = m.embed_dim
        q, k, v = m.in_proj_weight.chunk(3)
        self.q.weight.copy_(q)
        self.k.weight.copy_(k)
        self.v.weight.copy_(v)
        self.proj.weight.copy_(m.out_proj.weight)

    def forward(  # type: ignore[override]
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
        **absent: object,
    ) -> Tensor | tuple[Tensor, None]:
        if (key is not None and key is not query) or (value is not None and value is not query):
            raise ConvertError(
                "a converted nn.MultiheadAttention supports self-attention only (query, key "
                "and value the same tensor)"
            )
        absent |= {"key_padding_mask": key_padding_mask, "attn_mask": attn_mask}
        if is_causal or any(v not in (None, False) for v in absent.values()):
            raise ConvertError(
                "a converted nn.MultiheadAttention supports no attention or padding mask"
            )
        if self.tokens_only:
            return super().forward(query)
        x = query if self.batch_first else query.transpose(0, 1)
        out = super().forward(x)
        return (out if self.batch_first else out.transpose(0, 1)), None


class SelfAttention(nn.MultiheadAttention):
    """Multi-head self-attention called as ``attn(x)`` on ``(B, N, D)`` tokens, returning the
    tokens: what the converter puts in place of attention written by hand (q, k and v cut
    from one projection, see :func:`espn.models.convert_tokens.replace_attention`); it
    becomes a :class:`MaskedSelfAttention` with ``tokens_only``."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__(dim, heads, batch_first=True)

    def forward(self, x: Tensor, **absent: object) -> Tensor:  # type: ignore[override]
        if any(v not in (None, False) for v in absent.values()):  # timm passes attn_mask=None
            raise ConvertError(f"a converted attention takes no {', '.join(absent)}")
        return super().forward(x, x, x, need_weights=False)[0]


@register
class AttentionAdapter(LayerAdapter):
    source = (nn.MultiheadAttention,)
    exports = (MaskedAttention,)
    role = "attention"
    tokens = True

    def check(self, name: str, m: nn.Module) -> None:
        assert isinstance(m, nn.MultiheadAttention)
        if not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn:
            raise ConvertError(
                f"MultiheadAttention {name!r} has kdim/vdim, add_bias_kv or add_zero_attn; "
                "only plain self-attention (q, k, v of the embedding width) is supported"
            )

    def width(self, m: nn.Module, out_side: bool) -> int:
        assert isinstance(m, nn.MultiheadAttention)
        return m.embed_dim

    def convert(self, m: nn.Module, place: Placement) -> nn.Module:
        assert isinstance(m, nn.MultiheadAttention)
        return MaskedSelfAttention(m, place).to(m.in_proj_weight.device)
