"""Supernet building blocks for transformers, features on the last dimension of token tensors
(docs/transformers.md): token gates, task LayerNorms, task tokens, attention with heads as units.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from espn.supernet.fast import is_on, memo
from espn.supernet.layers import (
    MaskedLinear,
    TaskSpecific,
    UnitGate,
    UnitModule,
    expand_units,
)


class TokenGate(UnitGate):
    """A :class:`UnitGate` scaling the last dimension; one unit spans ``unit_size`` features."""

    def feature_shape(self, x: Tensor) -> tuple[int, ...]:
        return (-1,)


def gated(layer: nn.Module, gate: nn.Module, x: Tensor) -> Tensor:
    """``gate(layer(x))``; on the fast path, in a training step of a masked linear layer and a
    token gate, one linear map whose weight rows the gate scales (its shift the bias), as the
    slim export folds it: a pass over the weights instead of several over every token. Not
    where anything could tell: traced, hooked, or a gate that is the identity."""
    if (
        is_on()
        and not is_fx_symbolic_tracing()
        and isinstance(layer, MaskedLinear)
        and isinstance(gate, TokenGate)
        and layer.training
        and torch.is_grad_enabled()
        and not hooked(layer)
        and not hooked(gate)
        and not gate.is_identity()
    ):
        return alive_linear(layer, x, gate=gate)
    return cast(Tensor, gate(layer(x)))


def alive_index(module: UnitModule) -> Tensor | None:
    """The indices of the features ``module`` keeps alive (a unit's ``unit_size`` features
    each; None: every feature is alive), read from its ``unit_mask`` once per change of it
    (a host read at a prune event or a task switch, never in a step)."""
    mask = module.unit_mask

    def index() -> Tensor | None:
        alive = expand_units(mask, module.unit_size).nonzero().flatten()
        return None if alive.numel() == mask.numel() * module.unit_size else alive

    return cast(Tensor | None, memo(module, "_alive", mask, index))


def alive_linear(
    layer: MaskedLinear,
    x: Tensor,
    inputs: Tensor | None = None,
    outputs: Tensor | None = None,
    gate: TokenGate | None = None,
) -> Tensor:
    """``layer``'s map from the input features ``inputs`` (``x`` holds just those; None: all)
    to the output features ``outputs`` (None: all), ``gate`` folded into its rows (see
    :func:`gated`): cut from the masked weight, so the gradient flows as in its forward."""
    weight = layer.masked_weight()
    if inputs is not None:
        weight = weight.index_select(1, inputs)
    if outputs is not None:
        weight = weight.index_select(0, outputs)
    if gate is None or gate.is_identity():
        return F.linear(x, weight)
    scale, shift = gate.feature_affine()
    if outputs is not None:
        scale = scale.index_select(0, outputs)
        shift = None if shift is None else shift.index_select(0, outputs)
    return F.linear(x, weight * scale.unsqueeze(1), shift)


def hooked(m: nn.Module) -> bool:
    """Whether a forward hook would see ``m``'s call (its own or a global one)."""
    return bool(
        m._forward_hooks
        or m._forward_pre_hooks
        or _global_forward_hooks
        or _global_forward_pre_hooks
    )


class TaskLayerNorm(nn.LayerNorm, UnitModule):
    """LayerNorm over the last dimension with per-task affine parameters (always affine) and
    statistics over the alive features of its group alone, as the slim model's ``nn.LayerNorm``
    computes them (docs/transformers.md); a pruned feature outputs exactly zero."""

    weight: nn.Parameter
    bias: nn.Parameter

    def __init__(self, n: int, group: str, eps: float = 1e-5, unit_size: int = 1) -> None:
        super().__init__(n, eps=eps)
        self._init_units(group, n, unit_size)
        self.affine = True

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            return self.masked_norm(x)
        alive = alive_index(self)
        if alive is None:
            return self.alive_norm(x, None)
        if alive.numel() == 0:
            return self.masked_norm(x)  # every feature pruned: zeros
        # the alive features gathered, normalised as the slim model's LayerNorm does, and put
        # back at their places among zeros (a pruned feature outputs exactly zero)
        out = self.alive_norm(_Features.apply(x, alive, None), alive)
        return cast(Tensor, _Features.apply(out, alive, x.shape[-1]))

    def alive_norm(self, x: Tensor, alive: Tensor | None) -> Tensor:
        """The normalisation of ``x``, the features ``alive`` alone (``alive`` as
        :meth:`alive_features` gives them; None: the whole width), at those features: what
        :meth:`forward` computes there from the whole width."""
        if alive is None:
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        weight, bias = self.weight.index_select(0, alive), self.bias.index_select(0, alive)
        return F.layer_norm(x, (alive.numel(),), weight, bias, self.eps)

    def masked_norm(self, x: Tensor) -> Tensor:
        """The same normalisation written with the unit mask as a tensor (no Python value
        read from it): what a compiled graph computes, which a prune event's in-place mask
        update must not force to recompile."""
        mask = expand_units(self.unit_mask, self.unit_size).to(x.dtype)
        count = mask.sum().clamp_min(1.0)
        mean = (x * mask).sum(-1, keepdim=True) / count
        centred = (x - mean) * mask
        var = (centred * centred).sum(-1, keepdim=True) / count
        return centred * torch.rsqrt(var + self.eps) * (self.weight * mask) + self.bias * mask


class _Features(torch.autograd.Function):
    """The features ``index`` of the last dimension of ``x`` (``width`` None), or ``x``'s
    features put at places ``index`` of a last dimension of ``width`` among zeros; the
    backward is the other. A gather and a scatter: half the time of ``index_select``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, index: Tensor, width: int | None) -> Tensor:
        ctx.save_for_backward(index)
        ctx.width = x.shape[-1]
        return _move_features(x, index, width)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, None, None]:
        (index,) = ctx.saved_tensors
        (grad,) = grads
        back = ctx.width if grad.shape[-1] == index.numel() else None
        return _move_features(grad, index, back), None, None


def _move_features(x: Tensor, index: Tensor, width: int | None) -> Tensor:
    rows = x.reshape(-1, x.shape[-1])
    where = index.expand(rows.shape[0], -1)
    if width is None:
        return torch.gather(rows, 1, where).view(*x.shape[:-1], index.numel())
    out = rows.new_zeros(rows.shape[0], width).scatter_(1, where, rows)
    return out.view(*x.shape[:-1], width)


class TaskTokens(TaskSpecific):
    """Prepends a class token and adds position embeddings, both owned by the active task (no
    task changes another's; no FLOPs). ``group``: the unit group of the ``dim`` features
    (the residual stream), whose pruned features the slim model drops from them."""

    def __init__(self, tokens: int, dim: int, group: str | None) -> None:
        super().__init__()
        self.group = group
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens + 1, dim))
        self.reset_task(0)

    def reset_task(self, n_classes: int) -> None:
        with torch.no_grad():
            nn.init.trunc_normal_(self.cls_token, std=0.02)
            nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        return torch.cat([cls, x], dim=1) + self.pos_embed

    def alive_forward(self, x: Tensor, alive: Tensor | None) -> Tensor:
        """:meth:`forward` on the features ``alive`` of the stream alone (None: all)."""
        if alive is None:
            return self.forward(x)
        cls = self.cls_token.index_select(-1, alive).expand(x.shape[0], -1, -1)
        return torch.cat([cls, x], dim=1) + self.pos_embed.index_select(-1, alive)


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

    def alive_forward(self, x: Tensor, alive: Tensor | None) -> Tensor:
        """:meth:`forward` on the features ``alive`` of its input stream alone (``x`` holds
        just those; None: all), giving those of its output, through the alive heads alone
        (a dead head adds exactly nothing to the whole-width forward)."""
        heads = alive_index(self.gate)
        q = alive_linear(self.q, x, alive, heads)
        k = alive_linear(self.k, x, alive, heads)
        v = alive_linear(self.v, x, alive, heads, self.gate)
        return alive_linear(self.proj, self.attend(q, k, v), heads, alive)
