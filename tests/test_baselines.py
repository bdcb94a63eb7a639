"""The paper's baselines (Individual-gamma, MTL, SupSup) from the same CLI and engine as ESPN:
valid results, exact zero forgetting, budgets, honest storage, and each method's mechanics."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call
from typer.testing import CliRunner

from espn.api.experiment import build_benchmark, build_supernet
from espn.cli.main import app
from espn.data.joint import JointTask
from espn.evaluation import task_logits
from espn.evaluation.storage import storage_report
from espn.methods import METHODS
from espn.methods.supsup import supermask
from espn.models.fc import FCNet
from espn.models.registry import MODELS, ModelSpec
from espn.runs.config import ConfigError, make_config
from espn.training import Engine, OptimConfig
from espn.training.callbacks import Callback
from helpers.baseline import fc_small, make_engine, tiny_sequence

runner = CliRunner()
TINY = ["--model", "fc-small", "--tasks", "3", "--epochs", "1,1,1", "--batch-size", "64"]
OPTIMIZERS = [
    OptimConfig("sgd", lr=0.05, momentum=0.9, weight_decay=1e-2),
    OptimConfig("adam", lr=1e-3, weight_decay=1e-2, betas=(0.0, 0.999)),
    OptimConfig("rmsprop", lr=1e-3, momentum=0.5, weight_decay=1e-2),
]


@pytest.fixture(autouse=True)
def small_model(fc_small_model):
    """Every test here may run model ``fc-small``."""


# ------------------------------------------------------------------------------ the CLI
@pytest.mark.parametrize("method", ["individual", "mtl", "supsup"])
def test_each_baseline_runs_from_the_cli_and_writes_valid_results(fake_mnist, tmp_path, method):
    out = tmp_path / method
    argv = ["run", "--benchmark", "permuted-mnist", "--method", method, "--out", str(out)]
    result = runner.invoke(app, [*argv, *TINY, "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "storage" in result.output
    doc = json.loads((out / "results.json").read_text())
    for key in (
        "accuracy_matrix",
        "final_accuracy",
        "average_accuracy",
        "forgetting",
        "flops_ratio",
        "units_kept",
        "new_weights",
        "weight_budget",
        "storage_bytes",
        "storage",
    ):
        assert key in doc, key
    matrix = doc["accuracy_matrix"]
    if method == "mtl":
        assert [len(row) for row in matrix] == [3]  # one row: the joint model on every task
        assert doc["backward_transfer"] == 0.0
    else:
        assert [len(row) for row in matrix] == [1, 2, 3]
        assert all(doc["final_accuracy"][j] == matrix[j][j] for j in range(3))
    assert doc["final_accuracy"] == matrix[-1]
    assert doc["average_accuracy"] == pytest.approx(sum(matrix[-1]) / 3)
    assert doc["forgetting"] == [0.0, 0.0, 0.0]
    assert doc["task_names"] == ["permutation 0", "permutation 1", "permutation 2"]
    assert doc["complete"] is True
    assert min(matrix[-1]) > 30  # the tiny data is learnable
    assert doc["gamma"] == (0.2 if method == "individual" else 1.0)
    assert doc["alpha"] == 1.0
    assert all(r <= doc["gamma"] + 1e-12 for r in doc["flops_ratio"])
    parts = {k: v for k, v in doc["storage"].items() if k not in ("total", "one_dense_network")}
    assert doc["storage_bytes"] == doc["storage"]["total"] == sum(parts.values())
    if method == "individual":  # its own network per task: every weight it uses is new
        assert doc["new_weights"] == doc["used_weights"]
        assert parts["shared_weights"] == 0
        assert parts["own_weights"] == 4 * sum(doc["used_weights"])
    if method == "supsup":
        assert doc["new_weights"] == [0, 0, 0] and doc["weight_budget"] == [0, 0, 0]
    if method == "mtl":
        assert doc["new_weights"] == [doc["total_weights"], 0, 0]
        assert parts["shared_weights"] == 4 * doc["total_weights"]
    assert (out / "accuracy.png").stat().st_size > 1000

    shown = runner.invoke(app, ["show", str(out)])
    assert shown.exit_code == 0, shown.output
    evaluated = runner.invoke(app, ["evaluate", "--run", str(out)])  # from the checkpoint alone
    assert evaluated.exit_code == 0, evaluated.output
    assert "all 3 tasks match results.json" in " ".join(evaluated.output.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "mtl", "--alpha", "0.3"], "method 'mtl' has no weight budget"),
        (["--method", "supsup", "--alpha", "0.3"], "method 'supsup' has no weight budget"),
        (["--method", "mtl", "--gamma", "0.5"], "method 'mtl' has no FLOP constraint"),
        (["--method", "supsup", "--gamma", "0.2"], "method 'supsup' has no FLOP constraint"),
        (["--method", "espn", "--supsup-k", "0.3"], "supsup_k applies to method 'supsup' only"),
        (["--method", "supsup", "--supsup-k", "0"], "supsup_k must be in (0, 1], got 0.0"),
        (["--method", "supsup", "--supsup-k", "1.5"], "supsup_k must be in (0, 1], got 1.5"),
        (["--method", "ewc"], "choose one of: cpg, espn, individual, mtl, packnet, rmn, supsup"),
        # the pruner is ESPN's own option: its declaration checks it and names its methods
        (["--pruner", "magic"], "pruner must be one of: flop-aware, l1, polarization"),
        (
            ["--method", "packnet", "--pruner", "l1"],
            "pruner applies to methods 'espn', 'individual' only, not 'packnet'",
        ),
        (
            ["--method", "supsup", "--pruner", "polarization"],
            "pruner applies to methods 'espn', 'individual' only",
        ),
    ],
)
def test_bad_method_options_are_rejected(tmp_path, args, message):
    argv = ["run", "--benchmark", "permuted-mnist", "--out", str(tmp_path / "r"), *args]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_alpha_of_a_preset_does_not_stop_methods_without_a_weight_budget(tmp_path):
    cfg = make_config(preset="quick", method="mtl", out=tmp_path)
    assert cfg.alpha == 1.0 and cfg.gamma == 1.0
    # Individual-gamma has no weight budget: the recipe's alpha is not its (paper's Table 1)
    assert make_config(preset="quick", method="individual", out=tmp_path).alpha == 1.0
    assert make_config(preset="paper", method="individual", out=tmp_path).alpha == 1.0
    assert make_config(preset="paper", method="individual", alpha=0.1, out=tmp_path).alpha == 0.1
    assert make_config(preset="paper", method="packnet", out=tmp_path).alpha == 0.1
    with pytest.raises(ConfigError, match="has no weight budget"):
        make_config(preset="quick", method="supsup", alpha=0.5, out=tmp_path)


def test_method_defaults():
    assert make_config(benchmark="permuted-mnist", method="individual").alpha == 1.0
    assert make_config(benchmark="permuted-mnist", method="individual").gamma == 0.2
    # every method's options, completed with their declared defaults (ESPN's pruner & co.)
    for method in ("supsup", "espn"):
        declared = {o.name: o.default for o in METHODS.get(method).options}
        assert make_config(benchmark="permuted-mnist", method=method).method_options == declared
    assert (
        make_config(benchmark="permuted-mnist", method="supsup").method_options["supsup_k"] == 0.5
    )


# ------------------------------------------------------------------- zero forgetting
def train_and_check_logits(args: dict, optim: OptimConfig) -> None:
    """After every task, every earlier task's test logits are bit-identical."""
    cfg = make_config(**args)
    seq = build_benchmark(cfg)
    sn = build_supernet(cfg, seq)
    strategy = METHODS.get(cfg.method)(cfg.method_config())
    engine = Engine(sn, strategy, optim, batch_size=64, seed=0)
    logits: list[torch.Tensor] = []
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
        for j in range(t):
            assert torch.equal(task_logits(sn, seq.tasks[j], j), logits[j]), f"task {j} changed"
        logits.append(task_logits(sn, task, t))
        if t:  # the new task did learn something of its own
            assert not torch.equal(logits[t], logits[t - 1])


@pytest.mark.parametrize(
    ("method", "optim"),
    [
        *[({"method": "supsup"}, optim) for optim in OPTIMIZERS],
        ({"method": "individual"}, OPTIMIZERS[1]),
        # gamma 0.5: at 0.2 this tiny bias-free net (the paper's FC) can end a task with every
        # unit of a layer dead under SGD lr 0.05 + momentum, i.e. all-zero logits
        ({"method": "espn", "pruner": "polarization", "alpha": 0.2, "gamma": 0.5}, OPTIMIZERS[0]),
        ({"method": "cpg", "cpg_acc_loss": 100.0, "cpg_train_acc": 0.0}, OPTIMIZERS[1]),
        ({"method": "rmn", "rmn_budget": 0.3, "rmn_l1": 1e-4}, OPTIMIZERS[2]),
    ],
    ids=[
        "supsup-sgd",
        "supsup-adam",
        "supsup-rmsprop",
        "individual-adam",
        "espn-polarization-sgd",
        "cpg-adam",
        "rmn-rmsprop",
    ],
)
def test_earlier_tasks_logits_stay_bit_identical(fake_mnist, tiny_run_args, method, optim):
    train_and_check_logits({**tiny_run_args, **method, "model": "fc-small"}, optim)


def test_supsup_on_the_reduced_resnet_keeps_tasks_and_their_batchnorm_statistics():
    seq = tiny_sequence(n_tasks=2, shape=(3, 8, 8), n=16)
    torch.manual_seed(0)
    model = MODELS.get("resnet18-reduced")(ModelSpec((3, 8, 8), 3, True))
    sn, _, engine = make_engine(model, seq, "supsup", OPTIMIZERS[0], epochs=(1, 0, 1))
    weights = {n: m.weight.detach().clone() for n, m in sn.layers.items()}
    engine.train_task(seq.tasks[0], 0)
    first = task_logits(sn, seq.tasks[0], 0)
    engine.train_task(seq.tasks[1], 1)
    assert torch.equal(task_logits(sn, seq.tasks[0], 0), first)
    assert all(torch.equal(m.weight, weights[n]) for n, m in sn.layers.items())
    stats = [k for k in sn.masks[0].state if k.endswith("running_mean")]
    assert stats and any(not torch.equal(sn.masks[0].state[k], sn.masks[1].state[k]) for k in stats)
    for k in sn.masks[0].state:  # BatchNorm affine parameters stay at 1 and 0
        if k.endswith("bn1.weight"):
            assert bool((sn.masks[1].state[k] == 1).all())


# ------------------------------------------------------------------------------- SupSup
def test_supsup_weights_are_fixed_signed_constants_and_masks_are_packed_top_k():
    seq = tiny_sequence(n_tasks=2)
    torch.manual_seed(0)
    model = FCNet(64, [32, 24], 3, multi_head=True)
    initial = {
        n: m.weight.detach().clone() for n, m in model.named_modules() if hasattr(m, "frozen")
    }
    sn, strategy, engine = make_engine(
        model, seq, "supsup", supsup_k=0.25, supsup_density="uniform"
    )
    for name, layer in sn.layers.items():
        scale = math.sqrt(2.0 / layer.weight.shape[1])  # the reference's +-sqrt(2 / fan_in)
        expected = torch.where(initial[name] >= 0, scale, -scale)
        assert torch.equal(layer.weight, expected)
    fixed = {n: m.weight.detach().clone() for n, m in sn.layers.items()}
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
    assert all(torch.equal(m.weight, fixed[n]) for n, m in sn.layers.items())
    assert sn.masks[0].new_weights == sn.masks[1].new_weights == 0
    for mask in sn.masks:
        assert sn.flops(mask.units) == sn.dense_flops  # no FLOP saving
        for name, layer in sn.layers.items():
            n = layer.weight.numel()
            assert mask.weights[name].dtype == torch.uint8
            assert mask.weights[name].numel() == (n + 7) // 8  # bit-packed
            assert int(mask.weight_mask(name).sum()) == math.ceil(0.25 * n)
    assert any(
        not torch.equal(sn.masks[0].weight_mask(n), sn.masks[1].weight_mask(n)) for n in sn.layers
    )
    # the mask is the top-k of the last task's trained scores (the head's: tests/test_recipes.py)
    for name in sn.layers:
        scores = strategy.scores[name]
        kept = scores.detach().abs()[sn.masks[1].weight_mask(name)]
        dropped = scores.detach().abs()[~sn.masks[1].weight_mask(name)]
        assert kept.min() >= dropped.max()


def test_supsup_scores_get_the_straight_through_gradient():
    seq = tiny_sequence(n_tasks=1)
    torch.manual_seed(0)
    # the dense head, so that the masked layers alone make the difference to the reference
    sn, strategy, _ = make_engine(
        FCNet(64, [32, 24], 3, multi_head=True), seq, "supsup", supsup_head="dense"
    )
    sn.begin_task(3)
    strategy.begin_task(sn)
    x, y = next(seq.tasks[0].batches("train", 16))
    F.cross_entropy(strategy.forward(sn, x), y).backward()
    # reference: the gradient of the loss w.r.t. each (hard) mask, times d|s|/ds = sign(s)
    masks = {
        f"{n}.weight_mask": supermask(s.detach(), 0.5).requires_grad_(True)
        for n, s in strategy.scores.items()
    }
    F.cross_entropy(functional_call(sn.model, masks, (x,)), y).backward()
    for name, scores in strategy.scores.items():
        expected = masks[f"{name}.weight_mask"].grad * torch.sign(scores.detach())
        torch.testing.assert_close(scores.grad, expected)
    assert all(m.weight.grad is None for m in sn.layers.values())  # weights are not trained


# --------------------------------------------------------------------------- Individual
@pytest.mark.parametrize("gamma", [0.1, 0.5, 1.0])
def test_individual_trains_each_task_from_scratch_within_gamma(monkeypatch, gamma):
    seq = tiny_sequence(n_tasks=3)
    torch.manual_seed(0)
    sn, strategy, engine = make_engine(
        FCNet(64, [32, 24], 3, multi_head=True), seq, "individual", gamma=gamma, alpha=1.0
    )
    initial = {n: m.weight.detach().clone() for n, m in sn.layers.items()}
    starts = []
    real = strategy.begin_task

    def begin_task(supernet):
        real(supernet)
        starts.append({n: m.weight.detach().clone() for n, m in supernet.layers.items()})

    monkeypatch.setattr(strategy, "begin_task", begin_task)
    logits = []
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
        logits.append(task_logits(sn, task, t))
        assert not any(bool(m.frozen.any()) for m in sn.layers.values())  # nothing shared
    for start in starts:  # every task starts from the same initial weights
        assert all(torch.equal(start[n], initial[n]) for n in initial)
    for t, mask in enumerate(sn.masks):
        assert sn.flops(mask.units) <= gamma * sn.dense_flops
        if gamma == 1.0:
            assert all(bool(a.all()) for a in mask.units.values())
        assert mask.new_weights == mask.nnz()  # all its weights are its own
        for name in sn.layers:
            assert mask.own[name].numel() == int(mask.weight_mask(name).sum())
        assert torch.equal(task_logits(sn, seq.tasks[t], t), logits[t])
    report = storage_report(sn, "own")
    assert report["shared_weights"] == 0
    assert report["own_weights"] == 4 * sum(m.nnz() for m in sn.masks)
    # alpha = 1: weight masks are exactly the alive units' structure and cost nothing
    assert report["weight_masks"] == 0
    if gamma == 1.0:  # dense tasks: no mask to store, one full network each
        assert report["unit_masks"] == 0
        assert report["own_weights"] == 3 * report["one_dense_network"]
    else:  # one bit per unit of each group, per task
        assert report["unit_masks"] == 3 * (32 // 8 + 24 // 8)


def test_individual_with_a_weight_budget():
    seq = tiny_sequence(n_tasks=2)
    torch.manual_seed(0)
    sn, strategy, engine = make_engine(
        FCNet(64, [32, 24], 3, multi_head=True), seq, "individual", gamma=0.5, alpha=0.2
    )
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
        assert strategy.weight_budget == math.ceil(0.2 * sn.total_weights)  # all weights free
        assert 0 < sn.masks[t].new_weights <= strategy.weight_budget


# ---------------------------------------------------------------------------------- MTL
def test_joint_task_mixes_tasks_and_transforms_each_sample_by_its_own_task():
    seq = tiny_sequence(n_tasks=3, offset=100.0)
    joint = JointTask(seq)
    assert joint.n_classes == 9 and len(joint.train) == 3 * 48
    gen = torch.Generator().manual_seed(3)
    order = torch.randperm(len(joint.train), generator=torch.Generator().manual_seed(3))
    seen_tasks = set()
    for b, (x, y) in enumerate(joint.batches("train", 20, True, gen)):
        rows = order[b * 20 : (b + 1) * 20]
        owners = joint.column_task[y]
        assert torch.equal(owners, joint.train.x[rows])
        seen_tasks |= {len(set(owners.tolist()))}
        for i, row in enumerate(rows.tolist()):
            t, local = int(joint.train.x[row]), int(joint.train.index[row])
            raw = seq.tasks[t].train
            assert torch.equal(x[i], raw.x[raw.index[local]] + 100.0 * t)
            assert int(y[i]) == 3 * t + int(raw.y[local])
    assert max(seen_tasks) > 1  # batches do mix tasks


def test_joint_loss_routes_each_sample_to_its_own_head_block():
    joint = JointTask(tiny_sequence(n_tasks=3, n_classes=2))
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(10, 6, generator=gen)
    y = torch.tensor([0, 1, 2, 3, 4, 5, 1, 2, 5, 4])
    expected = torch.stack(
        [
            F.cross_entropy(logits[i, 2 * (int(y[i]) // 2) : 2 * (int(y[i]) // 2) + 2], y[i] % 2)
            for i in range(10)
        ]
    ).mean()
    torch.testing.assert_close(joint.loss(logits, y), expected)


def test_mtl_trains_once_on_all_tasks_and_files_one_view_per_task(monkeypatch):
    seq = tiny_sequence(n_tasks=3)
    torch.manual_seed(0)
    sn, strategy, engine = make_engine(FCNet(64, [32, 24], 3, multi_head=True), seq, "mtl")
    (joint,) = strategy.training_tasks(seq)
    steps = {"n": 0}

    class Steps(Callback):
        def on_step_end(self, learner, event) -> None:
            steps["n"] += 1

    engine.callbacks.append(Steps())
    probe = torch.cat([t.test.x for t in seq.tasks])
    captured = {}
    real_commit = sn.commit_task

    def commit_task(weights="shared"):
        sn.eval()
        captured["logits"] = sn.model(probe).detach()
        return real_commit(weights)

    monkeypatch.setattr(sn, "commit_task", commit_task)
    engine.train_task(joint, 0)
    assert steps["n"] == 3 * math.ceil(3 * 48 / 16)  # the same epochs, over all tasks' data
    assert len(sn.masks) == 3
    for t, mask in enumerate(sn.masks):
        assert mask.n_classes == 3
        sn.use_task(t)  # the FLOP count follows the loaded head's width
        assert sn.flops(mask.units) == sn.dense_flops
        # the joint model's block of logits (up to float summation order in the head)
        torch.testing.assert_close(sn(probe, task=t), captured["logits"][:, 3 * t : 3 * t + 3])
    assert [m.new_weights for m in sn.masks] == [sn.total_weights, 0, 0]
    report = storage_report(sn, "shared")
    heads = sum(sn.masks[0].state[k].numel() * 4 for k in ("head.weight", "head.bias"))
    gates = sum(v.numel() * 4 for k, v in sn.masks[0].state.items() if not k.startswith("head"))
    assert report["task_state"] == 3 * heads + gates  # shared state once, a head per task
    assert report["weight_masks"] == 0 and report["shared_weights"] == 4 * sn.total_weights


# ------------------------------------------------------------------------------ storage
@pytest.mark.parametrize("reuse", ["magnitude", "all"])
def test_storage_counts_shared_weights_once_and_masks_per_task(fake_mnist, tiny_run_args, reuse):
    # gamma = 1: masks are sparse weight masks inside dense layers; a mask that is exactly the
    # weights owned by its task and earlier ones costs nothing (the owner ids count once)
    cfg = make_config(
        **tiny_run_args, model="fc-small", method="espn", gamma=1.0, alpha=0.3, reuse=reuse
    )
    seq = build_benchmark(cfg)
    sn = build_supernet(cfg, seq)
    engine = Engine(sn, METHODS.get("espn")(cfg.method_config()), cfg.training_settings(), 64)
    owned = []  # frozen after each task: the weights owned by it and earlier tasks
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
        owned.append({n: m.frozen.clone() for n, m in sn.layers.items()})
    report = storage_report(sn, "shared")
    used = sum(int(m.frozen.sum()) for m in sn.layers.values())
    assert report["shared_weights"] == 4 * used
    explicit, derived = 0, 0
    for t, mask in enumerate(sn.masks):
        for name, layer in sn.layers.items():
            dense = mask.weight_mask(name)
            if torch.equal(dense, owned[t][name]):
                derived += 1
            else:  # the smaller of one bit per weight and one int32 per kept weight
                explicit += min((layer.weight.numel() + 7) // 8, 4 * int(dense.sum()))
    assert report["weight_masks"] == explicit
    # 3 tasks: ids 0..2 and the free sentinel in 2 bit-planes of each layer
    planes = 2 * sum((m.weight.numel() + 7) // 8 for m in sn.layers.values())
    assert report["owner_ids"] == (planes if derived else 0)
    if reuse == "all":  # every task keeps all frozen weights: nothing stored per task
        assert derived == 3 * len(sn.layers) and explicit == 0
    else:  # the first task's mask is what it owns; later ones keep only some frozen weights
        assert derived >= len(sn.layers) and explicit > 0
    assert report["own_weights"] == 0
    assert report["one_dense_network"] == 4 * sn.total_weights
    fixed = storage_report(sn, "fixed")["shared_weights"]
    assert fixed == sum((m.weight.numel() + 7) // 8 + 4 for m in sn.layers.values())
    with pytest.raises(ValueError, match="unknown weights 'lent'"):
        storage_report(sn, "lent")


def test_fc_small_is_registered_only_inside_tests():
    assert fc_small(ModelSpec((1, 28, 28), 10, False)).features[0].weight.shape == (48, 784)
