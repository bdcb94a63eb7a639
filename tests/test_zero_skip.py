"""Pruned free weights kept at zero let a training step skip the mask product, exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from espn.api.experiment import run_experiment
from espn.layers.linear import MaskedLinear
from espn.methods.base import METHODS, MethodConfig, Strategy
from espn.runs.config import make_config
from espn.supernet import Supernet, fast
from espn.supernet.layers import MaskedLayer
from espn.training.callbacks import Callback, EpochStart
from espn.training.engine import Engine
from espn.training.optim import OptimConfig
from helpers.deploy import (
    AtEpochEnd,
    Killed,
    kill_at_step,
    make_model,
    run_options,
    tiny_sequence,
)

OPTIMIZERS = [
    OptimConfig("rmsprop", lr=1e-3, momentum=0.5, weight_decay=1e-2),
    OptimConfig("adam", lr=1e-2, betas=(0.0, 0.999)),
    OptimConfig("sgd", lr=0.05, momentum=0.9, weight_decay=1e-3),
]


class ProductSpy(Callback):
    """Counts, per task and phase, the training forward passes that multiplied a mask which
    is not all ones and those that took the weight itself in its place."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.phase = (0, "")
        self.skipped: dict[tuple[int, str], int] = {}
        self.multiplied: dict[tuple[int, str], int] = {}
        real = fast._TrainedWeight.apply

        def apply(weight: torch.Tensor, mask: Any, keep: Any, layer: MaskedLayer) -> Any:
            if not layer.mask_is_ones():
                counts = self.multiplied if mask is not None else self.skipped
                counts[self.phase] = counts.get(self.phase, 0) + 1
            return real(weight, mask, keep, layer)

        monkeypatch.setattr(fast._TrainedWeight, "apply", apply)

    def on_epoch_start(self, learner: Any, event: EpochStart) -> None:
        self.phase = (event.task, event.phase)


def two_tasks(
    method: str,
    optim: OptimConfig,
    spy: ProductSpy | None = None,
    **options: Any,
) -> tuple[Supernet, list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """Task 0, then task 1 through the masked supernet (no slim copy), ESPN-0.5's units or
    PackNet's weights pruned over two epochs; returns the supernet, the weights at each epoch
    end, and the weights before task 1."""
    seq = tiny_sequence(2)
    torch.manual_seed(0)
    sn = Supernet(make_model("fc"), seq.tasks[0].train.x[:2])
    cfg = MethodConfig(gamma=0.5, alpha=0.3, epochs=(1, 2, 2), method_options=options)
    strategy = METHODS.get(method)(cfg)
    engine = Engine(sn, strategy, optim, 16, seed=0, slim_training=False)
    seen: list[dict[str, torch.Tensor]] = []

    def record(phase: str, epoch: int) -> None:
        seen.append({n: layer.weight.detach().clone() for n, layer in sn.layers.items()})
        if not strategy.zeroes_pruned or phase not in ("prune", "finetune"):
            return
        for name, layer in sn.layers.items():
            outside = ~layer.weight_mask.bool()
            # what a checkpoint at this epoch's end saves: zeros where pruned, unless a
            # frozen weight is outside the mask (a pruned unit holding an earlier task's)
            stuck = bool((outside & layer.frozen).any())
            assert stuck or not bool(layer.weight[outside].any()), name

    engine.callbacks.append(AtEpochEnd(record))
    if spy is not None:
        engine.callbacks.append(spy)
    engine.train_task(seq.tasks[0], 0)
    before = {n: layer.weight.detach().clone() for n, layer in sn.layers.items()}
    engine.train_task(seq.tasks[1], 1)
    return sn, seen, before


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().view(torch.int32)


def force_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path before the skip: every step multiplies the mask (the zeroing still runs)."""
    monkeypatch.setattr(MaskedLayer, "zero_outside_known", lambda self: False)


@pytest.mark.parametrize("optim", OPTIMIZERS, ids=lambda o: o.optimizer)
@pytest.mark.parametrize("method", ["espn", "packnet", "individual"])
def test_skipping_the_product_trains_the_same_bits(monkeypatch, method, optim):
    """Same steps on the same batches: bit-identical weights at every epoch end whether the
    product is skipped or computed, the frozen weights untouched, and the skip taken in the
    prune and fine-tune phases."""
    spy = ProductSpy(monkeypatch)
    skipped, seen, before = two_tasks(method, optim, spy)
    # ESPN's task 1 prunes units holding task 0's weights: it multiplies (see below)
    for task in (0,) if method == "espn" else (0, 1):
        assert spy.skipped.get((task, "prune"), 0) > 0, task
        assert spy.skipped.get((task, "finetune"), 0) > 0, task
    with monkeypatch.context() as m:
        force_product(m)
        product, seen_product, _ = two_tasks(method, optim)
    assert len(seen) == len(seen_product) == 10
    for mine, theirs in zip(seen, seen_product, strict=True):
        for name in mine:
            assert torch.equal(bits(mine[name]), bits(theirs[name])), name
    for name, layer in skipped.layers.items():
        other = product.layers[name]
        assert torch.equal(layer.weight_mask, other.weight_mask)
        assert torch.equal(bits(layer.weight), bits(other.weight)), name
        if method != "individual":  # task 0's weights, frozen in task 1
            frozen = skipped.masks[0].weight_mask(name)
            assert torch.equal(bits(layer.weight[frozen]), bits(before[name][frozen])), name


@pytest.mark.parametrize("method", ["espn", "packnet"])
def test_zeroing_changes_nothing_the_tasks_use(monkeypatch, method):
    """Against the run that never zeroes (the masked product alone): the same weights in
    every task's mask, bit for bit, and the same logits; only the pruned free weights,
    which the next task draws anew, differ."""
    optim = OPTIMIZERS[0]
    zeroed, _, _ = two_tasks(method, optim)
    with monkeypatch.context() as m:
        m.setattr(Strategy, "zeroes_pruned", property(lambda self: False))
        kept, _, _ = two_tasks(method, optim)
    used = False
    x = tiny_sequence(2).tasks[1].test.x
    for t in range(2):
        zeroed.use_task(t)
        kept.use_task(t)
        for name, layer in zeroed.layers.items():
            mask = layer.weight_mask.bool()
            assert torch.equal(mask, kept.layers[name].weight_mask.bool())
            assert torch.equal(bits(layer.weight[mask]), bits(kept.layers[name].weight[mask]))
            used |= bool(kept.layers[name].weight[~mask & ~layer.frozen].any())
        with torch.no_grad():
            assert torch.equal(zeroed(x, task=t), kept(x, task=t))
    assert used, "the run without zeroing left pruned weights non-zero"


def test_free_init_keep_neither_zeroes_nor_skips(monkeypatch):
    """With free_init keep the next task starts from the pruned weights' values: they are
    not zeroed, and every step multiplies the mask."""
    spy = ProductSpy(monkeypatch)
    sn, _, _ = two_tasks("packnet", OPTIMIZERS[0], spy, free_init="keep")
    assert not any(spy.skipped.values()) and spy.multiplied.get((1, "finetune"), 0) > 0
    assert any(
        bool(layer.weight[~layer.weight_mask.bool() & ~layer.frozen].any())
        for layer in sn.layers.values()
    )


def zeroed_layer() -> MaskedLinear:
    torch.manual_seed(0)
    layer = MaskedLinear(6, 4)
    mask = torch.rand(4, 6) > 0.5
    layer.weight_mask.copy_(mask)
    layer.note_mask(binary=True)
    assert layer.zero_pruned()
    assert layer.zero_outside_known()
    return layer


@pytest.mark.parametrize(
    "write",
    [
        lambda layer: layer.weight.__setitem__((0, 0), 1.0),
        lambda layer: setattr(layer.weight, "data", layer.weight.detach().clone()),
        lambda layer: layer.load_state_dict(layer.state_dict()),
        lambda layer: layer.weight_mask.fill_(1.0),
        lambda layer: layer.frozen.fill_(True),
    ],
    ids=["edit", "data", "load", "mask", "frozen"],
)
def test_a_write_outside_a_training_step_ends_the_skip(write):
    """An edit, a new tensor, a loaded state, a new mask or frozen set: the weight is no
    longer known zero outside the mask, and the forward multiplies again."""
    layer = zeroed_layer()
    with torch.no_grad():
        write(layer)
    assert not layer.zero_outside_known()
    x = torch.randn(3, 6)
    assert torch.equal(layer(x), x @ (layer.weight * layer.weight_mask).t())


def test_a_training_step_keeps_the_skip_only_with_a_kept_gradient():
    layer = zeroed_layer()
    opt = torch.optim.SGD([layer.weight], lr=0.1, momentum=0.9)
    for _ in range(2):
        opt.zero_grad()
        layer.forget_kept_grad()
        layer(torch.randn(3, 6)).square().sum().backward()
        assert layer.keeps_zero()
        opt.step()
        layer.note_trained()
        assert layer.zero_outside_known()
    assert not bool(layer.weight[~layer.weight_mask.bool()].any())
    # a gradient written by anything else than the product's backward: not carried
    layer.weight.grad.add_(1.0)
    assert not layer.keeps_zero()


def test_a_frozen_weight_outside_the_mask_is_neither_zeroed_nor_skipped():
    """An earlier task's weight in a unit this task pruned stays as it is: the layer keeps
    multiplying the mask."""
    torch.manual_seed(0)
    layer = MaskedLinear(6, 4)
    layer.frozen[0, :3] = True
    layer.weight_mask[0] = 0.0  # unit 0 pruned, its frozen weights outside the mask
    layer.note_mask(binary=True)
    before = layer.weight.detach().clone()
    assert not layer.zero_pruned()
    assert not layer.zero_pruned()  # the frozen weight found outside, read again
    assert torch.equal(bits(layer.weight), bits(before))
    assert not layer.zero_outside_known()
    # the unit's frozen weights back in the mask (its free ones still out): zeroed, skipped
    layer.weight_mask[0, :3] = 1.0
    layer.note_mask(binary=True)
    assert layer.zero_pruned() and layer.zero_outside_known()
    assert torch.equal(bits(layer.weight[0, :3]), bits(before[0, :3]))
    assert not bool(layer.weight[0, 3:].any())


def test_a_resumed_run_skips_the_product_again(tmp_path, monkeypatch, fake_mnist, fc_test_model):
    """Killed in the last task's fine-tuning and resumed: the checkpoint holds the pruned
    weights at zero, so the resumed steps know it again and multiply no mask."""
    cfg = make_config(**run_options(tmp_path / "run", method="packnet"))
    with monkeypatch.context() as mp:
        kill_at_step(mp, 46)  # 16 steps per task: task 2, its fine-tuning epoch
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    spy = ProductSpy(monkeypatch)
    run_experiment(cfg, progress=False, resume=True)
    assert spy.skipped.get((0, ""), 0) > 0 and not spy.multiplied
