"""The compiled training step (``compile=True``, ``espn run --compile``).

The compiled runs here use torch.compile's ``aot_eager`` backend: it traces the step as
``--compile`` does (graphs, guards, recompiles, the compiled backward) without generating
code, so a test takes seconds; inductor itself runs in the slow and the CUDA tests.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn
from typer.testing import CliRunner

import espn
from espn.cli.main import app
from espn.training.compile import StepCompiler
from espn.training.engine import autocast_dtype
from helpers.deploy import cli_options

BACKEND = "aot_eager"


def data(seed: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(80, *shape, generator=gen), torch.randint(0, 4, (80,), generator=gen)


def supernet(model: str) -> tuple[espn.Supernet, tuple[int, ...]]:
    torch.manual_seed(0)
    if model == "mlp":
        mlp = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))
        return espn.wrap(mlp, torch.zeros(2, 1, 8, 8)), (1, 8, 8)
    conv = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )
    return espn.wrap(conv, torch.zeros(2, 3, 6, 6)), (3, 6, 6)


def learner(model: str, compiled: bool) -> espn.ContinualLearner:
    """ESPN-0.5 on ``model``, 4 steps an epoch, 8 prune events a task; compiled with
    :data:`BACKEND` when ``compiled``."""
    sn, _ = supernet(model)
    out = espn.ContinualLearner(sn, "espn", gamma=0.5, batch_size=20, epochs=(1, 2, 1))
    if compiled:
        out.engine.compiler = StepCompiler(BACKEND)
    return out


def test_a_prune_event_compiles_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """Masks, gates and lambdas change in place at a prune event: the compiled step's graphs
    are compiled per phase structure (penalty on, then gates released and penalty off), not
    per prune event, and not again for a second task; each compile is logged."""
    caplog.set_level(logging.DEBUG, logger="espn.training.compile")
    torch._dynamo.reset()
    run = learner("mlp", compiled=True)
    events = []
    prune_step = run.strategy.prune_step

    def counted(supernet: espn.Supernet, progress: float) -> None:
        events.append(progress)
        prune_step(supernet, progress)

    run.strategy.prune_step = counted  # type: ignore[method-assign]
    shape = supernet("mlp")[1]
    run.learn(data(1, shape))
    first = len(events)
    run.learn(data(2, shape))
    graphs = [r["compiled_graphs"] for r in run.records]
    assert first == 8 and len(events) == 16
    assert sum(graphs) == run.engine.compiler.graphs
    assert graphs[0] == 2  # penalty on (pre-training, pruning), then off (fine-tuning)
    assert graphs[1] == 0
    assert sum(graphs) <= len(events) // 8  # far below one per prune event
    logged = [r for r in caplog.records if r.name == "espn.training.compile"]
    assert len(logged) == sum(graphs)


@pytest.mark.parametrize("model", ["mlp", "conv"])
def test_compiled_training_matches_eager_and_keeps_frozen_weights(model: str) -> None:
    """The same two tasks trained eagerly and compiled reach the same weights (float
    tolerance: a compiled graph may order sums differently), and under compile task 0's
    weights stay bit-identical while task 1 trains."""
    torch._dynamo.reset()
    shape = supernet(model)[1]
    runs = {compiled: learner(model, compiled) for compiled in (False, True)}
    for run in runs.values():
        torch.manual_seed(1)  # a new task's head starts from torch's global generator
        run.learn(data(1, shape))
    sn = runs[True].supernet
    kept = {n: layer.frozen.clone() for n, layer in sn.layers.items()}
    frozen = {n: layer.weight.detach()[kept[n]].clone() for n, layer in sn.layers.items()}
    for run in runs.values():
        torch.manual_seed(2)
        run.learn(data(2, shape))
    for name, layer in sn.layers.items():
        assert bool(kept[name].any())
        assert torch.equal(layer.weight.detach()[kept[name]], frozen[name]), name
    eager, compiled = (dict(runs[c].supernet.state_dict()) for c in (False, True))
    for key, value in eager.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            torch.testing.assert_close(compiled[key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert runs[True].engine.compiler.graphs >= 1
    assert runs[False].accuracy_matrix == runs[True].accuracy_matrix


def test_the_compile_setting_reaches_the_engine() -> None:
    """compile=True gives the engine a step compiler (inductor, as espn run --compile); the
    default trains eagerly and records no compiled graphs."""
    sn, shape = supernet("mlp")
    assert espn.ContinualLearner(sn, "espn", compile=True).engine.compiler.backend == "inductor"
    eager = espn.ContinualLearner(sn, "espn", batch_size=40, epochs=(1, 1, 1))
    assert eager.engine.compiler is None
    eager.learn(data(1, shape))
    assert "compiled_graphs" not in eager.records[0]


def test_amp_autocasts_to_bfloat16_unless_the_gpu_lacks_it(monkeypatch) -> None:
    assert autocast_dtype("cpu") == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert autocast_dtype("cuda") == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert autocast_dtype("cuda") == torch.float16


@pytest.mark.parametrize("compile", [True, False])
def test_compile_on_a_cpu_warns(monkeypatch, tmp_path: Path, compile: bool) -> None:
    """espn run --compile on a CPU warns that compiling takes minutes there (the run goes on;
    here it is stopped right after the configuration)."""
    import espn.api.experiment

    class Stop(Exception):
        pass

    def fake_run(*args: object, **kwargs: object) -> None:
        raise Stop

    monkeypatch.setattr(espn.api.experiment, "run_experiment", fake_run)
    args = ["run", "--benchmark", "permuted-mnist", "--out", str(tmp_path / "o")]
    flags = ["--compile"] if compile else []
    result = CliRunner().invoke(app, [*args, *flags], env={"ESPN_DEBUG": "1"})
    assert isinstance(result.exception, Stop), result.output
    text = " ".join(result.output.split())
    assert ("warning: --compile on a CPU compiles the step" in text) == compile
    # how long it takes and when it pays
    assert ("about 90-130 s" in text and "it pays only when the steps" in text) == compile


@pytest.mark.slow
def test_espn_run_compile_end_to_end(fake_mnist: dict, fc_test_model: str, tmp_path: Path) -> None:
    """``espn run --compile`` with inductor on the CPU (the shared tiny FC run on synthetic
    MNIST, 8 prune events a task): the run finishes and each task's record says how many
    graphs it compiled, a few per task whatever the prune events."""
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*cli_options(out), "--compile"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    graphs = doc["compiled_graphs"]  # per task
    # a short last batch is a second shape; a task's two structures (penalty on, off) are
    # compiled in each, a later task's slim fine-tuning copy of other widths in each
    shapes = [1 + (n % 128 != 0) for n in doc["train_samples"]]
    assert len(graphs) == 3 and 1 <= graphs[0] <= 2 * shapes[0], graphs
    assert all(g <= s for g, s in zip(graphs[1:], shapes[1:], strict=True)), graphs


@pytest.mark.slow
def test_compile_step_benchmark_times_the_four_loops() -> None:
    """benchmarks/compile_step.py (the aot_eager backend on the CPU): plain, plain compiled,
    espn and espn compiled timed in every phase, and a smoke-sized paper-recipe task."""
    from test_benchmark_scripts import run_script

    out = run_script(
        "compile_step.py",
        *("--models", "fc1024", "--backend", "aot_eager", "--steps", "2", "--repeats", "1"),
        *("--batch", "8", "--task", "--task-images", "16", "--task-scale", "100"),
    )
    rows = [row.split() for row in out.splitlines() if row.split()[:1] == ["fc1024"]]
    assert [r[2] for r in rows] == ["pretrain", "prune", "finetune"]
    assert all(len(r) == 9 for r in rows)  # 4 loops, espn's two with their ratios
    assert "2 graphs for tasks 0 and 1" in out
    tasks = [line for line in out.splitlines() if line.startswith("paper-recipe task")]
    assert len(tasks) == 2 and "compiled (" in tasks[1]
