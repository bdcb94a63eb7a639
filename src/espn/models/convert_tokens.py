"""Converting transformer models (docs/transformers.md): hand-written attention replaced
(:func:`replace_attention`), token linear layers found, bad stream sources refused."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from espn.errors import EspnError
from espn.layers.attention import SelfAttention
from espn.layers.base import call_hooked, module_outputs


class TokenConvertError(EspnError, ValueError):
    """A transformer model the converter cannot express; the message says what."""


@torch.no_grad()
def replace_attention(model: nn.Module, example_input: Tensor) -> None:
    """Put a :class:`SelfAttention` in place of every module of the user's own that computes
    multi-head self-attention with two linear layers of its own, ``qkv`` and ``proj``, found by
    running it; any other computation is refused in one line (docs/architectures.md, "Layers")."""
    linears = {n: m for n, m in model.named_modules() if type(m) is nn.Linear}
    pairs = _qkv_pairs(model, linears)
    if not pairs:
        return
    shapes: dict[str, torch.Size] = {}

    def record(name: str) -> Callable[..., None]:
        def hook(m: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
            x = args[0] if len(args) == 1 else None
            masks = any(v not in (None, False) for v in kwargs.values())  # timm's attn_mask=None
            if isinstance(x, Tensor) and x.dim() == 3 and not masks:
                shapes[name] = x.shape

        return hook

    hooks = [
        model.get_submodule(n).register_forward_pre_hook(record(n), with_kwargs=True) for n in pairs
    ]
    call_hooked(model, hooks, example_input)
    for name, shape in shapes.items():
        a, b = pairs[name]
        attention = _attention_of(model.get_submodule(name), linears[a], linears[b], shape)
        if attention is None:
            raise TokenConvertError(
                f"module {name!r} cuts the output of {a!r} into parts read by {b!r} but does not "
                "compute multi-head self-attention with them (softmax(q k^T / sqrt(head "
                "width)) v per head, then the output projection: q or k normalised, another "
                "scale or a mask is not supported)"
            )
        model.set_submodule(name, attention)


def _qkv_pairs(model: nn.Module, linears: dict[str, nn.Linear]) -> dict[str, tuple[str, str]]:
    """The user's own modules holding only a ``qkv`` and a ``proj`` linear layer of matching
    widths (see :func:`replace_attention`), by name: their two layers' names."""
    pairs: dict[str, tuple[str, str]] = {}
    for a, qkv in linears.items():
        for b, proj in linears.items():
            owner = a.rpartition(".")[0]
            if (
                qkv.out_features == 3 * proj.in_features
                and proj.out_features == qkv.in_features
                and b.rpartition(".")[0] == owner
            ):
                module = model.get_submodule(owner)
                if not owner or type(module).__module__.startswith("torch."):
                    continue
                held = {id(p) for n in (a, b) for p in linears[n].parameters()}
                if {id(p) for p in module.parameters()} == held:
                    pairs[owner] = (a, b)
    return pairs


def _attention_of(
    module: nn.Module, qkv: nn.Linear, proj: nn.Linear, shape: torch.Size
) -> SelfAttention | None:
    """The :class:`SelfAttention` computing what ``module`` computes (see
    :func:`replace_attention`), its weights and biases copied, or None."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(qkv.weight.device)
    want = module(x)
    if not isinstance(want, Tensor) or want.shape != x.shape:
        return None
    width = proj.in_features
    for heads in (h for h in range(1, width + 1) if width % h == 0):
        rows = torch.arange(3 * width, device=x.device)
        # q, k and v each cut into heads (3, H, d), or each head's q, k and v together (H, 3, d)
        for order in (rows, rows.view(heads, 3, -1).transpose(0, 1).flatten()):
            attn = SelfAttention(qkv.in_features, heads).to(x.device).eval()  # zero biases
            attn.in_proj_weight.copy_(qkv.weight.index_select(0, order))
            attn.out_proj.weight.copy_(proj.weight)
            if qkv.bias is not None:
                attn.in_proj_bias.copy_(qkv.bias.index_select(0, order))
            if proj.bias is not None:
                attn.out_proj.bias.copy_(proj.bias)
            got = attn(x)
            if torch.allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, float(want.abs().max()))):
                return attn
    return None


def token_outputs(model: nn.Module, example_input: Tensor, names: list[str]) -> set[str]:
    """The modules of ``names`` whose output has more than two dimensions on ``example_input``
    (features on the last dimension of a token tensor)."""
    with torch.no_grad():
        _, outputs = module_outputs(model, names, example_input)
    return {name for name, out in outputs.items() if out.dim() > 2}


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

    def zero(mod: nn.Module, inp: object, out: object) -> object:
        if isinstance(out, tuple):
            return (torch.zeros_like(out[0]), *out[1:])
        return torch.zeros_like(out) if isinstance(out, Tensor) else out

    hooks = [model.get_submodule(name).register_forward_hook(zero) for name in writers]
    for name in readers:

        def check(mod: nn.Module, inp: tuple[object, ...], name: str = name) -> None:
            x = inp[0] if inp else None
            if isinstance(x, Tensor) and bool(x.ne(0).any()):
                leaked.append(name)

        hooks.append(model.get_submodule(name).register_forward_pre_hook(check))
    try:
        call_hooked(model, hooks, example_input)
    finally:
        for p, value in zip(params or [], saved, strict=True):
            p.copy_(value)
    if leaked:
        raise TokenConvertError(
            f"the features {leaked[0]!r} reads (unit group {group!r}) come partly from the "
            "model input or a bare parameter, not only from layers, so they cannot be pruned "
            "exactly; start the residual stream with a layer (an input nn.Linear or a patch "
            "nn.Conv2d)"
        )
