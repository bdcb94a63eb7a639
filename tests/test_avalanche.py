"""espn as an Avalanche strategy: a tiny task-incremental Avalanche benchmark built from
tensors, learned with zero forgetting through espn's engine, FLOPs reported per task."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from espn.errors import EspnError

pytest.importorskip("avalanche")
pytestmark = pytest.mark.filterwarnings("ignore:No loggers specified")
with warnings.catch_warnings():  # Avalanche's import-time notices (no QP solver, ...)
    warnings.simplefilter("ignore")
    from avalanche.benchmarks import (
        benchmark_from_datasets,
        class_incremental_benchmark,
        task_incremental_benchmark,
    )
    from avalanche.benchmarks.utils import as_classification_dataset
    from avalanche.evaluation.metrics import accuracy_metrics
    from avalanche.training.plugins import EvaluationPlugin

    from espn.integrations.avalanche import ESPNStrategy, optim_config, split_epochs

PROTOTYPES = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(7))


def dataset(n: int, classes: list[int], seed: int):
    """``n`` 1x8x8 samples of ``classes``: a class prototype plus noise (learnable)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor(classes)[torch.randint(len(classes), (n,), generator=g)]
    x = PROTOTYPES[y] + 0.7 * torch.randn(n, 1, 8, 8, generator=g)
    data = TensorDataset(x, y)
    data.targets = y.tolist()
    return as_classification_dataset(data)


def scenario():
    """Two tasks (classes 0,1 then 2,3), each experience with its task label."""
    train = [dataset(256, [0, 1], 0), dataset(256, [2, 3], 1)]
    test = [dataset(128, [0, 1], 2), dataset(128, [2, 3], 3)]
    return task_incremental_benchmark(benchmark_from_datasets(train=train, test=test))


def plain_model() -> nn.Module:
    """The user's own model: a plain MLP whose last layer becomes one head per task."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 4)
    )


def strategy(**kw) -> ESPNStrategy:
    model = plain_model()
    options = {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-2),
        "train_mb_size": 32,
        "train_epochs": 10,
        "eval_mb_size": 128,
        "evaluator": EvaluationPlugin(accuracy_metrics(experience=True), loggers=[]),
        "alpha": 0.3,
    }
    return ESPNStrategy(**(options | kw))


def accuracy(results: dict, task: int) -> float:
    return results[f"Top1_Acc_Exp/eval_phase/test_stream/Task{task:03d}/Exp{task:03d}"]


@pytest.mark.parametrize("method", ["espn", "packnet"])
def test_two_tasks_are_learned_with_zero_forgetting_and_their_flops(method, tmp_path):
    bench = scenario()
    learner = strategy(method=method)
    x0 = torch.stack([bench.test_stream[0].dataset[i][0] for i in range(128)])
    labels0 = torch.zeros(128, dtype=torch.long)

    first = learner.train(bench.train_stream[0])
    before = learner.predict(x0, labels0)
    after_first = learner.eval(bench.test_stream)
    second = learner.train(bench.train_stream[1])
    after = learner.eval(bench.test_stream)

    now = learner.predict(x0, labels0)  # scores of the classes seen so far: 0..3
    assert torch.equal(now[:, :2], before) and torch.isinf(now[:, 2:]).all()  # bit for bit
    assert accuracy(after, 0) == accuracy(after_first, 0) > 0.85  # learned, then kept
    assert accuracy(after, 1) > 0.85
    assert before.shape == (128, 2) and torch.isfinite(before).all()
    gamma = 0.2 if method == "espn" else 1.0
    assert learner.method.cfg.gamma == gamma and learner.method.cfg.epochs == (3, 4, 3)
    sn = learner.supernet
    for label, results in ((0, first), (1, second)):
        record = learner.task_records[label]
        mask = sn.masks[learner.task_index[label]]
        assert record["flops"] == sn.flops(mask.units)
        assert record["flops_ratio"] == record["flops"] / sn.dense_flops <= gamma + 1e-9
        assert 0 < record["new_weights"] <= record["weight_budget"]
        name = f"train_phase/train_stream/Task{label:03d}"
        assert results[f"FLOPs_Ratio_Exp/{name}"] == record["flops_ratio"]
        assert results[f"New_Weights_Exp/{name}"] == record["new_weights"]
    if method == "espn":
        assert learner.task_records[0]["units_kept"] < 1.0  # units pruned to meet gamma
        # the slim export of task 0 (espn's learner behind the strategy) computes its logits
        # with the FLOPs counted independently on the exported model
        report = learner.learner.export(0, tmp_path / "task0.pt2", data=(x0, labels0))
        assert report.flops == learner.task_records[0]["flops"] and report.checked_samples == 128


def test_the_methods_own_settings_reach_it():
    learner = strategy(method="supsup", supsup_k=0.3, alpha=1.0, epochs=(1, 1, 1))
    assert learner.method.k == 0.3 and learner.method.cfg.epochs == (1, 1, 1)
    assert learner.optim.optimizer == "adam" and learner.optim.lr == 1e-2


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"gama": 0.2}, ValueError, "unknown setting 'gama' for method 'espn'"),
        ({"supsup_k": 0.3}, ValueError, "supsup_k applies to method 'supsup' only"),
        ({"gamma": 1.5}, ValueError, r"gamma must be in \(0, 1\], got 1.5"),
        ({"optimizer": "adagrad"}, EspnError, "unknown optimizer 'adagrad'; choose one of"),
        ({"train_epochs": 0}, EspnError, "train_epochs must be >= 1, got 0"),
    ],
)
def test_bad_settings_are_refused_when_built(kw, error, message):
    with pytest.raises(error, match=message):
        strategy(**kw)


def test_streams_espn_cannot_learn_are_refused():
    learner = strategy()
    no_labels = class_incremental_benchmark(
        {"train": dataset(64, [0, 1, 2, 3], 0)}, num_experiences=2
    )
    with pytest.raises(EspnError, match="has no task labels; espn learns task-incremental"):
        learner.train(no_labels.train_stream[0])
    bench = scenario()
    learner.train(bench.train_stream[0])
    with pytest.raises(EspnError, match="task label 0 is learned already; espn learns each"):
        learner.train(bench.train_stream[0])


def test_optimizer_settings_come_from_the_torch_optimizer():
    params = [nn.Parameter(torch.zeros(1))]
    sgd = optim_config(torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4))
    assert (sgd.optimizer, sgd.lr, sgd.momentum, sgd.weight_decay) == ("sgd", 0.05, 0.9, 1e-4)
    assert optim_config(torch.optim.Adam(params, betas=(0.0, 0.99))).betas == (0.0, 0.99)
    assert optim_config(None).optimizer == "adam"
    with pytest.raises(EspnError, match="optimizer Adagrad is not one espn's engine runs"):
        optim_config(torch.optim.Adagrad(params))
    assert [split_epochs(n) for n in (1, 2, 4, 10)] == [(0, 1, 0), (0, 2, 0), (1, 2, 1), (3, 4, 3)]


def test_without_avalanche_the_import_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "avalanche.training.templates", None)
    monkeypatch.delitem(sys.modules, "espn.integrations.avalanche")
    with pytest.raises(ImportError, match=r"pip install 'espn\[avalanche\]'"):
        importlib.import_module("espn.integrations.avalanche")


def test_the_strategy_learns_through_the_one_learner(monkeypatch):
    """Each experience is one ``ContinualLearner.learn`` call: every task the engine trains
    is trained for espn's learner, none by the strategy driving the engine itself."""
    from helpers.learner_spy import LearnerSpy

    spy = LearnerSpy(monkeypatch)
    bench = scenario()
    learner = strategy(train_epochs=3, train_mb_size=64)
    for experience in bench.train_stream:
        learner.train(experience)
    assert spy.learned == ["task 0", "task 1"]
    assert [name for name, _ in spy.trained] == ["task 0", "task 1"] and spy.trained_by_learner
    assert learner.learner is not None and learner.learner.names == ["task 0", "task 1"]
    assert [learner.task_records[t] for t in (0, 1)] == learner.learner.records
