"""Slim fine-tuning and slim evaluation compute what the masked supernet computes."""

from __future__ import annotations

import json

import pytest
import torch

import espn
import espn.run_directory as run_directory_module
import espn.training.slim_step as slim_module
from espn.config import make_config
from espn.data.tasks import TaskSequence
from espn.evaluation.metrics import task_accuracy, task_logits
from espn.evaluation.slim_eval import SlimEvaluator
from espn.experiment import run_experiment
from espn.methods.base import METHODS, MethodConfig
from espn.models.registry import ModelSpec
from espn.models.resnet import BasicBlock, ResNet
from espn.supernet import Supernet
from espn.supernet.layers import with_unions
from espn.training.engine import Engine
from espn.training.optim import OptimConfig
from helpers.arch import fingerprint
from helpers.deploy import Killed, kill_at_step, make_model, run_options, tiny_sequence
from helpers.tokens import tiny_vit

#: float32 sums taken over fewer terms in another order: the copies may differ by rounding
ATOL = 1e-5


class SlimSpy:
    """Counts the slim phases the engine built (and the ones it fell back from)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.built: list[bool] = []
        real = slim_module.SlimPhase.build.__func__  # type: ignore[attr-defined]

        def build(cls, *args, **kwargs):
            phase = real(cls, *args, **kwargs)
            self.built.append(phase is not None)
            return phase

        monkeypatch.setattr(slim_module.SlimPhase, "build", classmethod(build))


def model(kind: str) -> torch.nn.Module:
    """``fc``: an FC net; ``conv``: a residual block whose stream is one unit group;
    ``resnet``: the reduced ResNet18's structure at width 8, streams pruned per conv."""
    if kind == "resnet":
        return ResNet(BasicBlock, [2, 2, 1, 1], 8, 1, 3, True, streams="per-conv")
    return make_model(kind)


def two_tasks(
    kind: str, method: str, optim: OptimConfig, slim: bool, epochs=(1, 1, 2), gamma=0.5
) -> tuple[Supernet, TaskSequence, list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """Task 0 learned through the masked supernet, then task 1 with slim fine-tuning on or
    off; returns the supernet, the tasks, the frozen weights at each epoch end of task 1 and
    the weights before it."""
    seq = tiny_sequence(2)
    torch.manual_seed(0)
    sn = Supernet(model(kind), seq.tasks[0].train.x[:2])
    cfg = MethodConfig(gamma=gamma, alpha=0.3, epochs=epochs)
    engine = Engine(sn, METHODS.get(method)(cfg), optim, 16, seed=0, slim_training=False)
    engine.train_task(seq.tasks[0], 0)
    engine.slim_training = slim
    before = {n: layer.weight.detach().clone() for n, layer in sn.layers.items()}
    seen: list[dict[str, torch.Tensor]] = []

    def frozen_now(phase: str, epoch: int) -> None:
        seen.append({n: layer.weight[layer.frozen].clone() for n, layer in sn.layers.items()})

    engine.train_task(seq.tasks[1], 1, on_epoch_end=frozen_now)
    return sn, seq, seen, before


def assert_same_task(masked: Supernet, slim: Supernet) -> None:
    """Equal masks; equal trained weights and task state (on alive units) within rounding."""
    units = masked.masks[1].units
    assert all(torch.equal(units[g], slim.masks[1].units[g]) for g in units)
    units = with_unions(units, masked.unions)
    for name, layer in masked.layers.items():
        other = slim.layers[name]
        assert torch.equal(layer.weight_mask, other.weight_mask), name
        mask = layer.weight_mask.bool()
        torch.testing.assert_close(other.weight[mask], layer.weight[mask], atol=ATOL, rtol=0)
    masked.use_task(1)
    slim.use_task(1)
    for name, m in masked.task_modules.items():
        other = dict(slim.task_modules[name].named_parameters())
        for key, value in m.named_parameters():
            alive = value.detach()
            if key == "weight" and hasattr(m, "in_units") and m.in_units:  # a head: alive inputs
                alive_in = units[m.in_units]
                torch.testing.assert_close(
                    other[key][:, alive_in], alive[:, alive_in], atol=ATOL, rtol=0
                )
            else:
                torch.testing.assert_close(other[key], alive, atol=ATOL, rtol=0)


OPTIMIZERS = [
    OptimConfig("adam", lr=1e-2, betas=(0.0, 0.999)),
    OptimConfig("rmsprop", lr=1e-3, momentum=0.5, weight_decay=1e-2),
    OptimConfig("sgd", lr=0.05, momentum=0.9, weight_decay=1e-3),
]


@pytest.mark.parametrize("kind", ["fc", "conv", "resnet"])
@pytest.mark.parametrize("method", ["espn", "individual"])
def test_slim_fine_tuning_equals_masked_fine_tuning(monkeypatch, method, kind):
    """Same steps on the same batches: the same weights, task state and accuracy."""
    optim = OPTIMIZERS[0]
    masked, seq, _, _ = two_tasks(kind, method, optim, slim=False)
    spy = SlimSpy(monkeypatch)
    slim, _, _, _ = two_tasks(kind, method, optim, slim=True)
    assert spy.built == [True], "the fine-tuning phase trained a slim copy"
    assert_same_task(masked, slim)
    for t, task in enumerate(seq.tasks):
        assert task_accuracy(slim, task, t) == task_accuracy(masked, task, t)


def test_a_method_that_keeps_every_unit_fine_tunes_masked(monkeypatch):
    """PackNet prunes weights, not units, and ESPN at gamma 1 keeps every unit: a copy of the
    whole width would only skip mask products, so the supernet trains masked."""
    spy = SlimSpy(monkeypatch)
    two_tasks("fc", "packnet", OPTIMIZERS[0], slim=True)
    assert spy.built == []
    masked, _, _, _ = two_tasks("fc", "espn", OPTIMIZERS[0], slim=False, gamma=1.0)
    slim, _, _, _ = two_tasks("fc", "espn", OPTIMIZERS[0], slim=True, gamma=1.0)
    assert spy.built == [False]  # the copy was built, kept nothing narrower, and dropped
    assert_same_task(masked, slim)


@pytest.mark.parametrize("optim", OPTIMIZERS[1:], ids=lambda o: o.name)
def test_momentum_and_weight_decay_train_the_same_weights(monkeypatch, optim):
    """Optimizer state carried in from the earlier phases, and decay (the guard's restore)."""
    masked, _, _, _ = two_tasks("fc", "espn", optim, slim=False)
    spy = SlimSpy(monkeypatch)
    slim, _, _, _ = two_tasks("fc", "espn", optim, slim=True)
    assert spy.built == [True]
    assert_same_task(masked, slim)


@pytest.mark.parametrize("kind", ["fc", "resnet"])
def test_frozen_weights_bit_identical_after_every_epoch_of_a_slim_phase(monkeypatch, kind):
    optim = OptimConfig("rmsprop", lr=1e-3, momentum=0.5, weight_decay=1e-2)
    spy = SlimSpy(monkeypatch)
    sn, _, seen, before = two_tasks(kind, "espn", optim, slim=True, epochs=(1, 1, 3))
    assert spy.built == [True] and len(seen) == 5
    for epoch in seen:
        for name in sn.layers:
            frozen = sn.masks[0].weight_mask(name)  # task 0's weights: frozen in task 1
            assert torch.equal(
                epoch[name].view(torch.int32), before[name][frozen].view(torch.int32)
            )


def test_slim_copy_holds_alive_units_only():
    """The copy trains the widths the export builds (a model without residual unions)."""
    seq = tiny_sequence(1)
    torch.manual_seed(0)
    sn = Supernet(make_model("fc"), seq.tasks[0].train.x[:2])
    strategy = METHODS.get("espn")(MethodConfig(gamma=0.5, alpha=0.3, epochs=(1, 1, 1)))
    engine = Engine(sn, strategy, OPTIMIZERS[0], 16, seed=0)
    widths: list[dict[str, tuple[int, ...]]] = []
    real = slim_module.SlimPhase.__init__

    def record(self, *args, **kwargs):
        real(self, *args, **kwargs)
        widths.append({n: tuple(m.weight.shape) for n, m in self.net.layers.items()})

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(slim_module.SlimPhase, "__init__", record)
        engine.train_task(seq.tasks[0], 0)
    alive = sn.alive_counts()
    assert len(widths) == 1
    for name, shape in widths[0].items():
        layer = sn.layers[name]
        rows = alive[layer.out_units] if layer.out_units else layer.weight.shape[0]
        cols = alive[layer.in_units] if layer.in_units else layer.weight.shape[1]
        assert shape[:2] == (rows, cols), name
    assert sum(alive.values()) < sum(sn.group_sizes.values())


def test_no_slim_training_trains_the_masked_supernet(monkeypatch):
    spy = SlimSpy(monkeypatch)
    two_tasks("fc", "espn", OPTIMIZERS[0], slim=False)
    assert spy.built == []


def test_methods_that_do_not_declare_it_train_masked(monkeypatch):
    """SupSup trains scores through its own forward: its phases never build a slim copy."""
    spy = SlimSpy(monkeypatch)
    seq = tiny_sequence(1)
    torch.manual_seed(0)
    sn = Supernet(make_model("fc"), seq.tasks[0].train.x[:2])
    strategy = METHODS.get("supsup")(MethodConfig(epochs=(1, 1, 1)))
    Engine(sn, strategy, OPTIMIZERS[0], 16, seed=0).train_task(seq.tasks[0], 0)
    assert spy.built == []


@pytest.mark.parametrize("kind", ["fc", "conv", "resnet"])
def test_evaluation_through_slim_copies_equals_the_supernet(kind):
    seq = tiny_sequence(3)
    torch.manual_seed(0)
    sn = Supernet(model(kind), seq.tasks[0].train.x[:2])
    strategy = METHODS.get("espn")(MethodConfig(gamma=0.5, alpha=0.3, epochs=(1, 1, 1)))
    engine = Engine(sn, strategy, OPTIMIZERS[0], 16, seed=0)
    evaluator = SlimEvaluator(sn)
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
        for j in range(t + 1):
            want = task_logits(sn, seq.tasks[j], j)
            got = torch.cat([evaluator.logits(x, j) for x, _ in seq.tasks[j].batches("test", 32)])
            torch.testing.assert_close(
                got, want, atol=ATOL * max(1.0, float(want.abs().max())), rtol=0
            )
            assert evaluator.accuracy(seq.tasks[j], j) == task_accuracy(sn, seq.tasks[j], j)
    copies = [evaluator.cache[t][1] for t in range(3)]
    assert all(c is not None for c in copies), "every task ran through its slim copy"
    sizes = [sum(p.numel() for p in c.parameters()) for c in copies if c is not None]
    assert max(sizes) < sum(layer.weight.numel() for layer in sn.layers.values())
    first = copies[0]
    engine.train_task(tiny_sequence(4).tasks[3], 3)
    evaluator.accuracy(seq.tasks[0], 0)
    assert evaluator.cache[0][1] is first, "a committed task's copy is built once"


def test_a_task_whose_copy_differs_is_evaluated_through_the_supernet(monkeypatch):
    """The check on the first batch: a copy that does not match is not used."""
    seq = tiny_sequence(1)
    torch.manual_seed(0)
    sn = Supernet(make_model("fc"), seq.tasks[0].train.x[:2])
    strategy = METHODS.get("espn")(MethodConfig(gamma=0.5, alpha=0.3, epochs=(1, 1, 1)))
    Engine(sn, strategy, OPTIMIZERS[0], 16, seed=0).train_task(seq.tasks[0], 0)
    import espn.evaluation.slim_eval as eval_module

    real = eval_module.slim_copy

    def broken(*args, **kwargs):
        model = real(*args, **kwargs)
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        return model

    monkeypatch.setattr(eval_module, "slim_copy", broken)
    evaluator = SlimEvaluator(sn)
    assert evaluator.accuracy(seq.tasks[0], 0) == task_accuracy(sn, seq.tasks[0], 0)
    assert evaluator.cache[0][1] is None


def test_killed_inside_a_slim_phase_resumes_exactly(
    tmp_path, monkeypatch, fake_mnist, fc_test_model
):
    """16 steps per task (epochs 1,1,2 of 4 steps): step 30 is task 1's sixth fine-tuning
    step, in the second epoch of its slim phase, after one slim epoch was checkpointed (every
    pass is, with no minimum time between checkpoints)."""
    monkeypatch.setattr(run_directory_module, "CHECKPOINT_SECONDS", 0.0)
    options = run_options(tmp_path / "reference", epochs=(1, 1, 2))
    spy = SlimSpy(monkeypatch)
    run_experiment(make_config(**options), progress=False)
    assert spy.built == [True, True, True]
    cfg = make_config(**(options | {"out": tmp_path / "run"}))
    with monkeypatch.context() as mp:
        kill_at_step(mp, 30)
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    position = json.loads((tmp_path / "run/checkpoint/manifest.json").read_text())["training"]
    assert position["task"] == 1 and position["position"]["epoch"] == 1
    run_experiment(cfg, progress=False, resume=True)
    assert fingerprint(tmp_path / "run") == fingerprint(tmp_path / "reference")


def test_a_model_the_copy_cannot_slice_fine_tunes_masked(monkeypatch):
    """A ViT's token gates and task LayerNorms are not sliced: its fine-tuning falls back to
    the masked supernet, and trains as it does with slim_training off."""
    seq = tiny_sequence(1)
    spec = ModelSpec((1, 8, 8), 3, True)
    results = []
    for slim in (True, False):
        torch.manual_seed(0)
        sn = Supernet(tiny_vit(spec), seq.tasks[0].train.x[:2])
        strategy = METHODS.get("espn")(MethodConfig(gamma=0.5, alpha=0.3, epochs=(1, 1, 1)))
        spy = SlimSpy(monkeypatch)
        engine = Engine(sn, strategy, OPTIMIZERS[0], 16, seed=0, slim_training=slim)
        engine.train_task(seq.tasks[0], 0)
        assert spy.built == ([False] if slim else [])
        results.append({n: layer.weight.detach().clone() for n, layer in sn.layers.items()})
    assert all(torch.equal(results[0][n], results[1][n]) for n in results[0])
    with pytest.raises(slim_module.SlimUnsupported, match="not sliced"):
        slim_module.SlimNet(sn)


def test_dropout_keeps_the_masked_supernet():
    """A dropout's random mask has its input's width: a slim copy would draw other masks."""
    seq = tiny_sequence(1)
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 3)
    )
    sn = espn.wrap(net, seq.tasks[0].train.x[:2])
    with pytest.raises(slim_module.SlimUnsupported, match="draws random masks"):
        slim_module.SlimNet(sn)
