"""The baselines' reference rules: SupSup's Erdos-Renyi per-layer density, CPG's stop rule
for compacting, RMN without a weight budget; each against an independent computation."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from espn.cli.main import app
from espn.evaluation import task_logits
from espn.methods import METHODS
from espn.methods.cpg import SPARSITIES
from espn.methods.supsup import erdos_renyi_scale
from espn.models.fc import FCNet
from espn.models.registry import MODELS, ModelSpec
from espn.runs.config import make_config
from espn.runs.legacy import upgrade_saved_config
from helpers.baseline import make_engine, scripted_cpg, tiny_sequence

runner = CliRunner()


def er_reference(shapes: list[tuple[int, ...]], k: float) -> list[float]:
    """Per-layer densities min(0.5, s (c_in + c_out) / (c_in c_out kh kw)) with ``s`` found
    by bisection on the total kept fraction (independent of espn's closed-form solve)."""

    def densities(s: float) -> list[float]:
        return [min(0.5, s * (sh[0] + sh[1]) / math.prod(sh)) for sh in shapes]

    total = sum(math.prod(sh) for sh in shapes)

    def kept(s: float) -> float:
        return sum(d * math.prod(sh) for d, sh in zip(densities(s), shapes, strict=True)) / total

    low, high = 0.0, 1.0
    while kept(high) < k:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if kept(mid) < k else (low, mid)
    return densities(high)


# ------------------------------------------------------------------------------ SupSup
@pytest.mark.parametrize("k", [0.05, 0.2, 0.5])
def test_erdos_renyi_densities_follow_the_formula_and_meet_the_budget_on_a_resnet(k):
    model = MODELS.get("resnet18-reduced")(ModelSpec((3, 8, 8), 3, True))
    shapes = [tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    s = erdos_renyi_scale(shapes, k)
    ours = [min(0.5, s * (sh[0] + sh[1]) / math.prod(sh)) for sh in shapes]
    expected = er_reference(shapes, k)
    assert ours == pytest.approx(expected, rel=1e-9)
    total = sum(math.prod(sh) for sh in shapes)
    kept = sum(d * math.prod(sh) for d, sh in zip(ours, shapes, strict=True))
    assert kept == pytest.approx(k * total, rel=1e-9)
    if k < 0.5:  # not uniform: the stem is capped and the widest layers keep least
        assert max(ours) == 0.5 and min(ours) < k


def test_supsup_erdos_renyi_masks_and_signed_constants_per_layer():
    seq = tiny_sequence(n_tasks=2)
    torch.manual_seed(0)
    model = FCNet(64, [32, 24], 3, multi_head=True)
    initial = {
        n: m.weight.detach().clone() for n, m in model.named_modules() if hasattr(m, "frozen")
    }
    sn, strategy, engine = make_engine(model, seq, "supsup", supsup_k=0.2, supsup_scale="density")
    assert strategy.settings["supsup_density"] == "erdos-renyi"  # the reference's config
    names = list(sn.layers)
    shapes = [tuple(sn.layers[n].weight.shape) for n in names]
    density = dict(zip(names, er_reference(shapes, 0.2), strict=True))
    for name, layer in sn.layers.items():
        scale = math.sqrt(2.0 / (density[name] * layer.weight.shape[1]))
        expected = torch.where(initial[name] >= 0, scale, -scale)
        torch.testing.assert_close(layer.weight, expected, rtol=1e-6, atol=0)
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
    total = sum(layer.weight.numel() for layer in sn.layers.values())
    for mask in sn.masks:
        kept = 0
        for name, layer in sn.layers.items():
            n_kept = int(mask.weight_mask(name).sum())
            assert n_kept == math.ceil(density[name] * layer.weight.numel() - 1e-9)
            kept += n_kept
        assert 0.2 * total <= kept < 0.2 * total + len(sn.layers)  # the budget, up to rounding
    assert len(set(density.values())) > 1  # the layers keep different fractions


def test_supsup_erdos_renyi_at_half_caps_every_layer_and_equals_uniform():
    """At supsup_k 0.5 (the default) every layer sits at the reference's cap: the same run."""
    seq = tiny_sequence(n_tasks=2)
    runs = []
    for density in ("erdos-renyi", "uniform"):
        torch.manual_seed(0)
        model = FCNet(64, [32, 24], 3, multi_head=True)
        sn, _, engine = make_engine(model, seq, "supsup", supsup_density=density)
        for t, task in enumerate(seq.tasks):
            engine.train_task(task, t)
        runs.append([task_logits(sn, task, t) for t, task in enumerate(seq.tasks)])
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_supsup_uniform_density_is_an_option_and_er_refuses_k_above_its_cap(tmp_path):
    seq = tiny_sequence(n_tasks=1)
    sn, _, engine = make_engine(
        FCNet(64, [32, 24], 3, multi_head=True),
        seq,
        "supsup",
        supsup_k=0.2,
        supsup_density="uniform",
    )
    engine.train_task(seq.tasks[0], 0)
    for name, layer in sn.layers.items():
        assert int(sn.masks[0].weight_mask(name).sum()) == math.ceil(0.2 * layer.weight.numel())
    out = tmp_path / "r"
    argv = ["run", "--benchmark", "permuted-mnist", "--method", "supsup", "--out", str(out)]
    result = runner.invoke(app, [*argv, "--supsup-k", "0.7"])
    assert result.exit_code == 2
    assert "supsup_k must be in (0, 0.5] with supsup_density erdos-renyi" in " ".join(
        result.output.split()
    )
    assert not out.exists()
    assert task_logits(sn, seq.tasks[0], 0).shape[1] == 3


# --------------------------------------------------------------------------------- CPG
def assert_task_is(sn, snapshot: dict[str, torch.Tensor], sparsity: float) -> None:
    """Task 0 holds the snapshot's masks and kept weights (released ones zeroed) and its
    sparsity is ``sparsity`` of every layer's weights."""
    for n, layer in sn.layers.items():
        mask = sn.masks[0].weight_mask(n)
        size = layer.weight.numel()
        assert int(mask.sum()) == size - math.floor(sparsity * size)
        assert torch.equal(mask, snapshot[f"mask.{n}"])
        expected = torch.where(mask, snapshot[f"weight.{n}"], torch.zeros(()))
        assert torch.equal(layer.weight, expected)


def test_cpg_reference_rule_prunes_on_while_above_95_and_keeps_the_largest_reaching_the_goal(
    monkeypatch,
):
    # train 98 (the goal); rounds: 99 reaches it, 97 does not, 98.5 does, 96 does not, 90 is
    # not above 95: compacting stops there and returns to round 3 (30% sparsity)
    accuracies = [98.0, 99.0, 97.0, 98.5, 96.0, 90.0]
    sn, strategy, log, snapshots = scripted_cpg(monkeypatch, accuracies)
    assert strategy.settings["cpg_stop"] == "reference"  # the default
    assert log.epochs == 1 + 5  # train and rounds 1-5; rounds 6-10 skipped, no retraining
    assert len(snapshots) == 3  # after train, round 1, round 3
    assert_task_is(sn, snapshots[-1], SPARSITIES[2])
    assert strategy.report()["compacting"] == {
        "goal": 98.0,
        "accuracies": accuracies[1:],
        "kept_sparsity": SPARSITIES[2],
    }


def test_cpg_reference_rule_keeps_the_uncompacted_task_when_no_round_reaches_the_goal(
    monkeypatch,
):
    sn, strategy, log, snapshots = scripted_cpg(monkeypatch, [99.0, 97.0, 96.5, 94.0])
    assert log.epochs == 1 + 3
    assert len(snapshots) == 1
    assert_task_is(sn, snapshots[0], 0.0)  # every weight kept, as the reference's scratch
    assert strategy.report()["compacting"]["kept_sparsity"] == 0.0


def test_cpg_goal_rule_stops_at_the_first_miss_and_train_acc_is_an_option(monkeypatch):
    # the same accuracies under espn's former rule: round 2 (97 < 98) is undone, stop
    accuracies = [98.0, 99.0, 97.0, 98.5, 96.0, 90.0]
    sn, _, log, snapshots = scripted_cpg(monkeypatch, accuracies, cpg_stop="goal")
    assert log.epochs == 1 + 2
    assert_task_is(sn, snapshots[-1], SPARSITIES[0])
    # a lower continuation threshold lets the reference rule run on past 90
    accuracies = [98.0, 99.0, 97.0, 98.5, 96.0, 90.0, 99.0, 80.0]
    sn, _, log, snapshots = scripted_cpg(monkeypatch, accuracies, cpg_train_acc=85.0)
    assert log.epochs == 1 + 7
    assert_task_is(sn, snapshots[-1], SPARSITIES[5])


# --------------------------------------------------------------------------------- RMN
def test_rmn_without_a_budget_keeps_relevances_above_the_threshold_with_zero_forgetting():
    seq = tiny_sequence(n_tasks=3)
    torch.manual_seed(0)
    # threshold 1: a weight stays where training raised its relevance above its start
    sn, strategy, engine = make_engine(
        FCNet(64, [32, 24], 3, multi_head=True), seq, "rmn", rmn_threshold=1.0, rmn_l1=1e-4
    )
    assert strategy.budget == 0.0  # the paper: no weight budget
    logits = []
    for t, task in enumerate(seq.tasks):
        frozen = {n: m.frozen.clone() for n, m in sn.layers.items()}
        weights = {n: m.weight.detach().clone() for n, m in sn.layers.items()}
        engine.train_task(task, t)
        new = 0
        for n, layer in sn.layers.items():
            mask = sn.masks[t].weight_mask(n)
            relevance = strategy.relevance[n].detach()
            assert torch.equal(mask, relevance.abs() > 1.0)  # free and frozen alike
            assert torch.equal(layer.weight[frozen[n]], weights[n][frozen[n]])
            new += int((mask & ~frozen[n]).sum())
        assert sn.masks[t].new_weights == new
        assert 0 < new < sum(int((~f).sum()) for f in frozen.values())  # some, not all
        logits.append(task_logits(sn, task, t))
        for j in range(t):  # earlier tasks bit-identical
            assert torch.equal(task_logits(sn, seq.tasks[j], j), logits[j])


# -------------------------------------------------------------------- older runs
def test_runs_saved_before_the_reference_rules_are_read_as_they_ran():
    """SupSup uniform with density-scaled constants, CPG's goal rule, RMN's alpha budget."""
    for method, given, then in (
        ("supsup", {}, {"supsup_density": "uniform", "supsup_scale": "density"}),
        ("cpg", {}, {"cpg_stop": "goal"}),
        ("rmn", {"alpha": 0.05}, {"rmn_budget": 0.05}),
    ):
        now = make_config(benchmark="permuted-mnist", method=method)
        saved = now.model_dump(mode="json") | given
        options = METHODS.get(method).option_names()
        old = {k: v for k, v in saved["method_options"].items() if k not in then}
        upgraded = upgrade_saved_config(saved | {"method_options": old})
        assert upgraded["method_options"] == {o: (then | old)[o] for o in options}
        cfg = make_config(**upgraded)
        assert cfg.alpha == 1.0 and cfg.method_options == upgraded["method_options"]
