"""The fast path (``espn.supernet.fast``) trains what the reference step trains."""

from __future__ import annotations

import pytest
import torch

from espn.methods.base import METHODS, MethodConfig
from espn.supernet import Supernet, fast
from espn.training.engine import Engine
from espn.training.optim import LeanRMSprop, OptimConfig, build_optimizer
from helpers.deploy import make_model, tiny_sequence

OPTIMIZERS = [
    OptimConfig("sgd", lr=0.05, momentum=0.9, weight_decay=1e-3),
    OptimConfig("adam", lr=1e-2),
    OptimConfig("rmsprop", lr=1e-3, momentum=0.5),
]


def two_tasks(kind: str, method: str, optim: OptimConfig) -> Supernet:
    """Two tiny tasks learned by ``method`` through the masked supernet (no slim copy)."""
    seq = tiny_sequence(2)
    torch.manual_seed(0)
    sn = Supernet(make_model(kind), seq.tasks[0].train.x[:2])
    strategy = METHODS.get(method)(MethodConfig(gamma=0.5, alpha=0.3, epochs=(1, 1, 1)))
    engine = Engine(sn, strategy, optim, 16, seed=0, slim_training=False)
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
    return sn


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().view(torch.int32)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same tensor, bit for bit where floating-point."""
    return torch.equal(bits(a), bits(b)) if a.is_floating_point() else torch.equal(a, b)


@pytest.mark.parametrize("optim", OPTIMIZERS, ids=lambda o: o.optimizer)
@pytest.mark.parametrize(("kind", "method"), [("fc", "espn"), ("conv", "packnet")])
def test_the_fast_path_trains_the_reference_bits(
    monkeypatch: pytest.MonkeyPatch, kind: str, method: str, optim: OptimConfig
) -> None:
    """Same batches, fast path on and off: the same masks, and bit for bit the same weights in
    every task's mask and every other parameter and buffer (gates, norms, heads). Outside the
    mask the fast path may have zeroed free weights no task reads (``zero_pruned``); the
    reference keeps them."""
    products = []
    real = fast._TrainedWeight.apply
    monkeypatch.setattr(fast._TrainedWeight, "apply", lambda *a: products.append(1) or real(*a))
    with fast.enabled(False):
        reference = two_tasks(kind, method, optim)
    assert not products  # the reference step: weight * mask, differentiated by autograd
    fast_net = two_tasks(kind, method, optim)
    assert products
    shared = {f"model.{name}.weight" for name in fast_net.layers}
    theirs = reference.state_dict()
    assert len(fast_net.masks) == len(reference.masks) == 2
    for mine, other in zip(fast_net.masks, reference.masks, strict=True):
        for ours, ref in (
            (mine.state, other.state),
            (mine.own, other.own),
            (mine.units, other.units),
        ):
            assert ours.keys() == ref.keys()
            assert all(same(ours[k], ref[k]) for k in ours)
    for name, value in fast_net.state_dict().items():
        if isinstance(value, torch.Tensor) and name not in shared:
            assert same(value, theirs[name]), name
    for name, layer in fast_net.layers.items():
        other = reference.layers[name]
        assert torch.equal(layer.weight_mask, other.weight_mask), name
        used = layer.frozen | layer.weight_mask.bool()
        assert bool(layer.frozen.any()), name  # task 0's weights, kept through task 1
        assert torch.equal(bits(layer.weight[used]), bits(other.weight[used])), name
        # outside every mask: the reference's free weights, or zeros the fast path wrote
        moved = ~used & (bits(layer.weight) != bits(other.weight))
        assert not bool(layer.weight[moved].any()), name
    with fast.enabled(False):
        rmsprop = build_optimizer(OptimConfig("rmsprop"), [torch.zeros(2, requires_grad=True)])
    assert type(rmsprop) is torch.optim.RMSprop and not isinstance(rmsprop, LeanRMSprop)
