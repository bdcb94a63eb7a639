"""timm's ``VisionTransformer`` as an espn ViT supernet (timm itself is never imported here):
:func:`from_timm_vit` builds the equivalent :class:`espn.models.vit.ViT` and copies the
weights over, the patch bias folded into the position embeddings and the other linear biases
dropped (docs/transformers.md). Only the plain ViT recipe is supported; any other variant is
refused with one line naming the attribute."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from espn.errors import EspnError
from espn.models.vit import ViT
from espn.supernet.layers import MaskedLinear, TaskBias, TaskHead


class TimmConvertError(EspnError, ValueError):
    """A timm model the converter cannot express; the message says what."""


def is_timm_vit(model: nn.Module) -> bool:
    """Whether ``model`` is timm's ``VisionTransformer`` (checked by its class, not imported)."""
    cls = type(model)
    return cls.__name__ == "VisionTransformer" and cls.__module__.startswith("timm.")


def _refuse(what: str) -> TimmConvertError:
    return TimmConvertError(
        f"timm VisionTransformer with {what} is not supported; espn converts the plain ViT "
        "(class token, pre-norm LayerNorm blocks, GELU MLP, no layer scale or q/k norm)"
    )


def _check(model: Any, example_input: Tensor) -> None:
    """Refuse anything :func:`from_timm_vit` does not reproduce."""
    if getattr(model, "global_pool", None) != "token" or not model.has_class_token:
        raise _refuse(f"global_pool={getattr(model, 'global_pool', None)!r} (needs 'token')")
    if getattr(model, "num_reg_tokens", 0) or getattr(model, "no_embed_class", False):
        raise _refuse("register tokens or no_embed_class")
    for attr in ("norm_pre", "fc_norm", "patch_drop"):
        if not isinstance(getattr(model, attr, nn.Identity()), nn.Identity):
            raise _refuse(f"{attr}={type(getattr(model, attr)).__name__}")
    if not isinstance(model.patch_embed.norm, nn.Identity):
        raise _refuse("a norm in its patch embedding")
    for i, block in enumerate(model.blocks):
        attn, mlp = block.attn, block.mlp
        for path in ("ls1", "ls2", "attn.q_norm", "attn.k_norm", "attn.norm", "mlp.norm"):
            owner, _, attr = path.rpartition(".")
            part = getattr(getattr(block, owner) if owner else block, attr, nn.Identity())
            if not isinstance(part, nn.Identity):
                raise _refuse(f"blocks.{i}.{path}={type(part).__name__}")
        if getattr(attn, "gate", None) is not None:
            raise _refuse(f"an attention gate in blocks.{i}")
        if not hasattr(attn, "qkv") or not hasattr(mlp, "fc1"):
            raise _refuse(f"a {type(attn).__name__}/{type(mlp).__name__} block (blocks.{i})")
        if not isinstance(mlp.act, nn.GELU) or mlp.act.approximate != "none":
            raise _refuse(f"activation {mlp.act} in blocks.{i}")
        for norm in (block.norm1, block.norm2):
            if not isinstance(norm, nn.LayerNorm) or norm.eps != 1e-6:
                raise _refuse(f"norm {norm} in blocks.{i} (needs nn.LayerNorm, eps 1e-6)")
    size = tuple(model.patch_embed.img_size)
    if tuple(example_input.shape[2:]) != size:
        raise TimmConvertError(
            f"the example input is {tuple(example_input.shape[2:])} pixels but the timm model "
            f"was built for img_size={size}"
        )


@torch.no_grad()
def from_timm_vit(
    timm_model: nn.Module, example_input: Tensor, multi_head: bool, task_affine: bool
) -> ViT:
    """An espn :class:`ViT` computing what the timm ``model`` computes, minus dropped biases
    (see the module docstring)."""
    model: Any = timm_model  # timm's attributes, untyped here
    _check(model, example_input)
    proj = model.patch_embed.proj
    patch = int(proj.kernel_size[0])
    blocks = list(model.blocks)
    dim = int(model.embed_dim)
    heads = int(blocks[0].attn.num_heads)
    hidden = int(blocks[0].mlp.fc1.out_features)
    head = model.head
    if not isinstance(head, nn.Linear):
        raise _refuse("no linear head (num_classes=0)")
    vit = ViT(
        tuple(example_input.shape[1:]),
        head.out_features,
        multi_head,
        dim=dim,
        depth=len(blocks),
        heads=heads,
        mlp_ratio=hidden / dim,
        patch=patch,
        task_affine=task_affine,
    ).to(proj.weight.device)
    vit.patch_embed.weight.copy_(proj.weight)
    vit.tokens.cls_token.copy_(model.cls_token)
    vit.tokens.pos_embed.copy_(model.pos_embed)
    if proj.bias is not None:
        vit.tokens.pos_embed[:, 1:] += proj.bias
    mine: Any
    for mine, theirs in zip(vit.blocks, blocks, strict=True):
        q, k, v = theirs.attn.qkv.weight.chunk(3)
        mine.attn.q.weight.copy_(q)
        mine.attn.k.weight.copy_(k)
        mine.attn.v.weight.copy_(v)
        mine.attn.proj.weight.copy_(theirs.attn.proj.weight)
        mine.fc1.weight.copy_(theirs.mlp.fc1.weight)
        mine.fc2.weight.copy_(theirs.mlp.fc2.weight)
        for a, b in ((mine.norm1, theirs.norm1), (mine.norm2, theirs.norm2)):
            a.weight.copy_(b.weight)
            a.bias.copy_(b.bias)
    vit.norm.weight.copy_(model.norm.weight)
    vit.norm.bias.copy_(model.norm.bias)
    for part in vit.head.modules():
        if isinstance(part, TaskHead | MaskedLinear):
            part.weight.copy_(head.weight)
        if isinstance(part, TaskHead | TaskBias):
            part.bias.copy_(head.bias)
    return vit
