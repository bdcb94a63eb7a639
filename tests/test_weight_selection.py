"""A prune event's weight selection and mask writes: exactly the weights the rule names, counted
against an independent sort-based reference (ties included)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import espn
from espn.pruning.weights import _SAMPLE, largest_free, select_weights
from espn.supernet import Supernet


def reference(magnitude: torch.Tensor, free: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` largest free magnitudes, ties by position: a stable sort of the whole layer."""
    flat = torch.where(free, magnitude.double(), -1.0).flatten()
    order = torch.sort(flat, descending=True, stable=True).indices
    keep = torch.zeros(flat.numel(), dtype=torch.bool)
    keep[order[: min(n, int(free.sum()))]] = True
    return keep.view_as(free)


def weights(shape: tuple[int, ...], levels: int, seed: int) -> torch.Tensor:
    """Random weights; with ``levels``, integers in [-levels, levels] (many ties)."""
    g = torch.Generator().manual_seed(seed)
    if levels:
        return torch.randint(-levels, levels + 1, shape, generator=g).float()
    return torch.randn(shape, generator=g)


# (256, 200) has more free weights than four samples: the sampled bracket is used
@pytest.mark.parametrize("shape", [(7, 9), (40, 30), (256, 200), (16, 8, 3, 3)])
@pytest.mark.parametrize("levels", [0, 1, 6])
def test_the_n_largest_free_weights_exactly_ties_by_position(shape, levels) -> None:
    w = weights(shape, levels, seed=sum(shape) + levels)
    free = torch.rand(shape, generator=torch.Generator().manual_seed(1)) < 0.8
    available = int(free.sum())
    for n in (0, 1, 2, available // 3, available // 2, available - 1, available, available + 3):
        keep, threshold = largest_free(w.abs(), free, n)
        expected = reference(w.abs(), free, n)
        assert int(keep.sum()) == min(n, available)
        assert torch.equal(keep, expected), (shape, levels, n)
        assert not (keep & ~free).any()
        if min(n, available) == 0:
            assert threshold is None
        else:
            assert float(threshold) == float(w.abs()[expected].min())
        # not asked for, the threshold is left out only where every free weight is kept
        lean, unasked = largest_free(w.abs(), free, n, threshold=False)
        assert torch.equal(lean, keep)
        assert (unasked is None) == (n >= available or threshold is None)
        if unasked is not None:
            assert torch.equal(unasked, threshold)


def test_the_sampled_path_is_exact_on_a_large_layer() -> None:
    """A layer with far more free weights than the sample (all of one magnitude but a few:
    every bracket holds the threshold's ties) keeps exactly the reference's weights."""
    shape = (96, 4 * _SAMPLE // 96 + 7)
    w = torch.ones(shape)
    w.view(-1)[torch.randperm(w.numel(), generator=torch.Generator().manual_seed(0))[:50]] = 2.0
    free = torch.ones(shape, dtype=torch.bool)
    free[3] = False
    for n in (10, 50, 51, 1000, free.sum().item() - 5):
        keep, _ = largest_free(w, free, int(n))
        assert torch.equal(keep, reference(w, free, int(n)))
    w = weights(shape, 0, seed=3)
    for share in (0.01, 0.5, 0.97):
        n = int(share * int(free.sum()))
        keep, _ = largest_free(w.abs(), free, n)
        assert torch.equal(keep, reference(w.abs(), free, n))


def test_reuse_policies_keep_frozen_weights_by_the_rule() -> None:
    g = torch.Generator().manual_seed(4)
    w = weights((30, 20), 3, seed=5)
    candidates = torch.rand(30, 20, generator=g) < 0.9
    frozen = torch.rand(30, 20, generator=g) < 0.3
    n = 100
    new = reference(w.abs(), candidates & ~frozen, n)
    smallest_new = w.abs()[new].min()
    assert torch.equal(select_weights(w, candidates, frozen, n, "all"), new | (candidates & frozen))
    magnitude = select_weights(w, candidates, frozen, n, "magnitude")
    assert torch.equal(magnitude, new | (candidates & frozen & (w.abs() >= smallest_new)))
    # no new weight: every frozen candidate stays
    assert torch.equal(select_weights(w, candidates, frozen, 0, "magnitude"), candidates & frozen)
    with pytest.raises(ValueError, match="reuse policy 'some'"):
        select_weights(w, candidates, frozen, n, "some")


def test_a_nan_weight_ranks_first() -> None:
    w = weights((12, 10), 0, seed=6)
    w[2, 3] = float("nan")
    free = torch.ones(12, 10, dtype=torch.bool)
    keep = select_weights(w, free, ~free, 5, "all")
    assert keep[2, 3] and int(keep.sum()) == 5


def small_supernet() -> Supernet:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5), nn.ReLU(), nn.Linear(5, 3))
    return espn.wrap(model, torch.zeros(2, 6))


def test_weight_masks_are_restricted_to_alive_units_and_noted() -> None:
    """A boolean mask and the same mask as floats give one weight mask, zero on every weight
    of a dead unit; the notes say binary, and all ones only where it is."""
    results = []
    for as_float in (False, True):
        sn = small_supernet()
        sn.begin_task(3)
        assert all(layer.mask_is_ones() for layer in sn.layers.values())
        units = sn.unit_masks()
        first = next(iter(units))
        units[first][[1, 4]] = False
        sn.set_unit_masks(units)
        g = torch.Generator().manual_seed(7)
        masks = {n: torch.rand(m.weight.shape, generator=g) < 0.7 for n, m in sn.layers.items()}
        masks[list(masks)[-1]].fill_(True)
        sn.set_weight_masks({n: m.float() if as_float else m for n, m in masks.items()})
        for name, layer in sn.layers.items():
            expected = masks[name] & sn.structural_mask(name)
            assert torch.equal(layer.weight_mask, expected.float())
            assert layer.mask_is_binary()
            assert layer.mask_is_ones() == bool(expected.all())
        results.append({n: m.weight_mask.clone() for n, m in sn.layers.items()})
    first_layer, second_layer = list(results[0])[:2]
    assert not results[0][first_layer][[1, 4]].any()
    assert not results[0][second_layer][:, [1, 4]].any()
    assert all(torch.equal(results[0][n], results[1][n]) for n in results[0])


def test_a_fractional_mask_is_noted_neither_ones_nor_binary() -> None:
    sn = small_supernet()
    sn.begin_task(3)
    layer = next(iter(sn.layers.values()))
    layer.weight_mask.fill_(0.5)
    sn.note_masks()
    assert not layer.mask_is_ones() and not layer.mask_is_binary()
    with pytest.raises(KeyError, match="no masked layer"):
        sn.set_weight_masks({"nothing": torch.ones(1, dtype=torch.bool)})
