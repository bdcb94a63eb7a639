"""Zero forgetting, exactly: frozen weights and earlier tasks' logits are bit-identical."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import espn
from espn.api.experiment import build_benchmark, build_supernet
from espn.evaluation import task_logits
from espn.methods import METHODS
from espn.runs.config import make_config
from espn.training import Engine, OptimConfig
from espn.training.optim import FrozenGuard

OPTIMIZERS = [
    OptimConfig("sgd", lr=0.05, momentum=0.9, weight_decay=1e-2),
    OptimConfig("adam", lr=1e-3, weight_decay=1e-2, betas=(0.0, 0.999)),
    OptimConfig("rmsprop", lr=1e-3, momentum=0.5, weight_decay=1e-2),
]


def train_and_check(args: dict, optim: OptimConfig) -> None:
    cfg = make_config(**args)
    seq = build_benchmark(cfg)
    sn = build_supernet(cfg, seq)
    strategy = METHODS.get(cfg.method)(cfg.method_config())
    engine = Engine(sn, strategy, optim, batch_size=128, seed=0)
    snapshots: list[dict[str, torch.Tensor]] = []
    logits: list[torch.Tensor] = []
    for t, task in enumerate(seq.tasks):
        before = {n: layer.weight.detach().clone() for n, layer in sn.layers.items()}
        engine.train_task(task, t)
        # something did change: the new task trained its free weights
        assert any(not torch.equal(before[n], m.weight) for n, m in sn.layers.items())
        for n, layer in sn.layers.items():  # a committed task's weights are frozen
            assert not (sn.masks[t].weight_mask(n) & ~layer.frozen).any()
        for j in range(t):
            assert torch.equal(task_logits(sn, seq.tasks[j], j), logits[j]), f"task {j} changed"
            for n, layer in sn.layers.items():
                mask = sn.masks[j].weight_mask(n)
                assert torch.equal(layer.weight[mask], snapshots[j][n][mask])
        snapshots.append({n: layer.weight.detach().clone() for n, layer in sn.layers.items()})
        logits.append(task_logits(sn, task, t))


@pytest.mark.parametrize("optim", OPTIMIZERS, ids=lambda o: o.optimizer)
@pytest.mark.parametrize("method", ["espn", "packnet", "cpg", "rmn", "rmn-budget"])
def test_frozen_weights_and_logits_bit_identical(
    fake_mnist, tiny_run_args, fc_test_model, method, optim
):
    """On FC1024's shape at test size (``fc-test``), every method under every optimizer."""
    budget = {  # CPG's compacting sets its own size (here every round runs and is kept, so
        # later tasks get weights); RMN's relevance threshold (the paper) at 1 keeps the
        # weights whose relevance training raised, so every task gets some
        "cpg": {"cpg_train_acc": 0.0, "cpg_acc_loss": 100.0},
        "rmn": {"rmn_threshold": 1.0, "rmn_l1": 1e-4},
        "rmn-budget": {"method": "rmn", "rmn_budget": 0.2},
    }.get(method, {"alpha": 0.2})
    train_and_check({**tiny_run_args, "model": fc_test_model, "method": method, **budget}, optim)


def test_every_frozen_entry_survives_weight_decay(fake_mnist, tiny_run_args):
    """All frozen weights (not only masked ones) keep their bits after a heavy-decay task."""
    cfg = make_config(**tiny_run_args, method="espn", gamma=0.5, alpha=0.3)
    seq = build_benchmark(cfg)
    sn = build_supernet(cfg, seq)
    engine = Engine(
        sn,
        METHODS.get("espn")(cfg.method_config()),
        OptimConfig("sgd", lr=0.1, momentum=0.9, weight_decay=0.5),
        batch_size=64,
    )
    engine.train_task(seq.tasks[0], 0)
    frozen = {
        n: (layer.frozen.clone(), layer.weight.detach().clone()) for n, layer in sn.layers.items()
    }
    engine.train_task(seq.tasks[1], 1)
    for n, (mask, values) in frozen.items():
        assert mask.any()
        assert torch.equal(sn.layers[n].weight[mask], values[mask])


def test_guard_restores_exact_bits_whatever_the_step_wrote():
    """A diverging step writes NaN, inf and -0.0: every frozen weight gets its bits back and
    its gradient becomes +0.0; free weights and their gradients keep what was written."""
    sn = espn.wrap(nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)), torch.zeros(2, 6))
    gen = torch.Generator().manual_seed(0)
    for layer in sn.layers.values():
        layer.frozen.copy_(torch.rand(layer.frozen.shape, generator=gen) < 0.5)
        layer.weight.data.view(-1)[:2] = torch.tensor([-0.0, float("inf")])
    start = {n: layer.weight.detach().clone() for n, layer in sn.layers.items()}
    guard = FrozenGuard(sn)
    odd = torch.tensor([float("nan"), float("-inf"), -0.0, 1e-40, 3.0])
    for layer in sn.layers.values():
        picks = torch.randint(0, len(odd), layer.weight.shape, generator=gen)
        layer.weight.grad = odd[picks]
        layer.weight.data.copy_(odd[picks.flip(-1)])
    written = {n: (m.weight.detach().clone(), m.weight.grad.clone()) for n, m in sn.layers.items()}
    guard.mask_gradients()
    guard.restore()
    for n, layer in sn.layers.items():
        frozen, (weight, grad) = layer.frozen, written[n]
        expected_weight = torch.where(frozen, start[n], weight).view(torch.int32)
        expected_grad = torch.where(frozen, 0.0, grad).view(torch.int32)
        assert torch.equal(layer.weight.detach().view(torch.int32), expected_weight)
        assert torch.equal(layer.weight.grad.view(torch.int32), expected_grad)
