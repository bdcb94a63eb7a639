"""One learner behind both front doors: the Python learner fed a registered benchmark's
tensors learns exactly what ``espn run`` learns on it, and a Python script given ``out=``
writes a run directory that a second run of the script resumes, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import espn
from espn.api.experiment import build_benchmark, run_experiment
from espn.api.learner import LearnerError
from espn.data.tensors import split_tensors
from espn.runs.config import make_config
from espn.training.callbacks import Callback, EpochEnd, StepEnd, TaskEnd
from helpers.deploy import comparable

TESTS = Path(__file__).parent
METHODS = ("espn", "packnet", "supsup", "cpg", "rmn", "individual", "mtl")
#: CPG runs all its compacting rounds; RMN keeps half of the free weights, leaving some for
#: task 1 on a run this short
OWN: dict[str, dict] = {"cpg": {"cpg_train_acc": 0.0}, "rmn": {"rmn_budget": 0.5}}


@pytest.fixture(autouse=True)
def tiny(fake_mnist, fc_test_model):
    """Every test here runs model ``fc-test`` on the fake data."""


def checkpoint_tensors(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Every tensor of a run's checkpoint (task files and the last state file), by file."""
    manifest = json.loads((run / "checkpoint" / "manifest.json").read_text())
    files = [t["file"] for t in manifest["tasks"]] + [manifest["state"]["file"]]
    return {f: load_file(str(run / "checkpoint" / f)) for f in files}


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for f in a:
        assert a[f].keys() == b[f].keys(), f
        for k in a[f]:
            assert torch.equal(a[f][k], b[f][k]), f"{f}: {k}"


@pytest.mark.parametrize("method", METHODS)
def test_the_learner_on_a_benchmarks_tensors_learns_what_espn_run_learns(
    tmp_path: Path, method: str
) -> None:
    """Same seed, the benchmark's recipe (``recipe=``), defaults otherwise: the identical
    accuracy matrix and identical checkpoint tensors (weights, masks, RNG states)."""
    options = {"tasks": 2, "train_per_task": 96, "test_per_task": 48, "epochs": (1, 1, 1)}
    options |= {"batch_size": 32} | OWN.get(method, {})
    cfg = make_config(
        benchmark="permuted-mnist", model="fc-test", method=method, out=tmp_path / "cli", **options
    )
    doc = run_experiment(cfg, progress=False)

    seq = build_benchmark(cfg)
    first = seq.tasks[0]
    torch.manual_seed(cfg.seed)  # as espn run builds the model: under the run's seed
    sn = espn.wrap(
        "fc-test",
        split_tensors(first, "train")[0][:2],
        n_classes=seq.n_classes,
        multi_head=seq.multi_head,
    )
    given = {
        k: v for k, v in options.items() if k not in ("tasks", "train_per_task", "test_per_task")
    }
    learner = espn.ContinualLearner(
        sn, method, recipe="permuted-mnist", out=tmp_path / "api", **given
    )
    data = [(split_tensors(t, "train"), split_tensors(t, "test")) for t in seq.tasks]
    learner.learn_all(data, names=[t.name for t in seq.tasks])

    assert learner.accuracy_matrix == doc["accuracy_matrix"]
    api = json.loads((tmp_path / "api" / "results.json").read_text())
    assert api["accuracy_matrix"] == doc["accuracy_matrix"]
    assert api["flops_ratio"] == doc["flops_ratio"] and api["new_weights"] == doc["new_weights"]
    assert_same_tensors(checkpoint_tensors(tmp_path / "api"), checkpoint_tensors(tmp_path / "cli"))


class Recorder(Callback):
    """What the hooks were told, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def on_run_start(self, learner: object) -> None:
        self.calls.append(("run_start", None))

    def on_task_start(self, learner: object, task: int, name: str) -> None:
        self.calls.append(("task_start", (task, name)))

    def on_step_end(self, learner: object, event: StepEnd) -> None:
        self.calls.append(("step", event))

    def on_epoch_end(self, learner: object, event: EpochEnd) -> None:
        self.calls.append(("epoch", event))

    def on_task_end(self, learner: object, event: TaskEnd) -> None:
        self.calls.append(("task_end", event))

    def on_run_end(self, learner: object) -> None:
        self.calls.append(("run_end", None))


def test_callbacks_hear_every_step_epoch_and_task_of_espn_run(tmp_path: Path) -> None:
    rec = Recorder()
    cfg = make_config(
        benchmark="permuted-mnist",
        model="fc-test",
        tasks=2,
        train_per_task=64,
        test_per_task=32,
        epochs=(1, 2, 1),
        batch_size=32,
        out=tmp_path / "run",
    )
    doc = run_experiment(cfg, progress=False, loggers=[rec])
    kinds = [k for k, _ in rec.calls]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    steps = [e for k, e in rec.calls if k == "step"]
    epochs = [e for k, e in rec.calls if k == "epoch"]
    ends = [e for k, e in rec.calls if k == "task_end"]
    # 64 images in batches of 32: 2 steps per pass; 1 + 2 + 1 passes per task
    assert len(steps) == 2 * 8 and len(epochs) == 8
    assert [e.step for e in steps[:8]] == list(range(1, 9)) and steps[0].loss.dim() == 0
    assert [(e.phase, e.epoch) for e in epochs[:4]] == [
        ("pretrain", 0),
        ("prune", 0),
        ("prune", 1),
        ("finetune", 0),
    ]
    assert [e.row for e in ends] == doc["accuracy_matrix"]
    assert [e.record["flops_ratio"] for e in ends] == doc["flops_ratio"]
    assert [c for k, c in rec.calls if k == "task_start"] == [
        (0, doc["task_names"][0]),
        (1, doc["task_names"][1]),
    ]


SCRIPT = """
import os, signal, sys
sys.path[:0] = [{tests!r}]
import torch
import espn
from espn.training.callbacks import Callback
from helpers.api_models import SmallMLP


class KillAt(Callback):
    def __init__(self, step):
        self.step, self.seen = step, 0

    def on_step_end(self, learner, event):
        self.seen += 1
        if self.seen == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def data(seed, n=48):
    gen = torch.Generator().manual_seed(seed)
    protos = torch.randn(3, 1, 8, 8, generator=gen) * 2
    y = torch.arange(n) % 3
    return protos[y] + 0.5 * torch.randn(n, 1, 8, 8, generator=gen), y


out, kill, shift = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
sn = espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8))
learner = espn.ContinualLearner(
    sn, "espn", out=out, epochs=(1, 2, 1), batch_size=16, gamma=0.5, alpha=0.3,
    callbacks=[KillAt(kill)] if kill else [],
)
for t in range(3):
    learner.learn(data(2 * t + shift), test=data(2 * t + 1))
print(learner.accuracy_matrix)
"""


def run_script(
    tmp_path: Path, out: Path, kill: int = 0, shift: int = 0
) -> subprocess.CompletedProcess:
    script = tmp_path / "learn.py"
    script.write_text(SCRIPT.format(tests=str(TESTS)))
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, str(script), str(out), str(kill), str(shift)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def run_state(run: Path) -> dict:
    manifest = json.loads((run / "checkpoint" / "manifest.json").read_text())
    results = comparable(json.loads((run / "results.json").read_text()))
    results["config"].pop("out", None)
    return {"results": results, "tasks": [t["sha256"] for t in manifest["tasks"]]}


@pytest.mark.slow  # two script runs in subprocesses, about 25 s
def test_a_python_script_killed_mid_task_resumes_bit_for_bit(tmp_path: Path) -> None:
    """SIGKILL in the middle of task 1 (3 passes of 3 steps a task); the rerun skips task 0
    (its data checked), continues task 1 from its last epoch, and ends exactly as a run
    that was never interrupted; data that differs from what a task learned is refused."""
    whole = run_script(tmp_path, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    killed = run_script(tmp_path, tmp_path / "run", kill=3 * 4 + 5)  # task 1, its 2nd pass
    assert killed.returncode == -signal.SIGKILL
    manifest = json.loads((tmp_path / "run" / "checkpoint" / "manifest.json").read_text())
    assert len(manifest["tasks"]) == 1 and manifest["training"]["task"] == 1
    again = run_script(tmp_path, tmp_path / "run")
    assert again.returncode == 0, again.stderr
    assert again.stdout == whole.stdout
    assert run_state(tmp_path / "run") == run_state(tmp_path / "whole")
    assert_same_tensors(
        checkpoint_tensors(tmp_path / "run"), checkpoint_tensors(tmp_path / "whole")
    )

    other = run_script(tmp_path, tmp_path / "run", shift=100)
    assert other.returncode != 0
    assert "task 0 was learned there from other data than given now" in other.stderr
    assert run_state(tmp_path / "run") == run_state(tmp_path / "whole")  # left as it was


def test_a_python_run_directory_is_read_by_show_and_evaluate(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from espn.cli.main import app
    from helpers.api_models import SmallMLP
    from test_api import tiny_data

    torch.manual_seed(0)
    sn = espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8))
    learner = espn.ContinualLearner(sn, out=tmp_path / "run", epochs=(1, 1, 1), batch_size=16)
    learner.learn(tiny_data(1), test=tiny_data(2))
    learner.learn(tiny_data(3), test=tiny_data(4))
    assert (tmp_path / "run" / "accuracy.png").is_file()
    runner = CliRunner()
    shown = runner.invoke(app, ["show", str(tmp_path / "run")])
    assert shown.exit_code == 0, shown.output
    evaluated = runner.invoke(app, ["evaluate", "--run", str(tmp_path / "run")])
    assert evaluated.exit_code == 0, evaluated.output
    row = learner.accuracy_matrix[-1]
    assert f"{row[1]:.2f}" in evaluated.output
    with pytest.raises(LearnerError, match="same method and settings"):
        espn.ContinualLearner(
            espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8)),
            out=tmp_path / "run",
            epochs=(1, 2, 1),
            batch_size=16,
        )


def test_the_progress_bar_is_a_callback_drawn_from_the_engines_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``progress=True`` attaches a :class:`ProgressBar` (the engine draws nothing itself):
    it counts each task's optimizer steps, as many as the task's phases ran, and names the
    phase and pass it is in."""
    from espn.training.progress import ProgressBar
    from helpers.api_models import SmallMLP
    from test_api import tiny_data

    torch.manual_seed(0)
    sn = espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8))
    shown = espn.ContinualLearner(sn, epochs=(1, 2, 1), batch_size=16, progress=True)
    assert [type(c) for c in shown.callbacks.callbacks] == [ProgressBar]
    quiet = espn.ContinualLearner(espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8)), epochs=(1, 2, 1))
    assert quiet.callbacks.callbacks == []

    bar = ProgressBar(disable=False)  # drawn although the output is not a terminal
    learner = espn.ContinualLearner(sn, epochs=(1, 2, 1), batch_size=16, callbacks=[bar])
    record = learner.learn(tiny_data(1), test=tiny_data(2))
    drawn = capsys.readouterr().err
    steps = sum(p["steps"] for p in record["phases"])
    assert steps > 0 and f"{steps}/{steps}" in drawn and "step" in drawn
    for desc in ("task 0 pretrain pass 1/1", "task 0 prune pass 2/2", "task 0 finetune pass 1/1"):
        assert desc in drawn
    assert "epoch" not in drawn
    assert bar.bar is None  # closed when the task's training ended
