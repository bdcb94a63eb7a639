"""Converting transformer models (docs/transformers.md): ``nn.TransformerEncoderLayer`` /
``nn.TransformerEncoder`` replaced by traceable twins, linear layers on token tensors found,
and a residual stream that does not start at a layer refused (:func:`check_stream_sources`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from espn.errors import EspnError


class TokenConvertError(EspnError, ValueError):
    """A transformer model the converter cannot express; the message says what."""


class EncoderLayer(nn.Module):
    """``nn.TransformerEncoderLayer``'s computation (post- or pre-norm, no masks) with its
    submodules, in a forward that ``torch.fx`` can trace."""

    def __init__(self, layer: nn.TransformerEncoderLayer) -> None:
        super().__init__()
        self.self_attn = layer.self_attn
        self.linear1, self.dropout, self.linear2 = layer.linear1, layer.dropout, layer.linear2
        self.norm1, self.norm2 = layer.norm1, layer.norm2
        self.dropout1, self.dropout2 = layer.dropout1, layer.dropout2
        self.norm_first = layer.norm_first
        self.activation: Callable[[Tensor], Tensor] = layer.activation

    def _sa_block(self, x: Tensor) -> Tensor:
        return self.dropout1(self.self_attn(x, x, x, need_weights=False)[0])

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(
        self,
        src: Tensor,
        src_mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        if src_mask is not None or src_key_padding_mask is not None or is_causal:
            raise TokenConvertError("a converted nn.TransformerEncoderLayer supports no mask")
        if self.norm_first:
            src = src + self._sa_block(self.norm1(src))
            return src + self._ff_block(self.norm2(src))
        src = self.norm1(src + self._sa_block(src))
        return self.norm2(src + self._ff_block(src))


class EncoderStack(nn.Module):
    """``nn.TransformerEncoder``: its layers in turn, then its optional norm (no masks)."""

    def __init__(self, encoder: nn.TransformerEncoder) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [
                EncoderLayer(m) if isinstance(m, nn.TransformerEncoderLayer) else m
                for m in encoder.layers
            ]
        )
        self.norm = encoder.norm

    def forward(
        self,
        src: Tensor,
        mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool | None = None,
    ) -> Tensor:
        if mask is not None or src_key_padding_mask is not None or is_causal:
            raise TokenConvertError("a converted nn.TransformerEncoder supports no mask")
        for layer in self.layers:
            src = layer(src)
        return src if self.norm is None else self.norm(src)


def replace_encoders(model: nn.Module) -> nn.Module:
    """``model`` with every ``nn.TransformerEncoder(Layer)`` replaced by its traceable twin
    (same submodules, same names), in place; returns ``model``."""
    if isinstance(model, nn.TransformerEncoder):
        return EncoderStack(model)
    if isinstance(model, nn.TransformerEncoderLayer):
        return EncoderLayer(model)
    for name, child in list(model.named_children()):
        setattr(model, name, replace_encoders(child))
    return model


def token_outputs(model: nn.Module, example_input: Tensor, names: list[str]) -> set[str]:
    """The modules of ``names`` whose output has more than two dimensions on ``example_input``
    (features on the last dimension of a token tensor)."""
    found: set[str] = set()
    hooks = []
    for name in names:

        def hook(mod: nn.Module, inp: object, out: Tensor, name: str = name) -> None:
            if isinstance(out, Tensor) and out.dim() > 2:
                found.add(name)

        hooks.append(model.get_submodule(name).register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(example_input)
    finally:
        for h in hooks:
            h.remove()
    return found


@torch.no_grad()
def check_stream_sources(
    model: nn.Module,
    example_input: Tensor,
    group: str,
    writers: list[str],
    readers: list[str],
    params: list[nn.Parameter] | None = None,
) -> None:
    """Refuse a unit group whose features reach its readers from anything but its writers.

    With the outputs of every writer of ``group`` (its producing layers, attention modules
    and norms) and its per-task ``params`` (a class token, position embeddings) set to zero,
    every reader must see only zeros on a random input of the example's shape; otherwise the
    model input or another bare parameter feeds the group, and its pruned features could not
    be zero.
    """
    saved = [p.detach().clone() for p in params or []]
    for p in params or []:
        p.zero_()
    if example_input.is_floating_point():
        gen = torch.Generator().manual_seed(0)
        noise = torch.randn(example_input.shape, generator=gen, dtype=example_input.dtype)
        example_input = noise.to(example_input.device)
    leaked: list[str] = []
    hooks = []

    def zero(mod: nn.Module, inp: object, out: object) -> object:
        if isinstance(out, tuple):
            return (torch.zeros_like(out[0]), *out[1:])
        return torch.zeros_like(out) if isinstance(out, Tensor) else out

    for name in writers:
        hooks.append(model.get_submodule(name).register_forward_hook(zero))
    for name in readers:

        def check(mod: nn.Module, inp: tuple[object, ...], name: str = name) -> None:
            x = inp[0] if inp else None
            if isinstance(x, Tensor) and bool(x.ne(0).any()):
                leaked.append(name)

        hooks.append(model.get_submodule(name).register_forward_pre_hook(check))
    try:
        model(example_input)
    finally:
        for h in hooks:
            h.remove()
        for p, value in zip(params or [], saved, strict=True):
            p.copy_(value)
    if leaked:
        raise TokenConvertError(
            f"the features {leaked[0]!r} reads (unit group {group!r}) come partly from the "
            "model input or a bare parameter, not only from layers, so they cannot be pruned "
            "exactly; start the residual stream with a layer (an input nn.Linear or a patch "
            "nn.Conv2d)"
        )
