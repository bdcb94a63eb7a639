"""The analytic FLOP count against torch's FlopCounterMode on a physically slim network."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from espn.models.fc import fc1024
from espn.models.registry import ModelSpec
from espn.pruning import flop_aware_lambdas, select_units
from espn.supernet import Supernet


def make_fc1024() -> Supernet:
    torch.manual_seed(0)
    spec = ModelSpec((1, 28, 28), 10, False, task_affine=True)  # gates with scale and shift
    return Supernet(fc1024(spec), torch.zeros(2, 1, 28, 28))


def measured_flops(model: nn.Module, x: torch.Tensor) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        model(x)
    return counter.get_total_flops()


def slim_by_hand(sn: Supernet) -> nn.Sequential:
    """Independent slim copy: keep alive rows/columns, fold each gate into its layer."""
    fc1, gate1 = sn.model.features[0], sn.model.features[1]
    fc2, gate2 = sn.model.features[3], sn.model.features[4]
    head, head_bias = sn.model.head[0], sn.model.head[1]
    a1, a2 = gate1.unit_mask.bool(), gate2.unit_mask.bool()
    w1 = fc1.masked_weight()[a1] * gate1.weight[a1, None]
    w2 = fc2.masked_weight()[a2][:, a1] * gate2.weight[a2, None]
    w3 = head.masked_weight()[:, a2]
    layers = [nn.Linear(w1.shape[1], w1.shape[0]), nn.Linear(w2.shape[1], w2.shape[0])]
    layers.append(nn.Linear(w3.shape[1], w3.shape[0]))
    with torch.no_grad():
        for layer, w, b in zip(
            layers, (w1, w2, w3), (gate1.bias[a1], gate2.bias[a2], head_bias.bias), strict=True
        ):
            layer.weight.copy_(w)
            layer.bias.copy_(b)
    return nn.Sequential(nn.Flatten(), layers[0], nn.ReLU(), layers[1], nn.ReLU(), layers[2])


def test_dense_flops_of_fc1024():
    sn = make_fc1024()
    assert sn.dense_flops == 2 * (784 * 1024 + 1024 * 1024 + 1024 * 10)
    assert measured_flops(slim_by_hand(sn), torch.zeros(1, 1, 28, 28)) == sn.dense_flops


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_masked_count_equals_flop_counter_on_slim_model(seed):
    sn = make_fc1024()
    gen = torch.Generator().manual_seed(seed)
    keep = torch.rand(2, generator=gen) * 0.9 + 0.05
    units = {
        g: torch.rand(1024, generator=gen) < float(k) for g, k in zip(sn.groups, keep, strict=True)
    }
    with torch.no_grad():
        for mods in sn.groups.values():
            for m in mods:
                m.weight.uniform_(0.5, 1.5, generator=gen)
                m.bias.uniform_(-0.1, 0.1, generator=gen)
    sn.set_unit_masks(units)
    sn.eval()
    slim = slim_by_hand(sn)
    x = torch.randn(4, 1, 28, 28, generator=gen)
    assert measured_flops(slim, x[:1]) == sn.flops()
    torch.testing.assert_close(slim(x), sn.forward_working(x), rtol=1e-5, atol=1e-5)


def test_pruned_unit_outputs_exact_zero():
    sn = make_fc1024()
    alive = torch.ones(1024, dtype=torch.bool)
    alive[::3] = False
    sn.set_unit_masks({"hidden1": alive, "hidden2": torch.ones(1024, dtype=torch.bool)})
    gate = sn.model.features[1]
    assert torch.all(gate.weight[~alive] == 0) and torch.all(gate.bias[~alive] == 0)
    hidden = sn.model.features[:2](torch.randn(8, 784))
    assert torch.all(hidden[:, ~alive] == 0)


@pytest.mark.parametrize("gamma", [0.05, 0.2, 0.5, 0.9])
def test_select_units_meets_flops_target(gamma):
    sn = make_fc1024()
    gen = torch.Generator().manual_seed(5)
    saliency = {g: torch.rand(n, generator=gen) for g, n in sn.group_sizes.items()}
    target = gamma * sn.dense_flops
    units = select_units(saliency, sn.unit_masks(), sn.flops, target)
    assert sn.flops(units) <= target
    assert all(int(a.sum()) >= 1 for a in units.values())
    # one global threshold: every dropped unit is less salient than every kept one
    # (except the most salient unit of each group, which is always kept)
    protected = {g: saliency[g].argmax() for g in units}
    dropped = torch.cat([saliency[g][~units[g]] for g in units])
    kept = []
    for g in units:
        k = units[g].clone()
        k[protected[g]] = False
        kept.append(saliency[g][k])
    assert dropped.max() < torch.cat(kept).min()
    # and it is the tightest: bringing back the best dropped unit overshoots the target
    best = max(units, key=lambda g: saliency[g][~units[g]].max() if (~units[g]).any() else -1)
    back = {g: a.clone() for g, a in units.items()}
    idx = torch.where(~back[best])[0][saliency[best][~back[best]].argmax()]
    back[best][idx] = True
    assert sn.flops(back) > target


def test_flop_aware_lambdas_on_fc1024_units():
    sn = make_fc1024()
    alive = torch.zeros(1024, dtype=torch.bool)
    alive[:100] = True
    sn.set_unit_masks({"hidden1": alive, "hidden2": torch.ones(1024, dtype=torch.bool)})
    # the paper's load: the cost of computing the unit (784 inputs; 100 alive inputs)
    assert sn.unit_flops() == {"hidden1": 2.0 * 784, "hidden2": 2.0 * 100}
    loads = sn.unit_flops("total")
    # one hidden1 neuron: 784 inputs in, 1024 hidden2 neurons out; hidden2: 100 in, 10 out
    assert loads == {"hidden1": 2.0 * (784 + 1024), "hidden2": 2.0 * (100 + 10)}
    lambdas = flop_aware_lambdas(loads)
    total = (2.0 * 1808) ** 0.5 + (2.0 * 110) ** 0.5
    assert lambdas["hidden1"] == pytest.approx((2.0 * 1808) ** 0.5 / total)
    assert lambdas["hidden2"] == pytest.approx((2.0 * 110) ** 0.5 / total)
