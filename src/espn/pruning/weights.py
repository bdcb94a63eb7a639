"""Weight pruning: the gradual new-weight schedule and magnitude selection of a task's weights.

Unit (neuron/channel) pruning is :class:`espn.pruning.pruner.Pruner`; a task's weight budget
per layer is set by :meth:`espn.methods.base.Strategy.begin_task`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from espn.settings.methods import REUSE_POLICIES
from espn.supernet.supernet import Supernet


def new_weight_target(progress: float, start: int, budget: int) -> int:
    """New weights allowed at pruning ``progress`` in [0, 1]: from ``start`` (the new weights
    available when pruning starts) down to the task's ``budget``, linearly."""
    if start <= budget:
        return start
    return budget + math.floor((1.0 - progress) * (start - budget))


#: magnitudes sampled to bracket the selection threshold (see :func:`largest_free`); layers
#: with fewer than four times as many free weights are searched whole
_SAMPLE = 1 << 13


def largest_free(
    magnitude: Tensor, free: Tensor, n: int, threshold: bool = True
) -> tuple[Tensor, Tensor | None]:
    """The ``n`` largest entries of ``magnitude`` (non-negative, no NaN) where ``free``: a
    boolean mask of exactly ``min(n, free entries)`` entries, and the smallest kept
    magnitude (None when none is kept, or where ``threshold`` is False and finding it would
    take a pass over the layer of its own: every free entry is kept).

    The kept entries are every free entry above the threshold, the ``n``-th largest free
    magnitude, and of those equal to it the first in row-major (flattened) order, as many as
    the count allows; the threshold is bracketed by a fixed-seed sample, which sets only the
    time it takes (docs/changelog.md, "Prune events").
    """
    magnitude, free = magnitude.contiguous(), free.contiguous()
    available = int(free.count_nonzero())
    n = min(n, available)
    if n <= 0:
        return torch.zeros_like(free), None
    if n == available:
        return free.clone(), magnitude.masked_select(free).min() if threshold else None
    flat, free_flat = magnitude.view(-1), free.view(-1)
    if available >= 4 * _SAMPLE:
        found = _sampled_nth_largest(flat, free_flat, n, available)
        if found is not None:
            return found[0].view_as(free), found[1]
    kept, value = _largest_at(flat, free_flat.nonzero().view(-1), n)
    keep = torch.zeros_like(free_flat)
    keep[kept] = True
    return keep.view_as(free), value


def _largest_at(magnitude: Tensor, inside: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The flat positions of the ``n`` largest entries of flat ``magnitude`` among the
    positions ``inside`` (ascending, ``0 < n <= len(inside)``), and the smallest kept value:
    every entry above it, and of those equal to it the first by position, as many as the
    count allows."""
    band = magnitude[inside]
    value = band.kthvalue(band.numel() - n + 1).values
    at_least = band >= value
    kept = inside[at_least]
    surplus = kept.numel() - n
    if surplus > 0:
        # ties at the threshold beyond the count: the last of them by position are dropped
        tied = (band[at_least] == value).nonzero().view(-1)
        stays = torch.ones_like(kept, dtype=torch.bool)
        stays[tied[tied.numel() - surplus :]] = False
        kept = kept[stays]
    return kept, value


def _sampled_nth_largest(
    magnitude: Tensor, free: Tensor, n: int, available: int
) -> tuple[Tensor, Tensor] | None:
    """:func:`largest_free` of flat ``magnitude`` and ``free`` (``0 < n < available``) through
    a bracket of the threshold from a fixed-seed sample: the kept mask and the threshold, or
    None where the bracket misses it. The entries inside the bracket (a few per cent of the
    layer) are found by position, so that the threshold, the kept entries among them and
    their ties are settled on them alone."""
    device = magnitude.device
    generator = torch.Generator(device=device).manual_seed(0)
    picks = torch.randint(magnitude.numel(), (_SAMPLE,), generator=generator, device=device)
    sample = magnitude[picks].masked_select(free[picks]).sort().values
    size = sample.numel()
    # the threshold's place in the sorted sample, give or take four standard deviations
    share = (available - n) / available  # its rank from the smallest, from 0, as a share
    margin = 4.0 * math.sqrt(size * share * (1.0 - share)) + 2.0
    low, high = math.floor(share * size - margin), math.ceil(share * size + margin)
    lo = sample[low] if 0 <= low < size else magnitude.new_tensor(0.0)
    hi = sample[high] if 0 <= high < size else magnitude.new_tensor(torch.inf)
    above, from_lo = (magnitude > hi) & free, (magnitude >= lo) & free
    n_above, n_from_lo = torch.stack([above.count_nonzero(), from_lo.count_nonzero()]).tolist()
    if not n_above < n <= n_from_lo:
        return None
    inside = from_lo.logical_xor_(above).nonzero().view(-1)  # row-major order
    kept, value = _largest_at(magnitude, inside, n - n_above)
    above[kept] = True
    return above, value


def select_weights(
    weight: Tensor,
    candidates: Tensor,
    frozen: Tensor,
    n_new: int,
    reuse: str,
) -> Tensor:
    """Magnitude-based weight mask of one layer.

    Keeps the ``n_new`` largest free weights among ``candidates`` (see :func:`largest_free`:
    exactly that many, ties at the threshold broken by position; a NaN weight ranks above
    every number, as in ``torch.sort``). Frozen candidates are all
    kept with ``reuse="all"`` (PackNet); with ``reuse="magnitude"`` the frozen and free weights
    compete on one magnitude threshold, the smallest magnitude among the kept free weights,
    so that a task keeps only the frozen weights at least as large as its own new ones.
    """
    if reuse not in REUSE_POLICIES:
        raise ValueError(f"unknown reuse policy {reuse!r}; choose 'all' or 'magnitude'")
    magnitude = weight.detach().abs().nan_to_num_(nan=torch.inf, posinf=torch.inf)
    keep, threshold = largest_free(magnitude, candidates & ~frozen, n_new, reuse == "magnitude")
    reused = candidates & frozen
    if reuse == "magnitude" and threshold is not None:
        reused &= magnitude >= threshold
    return keep | reused


def prune_weights(supernet: Supernet, n_new: Mapping[str, int], reuse: str) -> None:
    """Magnitude-prune every masked layer of the working sub-network to ``n_new[layer]`` new
    weights among those it still keeps (see :func:`select_weights` for ``reuse``)."""
    masks = {}
    for name, layer in supernet.layers.items():
        candidates = layer.weight_mask.bool()
        masks[name] = select_weights(layer.weight, candidates, layer.frozen, n_new[name], reuse)
    supernet.set_weight_masks(masks)
