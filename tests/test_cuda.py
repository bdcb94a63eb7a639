"""Every method, and the conv and attention supernets, on a GPU: ``pytest -m cuda``.

Deselected by default (CI has no GPU). Each case learns three small tasks on the device and
checks that task 0's logits stay bit-identical, that FLOPs stay within the budget and, for the
methods with a slim export, that the exported model matches the supernet (the export checks
itself in full float32). ``ESPN_TEST_DEVICE=cpu pytest -m cuda`` runs the same cases on the CPU.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
from torch import nn

import espn
from espn.training.callbacks import Callback
from helpers.images import fake_raw

DEVICE = os.environ.get("ESPN_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="no CUDA device"
    ),
]
CASES = [(m, "mlp") for m in ("espn", "packnet", "individual", "supsup", "cpg", "rmn")]
CASES += [("espn", "resnet18-reduced"), ("packnet", "resnet18-reduced"), ("espn", "vit-p4")]
EXPORTED = ("espn", "packnet", "individual")


def task(seed: int, shape: tuple[int, ...]) -> tuple[tuple, tuple]:
    """4 classes of noisy prototypes (the image tests' fake data), 200 training and 100 test
    inputs scaled to [0, 1]."""
    raw = fake_raw(4, 50, 25, shape, seed)
    train, test = ((x.float() / 255, y) for x, y in (raw["train"], raw["test"]))
    return train, test


def supernet(model: str) -> tuple[espn.Supernet, tuple[int, ...]]:
    torch.manual_seed(0)
    if model == "mlp":
        mlp = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4))
        return espn.wrap(mlp, torch.zeros(2, 1, 8, 8)), (1, 8, 8)
    return espn.wrap(model, torch.zeros(2, 3, 32, 32), n_classes=4), (3, 32, 32)


@pytest.mark.parametrize(("method", "model"), CASES)
def test_method_on_the_device(method: str, model: str, tmp_path) -> None:
    sn, shape = supernet(model)
    gamma = 0.5 if method in ("espn", "individual") else 1.0
    settings = {"gamma": gamma} if gamma < 1 else {}
    # one epoch per phase: CPG's and RMN's own rules would keep every weight for task 0 (and
    # the run stop before task 1); these runs cap what each task keeps
    settings |= {"cpg": {"cpg_train_acc": 0.0}, "rmn": {"rmn_budget": 0.5}}.get(method, {})
    learner = espn.ContinualLearner(
        sn, method, device=DEVICE, batch_size=50, epochs=(1, 1, 1), **settings
    )
    tasks = [task(seed, shape) for seed in range(3)]
    probe = tasks[0][1][0][:50].to(DEVICE)
    learner.learn(*tasks[0])
    sn.eval()
    with torch.no_grad():
        first = sn(probe, task=0).clone()
    for train, test in tasks[1:]:
        learner.learn(train, test=test)
        sn.eval()
        with torch.no_grad():
            assert torch.equal(sn(probe, task=0), first)
    assert all(r["flops_ratio"] <= gamma + 1e-9 for r in learner.report())
    assert next(sn.parameters()).device.type == torch.device(DEVICE).type
    if method in EXPORTED:
        report = learner.export(0, tmp_path / "task0.pt2")
        assert report.max_abs_diff <= report.tolerance


def test_mtl_on_the_device() -> None:
    sn, shape = supernet("mlp")
    learner = espn.ContinualLearner(sn, "mtl", device=DEVICE, batch_size=50, epochs=(1, 1, 1))
    learner.learn_all([task(seed, shape) for seed in range(3)])
    assert len(learner.accuracy_matrix[-1]) == 3


def test_step_cost_runs_on_the_device() -> None:
    """benchmarks/step_cost.py on the device: the plain network computes the supernet's
    logits, and every phase of ESPN and PackNet is timed against it."""
    from test_benchmark_scripts import run_script

    device = "cuda" if DEVICE.startswith("cuda") else "cpu"
    out = run_script(
        "step_cost.py",
        *("--device", device, "--models", "fc1024,resnet18-reduced", "--methods", "espn,packnet"),
        *("--steps", "2", "--repeats", "1", "--batch", "16"),
    )
    rows = [
        row.split()
        for row in out.splitlines()
        if row.split()[:1] in (["fc1024"], ["resnet18-reduced"])
    ]
    # each method against the plain loop and the plain loop with the recipe's L2 term
    assert [r[1] for r in rows] == ["ESPN-0.2", "ESPN-0.2", "packnet", "packnet"] * 2
    assert [r[3] for r in rows] == ["plain", "plain+L2"] * 4


def test_lean_penalties_match_the_loop_on_the_device() -> None:
    """The fused masked-L2 term and its gradient equal the per-layer loop on the device."""
    from espn.pruning.regularisers import masked_weight_l2
    from test_lean_step import reference_l2, small_supernet

    sn = small_supernet().to(DEVICE)
    second = list(sn.layers.values())[1]
    second.weight_mask.copy_((torch.rand(second.weight.shape, device=DEVICE) < 0.6).float())
    sn.note_masks()
    results = []
    for term in (masked_weight_l2, reference_l2):
        sn.zero_grad(set_to_none=True)
        value = term(sn)
        value.backward()
        results.append([value.detach()] + [m.weight.grad.clone() for m in sn.layers.values()])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


class Losses(Callback):
    """Every step's training loss (read on the host: a test, not a training run)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_step_end(self, learner, end) -> None:
        self.values.append(float(end.loss))


def compiled_learner(model: str, compile: bool, **settings) -> espn.ContinualLearner:
    """ESPN-0.5 with the step compiled by inductor on the device (aot_eager on the CPU, where
    inductor's compile takes minutes)."""
    from espn.training.compile import StepCompiler

    sn, _ = supernet(model)
    learner = espn.ContinualLearner(
        sn, "espn", device=DEVICE, batch_size=50, epochs=(1, 1, 1), gamma=0.5, **settings
    )
    if compile:
        backend = "inductor" if DEVICE.startswith("cuda") else "aot_eager"
        learner.engine.compiler = StepCompiler(backend)
    return learner


#: the graphs ``test_compiled_step_on_the_device`` compiles in each of its two tasks
GRAPHS_PER_TASK = {"mlp": [2, 0], "resnet18-reduced": [2, 1]}


@pytest.mark.parametrize(("model", "amp"), [("mlp", False), ("resnet18-reduced", True)])
def test_compiled_step_on_the_device(
    model: str, amp: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """--compile on the device (CUDA graphs, channels_last for the ResNet, bfloat16 with
    amp): the first two steps' losses are the eager step's, task 0's logits stay bit-identical
    while task 1 trains, and a task compiles a few graphs, not one per prune event (the
    second task at most one, for a slim fine-tuning copy of other widths)."""
    import torch._dynamo

    # torch's structured-trace logger writes every compile at DEBUG: not this test's report
    caplog.set_level(logging.WARNING, logger="torch.__trace")
    torch._dynamo.reset()
    shape = supernet(model)[1]
    tasks = [task(seed, shape) for seed in range(2)]
    losses = {}
    for compile in (False, True):
        learner = compiled_learner(model, compile, amp=amp)
        seen = Losses()
        learner.callbacks.callbacks.append(seen)
        torch.manual_seed(1)
        learner.learn(*tasks[0])
        # the first step checks the forward pass, the second the backward and the update (a
        # few more would compare Adam's sign-like first updates of near-zero gradients)
        losses[compile] = seen.values[:2]
    sn = learner.supernet
    assert learner.engine.amp_dtype == torch.bfloat16
    if DEVICE.startswith("cuda"):
        assert learner.engine.compiler.mode == "reduce-overhead"
    tolerance = 2e-2 if amp else 1e-4
    torch.testing.assert_close(losses[True], losses[False], rtol=tolerance, atol=tolerance)
    probe = tasks[0][1][0][:50].to(DEVICE)
    sn.eval()
    with torch.no_grad():
        first = sn(probe, task=0).clone()
    learner.learn(*tasks[1])
    sn.eval()
    with torch.no_grad():
        assert torch.equal(sn(probe, task=0), first)
    graphs = [r["compiled_graphs"] for r in learner.records]
    # task 0: one graph with the unit penalty (pre-training, pruning), one without it
    # (fine-tuning), none per prune event; task 1 reuses them but where its slim fine-tuning
    # copy has widths task 0's had not (the ResNet's). Counted by this test with
    # ESPN_TEST_DEVICE=cpu: CUDA changes the backend's mode and the input layout, not the
    # Python step dynamo traces
    assert graphs == GRAPHS_PER_TASK[model], graphs


def test_compile_step_benchmark_runs_on_the_device() -> None:
    """benchmarks/compile_step.py on the device: the four loops timed in every phase."""
    from test_benchmark_scripts import run_script

    device = "cuda" if DEVICE.startswith("cuda") else "cpu"
    backend = "inductor" if device == "cuda" else "aot_eager"
    out = run_script(
        "compile_step.py",
        *("--device", device, "--models", "fc1024", "--backend", backend),
        *("--steps", "2", "--repeats", "1", "--batch", "16"),
    )
    rows = [row.split() for row in out.splitlines() if row.split()[:1] == ["fc1024"]]
    assert [r[2] for r in rows] == ["pretrain", "prune", "finetune"]


def test_weight_selection_on_the_device() -> None:
    """A prune event's selection on the device (a layer large enough for the sampled bracket,
    with ties) keeps exactly the weights it keeps on the CPU, and the reference's."""
    from espn.pruning.weights import largest_free
    from test_weight_selection import reference, weights

    w = weights((256, 300), 5, seed=0).abs()
    free = torch.rand(w.shape, generator=torch.Generator().manual_seed(1)) < 0.9
    for n in (1, 20000, 60000):
        on_device, _ = largest_free(w.to(DEVICE), free.to(DEVICE), n)
        assert torch.equal(on_device.cpu(), reference(w, free, n))
