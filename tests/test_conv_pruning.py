"""Channel pruning in residual supernets: exact zeros, FLOP budgets, FLOPs equal to the
measured FLOPs of a physically slimmed copy, and zero forgetting with task-specific BatchNorm."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from espn.api.experiment import build_benchmark, build_supernet
from espn.evaluation import task_logits
from espn.export.slim import slim_copy
from espn.layers.batchnorm2d import TaskBatchNorm2d
from espn.methods import METHODS
from espn.models import MODELS, ModelSpec
from espn.models.resnet import BasicBlock, Bottleneck
from espn.runs.config import make_config
from espn.supernet import Supernet
from espn.supernet.layers import with_unions
from espn.training import Engine, OptimConfig
from helpers.images import random_task

ADAM = OptimConfig("adam", lr=0.01, betas=(0.0, 0.999), weight_decay=1e-3)


def measured_flops(model: nn.Module, x: torch.Tensor) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    return counter.get_total_flops()


def supernet_of(
    name: str, shape: tuple[int, ...], n_classes: int = 5, streams: str = "coupled"
) -> Supernet:
    torch.manual_seed(0)
    model = MODELS.get(name)(ModelSpec(shape, n_classes, multi_head=True, stream_pruning=streams))
    return Supernet(model, torch.zeros(2, *shape))


@pytest.mark.parametrize("streams", ["coupled", "per-conv"])
@pytest.mark.parametrize(
    ("name", "shape", "keeps"),
    [
        ("resnet18-reduced", (3, 32, 32), (0.0, 0.3, 0.8)),
        ("resnet50", (3, 32, 32), (0.4,)),
    ],
)
def test_analytic_flops_equal_measured_flops_of_the_slim_copy(name, shape, keeps, streams):
    """Under random channel masks (``keep`` 0: one channel per group), the analytic count
    equals FlopCounterMode on a copy with the dead channels physically removed by
    Torch-Pruning, through residual adds, downsample shortcuts and the stem; with per-conv
    streams, each producer computes only its own channels and every reader only the
    channels alive where it reads the stream."""
    sn = supernet_of(name, shape, streams=streams)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, *shape, generator=gen)
    for t, keep in enumerate(keeps):
        random_task(sn, 5, x, gen, keep)
        slim = slim_copy(sn, t, x[:1])
        sn.use_task(t)
        assert sn.flops() < sn.dense_flops
        assert measured_flops(slim, x[:1]) == sn.flops(), f"task {t}, keep {keep}"
        torch.testing.assert_close(slim(x), sn(x, task=t), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["resnet18-reduced", "resnet50"])
def test_unit_flops_is_the_cost_of_one_channel(name):
    """FLOP_l(m) with ``--flop-load total`` is exactly what removing one channel of the group
    saves, residual streams included (every writer and reader of the stream); the paper's
    ``output`` load is the writers' part of it."""
    sn = supernet_of(name, (3, 32, 32))
    gen = torch.Generator().manual_seed(2)
    sn.begin_task(5)
    units = {g: torch.rand(s, generator=gen) < 0.7 for g, s in sn.group_sizes.items()}
    for alive in units.values():
        alive[:2] = True
    sn.set_unit_masks(units)
    per_unit = sn.unit_flops("total")
    output = sn.unit_flops()
    assert all(0 < output[g] < per_unit[g] for g in per_unit)
    base = sn.flops()
    for g, alive in units.items():
        fewer = dict(units)
        fewer[g] = alive.clone()
        fewer[g][alive.nonzero()[0]] = False
        assert base - sn.flops(fewer) == per_unit[g], g


@pytest.mark.usefixtures("fake_cifar10")
@pytest.mark.parametrize("streams", ["per-conv", "coupled"])
def test_pruned_channels_output_exactly_zero(streams):
    """After ESPN-0.2 pruned a task, every dead channel is exactly 0 in every BatchNorm output
    and in the residual stream after every block (train and eval mode, any input); per conv,
    a stream channel is dead where every conv writing into it so far pruned it."""
    cfg = make_config(
        benchmark="split-cifar10",
        model="small-resnet",
        tasks=1,
        epochs=(1, 1, 0),
        gamma=0.2,
        batch_size=32,
        train_per_task=32,
        stream_pruning=streams,
    )
    seq = build_benchmark(cfg)
    sn = build_supernet(cfg, seq)
    Engine(sn, METHODS.get("espn")(cfg.method_config()), ADAM, 32).train_task(seq.tasks[0], 0)
    units = with_unions(sn.masks[0].units, sn.unions)
    assert sum(int((~a).sum()) for a in units.values()) > 0
    outputs: list[tuple[str, torch.Tensor]] = []
    model = sn.model
    hooks = [
        m.register_forward_hook(lambda m, i, o, g=m.group: outputs.append((g, o)))
        for m in model.modules()
        if isinstance(m, TaskBatchNorm2d)
    ]
    n_bn = len(hooks)
    for stage in ("layer1", "layer2", "layer3", "layer4"):
        for b, block in enumerate(getattr(model, stage)):
            group = f"{stage}.{b}.out" if streams == "per-conv" else stage
            hooks.append(
                block.register_forward_hook(lambda m, i, o, g=group: outputs.append((g, o)))
            )
    assert n_bn == 16 and len(hooks) == 16 + 6
    x = torch.randn(8, 3, 32, 32) * 3
    for train in (False, True):
        sn.train(train)
        outputs.clear()
        with torch.no_grad():
            sn(x, task=0)
        assert len(outputs) == len(hooks)
        for group, out in outputs:
            dead = out[:, ~units[group].to(out.device)]
            assert torch.equal(dead, torch.zeros_like(dead)), group
    for h in hooks:
        h.remove()


@pytest.mark.usefixtures("fake_cifar10")
@pytest.mark.parametrize("gamma", [0.1, 0.3, 0.6])
def test_flop_budget_met_for_every_task(tmp_path, gamma):
    cfg = make_config(
        benchmark="split-cifar10",
        model="small-resnet",
        tasks=2,
        epochs=(1, 1, 1),
        gamma=gamma,
        batch_size=32,
        train_per_task=32,
        out=tmp_path,
    )
    seq = build_benchmark(cfg)
    sn = build_supernet(cfg, seq)
    engine = Engine(sn, METHODS.get("espn")(cfg.method_config()), ADAM, 32)
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
        sn.use_task(t)
        # the budget holds, and the pruner did not cut far below it (one channel's cost)
        assert sn.flops() <= gamma * sn.dense_flops
        assert sn.flops() >= gamma * sn.dense_flops - 2 * max(sn.unit_flops().values())
        assert sn.masks[t].new_weights <= engine.strategy.weight_budget


def train_sequence(args: dict, optim: OptimConfig, amp: bool = False) -> None:
    """Train the tasks of ``args`` one after the other; after each, every earlier task's test
    logits (eval mode) and its BatchNorm state must be bit-identical to what they were."""
    cfg = make_config(**args)
    seq = build_benchmark(cfg)
    sn = build_supernet(cfg, seq)
    strategy = METHODS.get(cfg.method)(cfg.method_config())
    engine = Engine(sn, strategy, optim, batch_size=32, seed=0, amp=amp)
    logits, states = [], []
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
        for j in range(t):
            assert torch.equal(task_logits(sn, seq.tasks[j], j), logits[j]), f"task {j} changed"
            assert all(torch.equal(v, states[j][k]) for k, v in sn.masks[j].state.items())
        logits.append(task_logits(sn, task, t))
        states.append({k: v.clone() for k, v in sn.masks[t].state.items()})
        if t > 0:  # every task trains its own BatchNorm statistics and affine parameters
            key = "layer1.0.bn1.running_mean"
            assert not torch.equal(sn.masks[t].state[key], sn.masks[0].state[key])


@pytest.mark.usefixtures("fake_cifar10")
@pytest.mark.parametrize("method", ["espn", "packnet"])
def test_zero_forgetting_with_task_batchnorm(tmp_path, method):
    args = {
        "benchmark": "split-cifar10",
        "model": "small-resnet",
        "method": method,
        "tasks": 3,
        "epochs": (1, 1, 1),
        "alpha": 0.2,
        "train_per_task": 32,
        "out": tmp_path,
    }
    train_sequence(args | ({"gamma": 0.5} if method == "espn" else {}), ADAM)


@pytest.mark.usefixtures("fake_cifar10")
def test_zero_forgetting_with_mixed_precision(tmp_path):
    """--amp (bfloat16 autocast on the CPU, float16 + GradScaler on CUDA): FrozenGuard still
    keeps every earlier task exact."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = {
        "benchmark": "split-cifar10",
        "model": "small-resnet",
        "tasks": 2,
        "epochs": (1, 1, 1),
        "gamma": 0.5,
        "train_per_task": 32,
        "device": device,
        "out": tmp_path,
    }
    train_sequence(args, OptimConfig("sgd", lr=0.05, momentum=0.9, weight_decay=1e-2), amp=True)


def test_task_state_costs_kilobytes_not_a_network():
    """A task stores its BatchNorms and head (tens of KB); the shared weights stay shared."""
    sn = supernet_of("resnet18-reduced", (3, 32, 32))
    random_task(sn, 5, torch.randn(4, 3, 32, 32), torch.Generator().manual_seed(0), 0.5)
    mask = sn.masks[0]
    sizes = mask.nbytes()
    network_bytes = sn.total_weights * 4
    assert sizes["state"] < 0.01 * network_bytes
    assert sizes["weight_masks"] <= network_bytes / 32 + 8 * len(sn.layers)
    modules = {k.rsplit(".", 1)[0] for k in mask.state}
    assert modules == set(sn.task_modules)
    n_bn = sum(m.num_features for m in sn.model.modules() if isinstance(m, TaskBatchNorm2d))
    assert n_bn == 1500  # stem 20 + 4 x 20, 4 x 40 + 40, 4 x 80 + 80, 4 x 160 + 160


def test_blocks_put_the_stride_where_torchvision_does():
    basic = BasicBlock(8, 16, 2, "b", "s", "t")
    bottleneck = Bottleneck(64, 32, 2, "b", "s", "t")
    assert basic.conv1.stride == (2, 2) and basic.downsample[0].stride == (2, 2)
    assert bottleneck.conv1.stride == (1, 1) and bottleneck.conv2.stride == (2, 2)
    assert bottleneck.conv3.out_units == bottleneck.downsample[0].out_units == "t"
