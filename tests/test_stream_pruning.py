"""CtRL's per-conv pruning of residual streams (``--stream-pruning``) and its L2 term on the
masked weights (``--masked-l2``): what the methods declare, zero forgetting, stream channels
alive where any producer keeps them, FLOPs equal to the slim export's, and the old modes."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import espn.methods.base as method_base
from espn.api.experiment import build_benchmark, build_supernet
from espn.evaluation import task_logits
from espn.export.slim import slim_copy
from espn.layers.batchnorm2d import TaskBatchNorm2d
from espn.methods import METHODS
from espn.models.resnet import STREAM_PRUNING
from espn.runs.config import make_config
from espn.runs.legacy import upgrade_saved_config
from espn.supernet import Supernet
from espn.training import Engine, OptimConfig

ADAM = OptimConfig("adam", lr=0.01, betas=(0.0, 0.999))


def run_args(tmp_path, **extra) -> dict:
    return {
        "benchmark": "split-cifar10",
        "model": "small-resnet",
        "tasks": 2,
        "epochs": (1, 1, 1),
        "gamma": 0.3,
        "alpha": 0.3,
        "batch_size": 32,
        "train_per_task": 32,
        "out": tmp_path,
    } | extra


def producers_of(model: torch.nn.Module) -> dict[str, list[TaskBatchNorm2d]]:
    """For every block's output, the BatchNorms whose outputs are summed into it, read from the
    model's structure (stem, downsample, each block's last BatchNorm): independent of the
    supernet's unions."""
    out, writers = {}, [model.bn1]
    for stage in ("layer1", "layer2", "layer3", "layer4"):
        for b, block in enumerate(getattr(model, stage)):
            if block.downsample is not None:
                writers = [block.downsample[1]]
            writers = [*writers, block.bn2]
            out[f"{stage}.{b}"] = list(writers)
    return out


def measured_flops(model: torch.nn.Module, x: torch.Tensor) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    return counter.get_total_flops()


def test_the_methods_declare_the_options_at_the_authors_values():
    """ESPN and Individual prune streams per conv by default (CtRL), coupled on request;
    ESPN, Individual and PackNet add the L2 term at CtRL's lam 1; methods without the option
    add nothing."""
    for name in ("espn", "individual"):
        options = {o.name: o for o in METHODS.get(name).options}
        assert options["stream_pruning"].default == "per-conv"
        assert options["stream_pruning"].choices == STREAM_PRUNING == ("per-conv", "coupled")
    for name in ("espn", "individual", "packnet"):
        options = {o.name: o for o in METHODS.get(name).options}
        assert options["masked_l2"].default == 1.0
    for name in ("supsup", "cpg", "rmn", "packnet", "mtl"):
        assert "stream_pruning" not in METHODS.get(name).option_names()
    with pytest.raises(
        ValueError, match="stream_pruning must be one of: per-conv, coupled, got 'x'"
    ):
        make_config(benchmark="split-cifar10", model="resnet18-reduced", stream_pruning="x")
    with pytest.raises(ValueError, match="masked_l2 must be >= 0, got -1"):
        make_config(benchmark="split-cifar10", method="packnet", masked_l2=-1)


def test_saved_configurations_without_the_options_read_as_before():
    upgraded = upgrade_saved_config(
        {"method": "espn", "benchmark": "split-cifar10", "method_options": {"pruner": "l1"}}
    )
    assert upgraded["method_options"]["stream_pruning"] == "coupled"
    assert upgraded["method_options"]["masked_l2"] == 0.0
    assert upgraded["method_options"]["pruner"] == "l1"


@pytest.mark.usefixtures("fake_cifar10")
def test_masked_l2_is_the_authors_term_added_in_every_phase(tmp_path, monkeypatch):
    """``lam ||w m||_2 / sqrt(nnz(m))`` over the convs (not the head), counted independently,
    and the engine adds it at every optimizer step of every phase (warm-up and fine-tuning
    too, as CtRL); at 0 it is off."""
    cfg = make_config(**run_args(tmp_path, tasks=1, warmup=1, epochs=(2, 1, 1), masked_l2=0.5))
    seq = build_benchmark(cfg)
    sn = build_supernet(cfg, seq)
    strategy = METHODS.get("espn")(cfg.method_config())
    sn.begin_task(2)
    masks = {n: torch.rand(m.weight.shape) < 0.6 for n, m in sn.layers.items()}
    sn.set_weight_masks(masks)
    squares, nnz = 0.0, 0
    for m in sn.model.modules():
        if isinstance(m, torch.nn.Conv2d):
            kept = m.weight.detach().double() * m.weight_mask.double()
            squares += float((kept**2).sum())
            nnz += int(m.weight_mask.sum())
    expected = 0.5 * math.sqrt(squares) / math.sqrt(nnz)
    assert float(strategy.weight_penalty(sn).detach()) == pytest.approx(expected, rel=1e-5)
    off = make_config(**run_args(tmp_path, masked_l2=0.0)).method_config()
    assert METHODS.get("espn")(off).weight_penalty(sn) is None
    supsup = make_config(**run_args(tmp_path, method="supsup", gamma=None, alpha=None))
    assert METHODS.get("supsup")(supsup.method_config()).weight_penalty(sn) is None

    calls = []
    real = method_base.masked_weight_l2
    monkeypatch.setattr(
        method_base, "masked_weight_l2", lambda s: calls.append(s.in_training) or real(s)
    )
    sn = build_supernet(cfg, seq)
    log = Engine(sn, strategy, ADAM, 32).train_task(seq.tasks[0], 0)
    steps = sum(p["steps"] for p in log.phases)
    assert {p["phase"] for p in log.phases if p["steps"]} == {
        "warmup",
        "pretrain",
        "prune",
        "finetune",
    }
    assert len(calls) == steps > 0


@pytest.mark.usefixtures("fake_cifar10")
def test_per_conv_streams_zero_forgetting_flops_and_stream_channels(tmp_path):
    """Per-conv ESPN on the tiny ResNet: task 0's logits are bit-identical after task 1; each
    producer's pruned channel is exactly zero in its BatchNorm output; a stream channel is
    alive (nonzero somewhere) exactly where some producer keeps it, counted from the
    BatchNorms; the supernet's FLOPs equal FlopCounterMode on the slim export, whose stream
    tensors are as wide as the union of the stage's producers."""
    cfg = make_config(**run_args(tmp_path))
    seq = build_benchmark(cfg)
    sn = build_supernet(cfg, seq)
    assert sn.unions, "ESPN's default builds per-conv streams"
    engine = Engine(sn, METHODS.get("espn")(cfg.method_config()), ADAM, 32)
    engine.train_task(seq.tasks[0], 0)
    before = task_logits(sn, seq.tasks[0], 0)
    engine.train_task(seq.tasks[1], 1)
    assert torch.equal(task_logits(sn, seq.tasks[0], 0), before)

    x = torch.randn(16, 3, 32, 32) * 3
    streams = producers_of(sn.model)
    some_producer_pruned_a_live_channel = False
    for t in range(2):
        sn.use_task(t)
        sn.eval()
        outputs: dict[str, torch.Tensor] = {}
        keep = outputs.__setitem__
        hooks = [  # a block's input: its identity shortcut
            block.register_forward_pre_hook(lambda m, i, k=f"{s}.{b}", keep=keep: keep(k, i[0]))
            for s in ("layer1", "layer2", "layer3", "layer4")
            for b, block in enumerate(getattr(sn.model, s))
        ]
        hooks += [
            m.register_forward_hook(lambda m, i, o, k=n, keep=keep: keep(k, o))
            for n, m in sn.model.named_modules()
            if isinstance(m, TaskBatchNorm2d)
        ]
        with torch.no_grad():
            sn(x, task=t)
        for h in hooks:
            h.remove()
        for name, m in sn.model.named_modules():
            if isinstance(m, TaskBatchNorm2d):
                dead = outputs[name][:, ~m.unit_mask.bool()]
                assert torch.equal(dead, torch.zeros_like(dead)), name
        widths = sn.alive_widths(sn.masks[t].units)
        for block, writers in streams.items():
            alive = torch.stack([bn.unit_mask.bool() for bn in writers]).any(0)
            shortcut = f"{block}.downsample.1"
            # the stream before the ReLU: the block's last BatchNorm plus its shortcut
            added = outputs[f"{block}.bn2"] + (
                outputs[shortcut] if shortcut in outputs else outputs[block]
            )
            nonzero = added.abs().amax((0, 2, 3)) > 0
            assert torch.equal(nonzero, alive), block
            assert widths[f"{block}.out"] == int(alive.sum()), block
            own = torch.stack([bn.unit_mask.bool() for bn in writers])
            some_producer_pruned_a_live_channel |= bool((alive & ~own).any())
        slim = slim_copy(sn, t, x[:1])
        sn.use_task(t)
        assert measured_flops(slim, x[:1]) == sn.flops() <= 0.3 * sn.dense_flops
        torch.testing.assert_close(slim(x), sn(x, task=t), rtol=1e-4, atol=1e-4)
        # the head reads the last stream: its inputs are the union's alive channels
        last = streams["layer4.0"]
        union = torch.stack([bn.unit_mask.bool() for bn in last]).any(0)
        assert slim.get_submodule("fc").in_features == int(union.sum())
    assert some_producer_pruned_a_live_channel  # the per-conv case, not a coupled one


@pytest.mark.usefixtures("fake_cifar10")
def test_coupled_streams_still_work(tmp_path):
    """``--stream-pruning coupled``: one unit group per stream, no unions; zero forgetting and
    exact FLOPs of the slim export as before."""
    cfg = make_config(**run_args(tmp_path, stream_pruning="coupled"))
    seq = build_benchmark(cfg)
    sn = build_supernet(cfg, seq)
    assert not sn.unions and "layer1" in sn.groups
    engine = Engine(sn, METHODS.get("espn")(cfg.method_config()), ADAM, 32)
    engine.train_task(seq.tasks[0], 0)
    before = task_logits(sn, seq.tasks[0], 0)
    engine.train_task(seq.tasks[1], 1)
    assert torch.equal(task_logits(sn, seq.tasks[0], 0), before)
    x = torch.randn(4, 3, 32, 32)
    slim = slim_copy(sn, 1, x[:1])
    sn.use_task(1)
    assert measured_flops(slim, x[:1]) == sn.flops() <= 0.3 * sn.dense_flops


def test_a_union_must_join_known_groups_of_one_width():
    from espn.models import MODELS, ModelSpec

    model = MODELS.get("resnet18-reduced")(ModelSpec((3, 8, 8), 2, True, stream_pruning="per-conv"))
    model.unit_unions["layer1.0.out"] = ("conv1", "layer2.0.conv2")
    with pytest.raises(ValueError, match=r"unit union 'layer1\.0\.out' joins groups of different"):
        Supernet(model, torch.zeros(2, 3, 8, 8))
    model.unit_unions["layer1.0.out"] = ("conv1", "nope")
    with pytest.raises(ValueError, match=r"no gate/BatchNorm for \['nope'\]"):
        Supernet(model, torch.zeros(2, 3, 8, 8))


@pytest.mark.parametrize("streams", STREAM_PRUNING)
def test_api_runs_save_and_load_with_the_streams_they_were_built_with(tmp_path, streams):
    """``espn.wrap(name, ..., stream_pruning=...)`` builds the streams; the learner records
    them, a saved run loads into the same streams and evaluates the same; asking the learner
    for other streams than the model's is refused."""
    import espn

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 3, 8, 8, generator=gen), torch.randint(0, 2, (16,), generator=gen)
    sn = espn.wrap("resnet18-reduced", x[:2], n_classes=2, stream_pruning=streams)
    assert sn.stream_pruning == streams
    learner = espn.ContinualLearner(sn, "espn", epochs=(1, 1, 1), batch_size=8, gamma=0.5)
    learner.learn((x, y), test=(x, y))
    assert learner.strategy.settings["stream_pruning"] == streams
    learner.save(tmp_path / "run")
    loaded = espn.load(tmp_path / "run")
    assert loaded.supernet.stream_pruning == streams
    assert loaded.evaluate(0, (x, y)) == learner.evaluate(0, (x, y))
    other = "coupled" if streams == "per-conv" else "per-conv"
    with pytest.raises(espn.api.checks.ApiArgumentError, match="built with the model"):
        espn.ContinualLearner(sn, "espn", stream_pruning=other)
    with pytest.raises(espn.api.checks.ApiArgumentError, match="got 'x'"):
        espn.wrap("resnet18-reduced", x[:2], stream_pruning="x")


def test_per_conv_penalty_weights_are_per_conv():
    """Each conv writing into a stream has its own FLOP-aware penalty weight, from its own
    cost (a 1x1 downsample reading 20 channels costs 18x less per channel than the 3x3 conv
    beside it, reading 40); coupled,
    they share the stream's one weight."""
    from espn.models import MODELS, ModelSpec
    from espn.pruning import FlopAwareL1

    for streams in STREAM_PRUNING:
        spec = ModelSpec((3, 16, 16), 2, True, stream_pruning=streams)
        sn = Supernet(MODELS.get("resnet18-reduced")(spec), torch.zeros(2, 3, 16, 16))
        penalty = FlopAwareL1(1.0)
        penalty.refresh(sn)
        if streams == "coupled":
            assert "layer2.0.downsample" not in penalty.lambdas and "layer2" in penalty.lambdas
            continue
        assert set(penalty.lambdas) == set(sn.groups) and "layer2" not in penalty.lambdas
        loads = sn.unit_flops()
        assert loads["layer2.0.conv2"] == 18 * loads["layer2.0.downsample"]
        ratio = penalty.lambdas["layer2.0.conv2"] / penalty.lambdas["layer2.0.downsample"]
        assert ratio == pytest.approx(math.sqrt(18))  # the paper's sqrt(FLOP_l)
