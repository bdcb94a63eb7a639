"""A run killed at any point and resumed ends exactly as an uninterrupted run (on the CPU)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import espn.data.mnist as mnist_module
import espn.runs.resuming as run_directory_module
import espn.training.engine as engine_module
import espn.training.progress as progress_module
from espn.api.experiment import run_experiment
from espn.checkpoint import CheckpointWriter
from espn.cli.main import app
from espn.data.registry import BENCHMARKS, Benchmark
from espn.methods.base import METHODS
from espn.models.registry import MODELS
from espn.runs.config import make_config
from espn.runs.resuming import RunDirectory
from espn.training.callbacks import Callback
from helpers.deploy import (
    Killed,
    TinyResNet,
    cli_options,
    comparable,
    fc_test,
    kill_at_step,
    run_options,
    tiny_sequence,
)
from helpers.mnist import synthetic_mnist

runner = CliRunner()
TESTS = Path(__file__).parent


def fingerprint(run: Path) -> dict:
    """Results without timings, and the SHA-256 of every task file (masks, gates, heads) and
    of the final state file (all shared weights, RNG states)."""
    manifest = json.loads((run / "checkpoint" / "manifest.json").read_text())
    return {
        "results": comparable(json.loads((run / "results.json").read_text())),
        "tasks": [t["sha256"] for t in manifest["tasks"]],
        "state": manifest["state"]["sha256"],
        "complete": manifest["complete"],
    }


@pytest.fixture(autouse=True)
def tiny(fake_mnist, fc_test_model):
    """Every test here runs model ``fc-test`` on the fake data."""


#: options of a method's runs here beyond :func:`run_options`: CPG runs every compacting
#: round under its reference stop rule (no round ends it), so kills land in late rounds;
#: RMN takes a budget, as its threshold rule would give task 0 every weight in so short a run
METHOD_OPTIONS: dict[str, dict] = {"cpg": {"cpg_train_acc": 0.0}, "rmn": {"rmn_budget": 0.3}}


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, dict]:
    """Uninterrupted runs, one per method, made on first use."""
    cache: dict[str, dict] = {}

    def get(method: str) -> dict:
        if method not in cache:
            out = tmp_path_factory.mktemp("reference") / "run"
            with pytest.MonkeyPatch.context() as mp, MODELS.temporarily("fc-test", fc_test):
                data = synthetic_mnist()
                mp.setattr(mnist_module, "load_mnist_like", lambda *a, **k: data)
                options = run_options(out, method=method, **METHOD_OPTIONS.get(method, {}))
                run_experiment(make_config(**options), progress=False)
            cache[method] = fingerprint(out)
            assert cache[method]["complete"] and len(cache[method]["tasks"]) == 3
        return cache[method]

    return get


@pytest.fixture
def reference(references) -> dict:
    """The uninterrupted ESPN run."""
    return references("espn")


# 16 optimizer steps per task (4 per epoch; 1 pre-train, 2 prune, 1 fine-tune epochs):
def killed_and_resumed(tmp_path: Path, monkeypatch, kill: int) -> tuple[Path, list[str]]:
    """The run killed at step ``kill``, then resumed to its end: its directory and the
    resumed run's task lines."""
    out = tmp_path / "run"
    cfg = make_config(**run_options(out))
    with monkeypatch.context() as mp:
        kill_at_step(mp, kill)
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    notes: list[str] = []
    run_experiment(cfg, progress=False, on_task_end=notes.append, resume=True)
    return out, notes


# 3 = task 1 before its first checkpoint, 7 = task 1 pruning, 17 = first step of task 2,
# 30 = task 2 fine-tuning, 45 = task 3 fine-tuning.
@pytest.mark.parametrize("kill", [3, 7, 17, 30, 45])
def test_killed_at_a_step_and_resumed_equals_uninterrupted(tmp_path, monkeypatch, reference, kill):
    out, notes = killed_and_resumed(tmp_path, monkeypatch, kill)
    assert fingerprint(out) == reference
    if kill > 3:
        assert notes[0].startswith(
            f"resuming {out / 'checkpoint'}: {(kill - 1) // 16}/3 tasks done"
        )


def test_resumed_task_reports_its_time_before_the_kill(tmp_path, monkeypatch):
    """A task's ``seconds`` in results.json is its whole training time, resumes included."""
    out = tmp_path / "run"
    cfg = make_config(**run_options(out))
    clock = itertools.count(start=0.0, step=100.0)  # every reading 100 s after the last
    with monkeypatch.context() as mp:
        kill_at_step(mp, 30)  # task 2, fine-tuning: three epochs of it checkpointed
        mp.setattr(engine_module, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    manifest = json.loads((out / "checkpoint" / "manifest.json").read_text())
    before = manifest["training"]["position"]["seconds"]
    assert manifest["training"]["task"] == 1 and before > 0
    with monkeypatch.context() as mp:  # a frozen clock: the resumed part takes no time
        mp.setattr(engine_module, "time", SimpleNamespace(perf_counter=lambda: 0.0))
        run_experiment(cfg, progress=False, resume=True)
    results = json.loads((out / "results.json").read_text())
    assert results["seconds"][1] == before
    assert results["seconds"][2] == 0.0


@pytest.mark.parametrize("method", METHODS.names())
def test_every_method_resumes_exactly(tmp_path, monkeypatch, references, method):
    """Methods with state of their own must save it (Strategy.state_dict) to resume exactly."""
    out = tmp_path / "run"
    cfg = make_config(**run_options(out, method=method, **METHOD_OPTIONS.get(method, {})))
    with monkeypatch.context() as mp:
        kill_at_step(mp, 23)  # task 2, in the middle of its second epoch
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    run_experiment(cfg, progress=False, resume=True)
    assert fingerprint(out) == references(method)


# CPG takes 88 steps per task (epochs 1,2,1: a 1-epoch train phase, ten 2-epoch compacting
# rounds, all run with cpg_train_acc 0, retraining): 6 = task 1's first round, 30 =
# a later round of task 1, 100 = task 2, picking; the resumed run needs the stage, goal,
# accuracy being measured, snapshot and picking masks of the strategy's state
@pytest.mark.parametrize("kill", [6, 30, 100])
def test_cpg_resumes_exactly_within_its_compacting_rounds(tmp_path, monkeypatch, references, kill):
    out = tmp_path / "run"
    cfg = make_config(**run_options(out, method="cpg", **METHOD_OPTIONS["cpg"]))
    with monkeypatch.context() as mp:
        kill_at_step(mp, kill)
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    run_experiment(cfg, progress=False, resume=True)
    assert fingerprint(out) == references("cpg")


@pytest.fixture
def tiny_conv() -> Iterator[str]:
    """Benchmark ``tiny-conv``: three 1x8x8 tasks, one head each, on model ``tiny-res``."""
    bench = Benchmark(
        build=lambda args: tiny_sequence(args.n_tasks or 3, seed=args.seed),
        default_tasks=3,
        max_tasks=None,
        description="tiny conv tasks",
        defaults={"model": "tiny-res", "batch_size": 16, "optimizer": "sgd", "lr": 0.05},
    )
    with (
        MODELS.temporarily("tiny-res", lambda spec: TinyResNet(spec.n_classes)),
        BENCHMARKS.temporarily("tiny-conv", bench),
    ):
        yield "tiny-conv"


def test_conv_model_with_batchnorm_resumes_exactly(tmp_path, monkeypatch, tiny_conv):
    """Task BatchNorm (affine and running statistics), SGD momentum, a residual stream."""
    options = {"benchmark": "tiny-conv", "epochs": (1, 2, 1), "momentum": 0.9, "gamma": 0.5}
    run_experiment(make_config(**options, out=tmp_path / "reference"), progress=False)
    cfg = make_config(**options, out=tmp_path / "run")
    with monkeypatch.context() as mp:
        kill_at_step(mp, 17)  # 12 steps per task: task 2, in its second epoch
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    assert json.loads((tmp_path / "run/checkpoint/manifest.json").read_text())["training"]
    run_experiment(cfg, progress=False, resume=True)
    assert fingerprint(tmp_path / "run") == fingerprint(tmp_path / "reference")


def test_killed_between_the_checkpoint_and_results_of_a_task(tmp_path, monkeypatch, reference):
    """The checkpoint of a finished task is committed first, results.json rewritten from it:
    a kill in between leaves results one task behind (never listing a task the checkpoint
    lacks), and the resumed run rewrites them and ends as an uninterrupted run."""
    out = tmp_path / "run"
    cfg = make_config(**run_options(out))
    real = RunDirectory.write_results
    calls = {"n": 0}

    def write_results(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise Killed
        return real(self, *args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(RunDirectory, "write_results", write_results)
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    assert len(json.loads((out / "results.json").read_text())["accuracy_matrix"]) == 1
    manifest = json.loads((out / "checkpoint" / "manifest.json").read_text())
    assert len(manifest["tasks"]) == 2 and manifest["training"] is None
    result = runner.invoke(app, ["show", str(out)])  # what show lists, evaluate has
    assert result.exit_code == 0, result.output
    run_experiment(cfg, progress=False, resume=True)
    assert fingerprint(out) == reference


SCRIPT = """
import sys
sys.path[:0] = [{tests!r}]
from helpers.mnist import synthetic_mnist
import espn.data.mnist as mnist_module
data = synthetic_mnist()
mnist_module.load_mnist_like = lambda *a, **k: data
from helpers.deploy import fc_test
from espn.models.registry import MODELS
MODELS.register("fc-test")(fc_test)
from espn.cli.main import app
app(sys.argv[1:], prog_name="espn")
"""


def test_process_killed_by_sigkill_and_resumed_from_the_cli(tmp_path, reference):
    out = tmp_path / "run"
    script = tmp_path / "espn_run.py"
    script.write_text(SCRIPT.format(tests=str(TESTS)))
    proc = subprocess.Popen(
        [sys.executable, str(script), *cli_options(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    manifest = out / "checkpoint" / "manifest.json"
    deadline = time.monotonic() + 120
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                doc = json.loads(manifest.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                doc = {}
            if len(doc.get("tasks", [])) >= 1 and doc.get("training"):
                os.kill(proc.pid, signal.SIGKILL)  # in the middle of task 2
                break
            time.sleep(0.005)
    finally:
        if proc.poll() is None and time.monotonic() >= deadline:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not json.loads(manifest.read_text())["complete"]
    result = runner.invoke(app, [*cli_options(out), "--resume"])
    assert result.exit_code == 0, result.output
    assert fingerprint(out) == reference


def test_resume_with_other_options_is_refused(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with monkeypatch.context() as mp:
        kill_at_step(mp, 20)
        with pytest.raises(Killed):
            run_experiment(make_config(**run_options(out)), progress=False)
    before = (out / "checkpoint" / "manifest.json").read_text()
    result = runner.invoke(app, [*cli_options(out), "--resume", "--gamma", "0.5", "--seed", "3"])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "it was made with different options" in text
    assert "gamma=0.2 in the checkpoint, 0.5 now" in text
    assert "seed=0 in the checkpoint, 3 now" in text
    assert (out / "checkpoint" / "manifest.json").read_text() == before


def test_resume_of_a_finished_run_changes_nothing(tmp_path, reference):
    out = tmp_path / "run"
    run_experiment(make_config(**run_options(out)), progress=False)
    options = [o for o in cli_options(out) if o != "--quiet"]
    result = runner.invoke(app, [*options, "--resume"])
    assert result.exit_code == 0, result.output
    assert "3/3 tasks done" in " ".join(result.output.split())
    assert "(1/3 done)" not in result.output  # nothing trained again
    assert fingerprint(out) == reference


def test_resume_without_a_checkpoint_starts_over(tmp_path, reference):
    out = tmp_path / "run"
    options = [o for o in cli_options(out) if o != "--quiet"]
    result = runner.invoke(app, [*options, "--resume"])
    assert result.exit_code == 0, result.output
    assert "no checkpoint in" in result.output and "starting from the first task" in " ".join(
        result.output.split()
    )
    assert fingerprint(out) == reference


def test_an_earlier_run_is_not_overwritten_by_accident(tmp_path, reference):
    out = tmp_path / "run"
    run_experiment(make_config(**run_options(out)), progress=False)
    again = runner.invoke(app, cli_options(out))
    assert again.exit_code == 2
    text = " ".join(again.output.split())
    assert "already holds a run" in text and "--resume" in text and "--overwrite" in text
    assert fingerprint(out) == reference  # nothing was touched
    both = runner.invoke(app, [*cli_options(out), "--resume", "--overwrite"])
    assert both.exit_code == 2 and "exclude each other" in " ".join(both.output.split())
    replaced = runner.invoke(app, [*cli_options(out), "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert fingerprint(out) == reference  # started over: the same seed gives the same run


def test_progress_and_resume_speak_of_passes_and_steps(
    tmp_path, monkeypatch, fake_mnist, fc_test_model
):
    """The bar counts optimizer steps and names the pass of its phase; the resume line says
    where the task stands in passes over its data and optimizer steps (not "epochs": the
    size rule may turn --epochs into other pass counts)."""
    descriptions: list[str] = []

    class Bar(progress_module.tqdm):
        def __init__(self, *args, **kwargs):
            assert kwargs["unit"] == "step"
            super().__init__(*args, **kwargs)

        def set_description(self, desc=None, refresh=True):
            descriptions.append(desc)
            super().set_description(desc, refresh)

    monkeypatch.setattr(progress_module, "tqdm", Bar)
    monkeypatch.setattr(progress_module.ProgressBar, "terminal", lambda self: True)
    monkeypatch.setattr(run_directory_module, "CHECKPOINT_SECONDS", 0.0)  # every pass
    out = tmp_path / "run"
    options = [o for o in cli_options(out) if o not in ("--quiet", "--no-progress")]
    with monkeypatch.context() as mp:  # 4 steps per pass: killed in the prune phase's 2nd pass
        kill_at_step(mp, 10)
        killed = runner.invoke(app, options)
    assert killed.exit_code != 0
    assert descriptions == [
        "task 0 pretrain pass 1/1",
        "task 0 prune pass 1/2",
        "task 0 prune pass 2/2",
    ]
    result = runner.invoke(app, [*options, "--resume"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert (
        "0/3 tasks done; task 0 continues in its prune phase after 4 optimizer steps of it "
        "(2 passes over its training data done)"
    ) in text
    assert "epochs" not in text


def test_a_phase_of_many_passes_checkpoints_every_kth_pass_and_its_last():
    """The size rule on small data makes phases of hundreds of passes: at most
    CHECKPOINTS_PER_PHASE of them are checkpointed, always the phase's last; short phases
    checkpoint every pass."""
    limit = run_directory_module.CHECKPOINTS_PER_PHASE
    for n in (1, 7, limit):
        assert all(run_directory_module.checkpointed(e, n) for e in range(n))
    for n in (limit + 1, 176, 590):
        saved = [e for e in range(n) if run_directory_module.checkpointed(e, n)]
        assert len(saved) <= limit + 1 and saved[-1] == n - 1
        gaps = {b - a for a, b in itertools.pairwise(saved)}
        assert max(gaps) == -(-n // limit)


def test_passes_of_a_phase_are_checkpointed_a_minimum_time_apart(tmp_path, monkeypatch):
    """Within a phase a pass is checkpointed once CHECKPOINT_SECONDS passed since the last
    checkpoint; the phase's last pass always is. A clock that advances 5 s per optimizer step
    (4 steps, 20 s a pass) and a 45 s minimum: of the prune phase's 6 passes, the 3rd (60 s
    after the pre-training's checkpoint), the 6th (its last), none other."""
    now = {"t": 0.0}

    class Clock(Callback):
        def on_step_end(self, learner, event) -> None:
            now["t"] += 5.0

    saved: list[tuple[int, int]] = []
    real_save = CheckpointWriter.save

    def save(self, supernet, results, training=None, *args, **kwargs):
        if training is not None:  # a save of the task in training, not of a finished task
            saved.append((training.position["phase"], training.position["epoch"]))
        return real_save(self, supernet, results, training, *args, **kwargs)

    monkeypatch.setattr(CheckpointWriter, "save", save)
    clock = SimpleNamespace(monotonic=lambda: now["t"], perf_counter=time.perf_counter)
    monkeypatch.setattr(run_directory_module, "time", clock)
    monkeypatch.setattr(run_directory_module, "CHECKPOINT_SECONDS", 45.0)
    options = run_options(tmp_path / "run", tasks=1, epochs=(1, 6, 2))
    run_experiment(make_config(**options), progress=False, loggers=[Clock()])
    # position after a pass: the next pass to run (epoch), or the next phase's start
    assert saved == [(1, 0), (1, 3), (2, 0), (3, 0)]


@pytest.mark.parametrize("kill", [7, 30])
def test_killed_between_sparse_checkpoints_and_resumed_equals_uninterrupted(
    tmp_path, monkeypatch, reference, kill
):
    """With one checkpoint per phase (its last pass), a kill loses the passes since, and the
    resumed run trains them again to the same end."""
    monkeypatch.setattr(run_directory_module, "CHECKPOINTS_PER_PHASE", 1)
    out, _ = killed_and_resumed(tmp_path, monkeypatch, kill)
    assert fingerprint(out) == reference
