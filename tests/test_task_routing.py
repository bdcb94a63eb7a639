"""Task routing: every rule picks a sample's own task more often than chance on held-out
data of the tasks, on 1-D signal tasks whose heads differ in size and whose sub-networks
differ in confidence (the case where comparing raw or one-sided standardised scores across
tasks picked the right task for 2-7% of the samples, chance being 33%); the
``task_agnostic`` option (espn.inference.routing): zero forgetting bit for bit, nothing
changed with it off, its statistics through save, load and a killed-then-resumed run,
tasks separable by construction routed right."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import Tensor, nn
from typer.testing import CliRunner

import espn
from espn.cli.main import app
from espn.inference import InferenceError, evaluate_rules, routing, subspace
from espn.inference.outputs import batched_states
from espn.inference.statistics import STAT_KEYS
from helpers.deploy import cli_options

N_TASKS = 3
LENGTH = 64


def signals(task: int, n: int) -> tuple[Tensor, Tensor]:
    """Noisy 1-D signals: task 0 tells 4 frequencies apart, task 1 three wave shapes, task 2
    five positions of a bump."""
    g = torch.Generator().manual_seed(task)
    classes = (4, 3, 5)[task]
    y = torch.randint(classes, (n,), generator=g)
    t = torch.arange(LENGTH).float()
    phase = torch.rand(n, 1, generator=g) * 2 * math.pi
    if task == 0:
        x = torch.sin(2 * math.pi * 0.05 * (y.float() + 1)[:, None] * t + phase)
    elif task == 1:
        s = torch.sin(0.3 * t + phase)
        saw = ((0.3 * t + phase) / (2 * math.pi)) % 1 * 2 - 1
        x = torch.where(y[:, None] == 0, s, torch.where(y[:, None] == 1, torch.sign(s), saw))
    else:
        x = torch.exp(-((t - (12 * y.float() + 6)[:, None]) ** 2) / 8)
    return (x + 0.6 * torch.randn(n, LENGTH, generator=g))[:, None], y


class SignalNet(nn.Module):
    """A small 1-D CNN: two convolutions with BatchNorm, mean over time, a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv1d(1, 16, 5, padding=2), nn.BatchNorm1d(16)
        self.c2, self.b2 = nn.Conv1d(16, 32, 5, padding=2, stride=2), nn.BatchNorm1d(32)
        self.fc = nn.Linear(32, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.b1(self.c1(x)))
        return self.fc(torch.relu(self.b2(self.c2(x))).mean(-1))


@pytest.fixture(scope="module")
def signal_learner() -> espn.ContinualLearner:
    torch.manual_seed(0)
    net = espn.wrap(SignalNet(), torch.zeros(2, 1, LENGTH))
    learner = espn.ContinualLearner(net, "espn", gamma=0.5, epochs=(2, 1, 1))
    for task in range(N_TASKS):
        x, y = signals(task, 900)
        learner.learn((x[:600], y[:600]), test=(x[600:], y[600:]))
    return learner


def test_every_rule_picks_the_right_task_above_chance_on_held_out_data(signal_learner):
    """A rule below chance compares scores across tasks wrongly: raw entropies of heads of
    different sizes (the 3-class task won every sample), or a standardised energy that
    rewards scoring beyond the task's own range (a nearly constant sub-network won)."""
    learner = signal_learner
    for doc in learner.evaluate(task_agnostic=True, rule="all"):
        picked = [row["task_picked"] for row in doc["tasks"]]
        assert doc["average"]["task_picked"] > 100 / N_TASKS, (doc["rule"], picked)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 4))


def _prototypes(task: int, shift: float = 0.0) -> tuple[Tensor, Tensor]:
    """300 noisy copies of 4 random 8x8 prototypes (task ``task``'s), offset by ``shift``."""
    g = torch.Generator().manual_seed(100 + task)
    y = torch.randint(4, (300,), generator=g)
    x = torch.randn(4, 1, 8, 8, generator=g)[y] + 1.5 * torch.randn(300, 1, 8, 8, generator=g)
    return x + shift, y


def _learn(option: bool | None, n_tasks: int = 3, shifts: tuple[float, ...] = (0.0,) * 3):
    """A learner after each of ``n_tasks`` tasks, with task 0's test logits after each."""
    torch.manual_seed(0)
    settings = {} if option is None else {"task_agnostic": option}
    learner = espn.ContinualLearner(
        espn.wrap(_mlp(), torch.zeros(2, 1, 8, 8)), "espn", gamma=0.5, epochs=(1, 1, 1),
        **settings,
    )  # fmt: skip
    first = []
    for t in range(n_tasks):
        x, y = _prototypes(t, shifts[t])
        learner.learn((x[:200], y[:200]), test=(x[200:], y[200:]))
        learner.supernet.eval()
        first.append(learner.supernet(learner.tasks[0].test.x, task=0).detach().clone())
    return learner, first


def test_the_option_keeps_earlier_tasks_logits_bit_identical_and_the_budget():
    learner, first = _learn(True)
    assert all(torch.equal(first[0], later) for later in first[1:])
    assert all(r["flops_ratio"] <= 0.5 for r in learner.records)
    for m in learner.supernet.masks:
        assert set(m.stats) == {*STAT_KEYS, *routing.OPTION_KEYS}


def test_with_the_option_off_nothing_changes():
    """Off (given or not): the same logits, accuracies, FLOPs and statistics bit for bit;
    on: another training (the rejection term, a tenth held out), the same sub-network size
    (nothing added to a task's FLOPs)."""
    plain, plain_first = _learn(None)
    off, off_first = _learn(False)
    on, _ = _learn(True)
    assert all(torch.equal(a, b) for a, b in zip(plain_first, off_first, strict=True))
    assert plain.accuracy_matrix == off.accuracy_matrix
    for a, b, c in zip(plain.records, off.records, on.records, strict=True):
        assert a["flops"] == b["flops"] and a["new_weights"] == b["new_weights"]
        assert c["flops_ratio"] <= 0.5
    for a, b in zip(plain.supernet.masks, off.supernet.masks, strict=True):
        assert set(a.stats) == set(b.stats) == set(STAT_KEYS)
        assert all(torch.equal(a.stats[k], b.stats[k]) for k in STAT_KEYS)
    assert not torch.equal(plain.supernet.masks[0].stats["calibration"],
                           on.supernet.masks[0].stats["calibration"])  # fmt: skip


def test_held_out_samples_are_every_tenth_and_never_trained_on():
    x, y = _prototypes(0)
    learner = espn.ContinualLearner(espn.wrap(_mlp(), torch.zeros(2, 1, 8, 8)), "espn")
    (task,) = learner._tasks([((x, y), None)], [None], [None])
    fit, held = routing.held_out(task)
    assert len(fit.train) + len(held.train) == len(task.train) == 300
    assert held.train.index.tolist() == list(range(9, 300, 10))
    assert set(fit.train.index.tolist()).isdisjoint(held.train.index.tolist())


def test_the_option_s_statistics_survive_save_and_load(fake_mnist, fc_test_model, tmp_path):
    """(A killed and resumed run: test_task_agnostic's resume test, with the option.)"""
    learner, _ = _learn(True, n_tasks=2)
    loaded = espn.load(learner.save(tmp_path / "saved"), model=_mlp())
    keys = {*STAT_KEYS, *routing.OPTION_KEYS}
    for a, b in zip(learner.supernet.masks, loaded.supernet.masks, strict=True):
        assert set(a.stats) == set(b.stats) == keys
        assert all(torch.equal(a.stats[k], b.stats[k]) for k in keys)


def test_input_subspace_prediction_equals_the_task_given_one_and_is_refused_without():
    learner, _ = _learn(True)
    x = torch.cat([t.test.x for t in learner.tasks])
    tasks = learner.infer_task(x, rule="input-subspace")
    classes = learner.predict(x, rule="input-subspace")
    for t in range(N_TASKS):
        rows = tasks == t
        assert torch.equal(classes[rows], learner.predict(x[rows], task=t))
    plain, _ = _learn(False, n_tasks=1)
    with pytest.raises(InferenceError, match="task_agnostic=True"):
        plain.predict(x[:2], rule="input-subspace")


def test_tasks_separable_by_construction_are_routed_right():
    """Each task's inputs offset by its own constant (-4, 0, 4): every rule that reads the
    inputs or the trained sub-networks' features picks the right task for > 90% of the
    held-out samples."""
    learner, _ = _learn(True, shifts=(-4.0, 0.0, 4.0))
    rules = ["input-gaussian", "input-subspace", "mahalanobis"]
    docs = evaluate_rules(learner.supernet, learner.tasks, rules)
    for doc in docs:
        assert doc["average"]["task_picked"] > 90, (doc["rule"], doc["confusion"])


def test_input_mixture_has_a_component_per_mode_and_is_the_gaussian_density():
    """A class of two far-apart modes (as many samples as two components take) is fitted by
    two components centred on them, weighted by their shares; a class too small for two is
    one. One component's score is the negative log-density per dimension of its Gaussian
    (principal directions' variances plus an isotropic rest) of the input and its edges."""
    g = torch.Generator().manual_seed(0)
    n = 2 * subspace.PER_COMPONENT
    mode = torch.where(torch.arange(n) < n // 4, 6.0, -6.0)
    x = mode[:, None, None, None] + torch.randn(n, 1, 4, 4, generator=g)
    y = torch.zeros(n, dtype=torch.long)
    stats = subspace.fit_subspaces(x, y)
    centres = stats["input_centres"][:, :16].mean(1)  # the input's part of each centre
    assert sorted(centres.round().tolist()) == [-6.0, 6.0]
    assert sorted(stats["input_weight"].tolist()) == pytest.approx([0.25, 0.75])
    assert stats["input_basis"].shape == (2, subspace.K, 3 * 16)  # input, 2 axes of edges
    one = subspace.fit_subspaces(x[: n // 4], y[: n // 4])
    assert one["input_weight"].tolist() == [1.0]
    basis, eigen, noise = one["input_basis"][0].double(), one["input_eigen"][0], one["input_noise"]
    cov = basis.T @ torch.diag(eigen.double() - noise.double()) @ basis
    cov += noise.double() * torch.eye(cov.shape[0], dtype=torch.float64)
    gauss = torch.distributions.MultivariateNormal(one["input_centres"][0].double(), cov)
    f = subspace.edges(x[:8])
    expected = -gauss.log_prob(f) / f.shape[1] - 0.5 * math.log(2 * math.pi)
    assert torch.allclose(subspace.subspace_nll(x[:8], one).double(), expected, rtol=1e-4)


@pytest.mark.slow  # a CLI run and a confusion plot per rule: a minute on a loaded CPU
def test_espn_run_task_agnostic_ends_with_every_rule_and_routing_flops_summed(
    fake_mnist, fc_test_model, tmp_path
):
    """``espn run --task-agnostic`` stores every rule the run can use (one the default) and
    reports a rule that runs every sub-network at the sum of the tasks' FLOPs ratios;
    ``espn evaluate --rule all`` prints one row per rule."""
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*cli_options(out), "--task-agnostic"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    stored = doc["task_agnostic"]
    usable = {"input-gaussian", "input-subspace", "entropy", "energy", "mahalanobis",
              "entropy-mahalanobis"}  # fmt: skip
    assert set(stored) == usable
    assert sum(d["default"] for d in stored.values()) == 1
    assert stored["entropy"]["flops_passes"] == pytest.approx(sum(doc["flops_ratio"]))
    assert stored["input-subspace"]["flops_passes"] == pytest.approx(
        sum(doc["flops_ratio"]) / len(doc["flops_ratio"])
    )
    shown = CliRunner().invoke(
        app, ["evaluate", "--run", str(out), "--task-agnostic", "--rule", "all"]
    )
    assert shown.exit_code == 0, shown.output
    assert all(rule[:7] in shown.output for rule in usable)


def test_convolutions_keep_one_pass_per_task():
    """A batched convolution equals the per-task ones only to float rounding: evaluation runs
    a convolutional network task by task, even where every task's tensors have one shape."""
    torch.manual_seed(0)
    learner = espn.ContinualLearner(
        espn.wrap(SignalNet(), torch.zeros(2, 1, LENGTH)), "espn", gamma=0.5, epochs=(1, 1, 1)
    )
    for task in range(2):
        x, y = signals(task, 60)
        learner.learn((x, y % 3))  # three classes each: heads of one shape
    assert batched_states(learner.supernet, range(2)) is None
