"""Channel/neuron pruners: the FLOP-aware penalty's weights by hand, polarization's penalty
and clamp, and every pruner meeting the FLOPs target on FC and conv supernets."""

from __future__ import annotations

import math

import pytest
import torch

from espn.models.fc import FCNet
from espn.models.registry import MODELS, ModelSpec
from espn.pruning import PRUNERS, FlopAwareL1, Polarization, flop_aware_lambdas
from espn.supernet import Supernet
from helpers.baseline import make_engine, tiny_sequence

PRUNER_NAMES = ["flop-aware", "l1", "polarization"]


def small_fc() -> Supernet:
    """6-4-3-2 with a shared masked head; hidden1 unit 1 and hidden2 unit 0 are dead."""
    torch.manual_seed(0)
    sn = Supernet(FCNet(6, [4, 3], 2, multi_head=False), torch.zeros(2, 6))
    sn.set_unit_masks(
        {
            "hidden1": torch.tensor([True, False, True, True]),
            "hidden2": torch.tensor([False, True, True]),
        }
    )
    return sn


def test_flop_aware_lambdas_on_a_hand_computed_fcnet():
    sn = small_fc()
    # FLOPs = 2 x MACs: 6 inputs -> 3 alive hidden1 -> 2 alive hidden2 -> 2 outputs
    assert sn.dense_flops == 2 * (6 * 4 + 4 * 3 + 3 * 2)
    assert sn.flops() == 2 * (6 * 3 + 3 * 2 + 2 * 2)
    # the paper's load, the cost of computing a unit: hidden1 6 inputs, hidden2 3 alive inputs
    flop_1, flop_2 = 2.0 * 6, 2.0 * 3
    assert sn.unit_flops() == {"hidden1": flop_1, "hidden2": flop_2}
    # --flop-load total adds the outgoing connections: 2 alive hidden2 units, 2 head outputs
    assert sn.unit_flops("total") == {"hidden1": 2.0 * (6 + 2), "hidden2": 2.0 * (3 + 2)}
    lambdas = flop_aware_lambdas(sn.unit_flops())
    denominator = math.sqrt(flop_1) + math.sqrt(flop_2)
    assert lambdas["hidden1"] == pytest.approx(math.sqrt(flop_1) / denominator)
    assert lambdas["hidden2"] == pytest.approx(math.sqrt(flop_2) / denominator)
    assert lambdas["hidden1"] == pytest.approx(math.sqrt(2) / (math.sqrt(2) + 1))

    # the penalty the pruner adds: strength * sum_l w_l ||gamma_l||_1 / (alive saliencies),
    # w_l = lambda_l x (number of groups) = sqrt(FLOP_l) / mean_i sqrt(FLOP_i)
    with torch.no_grad():
        sn.model.features[1].weight.copy_(torch.tensor([0.5, 0.0, -1.0, 2.0]))
        sn.model.features[4].weight.copy_(torch.tensor([0.0, 0.25, -0.75]))
    reg = FlopAwareL1(1e-3)
    reg.refresh(sn)
    expected = 1e-3 * 2 * (lambdas["hidden1"] * 3.5 + lambdas["hidden2"] * 1.0) / (3 + 2)
    assert float(reg(sn).detach()) == pytest.approx(expected)


def test_polarization_penalty_and_clamp_by_hand():
    sn = small_fc()
    with torch.no_grad():
        sn.model.features[1].weight.copy_(torch.tensor([0.2, 0.0, 0.8, 0.5]))
        sn.model.features[4].weight.copy_(torch.tensor([0.0, 1.0, 0.4]))
    reg = Polarization(0.01, t=1.2)
    # alive saliencies [0.2, 0.8, 0.5, 1.0, 0.4], mean 0.58 over the network:
    # (0.24-0.38) + (0.96-0.22) + (0.6-0.08) + (1.2-0.42) + (0.48-0.18) = 2.2, over 5 of them
    assert float(reg(sn).detach()) == pytest.approx(0.01 * 2.2 / 5)
    with torch.no_grad():
        sn.model.features[1].weight.copy_(torch.tensor([-0.3, 0.0, 1.7, 0.5]))
    reg.after_step(sn)
    assert sn.model.features[1].weight.tolist() == pytest.approx([0.0, 0.0, 1.0, 0.5])


def test_polarization_is_registered_with_a_description():
    pruner = PRUNERS.get("polarization")(0.2, 1e-4)
    assert isinstance(pruner.regulariser, Polarization)
    assert "Zhuang" in (PRUNERS.get("polarization").__doc__ or "")


def conv_model(n_classes: int) -> torch.nn.Module:
    """The registered reduced ResNet18 of the conv experiments, at 3x8x8 inputs."""
    return MODELS.get("resnet18-reduced")(ModelSpec((3, 8, 8), n_classes, True))


def fc_model(n_classes: int) -> torch.nn.Module:
    return FCNet(64, [32, 24], n_classes, multi_head=True)


@pytest.mark.parametrize("pruner", PRUNER_NAMES)
@pytest.mark.parametrize("method", ["espn", "individual"])
@pytest.mark.parametrize("gamma", [0.05, 0.3])
def test_every_pruner_meets_the_flops_target_on_fc(pruner, method, gamma):
    seq = tiny_sequence(n_tasks=2)
    torch.manual_seed(0)
    sn, _, engine = make_engine(fc_model(3), seq, method, gamma=gamma, alpha=0.5, pruner=pruner)
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
    for mask in sn.masks:
        assert sn.flops(mask.units) <= gamma * sn.dense_flops
        assert all(int(a.sum()) >= 1 for a in mask.units.values())


@pytest.mark.parametrize("pruner", PRUNER_NAMES)
def test_every_pruner_meets_the_flops_target_on_the_reduced_resnet(pruner):
    seq = tiny_sequence(n_tasks=2, shape=(3, 8, 8), n=32)
    torch.manual_seed(0)
    sn, _, engine = make_engine(conv_model(3), seq, "espn", gamma=0.1, alpha=0.3, pruner=pruner)
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
    for mask in sn.masks:
        assert sn.flops(mask.units) <= 0.1 * sn.dense_flops


def test_polarization_keeps_saliencies_in_0_1_while_pruning(monkeypatch):
    seq = tiny_sequence(n_tasks=1)
    torch.manual_seed(0)
    sn, strategy, engine = make_engine(fc_model(3), seq, "espn", gamma=0.2, pruner="polarization")
    seen = []
    real = strategy.after_step

    def after_step(supernet):
        real(supernet)
        seen.append(torch.cat([m.weight.detach() for ms in sn.groups.values() for m in ms]))

    monkeypatch.setattr(strategy, "after_step", after_step)
    engine.train_task(seq.tasks[0], 0)
    assert seen and all(bool(((s >= 0) & (s <= 1)).all()) for s in seen)
