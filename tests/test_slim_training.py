"""Slim fine-tuning and slim evaluation compute what the masked supernet computes."""

from __future__ import annotations

import gc
import itertools
import json
import weakref
from collections import Counter

import pytest
import torch
from torch import nn

import espn
import espn.runs.resuming as run_directory_module
import espn.training.slim_net as net_module
import espn.training.slim_step as slim_module
from espn.api.experiment import run_experiment
from espn.data.tasks import TaskSequence
from espn.evaluation.metrics import task_accuracy, task_logits
from espn.evaluation.slim_eval import SlimEvaluator
from espn.layers.base import Cut, take
from espn.methods.base import METHODS, MethodConfig
from espn.models.convert import to_supernet
from espn.models.mobilenet import MobileNetV2Small
from espn.models.registry import ModelSpec
from espn.models.resnet import BasicBlock, ResNet
from espn.pruning.pruner import gate_magnitude
from espn.runs.config import make_config
from espn.supernet import Supernet
from espn.supernet.layers import UnitModule, with_unions
from espn.training.callbacks import Callback, EpochStart, StepEnd
from espn.training.engine import Engine
from espn.training.optim import OptimConfig
from helpers.arch import fingerprint
from helpers.deploy import (
    AtEpochEnd,
    Killed,
    kill_at_step,
    make_model,
    run_options,
    tiny_sequence,
    watch_engines,
)
from helpers.tokens import tiny_vit

#: float32 sums taken over fewer terms in another order: the copies may differ by rounding
ATOL = 1e-5


@pytest.fixture(autouse=True)
def copies_at_every_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny task has one or two steps between prune events, where a copy would not pay
    for itself (see ``slim_prune_pays``): these tests take one after every event that kills
    units, to check that it trains what the masked supernet trains."""
    monkeypatch.setattr(slim_module, "SLIM_REBUILD_COST", 0.0)
    monkeypatch.setattr(slim_module, "SLIM_CONV_SETUP", 0.0)


class SlimSpy(Callback):
    """Records the slim copies the engine built (True) and the ones it fell back from
    (False), per phase (``built``: all of them in order; ``phase(name)``: one phase's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.built: list[bool] = []
        self.phases: list[str] = []
        self.now = ""
        real = slim_module.SlimPhase.build.__func__  # type: ignore[attr-defined]

        def build(cls, *args, **kwargs):
            phase = real(cls, *args, **kwargs)
            self.built.append(phase is not None)
            self.phases.append(self.now)
            return phase

        monkeypatch.setattr(slim_module.SlimPhase, "build", classmethod(build))
        watch_engines(monkeypatch, self)

    def on_epoch_start(self, learner, event: EpochStart) -> None:
        self.now = event.phase

    def phase(self, name: str) -> list[bool]:
        return [b for b, p in zip(self.built, self.phases, strict=True) if p == name]


def model(kind: str) -> torch.nn.Module:
    """``fc``: an FC net; ``conv``: a residual block whose stream is one unit group;
    ``resnet``: the reduced ResNet18's structure at width 8, streams pruned per conv;
    ``mobilenet``: MobileNetV2-small's structure at width 8 (depthwise convs, a dropout
    before the head); ``conv1d``: 1-D convolutions over the flattened image, task BatchNorm1d;
    ``convhead``: a convolutional classifier (SqueezeNet's), cut through its adapters too."""
    if kind in ("conv1d", "convhead"):
        torch.manual_seed(0)
        conv, norm, pool = (
            (nn.Conv1d, nn.BatchNorm1d, nn.AdaptiveAvgPool1d)
            if kind == "conv1d"
            else (nn.Conv2d, nn.BatchNorm2d, nn.AdaptiveAvgPool2d)
        )
        head = nn.Linear(8, 3) if kind == "conv1d" else conv(8, 3, 1)
        layers = [conv(1, 8, 3), norm(8), nn.ReLU(), conv(8, 8, 3), norm(8), nn.ReLU()]
        layers += [pool(1), nn.Flatten(), head] if kind == "conv1d" else [head, pool(1)]
        flat = [nn.Flatten(2)] if kind == "conv1d" else []
        plain = nn.Sequential(*flat, *layers, *([] if kind == "conv1d" else [nn.Flatten()]))
        return to_supernet(plain, torch.zeros(2, 1, 8, 8))
    if kind == "resnet":
        return ResNet(BasicBlock, [2, 2, 1, 1], 8, 1, 3, True, streams="per-conv")
    if kind == "mobilenet":
        torch.manual_seed(0)
        plain = MobileNetV2Small(1, 3, 0.25, ((1, 8, 1, 1), (2, 8, 2, 2)), 16, dropout=0.3)
        return to_supernet(plain, torch.zeros(2, 1, 8, 8))
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

    engine.callbacks.append(AtEpochEnd(frozen_now))
    engine.train_task(seq.tasks[1], 1)
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


def near_ties(want: torch.Tensor, got: torch.Tensor) -> int:
    """Samples whose prediction the rounding between two float paths may change: the top two
    of ``want``'s logits closer than twice the largest difference from ``got``'s."""
    top = want.topk(2, dim=1).values
    return int((top[:, 0] - top[:, 1] <= 2 * float((got - want).abs().max())).sum())


OPTIMIZERS = [
    OptimConfig("adam", lr=1e-2, betas=(0.0, 0.999)),
    OptimConfig("rmsprop", lr=1e-3, momentum=0.5, weight_decay=1e-2),
    OptimConfig("sgd", lr=0.05, momentum=0.9, weight_decay=1e-3),
]


@pytest.mark.parametrize("kind", ["fc", "conv", "resnet", "mobilenet", "conv1d", "convhead"])
@pytest.mark.parametrize("method", ["espn", "individual"])
def test_slim_fine_tuning_equals_masked_fine_tuning(monkeypatch, method, kind):
    """Same steps on the same batches: the same weights, task state and accuracy.

    The MobileNet trains with SGD: the shift of the BatchNorm that ends its first block gets
    no gradient but float rounding (the next block's BatchNorm removes any per-channel shift
    of its 1x1 convolution's input), which Adam scales up to steps of its learning rate, so
    that two runs summing in another order move it apart whatever they compute."""
    optim = OPTIMIZERS[2] if kind == "mobilenet" else OPTIMIZERS[0]
    masked, seq, _, _ = two_tasks(kind, method, optim, slim=False)
    spy = SlimSpy(monkeypatch)
    slim, _, _, _ = two_tasks(kind, method, optim, slim=True)
    assert spy.phase("finetune") == [True], "the fine-tuning phase trained a slim copy"
    assert_same_task(masked, slim)
    for t, task in enumerate(seq.tasks):
        near = near_ties(task_logits(masked, task, t), task_logits(slim, task, t))
        gap = task_accuracy(slim, task, t) - task_accuracy(masked, task, t)
        assert abs(gap) <= 100 * near / len(task.test)


def test_a_method_that_keeps_every_unit_fine_tunes_masked(monkeypatch):
    """PackNet prunes weights, not units, and ESPN at gamma 1 keeps every unit: a copy of the
    whole width would only skip mask products, so the supernet trains masked."""
    spy = SlimSpy(monkeypatch)
    two_tasks("fc", "packnet", OPTIMIZERS[0], slim=True)
    assert spy.built == []
    masked, _, _, _ = two_tasks("fc", "espn", OPTIMIZERS[0], slim=False, gamma=1.0)
    slim, _, _, _ = two_tasks("fc", "espn", OPTIMIZERS[0], slim=True, gamma=1.0)
    # the fine-tuning copy was built, kept nothing narrower, and dropped; no prune phase
    # prunes units, so none trains a copy
    assert spy.built == [False] and spy.phases == ["finetune"]
    assert_same_task(masked, slim)


@pytest.mark.parametrize("optim", OPTIMIZERS[1:], ids=lambda o: o.optimizer)
def test_momentum_and_weight_decay_train_the_same_weights(monkeypatch, optim):
    """Optimizer state carried in from the earlier phases, and decay (the guard's restore)."""
    masked, _, _, _ = two_tasks("fc", "espn", optim, slim=False)
    spy = SlimSpy(monkeypatch)
    slim, _, _, _ = two_tasks("fc", "espn", optim, slim=True)
    assert spy.phase("finetune") == [True] and all(spy.phase("prune"))
    assert_same_task(masked, slim)


@pytest.mark.parametrize("kind", ["fc", "resnet", "conv1d", "convhead"])
def test_frozen_weights_bit_identical_after_every_epoch_of_a_slim_phase(monkeypatch, kind):
    optim = OptimConfig("rmsprop", lr=1e-3, momentum=0.5, weight_decay=1e-2)
    spy = SlimSpy(monkeypatch)
    sn, _, seen, before = two_tasks(kind, "espn", optim, slim=True, epochs=(1, 2, 3))
    assert spy.phase("finetune") == [True] and len(seen) == 6
    assert len(spy.phase("prune")) > 1 and all(spy.phase("prune"))
    for epoch in seen:
        for name in sn.layers:
            frozen = sn.masks[0].weight_mask(name)  # task 0's weights: frozen in task 1
            assert torch.equal(
                epoch[name].view(torch.int32), before[name][frozen].view(torch.int32)
            )


def test_no_slim_copy_outlives_its_phase(monkeypatch):
    """Every copy's layers are freed once training no longer uses them (a layer's cached
    product, whose autograd graph held the layer, once kept each copy alive for good)."""
    layers = []
    real = slim_module.SlimPhase.build.__func__  # type: ignore[attr-defined]

    def build(cls, *args, **kwargs):
        phase = real(cls, *args, **kwargs)
        if phase is not None:
            layers.extend(weakref.ref(layer) for layer in phase.net.layers.values())
        return phase

    monkeypatch.setattr(slim_module.SlimPhase, "build", classmethod(build))
    two_tasks("fc", "espn", OPTIMIZERS[2], slim=True)
    gc.collect()
    assert layers and all(layer() is None for layer in layers)


def test_slim_copy_holds_alive_units_only():
    """Every copy, in the prune phase after each event and in the fine-tuning, trains the
    widths the export builds (a model without residual unions) of the units alive then."""
    seq = tiny_sequence(1)
    torch.manual_seed(0)
    sn = Supernet(make_model("fc"), seq.tasks[0].train.x[:2])
    strategy = METHODS.get("espn")(MethodConfig(gamma=0.5, alpha=0.3, epochs=(1, 1, 1)))
    engine = Engine(sn, strategy, OPTIMIZERS[0], 16, seed=0)
    widths: list[tuple[dict[str, int], dict[str, tuple[int, ...]]]] = []
    ones: list[bool] = []
    real = slim_module.SlimPhase.__init__

    def record(self, *args, **kwargs):
        real(self, *args, **kwargs)
        shapes = {n: tuple(m.weight.shape) for n, m in self.net.layers.items()}
        widths.append((sn.alive_counts(), shapes))
        # a copy's weight is zero outside its mask: its layers use it as an all-ones mask
        ones.append(all(m.mask_is_ones() for m in self.net.layers.values()))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(slim_module.SlimPhase, "__init__", record)
        engine.train_task(seq.tasks[0], 0)
    assert sn.alive_counts() == widths[-1][0], "the fine-tuning copy has the final units"
    assert len(widths) == 4, "three prune-phase copies (events at steps 0, 1, 2) and one"
    assert all(ones), "every copy's layers skip the mask product"
    assert len({tuple(alive.values()) for alive, _ in widths[:3]}) == 3, "each one narrower"
    for alive, shapes in widths:
        for name, shape in shapes.items():
            layer = sn.layers[name]
            rows = alive[layer.out_units] if layer.out_units else layer.weight.shape[0]
            cols = alive[layer.in_units] if layer.in_units else layer.weight.shape[1]
            assert shape[:2] == (rows, cols), name
    assert sum(widths[-1][0].values()) < sum(sn.group_sizes.values())


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
            slim, masked = evaluator.accuracy(seq.tasks[j], j), task_accuracy(sn, seq.tasks[j], j)
            assert abs(slim - masked) <= 100 * near_ties(want, got) / len(want)
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


class SlimSteps(Callback):
    """Counts, per phase name, the engine's optimizer steps that train a slim copy: those in
    which the optimizer of a copy the engine built stepped (``counted``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counted: Counter[str] = Counter()
        self.stepped = False
        real = slim_module.SlimPhase.build.__func__  # type: ignore[attr-defined]

        def build(cls, *args, **kwargs):
            phase = real(cls, *args, **kwargs)
            if phase is not None:  # the copy's optimizers step together
                first = phase.optimizer.optimizers[0]
                inner = first.step

                def step(*a, **k):
                    self.stepped = True
                    return inner(*a, **k)

                first.step = step
            return phase

        monkeypatch.setattr(slim_module.SlimPhase, "build", classmethod(build))
        watch_engines(monkeypatch, self)

    def on_step_end(self, learner, event: StepEnd) -> None:
        self.counted[event.phase] += self.stepped
        self.stepped = False


def recorded_slim_steps(doc: dict) -> Counter[str]:
    """results.json's ``slim_steps``, per phase name, summed over the tasks."""
    recorded: Counter[str] = Counter()
    for task in doc["phases"]:
        for phase in task:
            recorded[phase["phase"]] += phase["slim_steps"]
    return recorded


def test_results_record_the_steps_trained_on_slim_copies(
    tmp_path, monkeypatch, fake_mnist, fc_test_model
):
    """results.json counts, per task and phase, the optimizer steps that trained a slim copy
    (as many as the engine took here), so that two runs tell whether and where they trained
    one (their float32 rounding differs there); none with slim training off."""
    seen = {}
    for slim in (True, False):
        counted = SlimSteps(monkeypatch).counted
        cfg = make_config(**run_options(tmp_path / str(slim), slim_training=slim))
        doc = run_experiment(cfg, progress=False)
        assert recorded_slim_steps(doc) == counted
        seen[slim] = doc
    on, off = seen[True]["phases"], seen[False]["phases"]
    assert all(p["slim_steps"] == 0 for task in off for p in task)
    assert all(
        p["slim_steps"] == p["steps"] > 0 for task in on for p in task if p["phase"] == "finetune"
    )
    assert [[p["steps"] for p in task] for task in on] == [
        [p["steps"] for p in task] for task in off
    ]


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
    assert spy.phase("finetune") == [True, True, True]
    cfg = make_config(**(options | {"out": tmp_path / "run"}))
    with monkeypatch.context() as mp:
        kill_at_step(mp, 30)
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    position = json.loads((tmp_path / "run/checkpoint/manifest.json").read_text())["training"]
    assert position["task"] == 1 and position["position"]["epoch"] == 1
    run_experiment(cfg, progress=False, resume=True)
    assert fingerprint(tmp_path / "run") == fingerprint(tmp_path / "reference")


def test_a_slim_copy_is_written_back_only_where_the_supernet_is_read(
    tmp_path, monkeypatch, fake_mnist, fc_test_model
):
    """Inside a slim phase the supernet is brought up to date where an epoch is checkpointed,
    before a prune event and at the phase's end, not at every epoch's end: a run
    checkpointing only phase ends writes back less often and ends bit for bit as one
    checkpointing (so writing back) every epoch."""
    calls: list[int] = []
    real = slim_module.SlimPhase.write_back

    def write_back(self, optimizer):
        calls[-1] += 1
        return real(self, optimizer)

    monkeypatch.setattr(slim_module.SlimPhase, "write_back", write_back)
    runs = []
    for seconds in (0.0, 1e9):
        monkeypatch.setattr(run_directory_module, "CHECKPOINT_SECONDS", seconds)
        calls.append(0)
        out = tmp_path / f"every-{seconds}"
        run_experiment(make_config(**run_options(out, epochs=(1, 1, 4))), progress=False)
        runs.append(fingerprint(out))
    assert runs[0] == runs[1]
    assert calls[1] < calls[0]


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
        # refused (before a copy is built) at every prune event and in the fine-tuning
        assert spy.built == ([False] * 4 if slim else [])
        results.append({n: layer.weight.detach().clone() for n, layer in sn.layers.items()})
    assert all(torch.equal(results[0][n], results[1][n]) for n in results[0])
    with pytest.raises(net_module.SlimUnsupported, match="not sliced"):
        net_module.SlimNet(sn)


def test_a_dropout_elsewhere_keeps_the_masked_supernet():
    """A dropout's random mask has its input's width: where no linear layer reads its output
    straight (which says which features a copy keeps), a slim copy would draw other masks."""
    seq = tiny_sequence(1)
    net = torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(64, 16),
        torch.nn.Dropout(0.1),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 3),
    )
    sn = espn.wrap(net, seq.tasks[0].train.x[:2])
    with pytest.raises(net_module.SlimUnsupported, match="draws random masks"):
        net_module.SlimNet(sn)


@pytest.mark.parametrize("p", [0.3, 1.0])
def test_a_dropout_feeding_a_linear_layer_draws_the_supernets_noise(p):
    """A dropout straight before a linear layer: the copy draws the supernet's noise over the
    whole width and keeps the alive features' part, so that in training mode, from the same
    random state, the copy computes the supernet's logits and gradients (a copy drawing its
    own, narrower noise would not: the check below fails for it)."""
    seq = tiny_sequence(1)
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.Dropout(p), torch.nn.Linear(16, 3)
    )
    sn = espn.wrap(net, seq.tasks[0].train.x[:2])
    sn.begin_task(3)
    units = sn.unit_masks()
    group = next(iter(units))
    units[group][::3] = False
    sn.set_unit_masks(units)
    copy = net_module.SlimNet(sn)
    assert copy.model[3].weight.shape[1] == int(units[group].sum())
    x = seq.tasks[0].train.x[:8]
    sn.train()
    copy.train()
    results = []
    for net_ in (sn, copy):
        torch.manual_seed(5)
        out = net_.forward_working(x)
        out.square().sum().backward()
        results.append(out.detach())
    torch.testing.assert_close(results[1], results[0], atol=ATOL, rtol=0)
    head = copy.model[3].weight
    alive = units[group]
    torch.testing.assert_close(head.grad, sn.model[3].weight.grad[:, alive], atol=ATOL, rtol=0)
    if p < 1.0:  # the noise of the copy's own width is other noise
        torch.manual_seed(5)
        narrow = torch.nn.functional.dropout(torch.ones(8, int(alive.sum())), p, True)
        torch.manual_seed(5)
        wide = torch.nn.functional.dropout(torch.ones(8, alive.numel()), p, True)[:, alive]
        assert not torch.equal(narrow, wide)


# ------------------------------------------------------------------ the prune phase, slim


def pruning_state(sn: Supernet) -> dict[str, torch.Tensor]:
    """What the prune phase trains and decides: unit and weight masks, the weights in the
    masks, and every gate/BatchNorm tensor (saliencies, shifts, statistics) on alive entries."""
    state: dict[str, torch.Tensor] = {}
    for name, layer in sn.layers.items():
        mask = layer.weight_mask.bool()
        state[f"{name}.mask"] = mask.clone()
        state[f"{name}.weight"] = layer.weight.detach()[mask].clone()
    for name, m in sn.task_modules.items():
        if isinstance(m, UnitModule):
            alive = m.entry_mask().bool()
            state[f"{name}.units"] = m.unit_mask.bool().clone()
            for key, value in list(m.named_parameters()) + list(m.named_buffers()):
                if value.dim() == 1 and value.numel() == alive.numel():
                    state[f"{name}.{key}"] = value.detach()[alive].clone()
    return state


class EventRecorder:
    """Wraps a strategy's prune events: records what each decides from (every unit group's
    saliencies, every layer's free weights in the mask) and what it decided (its units and
    weight masks after the event)."""

    def __init__(self, strategy) -> None:
        self.before: list[dict[str, torch.Tensor]] = []
        self.after: list[dict[str, torch.Tensor]] = []
        real = strategy.prune_step

        def prune_step(sn: Supernet, progress: float) -> None:
            scores = {f"{g}.saliency": s for g, s in gate_magnitude(sn).items()}
            alive = sn.unit_masks()
            for g in scores.copy():
                scores[g] = scores[g][alive[g.rsplit(".", 1)[0]]]
            for name, layer in sn.layers.items():
                free = layer.weight_mask.bool() & ~layer.frozen
                scores[name] = layer.weight.detach().abs().where(free, torch.nan).clone()
            self.before.append(scores)
            real(sn, progress)
            decided = {g: a.clone() for g, a in sn.unit_masks().items()}
            decided |= {n: m.clone() for n, m in sn.weight_masks().items()}
            # the weights ranked: those of units alive after the event (the units go first)
            decided |= {f"{n}.ranked": sn.structural_mask(n).clone() for n in sn.layers}
            self.after.append(decided)

        strategy.prune_step = prune_step


def margin(
    scores: torch.Tensor, decided: torch.Tensor | None, ranked: torch.Tensor | None
) -> float:
    """How far a decision is from flipping: for unit saliencies (``decided`` None), the
    smallest gap between two of them (any order change may change the units kept); for a
    layer's free weights among the ``ranked`` ones (in units alive after the event), the gap
    between the smallest kept and the largest dropped."""
    if decided is None or ranked is None:
        s = scores.sort().values
        return float((s[1:] - s[:-1]).min()) if s.numel() > 1 else float("inf")
    free = ~scores.isnan() & ranked
    kept, dropped = scores[free & decided], scores[free & ~decided]
    if kept.numel() == 0 or dropped.numel() == 0:
        return float("inf")
    return float(kept.min() - dropped.max())


def prune_phase_run(kind: str, optim: OptimConfig, slim: bool, seed: int = 0, finetune: int = 0):
    """ESPN's task 1 (task 0 learned masked) with a prune phase of 2 epochs (6 steps, 8
    events) and ``finetune`` epochs; the state at each of its epoch ends, and its prune
    events."""
    seq = tiny_sequence(2, seed=seed)
    torch.manual_seed(seed)
    sn = Supernet(model(kind), seq.tasks[0].train.x[:2])
    strategy = METHODS.get("espn")(MethodConfig(gamma=0.3, alpha=0.3, epochs=(1, 2, finetune)))
    engine = Engine(sn, strategy, optim, 16, seed=0, slim_training=False)
    engine.train_task(seq.tasks[0], 0)
    engine.slim_training = slim
    events = EventRecorder(strategy)
    states: list[dict[str, torch.Tensor]] = []

    def record(phase: str, epoch: int) -> None:
        if phase == "prune":
            states.append(pruning_state(sn))

    engine.callbacks.append(AtEpochEnd(record))
    engine.train_task(seq.tasks[1], 1)
    return sn, states, events


@pytest.mark.parametrize(
    "kind,optim,seed",
    [
        ("fc", OPTIMIZERS[0], 0),
        ("fc", OPTIMIZERS[1], 0),
        ("conv", OPTIMIZERS[2], 0),
        # not seed 0: two saliencies 2 eps apart at an event, where the runs may part
        # (the masked-L2 gradient is a quotient), which would leave the rest unchecked
        ("resnet", OPTIMIZERS[0], 1),
    ],
    ids=["fc-adam", "fc-rmsprop", "conv-sgd", "resnet-adam"],
)
def test_slim_prune_phase_equals_masked_prune_phase(monkeypatch, kind, optim, seed):
    """Between prune events the slim prune phase trains a copy (saliencies, penalty, clamps,
    masked-L2 term) and reaches what the masked one reaches: the same units and weight
    masks at every event, and the same weights, saliencies and statistics at every epoch end.

    The scores each event ranks are equal within ``ATOL`` (float32 sums in another order).
    A decision may flip only where two scores it ranks are closer than that rounding, which
    depends on the machine's float path: an event deciding otherwise must have had such a
    near tie in the masked run (margin at most 2 ``eps``), and the runs are compared up to
    it; on this machine's data none flips, and then everything after is compared too."""
    masked, masked_states, masked_events = prune_phase_run(kind, optim, slim=False, seed=seed)
    spy = SlimSpy(monkeypatch)
    slim, slim_states, slim_events = prune_phase_run(kind, optim, slim=True, seed=seed)
    assert len(spy.phase("prune")) >= 5 and all(spy.phase("prune")), "copies between events"
    assert len(masked_events.before) == len(slim_events.before) == 8
    for want, got, decided, slim_decided in zip(
        masked_events.before,
        slim_events.before,
        masked_events.after,
        slim_events.after,
        strict=True,
    ):
        eps = {}
        for key, scores in want.items():
            eps[key] = float((got[key] - scores).nan_to_num().abs().max()) if scores.numel() else 0
            assert eps[key] <= ATOL, key
        flipped = {k for k in decided if not torch.equal(decided[k], slim_decided[k])}
        # the units go first: a flipped unit changes the weights ranked after it
        units = {f"{g}.saliency" for g in flipped if f"{g}.saliency" in want}
        for key in units or flipped & want.keys():
            near = margin(want[key], decided.get(key), decided.get(f"{key}.ranked"))
            assert near <= 2 * eps[key], f"{key} decided otherwise, margin {near:g}"
        if flipped:
            return  # a near tie decided by the rounding: the runs part here
    assert len(masked_states) == len(slim_states) == 2
    for want, got in zip(masked_states, slim_states, strict=True):
        assert want.keys() == got.keys()
        for key, value in want.items():
            if value.dtype == torch.bool:
                assert torch.equal(got[key], value), key
            else:
                torch.testing.assert_close(got[key], value, atol=ATOL, rtol=0, msg=key)
    assert_same_task(masked, slim)


@pytest.mark.parametrize("kind", ["fc", "resnet"])
@pytest.mark.parametrize("pruner", ["flop-aware", "polarization"])
def test_a_copy_gets_the_supernets_penalty_and_l2_term(kind, pruner):
    """After a prune event: the copy lists the unit groups and their modules in the
    supernet's order (the penalty's lambda tensor is per module, in that order), its penalty,
    masked-L2 term and mask count equal the supernet's, and so do the saliencies' gradients
    and, after the pruner's clamps, the saliencies (on alive units)."""
    seq = tiny_sequence(1)
    torch.manual_seed(0)
    sn = Supernet(model(kind), seq.tasks[0].train.x[:2])
    cfg = MethodConfig(gamma=0.3, alpha=0.3, epochs=(1, 1, 1), method_options={"pruner": pruner})
    strategy = METHODS.get("espn")(cfg)
    engine = Engine(sn, strategy, OPTIMIZERS[0], 16, seed=0)
    sn.begin_task(3)
    strategy.begin_task(sn)
    with torch.no_grad():  # saliencies apart from one another, some above the clamp's 1
        for mods in sn.groups.values():
            for m in mods:
                m.weight.copy_(torch.rand(m.weight.shape) * 1.5 - 0.25)
    strategy.prune_step(sn, 0.5)
    optimizer = engine.build_optimizer()
    copy = slim_module.SlimPhase(sn, engine.optim, engine._trainable(), optimizer).net
    assert [(g, [type(m) for m in mods]) for g, mods in copy.groups.items()] == [
        (g, [type(m) for m in mods]) for g, mods in sn.groups.items()
    ]
    layers = [layer for layer in sn.layers.values() if layer.out_units is not None]
    mine = [copy.layers[n] for n, layer in sn.layers.items() if layer.out_units is not None]
    assert int(sum(m.mask_count() for m in mine)) == int(sum(m.mask_count() for m in layers))
    assert sum(m.weight.numel() for m in mine) < sum(m.weight.numel() for m in layers)
    for net in (sn, copy):
        (strategy.penalty(net) + strategy.weight_penalty(net)).backward()
    for name, mods in sn.groups.items():
        for full, part in zip(mods, copy.groups[name], strict=True):
            alive = full.entry_mask().bool()
            torch.testing.assert_close(part.weight.grad, full.weight.grad[alive], atol=ATOL, rtol=0)
    torch.testing.assert_close(strategy.penalty(copy), strategy.penalty(sn), atol=ATOL, rtol=0)
    l2 = strategy.weight_penalty(copy), strategy.weight_penalty(sn)
    torch.testing.assert_close(*l2, atol=ATOL, rtol=0)
    for net in (sn, copy):
        strategy.after_step(net)
    for name, mods in sn.groups.items():
        for full, part in zip(mods, copy.groups[name], strict=True):
            torch.testing.assert_close(part.weight, full.weight[full.entry_mask().bool()])


def test_killed_inside_a_slim_prune_phase_resumes_exactly(
    tmp_path, monkeypatch, fake_mnist, fc_test_model
):
    """The size rule at 850 reference images makes every phase 7 steps (passes of 4 and 3):
    the prune phase's events come after its steps 1, 3, 5 and 7, so its first epoch ends
    after 1 step of a copy built at step 3, and checkpoints that copy's work mid-way. Step
    34 of the run is task 1's sixth prune step, inside the second epoch of the slim prune
    phase; the resumed run slices the same copy again and ends as the uninterrupted one
    (every pass is checkpointed, with no minimum time between checkpoints)."""
    monkeypatch.setattr(run_directory_module, "CHECKPOINT_SECONDS", 0.0)
    options = run_options(tmp_path / "reference", epochs=(1, 1, 1), reference_size=850)
    spy = SlimSpy(monkeypatch)
    counted = SlimSteps(monkeypatch).counted
    reference = run_experiment(make_config(**options), progress=False)
    assert spy.phase("prune") == [True] * 9 and spy.phase("finetune") == [True] * 3
    assert recorded_slim_steps(reference) == counted and counted["prune"] > 0
    cfg = make_config(**(options | {"out": tmp_path / "run"}))
    with monkeypatch.context() as mp:
        kill_at_step(mp, 34)
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    position = json.loads((tmp_path / "run/checkpoint/manifest.json").read_text())["training"]
    at = position["position"]
    assert position["task"] == 1 and at["phase"] == 1  # pretrain, then prune
    assert (at["epoch"], at["step"], at["prunes_done"]) == (1, 4, 2)  # a copy since step 3
    assert at["slim_steps"] == 3  # steps 2 to 4, on the copies built after steps 1 and 3
    resumed = run_experiment(cfg, progress=False, resume=True)
    assert fingerprint(tmp_path / "run") == fingerprint(tmp_path / "reference")
    assert resumed["phases"] == reference["phases"]


def test_a_prune_phase_copy_is_built_where_it_pays(monkeypatch):
    """Without the tests' override: after each prune event the copy is built only where the
    steps to the next event times the FLOPs share of the dead units reach the copy's cost
    (here set to one step); with 24 prune steps and 4 events (every 6 steps) at gamma 0.5 the
    first event's units (about 0.86 of the FLOPs) do not pay, the later ones do."""
    import espn.training.engine as engine_module

    seq = tiny_sequence(1)
    torch.manual_seed(0)
    sn = Supernet(make_model("fc"), seq.tasks[0].train.x[:2])
    weights = sum(layer.weight.numel() for layer in sn.layers.values())
    monkeypatch.setattr(slim_module, "SLIM_REBUILD_COST", sn.dense_flops * 16 / weights)
    assert slim_module.rebuild_steps(sn, 16) == pytest.approx(1.0)
    decided: list[tuple[int, float, bool]] = []
    real = engine_module.slim_prune_pays

    def pays(sn: Supernet, steps: int, batch_size: int) -> bool:
        answer = real(sn, steps, batch_size)
        decided.append((steps, sn.flops() / sn.dense_flops, answer))
        return answer

    monkeypatch.setattr(engine_module, "slim_prune_pays", pays)
    strategy = METHODS.get("espn")(MethodConfig(gamma=0.5, alpha=0.3, epochs=(1, 1, 1)))
    engine = Engine(sn, strategy, OPTIMIZERS[0], 16, seed=0, reference_size=16 * 24)
    spy = SlimSpy(monkeypatch)
    engine.train_task(seq.tasks[0], 0)
    # the phase start (no unit dead) and the three events before the phase's end
    assert [steps for steps, _, _ in decided] == [6, 6, 6, 6]
    assert decided[0][1] == 1.0 and not decided[0][2]
    assert [answer for _, _, answer in decided] == [s * (1 - f) >= 1 - 1e-9 for s, f, _ in decided]
    assert [answer for _, _, answer in decided[1:]] == [False, True, True]
    assert spy.phase("prune") == [True, True] and spy.phase("finetune") == [True]


def test_a_copys_cost_counts_the_set_up_of_each_convolution(monkeypatch):
    """A copy of a convolutional net costs, beyond handling its weights, the set-up of every
    convolution at its first step (new channel counts): one ``SLIM_CONV_SETUP`` per conv, in
    FLOPs of a dense step; an FC net has none."""
    monkeypatch.setattr(slim_module, "SLIM_REBUILD_COST", 0.0)
    monkeypatch.setattr(slim_module, "SLIM_CONV_SETUP", 1e6)
    seq = tiny_sequence(1)
    for kind, convs in (("fc", 0), ("resnet", 1 + 2 * 6 + 3)):
        sn = Supernet(model(kind), seq.tasks[0].train.x[:2])
        assert sum(isinstance(m, torch.nn.Conv2d) for m in sn.model.modules()) == convs
        assert slim_module.rebuild_steps(sn, 8) == pytest.approx(1e6 * convs / (sn.dense_flops * 8))


def test_a_matrix_cut_both_ways_reads_and_writes_exactly_its_slice():
    """``take`` and ``put`` through a cut's flat positions read and write the entries the
    per-dimension indices name, and no other (a non-contiguous matrix goes the other way)."""
    g = torch.Generator().manual_seed(0)
    full = torch.randn(9, 7, generator=g)
    rows, cols = torch.tensor([0, 2, 3, 8]), torch.tensor([1, 4, 5])
    cut = Cut((rows, cols), tuple(full.shape))
    assert cut.flat is not None
    assert torch.equal(take(full, cut), full[rows][:, cols])
    value = torch.randn(4, 3, generator=g)
    for target in (full.clone(), full.t().contiguous().t()):  # contiguous, then not
        net_module.put(target, cut, value)
        want = full.clone()
        want[rows.view(-1, 1), cols.view(1, -1)] = value
        assert torch.equal(target, want)
    assert Cut((None, cols), tuple(full.shape)).flat is None


def test_a_copy_cut_like_the_last_one_is_not_checked_again(monkeypatch):
    """The check pass (a forward of the masked supernet) runs for a copy cut anew; a prune
    phase's next copy, cut like the copy before it (narrower where units died), runs as
    that one was checked to."""
    checked: list[frozenset[str]] = []
    real = slim_module._check

    def check(net, supernet):
        checked.append(net.cut_names())
        real(net, supernet)

    monkeypatch.setattr(slim_module, "_check", check)
    cuts: list[frozenset[str]] = []  # every copy's cut, checked or not
    real_init = slim_module.SlimPhase.__init__

    def init(phase, *args, **kwargs):
        real_init(phase, *args, **kwargs)
        cuts.append(phase.net.cut_names())

    monkeypatch.setattr(slim_module.SlimPhase, "__init__", init)
    spy = SlimSpy(monkeypatch)
    prune_phase_run("fc", OPTIMIZERS[0], slim=True, seed=0, finetune=1)
    copies = spy.phase("prune")
    assert len(copies) >= 5 and all(copies) and spy.phase("finetune") == [True]
    assert len(cuts) == len(copies) + 1
    pruning = checked[:-1]  # the last: the fine-tuning's copy, a phase's first, checked
    # this run has both kinds of copy: some cut like the copy before it (not checked)
    repeats = sum(a == b for a, b in itertools.pairwise(cuts[:-1]))
    assert repeats >= 1, "no copy was cut like the one before it: nothing here skips a check"
    # exactly the phase's first copy and every copy cut otherwise than the one before it
    anew = [cuts[0]] + [b for a, b in itertools.pairwise(cuts[:-1]) if a != b]
    assert pruning == anew and len(pruning) == len(copies) - repeats
    assert all(a != b for a, b in itertools.pairwise(pruning)), "checked: cut anew only"
