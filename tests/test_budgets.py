"""Every task meets its FLOPs budget and its new-weight budget, counted independently."""

from __future__ import annotations

import math

import pytest
import torch

from espn.api.experiment import build_benchmark, build_supernet
from espn.methods import METHODS
from espn.runs.config import make_config
from espn.training import Engine


def train(args: dict):
    cfg = make_config(**args)
    seq = build_benchmark(cfg)
    sn = build_supernet(cfg, seq)
    strategy = METHODS.get(cfg.method)(cfg.method_config())
    engine = Engine(sn, strategy, cfg.training_settings(), 128)
    budgets = []
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
        budgets.append(strategy.weight_budget)
    return sn, budgets


def union_before(sn, t: int, name: str) -> torch.Tensor:
    shape = sn.layers[name].weight.shape
    used = torch.zeros(shape, dtype=torch.bool)
    for j in range(t):
        used |= sn.masks[j].weight_mask(name)
    return used


@pytest.mark.parametrize(("gamma", "alpha"), [(0.1, 0.05), (0.2, 0.1), (0.5, 0.3), (1.0, 0.5)])
def test_espn_meets_flops_and_weight_budgets(fake_mnist, tiny_run_args, gamma, alpha):
    sn, budgets = train({**tiny_run_args, "method": "espn", "gamma": gamma, "alpha": alpha})
    for t, mask in enumerate(sn.masks):
        assert sn.flops(mask.units) <= gamma * sn.dense_flops
        free = sum(int((~union_before(sn, t, n)).sum()) for n in sn.layers)
        assert budgets[t] == math.ceil(alpha * free)
        new = sum(int((mask.weight_mask(n) & ~union_before(sn, t, n)).sum()) for n in sn.layers)
        assert new == mask.new_weights
        assert 0 < new <= budgets[t]
        if gamma == 1.0:
            assert all(bool(a.all()) for a in mask.units.values())


def test_reuse_policies(fake_mnist, tiny_run_args):
    """'all' keeps every frozen weight of alive units; 'magnitude' may drop small ones."""
    for reuse in ("all", "magnitude"):
        # free weights kept from task 1 (not re-drawn small), so that they compete with frozen ones
        args = {"tasks": 2, "gamma": 0.5, "alpha": 0.02, "reuse": reuse, "free_init": "keep"}
        sn, _ = train({**tiny_run_args, **args})
        second = sn.masks[1]
        kept, available = 0, 0
        sn.use_task(1)
        for n in sn.layers:
            frozen = sn.masks[0].weight_mask(n)
            alive = sn.structural_mask(n)
            kept += int((second.weight_mask(n) & frozen).sum())
            available += int((frozen & alive).sum())
        if reuse == "all":
            assert kept == available
        else:
            assert 0 < kept < available


def test_packnet_reuses_all_frozen_weights_without_flop_limit(fake_mnist, tiny_run_args):
    sn, budgets = train({**tiny_run_args, "method": "packnet", "alpha": 0.1})
    for t, mask in enumerate(sn.masks):
        assert sn.flops(mask.units) == sn.dense_flops
        for n in sn.layers:
            earlier = union_before(sn, t, n)
            assert torch.equal(mask.weight_mask(n) & earlier, earlier)
        assert mask.new_weights <= budgets[t]
