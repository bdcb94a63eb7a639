"""The Python API: wrapping a user's model, learning from DataLoaders and tensors, state that
round-trips (``state_dict`` and checkpoints), and checkpoints shared with the CLI both ways."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from typer.testing import CliRunner

import espn
from espn.api.experiment import build_benchmark
from espn.checkpoint.format import CheckpointError
from espn.cli.main import app
from espn.data.tensors import split_tensors
from espn.evaluation.metrics import task_logits
from espn.runs.loading import load_run
from espn.supernet import Supernet
from helpers.api_models import SmallConvNet, SmallMLP
from helpers.deploy import make_model, train_tiny

runner = CliRunner()
TESTS = Path(__file__).parent


def tiny_data(seed: int, n: int = 96, n_classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Learnable 1x8x8 samples: noisy class prototypes (seed picks the task)."""
    gen = torch.Generator().manual_seed(seed)
    protos = torch.randn(n_classes, 1, 8, 8, generator=gen) * 2
    y = torch.arange(n) % n_classes
    return protos[y] + 0.5 * torch.randn(n, 1, 8, 8, generator=gen), y


def learner_of(model: nn.Module | type, **model_args: object) -> espn.ContinualLearner:
    torch.manual_seed(0)
    sn = espn.wrap(model, torch.zeros(2, 1, 8, 8), **model_args)
    return espn.ContinualLearner(
        sn, "espn", gamma=0.5, alpha=0.3, epochs=(1, 1, 1), lr=1e-2, batch_size=16
    )


# ------------------------------------------------------------------ inputs
def test_dataloader_and_tensors_learn_the_same_task() -> None:
    """A DataLoader, a list of batches and an (x, y) pair are the same data: the engine
    batches and shuffles it itself, so all three learn bit-identical tasks."""
    x, y = tiny_data(1)
    test = tiny_data(2)
    inputs = {
        "loader": DataLoader(TensorDataset(x, y), batch_size=10),
        "list": [(x[i : i + 7], y[i : i + 7]) for i in range(0, len(x), 7)],
        "tensors": (x, y),
    }
    logits = {}
    for kind, data in inputs.items():
        learner = learner_of(SmallMLP)  # built under the seed: the same initial weights
        record = learner.learn(data, test=test, name=kind)
        assert record["flops_ratio"] <= 0.5 and record["train_samples"] == len(x)
        assert learner.names == [kind] and len(learner.accuracy_matrix) == 1
        logits[kind] = learner.supernet(test[0], task=0)
    assert torch.equal(logits["loader"], logits["tensors"])
    assert torch.equal(logits["list"], logits["tensors"])


def test_two_tasks_accuracy_matrix_report_and_zero_forgetting() -> None:
    learner = learner_of(SmallConvNet)
    learner.learn(tiny_data(1), test=tiny_data(2))
    before = learner.supernet(tiny_data(2)[0], task=0).clone()
    learner.learn(DataLoader(TensorDataset(*tiny_data(3)), batch_size=16), test=tiny_data(4))
    matrix = learner.accuracy_matrix
    assert len(matrix) == 2 and len(matrix[1]) == 2
    assert matrix[0][0] == matrix[1][0] > 50  # learned, and not forgotten
    assert matrix[1][1] == learner.evaluate(1) == learner.evaluate(1, tiny_data(4))
    assert torch.equal(learner.supernet(tiny_data(2)[0], task=0), before)
    report = learner.report()
    assert [r["task"] for r in report] == [0, 1]
    for r in report:  # an independent count of the task's weights
        mask = learner.supernet.masks[r["task"]]
        assert r["used_weights"] == mask.nnz() and r["flops_ratio"] <= 0.5


def test_bad_inputs_are_refused_with_what_is_accepted() -> None:
    learner = learner_of(SmallMLP())
    x, y = tiny_data(1)
    with pytest.raises(ValueError, match=r"expected \(x, y\) tensors or an iterable"):
        learner.learn(x)
    with pytest.raises(ValueError, match="labels must be integer class indices"):
        learner.learn((x, y.float()))
    with pytest.raises(ValueError, match="n_classes 2 does not cover the labels"):
        learner.learn((x, y), n_classes=2)
    with pytest.raises(ValueError, match="no task is learned yet"):
        learner.evaluate(0, (x, y))
    sn = espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8))
    with pytest.raises(ValueError, match=r"gamma 0\.001 is below the smallest FLOPs ratio"):
        espn.ContinualLearner(sn, gamma=0.001).learn((x, y))
    with pytest.raises(ValueError, match="method 'mtl' trains all tasks together"):
        espn.ContinualLearner(sn, "mtl").learn((x, y))
    assert sn.masks == []  # nothing was learned by the refused calls


def test_a_model_with_nothing_to_mask_is_refused() -> None:
    with pytest.raises(ValueError, match=r"nothing to mask.*nn\.Linear and nn\.Conv2d"):
        Supernet(nn.Sequential(nn.Linear(64, 3)), torch.zeros(2, 64))
    with pytest.raises(ValueError, match=r"LayerNorm '1' does not follow any linear or conv"):
        espn.wrap(
            nn.Sequential(nn.Flatten(), nn.LayerNorm(64), nn.Linear(64, 3)), torch.zeros(2, 64)
        )


def test_a_torchvision_resnet_is_wrapped_by_reference() -> None:
    torchvision = pytest.importorskip("torchvision")
    sn = espn.wrap(torchvision.models.resnet18, torch.zeros(2, 3, 32, 32), num_classes=5)
    assert sn.model_name == "torchvision.models.resnet:resnet18(num_classes=5)"
    assert len(sn.layers) == 20 and sn.dense_flops > 0  # 20 convs (incl. downsampling) + head


# ------------------------------------------------------------- state_dict
@pytest.mark.parametrize("kind", ["fc", "conv"])
def test_state_dict_round_trip_keeps_every_task_bit_for_bit(kind: str) -> None:
    sn, seq, _ = train_tiny(kind)
    want = [task_logits(sn, seq.tasks[t], t) for t in range(3)]
    buffer = io.BytesIO()
    torch.save(sn.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)  # tensors and plain containers only
    torch.manual_seed(123)  # other initial weights: everything must come from the state
    fresh = Supernet(make_model(kind), seq.tasks[0].train.x[:2])
    fresh.load_state_dict(state)
    assert len(fresh.masks) == 3
    for t in range(3):
        assert torch.equal(task_logits(fresh, seq.tasks[t], t), want[t])
        assert fresh.masks[t].nnz() == sn.masks[t].nnz()
    for name in sn.layers:
        assert torch.equal(fresh.owners.ids[name], sn.owners.ids[name])
        assert torch.equal(fresh.layers[name].frozen, sn.layers[name].frozen)


@pytest.mark.parametrize(
    ("method", "settings"),
    [("packnet", {}), ("individual", {"gamma": 0.5}), ("supsup", {"supsup_k": 0.3})],
)
def test_state_dict_round_trip_of_other_methods(method: str, settings: dict) -> None:
    """Own weights (Individual) and fixed weights with per-task masks (SupSup) round-trip
    too, through torch.save and a weights-only torch.load."""
    torch.manual_seed(0)
    sn = espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8))
    learner = espn.ContinualLearner(sn, method, epochs=(1, 1, 1), lr=1e-2, **settings)
    for seed in (1, 3):
        learner.learn(tiny_data(seed))
    x = tiny_data(2)[0]
    want = [sn(x, task=t).detach() for t in range(2)]
    buffer = io.BytesIO()
    torch.save(sn.state_dict(), buffer)
    buffer.seek(0)
    torch.manual_seed(7)
    fresh = espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8))
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    for t in range(2):
        assert torch.equal(fresh(x, task=t), want[t])


def test_method_by_class_with_its_own_option_and_settings_checked(tmp_path: Path) -> None:
    from espn.methods.supsup import SupSup

    sn = espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8))
    assert espn.ContinualLearner(sn).strategy.cfg.gamma == 0.2  # ESPN-0.2 as on the CLI
    with pytest.raises(ValueError, match="unknown setting 'gama' for method 'espn'"):
        espn.ContinualLearner(sn, "espn", gama=0.3)
    learner = espn.ContinualLearner(sn, SupSup, supsup_k=0.3, epochs=(1, 1, 1), lr=1e-2)
    learner.learn(tiny_data(1), test=tiny_data(2))
    run = learner.save(tmp_path / "run")
    config = json.loads((run / "results.json").read_text())["config"]
    assert config["method"] == "supsup" and config["method_options"]["supsup_k"] == 0.3
    again = espn.load(run)
    assert type(again.strategy) is SupSup and again.strategy.settings == learner.strategy.settings
    assert again.evaluate(0) == learner.accuracy_matrix[0][0]


def test_state_dict_of_another_model_is_refused() -> None:
    sn, _, _ = train_tiny("fc", n_tasks=1)
    wider = espn.wrap(SmallMLP(hidden=16), torch.zeros(2, 1, 8, 8))
    with pytest.raises(ValueError, match="masked layers differ"):
        wider.load_state_dict(sn.state_dict())


# ----------------------------------------------------- checkpoints and the CLI
def saved_run(tmp_path: Path) -> tuple[espn.ContinualLearner, Path]:
    """Two tasks learned from Python into a model built by reference, saved in tmp_path/run."""
    learner = learner_of(SmallConvNet, n_classes=3)
    learner.learn(tiny_data(1), test=tiny_data(2), name="first")
    learner.learn(tiny_data(3), test=tiny_data(4), name="second")
    return learner, learner.save(tmp_path / "run")


def test_api_checkpoint_is_read_by_espn_evaluate_and_export(tmp_path: Path) -> None:
    learner, run = saved_run(tmp_path)
    matrix = learner.accuracy_matrix
    doc = json.loads((run / "results.json").read_text())
    assert doc["accuracy_matrix"] == matrix and doc["task_names"] == ["first", "second"]
    result = runner.invoke(app, ["evaluate", "--run", str(run)])
    assert result.exit_code == 0, result.output
    assert "all 2 tasks match results.json" in result.output
    out = tmp_path / "second.pt2"
    args = ["export", "--run", str(run), "--task", "1", "--out", str(out), "--no-onnx"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    exported = torch.export.load(str(out)).module()
    x = tiny_data(4)[0]
    assert torch.allclose(exported(x), learner.supernet(x, task=1), atol=1e-4)
    again = espn.load(run)  # and the API reads its own checkpoint back
    assert again.accuracy_matrix == matrix and again.names == ["first", "second"]
    for t in range(2):
        assert again.evaluate(t) == matrix[1][t]
        assert torch.equal(again.supernet(x, task=t), learner.supernet(x, task=t))


def test_api_checkpoint_is_read_by_espn_evaluate_in_another_process(tmp_path: Path) -> None:
    """A fresh process rebuilds the model from the checkpoint's import reference alone, when
    told to trust the code it names."""
    _, run = saved_run(tmp_path)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    info = subprocess.run(
        [
            sys.executable,
            "-m",
            "espn.cli.main",
            "evaluate",
            "--run",
            str(run),
            "--trust-model-code",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert info.returncode == 0, info.stderr
    assert "all 2 tasks match results.json" in info.stdout


def test_model_instance_checkpoint_loads_with_the_model_given(tmp_path: Path) -> None:
    learner = learner_of(SmallMLP())
    learner.learn(tiny_data(1), test=tiny_data(2))
    run = learner.save(tmp_path / "run")
    again = espn.load(run, model=SmallMLP())
    x = tiny_data(2)[0]
    assert torch.equal(again.supernet(x, task=0), learner.supernet(x, task=0))
    again.learn(tiny_data(3), test=tiny_data(4))  # and goes on learning, forgetting nothing
    assert torch.equal(again.supernet(x, task=0), learner.supernet(x, task=0))
    assert again.accuracy_matrix[1][0] == learner.accuracy_matrix[0][0]
    with pytest.raises(CheckpointError, match="already holds a run's output"):
        again.save(run)
    again.save(run, overwrite=True)
    third = espn.load(run, model=SmallMLP())
    assert third.accuracy_matrix == again.accuracy_matrix and len(third.supernet.masks) == 2


def test_cli_run_checkpoint_loads_in_the_api(cli_run: Path) -> None:
    learner = espn.load(cli_run)
    doc = json.loads((cli_run / "results.json").read_text())
    seq = build_benchmark(load_run(cli_run).config)
    assert learner.names == doc["task_names"]
    assert learner.accuracy_matrix == doc["accuracy_matrix"]
    for t, task in enumerate(seq.tasks):
        assert learner.evaluate(t, split_tensors(task, "test")) == doc["final_accuracy"][t]
    assert [r["flops"] for r in learner.report()] == doc["flops"]
    with_data = espn.load(cli_run, benchmark_data=True)
    assert [with_data.evaluate(t) for t in range(len(seq))] == doc["final_accuracy"]


def test_espn_run_on_task_files_with_a_model_by_reference(tmp_path: Path) -> None:
    """Task files (benchmark ``tensors``) and an import-reference model on the CLI; the run's
    checkpoint then loads in the API with its test data."""
    from espn.data.tensors import save_task, task_path, tensor_task

    for t in range(2):
        task = tensor_task(f"mine {t}", tiny_data(2 * t + 1), tiny_data(2 * t + 2))
        save_task(task_path(tmp_path / "data", t), task)
    out = tmp_path / "run"
    model = "helpers.api_models:SmallMLP(n_in=64, hidden=32)"
    args = ["run", "--benchmark", "tensors", "--data-dir", str(tmp_path / "data"), "--tasks", "2"]
    args += ["--model", model, "--epochs", "1,1,1", "--batch-size", "16", "--out", str(out)]
    result = runner.invoke(app, [*args, "--no-progress", "--quiet"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    learner = espn.load(out)
    assert learner.names == ["mine 0", "mine 1"] and learner.supernet.model_name == model
    assert [learner.evaluate(t) for t in range(2)] == doc["final_accuracy"]


def test_a_model_only_this_script_can_build_is_loaded_by_passing_it_again(
    tmp_path: Path,
) -> None:
    class ScriptNet(SmallMLP):
        """Defined in a function: no other process can import it."""

    torch.manual_seed(0)
    sn = espn.wrap(ScriptNet, torch.zeros(2, 1, 8, 8), hidden=16)
    assert sn.model_name is not None and sn.model_name.endswith("ScriptNet instance>")
    learner = espn.ContinualLearner(sn, epochs=(1, 1, 1), lr=1e-2)
    learner.learn(tiny_data(1), test=tiny_data(2))
    run = learner.save(tmp_path / "run")
    result = runner.invoke(app, ["evaluate", "--run", str(run)])
    assert result.exit_code == 2
    assert "model=ScriptNet(...)" in " ".join(result.output.split())
    again = espn.load(run, model=ScriptNet(hidden=16))
    assert again.evaluate(0) == learner.accuracy_matrix[0][0]


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("subprocess:run(args='ls')", "is not an nn.Module class nor a function annotated"),
        ("helpers.api_models:SmallMLP(hidden=len('ab'))", "must be key=literal pairs"),
        ("helpers.no_such_module:Net()", "cannot be imported here"),
    ],
)
def test_a_model_reference_runs_nothing_but_a_model_factory(
    model: str, message: str, tmp_path: Path
) -> None:
    args = ["run", "--benchmark", "tensors", "--data-dir", str(tmp_path), "--model", model]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_a_run_saved_without_test_data_is_read_by_espn_info_and_show(tmp_path: Path) -> None:
    """Tasks learned without test data (as an Avalanche stream's) save a results.json the
    CLI accepts: no accuracy is recorded, the budgets are."""
    learner = learner_of(SmallMLP)
    learner.learn(tiny_data(0), name="first")
    learner.learn(tiny_data(1), name="second")
    run = learner.save(tmp_path / "run")
    doc = json.loads((run / "results.json").read_text())
    assert doc["final_accuracy"] == [] and len(doc["flops_ratio"]) == 2
    for argv in (["info", "--run", str(run)], ["show", str(run)]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 0, result.output


def test_the_learner_trains_mtl_as_espn_run_does(tmp_path: Path) -> None:
    """MTL through the Python learner (all tasks at once, ``learn_all``) is the very run
    ``espn run --method mtl`` makes of the same task files: bit-identical logits, the same
    single accuracy row and per-task records, and a saved run that reloads."""
    from espn.data.tensors import save_task, task_path, tensor_task

    data = [(tiny_data(2 * t + 1), tiny_data(2 * t + 2)) for t in range(2)]
    for t, (train, test) in enumerate(data):
        save_task(task_path(tmp_path / "data", t), tensor_task(f"task {t}", train, test))
    model = "helpers.api_models:SmallMLP(n_in=64, hidden=32)"
    args = ["run", "--benchmark", "tensors", "--data-dir", str(tmp_path / "data"), "--tasks", "2"]
    args += ["--model", model, "--method", "mtl", "--epochs", "1,1,1", "--batch-size", "16"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "cli"), "--no-progress"])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "cli" / "results.json").read_text())

    torch.manual_seed(0)  # espn run seeds the model's initialisation with --seed 0
    sn = espn.wrap(model, torch.zeros(2, 1, 8, 8))
    learner = espn.ContinualLearner(sn, "mtl", epochs=(1, 1, 1), batch_size=16)
    with pytest.raises(ValueError, match="method 'mtl' trains all tasks together"):
        learner.learn(*data[0])
    records = learner.learn_all(data)
    assert len(records) == 2 and len(learner.accuracy_matrix) == 1  # one joint step
    assert learner.accuracy_matrix == doc["accuracy_matrix"]
    assert [r["new_weights"] for r in records] == doc["new_weights"]
    cli = espn.load(tmp_path / "cli")
    for t, (_, test) in enumerate(data):
        assert torch.equal(learner.supernet(test[0], task=t), cli.supernet(test[0], task=t))
        assert learner.evaluate(t) == doc["final_accuracy"][t]
    saved = espn.load(learner.save(tmp_path / "api"))
    assert [saved.evaluate(t) for t in range(2)] == doc["final_accuracy"]
    with pytest.raises(ValueError, match="learns all its tasks in one call"):
        learner.learn_all(data)


# ------------------------------------------------------------------ the front door
def test_the_front_door_exports_what_a_user_reaches_for_first(tmp_path: Path) -> None:
    """``espn.run``, ``create_method`` and the names: the same objects as their homes, the
    names the CLI accepts."""
    from espn.api.experiment import run
    from espn.data.registry import BENCHMARKS
    from espn.methods import METHODS
    from espn.models.registry import MODELS
    from espn.pruning.pruner import PRUNERS
    from espn.runs.config import ConfigError, make_config
    from espn.runs.method import create_method

    assert espn.run is run and espn.create_method is create_method
    assert espn.list_methods() == list(METHODS) and "espn" in espn.list_methods()
    assert espn.list_models() == list(MODELS) and "fc1024" in espn.list_models()
    assert espn.list_benchmarks() == list(BENCHMARKS)
    assert espn.list_pruners() == list(PRUNERS)
    assert sorted(espn.__all__) == sorted([*espn._HOMES, "__version__"])
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = espn.nope
    cfg = make_config(benchmark="permuted-mnist", out=str(tmp_path / "r"))
    with pytest.raises(ConfigError, match=r"not both \(got gamma\)"):
        espn.run(cfg, gamma=0.5)
    with pytest.raises(ConfigError, match=r"gamma must be in \(0, 1\], got 1.5"):
        espn.run(benchmark="permuted-mnist", gamma=1.5, out=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()  # refused before anything was written
