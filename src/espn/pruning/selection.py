"""Choosing which units (neurons/channels) a task keeps; weights: :mod:`espn.pruning.weights`."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def select_units(
    saliency: dict[str, Tensor],
    alive: dict[str, Tensor],
    flops_of: Callable[[dict[str, Tensor]], float],
    flops_target: float,
) -> dict[str, Tensor]:
    """Drop the least salient alive units, one global threshold over all groups, until
    ``flops_of(alive units) <= flops_target`` (``flops_of`` reads the alive vectors, so that a
    residual stream read as the union of its producers' groups is counted as it is).

    The most salient unit of every group is never dropped, so that no layer is cut off
    entirely; if the target cannot be met without that, those units alone remain.
    """
    groups = list(saliency)
    scores = []
    for g in groups:
        s = saliency[g].detach().float().to(alive[g].device, copy=True)
        s[~alive[g]] = -torch.inf
        keep = torch.topk(s, min(1, s.numel())).indices
        s[keep] = torch.inf
        scores.append(s)
    flat = torch.cat(scores)
    rank = torch.empty_like(flat, dtype=torch.long)
    rank[torch.argsort(flat, stable=True)] = torch.arange(flat.numel(), device=flat.device)
    ranks = dict(zip(groups, rank.split([s.numel() for s in scores]), strict=True))
    n_dead = int(torch.isneginf(flat).sum())
    n_removable = int(torch.isfinite(flat).sum())

    def alive_after(k: int) -> dict[str, Tensor]:
        return {g: ranks[g] >= k for g in groups}

    def flops_after(k: int) -> float:
        return flops_of(alive_after(k))

    lo, hi = n_dead, n_dead + n_removable
    if flops_after(lo) <= flops_target:
        return alive_after(lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if flops_after(mid) <= flops_target:
            hi = mid
        else:
            lo = mid
    return alive_after(hi)
