"""The learner's run directory and its edges (issue 48): a script stopped anywhere in its
first task resumes, one process writes a run directory at a time, logs stay inside the run,
and arguments that would be ignored are refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import espn
from espn.api.learner import LearnerError
from espn.cli.main import app
from espn.runs.checks import DirectoryLockError
from espn.training.callbacks import Callback
from espn.training.loggers import CSVLogger, LoggerError
from helpers.api_models import SmallMLP
from helpers.deploy import cli_options
from test_api import tiny_data

TESTS = Path(__file__).parent

SCRIPT = """
import os, signal, sys
sys.path[:0] = [{tests!r}]
import torch
import espn
from espn.training.callbacks import Callback
from helpers.api_models import SmallMLP


class Stop(Callback):
    def __init__(self, how):
        self.how, self.seen = how, 0

    def on_step_end(self, learner, event):
        self.seen += 1
        if self.seen == 5 and self.how.startswith("SIG"):  # task 0, its prune phase
            os.kill(os.getpid(), getattr(signal, self.how))
        if self.how == "hold" and self.seen == 1:
            print("holding", flush=True)
            sys.stdin.readline()

    def on_train_end(self, learner, task):
        if self.how == "on_train_end":
            raise RuntimeError("stopped by a callback")

    def on_task_end(self, learner, event):
        if self.how == "on_task_end":
            raise RuntimeError("stopped by a callback")


def data(seed, n=48):
    gen = torch.Generator().manual_seed(seed)
    protos = torch.randn(3, 1, 8, 8, generator=gen) * 2
    y = torch.arange(n) % 3
    return protos[y] + 0.5 * torch.randn(n, 1, 8, 8, generator=gen), y


out, how = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
learner = espn.ContinualLearner(
    espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8)), "espn", out=out, epochs=(1, 2, 1),
    batch_size=16, gamma=0.5, alpha=0.3, callbacks=[Stop(how)],
)
for t in range(2):
    learner.learn(data(t), test=data(t))
print(learner.accuracy_matrix)
"""


def script(tmp_path: Path, out: Path, how: str = "", **kw) -> subprocess.Popen:
    file = tmp_path / "learn.py"
    file.write_text(SCRIPT.format(tests=str(TESTS)))
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, str(file), str(out), how or "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kw,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> tuple[str, dict]:
    """The script never stopped: its output and checkpoint manifest's task hashes."""
    tmp = tmp_path_factory.mktemp("whole")
    code, out, err = finish(script(tmp, tmp / "run"))
    assert code == 0, err
    return out, task_hashes(tmp / "run")


def task_hashes(run: Path) -> list[str]:
    manifest = json.loads((run / "checkpoint" / "manifest.json").read_text())
    return [t["sha256"] for t in manifest["tasks"]]


@pytest.mark.slow  # two script runs per case in subprocesses, 15-70 s each case
@pytest.mark.parametrize(
    ("how", "code"),
    [
        ("SIGKILL", -signal.SIGKILL),
        ("SIGTERM", -signal.SIGTERM),
        ("SIGINT", -signal.SIGINT),  # KeyboardInterrupt, Python's exit by the signal
        ("on_task_end", 1),  # a callback's error, uncaught (both events in-process below)
    ],
)
def test_a_script_stopped_in_its_first_task_resumes_from_its_last_pass(
    tmp_path: Path, whole: tuple[str, dict], how: str, code: int
) -> None:
    """Killed, interrupted or stopped by a callback while learning task 0, the run directory
    reads as one task planned, none finished, task 0 in training; ``espn info`` and
    ``espn evaluate`` read it, and the rerun resumes it and ends as the run never stopped."""
    out = tmp_path / "run"
    stopped = finish(script(tmp_path, out, how))
    assert stopped[0] == code, stopped[2]
    manifest = json.loads((out / "checkpoint" / "manifest.json").read_text())
    assert manifest["n_tasks"] == 1 and manifest["tasks"] == []
    assert manifest["training"]["task"] == 0
    runner = CliRunner()
    info = runner.invoke(app, ["info", str(out)])
    assert info.exit_code == 0, info.output
    assert "0/1 tasks finished, task 0 in training" in info.output
    sys.path.insert(0, str(TESTS))  # the model's module, for --trust-model-code
    evaluated = runner.invoke(app, ["evaluate", str(out), "--trust-model-code"])
    assert evaluated.exit_code == 0, evaluated.output
    assert "no task is finished yet" in evaluated.output
    again = finish(script(tmp_path, out))
    assert again[0] == 0, again[2]
    assert again[1] == whole[0]
    assert task_hashes(out) == whole[1]


def learner(out: Path | None = None, **kw) -> espn.ContinualLearner:
    torch.manual_seed(0)
    sn = espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8))
    options = {"epochs": (1, 1, 1), "batch_size": 32, "gamma": 0.5, "alpha": 0.3} | kw
    return espn.ContinualLearner(sn, "espn", out=out, **options)


class RaiseAt(Callback):
    def __init__(self, event: str) -> None:
        self.event = event

    def on_train_end(self, learner, task) -> None:
        if self.event == "on_train_end":
            raise RuntimeError("stop")

    def on_task_end(self, learner, event) -> None:
        if self.event == "on_task_end":
            raise RuntimeError("stop")


@pytest.mark.parametrize("event", ["on_train_end", "on_task_end"])
def test_a_callback_raising_in_task_0_leaves_a_run_the_script_resumes(
    tmp_path: Path, event: str
) -> None:
    out = tmp_path / "run"
    stopped = learner(out, callbacks=[RaiseAt(event)])
    with pytest.raises(RuntimeError, match="stop"):
        stopped.learn(tiny_data(1), test=tiny_data(2))
    stopped.close()
    again = learner(out)  # was: "n_tasks: Input should be greater than or equal to 1"
    assert again.summary.startswith(f"resuming {out / 'checkpoint'}: 0/1 tasks done")
    again.learn(tiny_data(1), test=tiny_data(2))
    reference = learner(tmp_path / "whole")
    reference.learn(tiny_data(1), test=tiny_data(2))
    assert again.accuracy_matrix == reference.accuracy_matrix
    assert task_hashes(out) == task_hashes(tmp_path / "whole")


@pytest.mark.slow  # a script in a subprocess, about 20 s
def test_a_second_process_on_the_same_out_is_refused_at_once(tmp_path: Path) -> None:
    """A script holds ``out``; a learner of another process (this one) on it is refused,
    naming the holder's pid, before anything is written; once the holder is killed, the
    directory is free again."""
    out = tmp_path / "run"
    holder = script(tmp_path, out, "hold", stdin=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding", holder.stderr
        before = sorted(p.name for p in out.rglob("*"))
        with pytest.raises(
            DirectoryLockError, match=f"in use by another process .pid {holder.pid}"
        ):
            learner(out)
        assert sorted(p.name for p in out.rglob("*")) == before
    finally:
        holder.kill()
        holder.communicate(timeout=60)
    learner(out, epochs=(1, 2, 1), batch_size=16).close()  # the same settings as the script's


def test_a_newer_learner_of_the_same_process_takes_the_directory_over(tmp_path: Path) -> None:
    out = tmp_path / "run"
    old = learner(out)
    new = learner(out)  # a notebook cell run again
    with pytest.raises(DirectoryLockError, match="written by a newer ContinualLearner"):
        old.learn(tiny_data(1), test=tiny_data(2))
    new.learn(tiny_data(1), test=tiny_data(2))
    new.close()
    assert not (out / ".espn-run.lock").exists()
    new.learn(tiny_data(3), test=tiny_data(4))  # learning after close() takes it again
    assert (out / ".espn-run.lock").exists()


@pytest.mark.parametrize("link", ["logs", "logs/csv"])
def test_a_linked_log_directory_is_refused_not_followed(
    fake_mnist, fc_test_model, tmp_path: Path, link: str
) -> None:
    out, target = tmp_path / "run", tmp_path / "elsewhere"
    target.mkdir()
    (out / link).parent.mkdir(parents=True, exist_ok=True)
    (out / link).symlink_to(target, target_is_directory=True)
    with pytest.raises(LoggerError, match=f"{out / link} is a symbolic link"):
        learner(out, loggers=["csv"])
    assert list(target.iterdir()) == []
    result = CliRunner().invoke(app, [*cli_options(out), "--log", "csv"])
    assert result.exit_code == 2 and "is a symbolic link" in result.output
    assert list(target.iterdir()) == []


def test_overwrite_removes_the_earlier_runs_logs(fake_mnist, fc_test_model, tmp_path) -> None:
    out = tmp_path / "run"
    runner = CliRunner()
    first = runner.invoke(app, [*cli_options(out), "--tasks", "1", "--log", "csv"])
    assert first.exit_code == 0, first.output
    assert (out / "logs" / "csv" / "tasks.csv").is_file()
    again = runner.invoke(app, [*cli_options(out), "--tasks", "1", "--overwrite"])
    assert again.exit_code == 0, again.output
    assert not (out / "logs").exists()


@pytest.mark.slow  # the W&B service starts and stops, about 9 s
def test_the_offline_wandb_logger_keeps_every_file_in_the_run(tmp_path, monkeypatch) -> None:
    wandb = pytest.importorskip("wandb")
    wandb.teardown()  # a W&B service started earlier in this process has its own place
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    with learner(out, loggers="wandb") as learned:
        learned.learn(tiny_data(1), test=tiny_data(2))
    wandb.teardown()
    assert not list((tmp_path / "home").rglob("*wandb*"))  # was: ~/.cache/wandb/logs
    assert list((out / "logs" / "wandb").glob("offline-run-*"))
    assert list((out / "logs" / "wandb" / "cache").rglob("core-debug-*.log"))
    assert "WANDB_CACHE_DIR" not in os.environ


def test_wandb_online_without_an_account_is_one_line_and_leaves_no_logs(
    fake_mnist, fc_test_model, tmp_path, monkeypatch
) -> None:
    wandb = pytest.importorskip("wandb")
    wandb.teardown()
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    with pytest.raises(LoggerError, match="W&B could not start its online run: No API key"):
        learner(out, loggers=["wandb"]).learn(tiny_data(1), test=tiny_data(2))
    assert not (out / "logs").exists()
    result = CliRunner().invoke(app, [*cli_options(tmp_path / "cli"), "--log", "wandb"])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "WANDB_MODE=offline" in result.output
    assert not (tmp_path / "cli" / "logs").exists()


def test_an_unwritable_log_directory_is_found_before_training(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "csv").write_text("not a directory")
    with pytest.raises(LoggerError, match="logs/csv is a file, not a directory of logs"):
        learner(out, loggers="csv")
    if os.geteuid() != 0:  # root writes anywhere
        (out / "logs" / "csv").unlink()
        (out / "logs").chmod(0o555)
        with pytest.raises(LoggerError, match=r"cannot write logs into .*permission denied"):
            learner(out, loggers="csv")


def test_a_finished_task_given_with_other_classes_or_name_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = learner(out)
    first.learn(tiny_data(1, n_classes=4), test=tiny_data(2, n_classes=4), name="first")
    first.close()
    for kw, message in [
        ({"n_classes": 6, "name": "first"}, "learned there with n_classes=4, given n_classes=6"),
        ({"name": "renamed"}, "learned there with name='first', given name='renamed'"),
    ]:
        again = learner(out)
        with pytest.raises(LearnerError, match=message):
            again.learn(tiny_data(1, n_classes=4), test=tiny_data(2, n_classes=4), **kw)
        again.close()
    again = learner(out)
    again.learn(tiny_data(1, n_classes=4), test=tiny_data(2, n_classes=4), name="first")


def test_arguments_that_would_be_ignored_are_refused() -> None:
    learned = learner()
    learned.learn(tiny_data(1), test=tiny_data(2))
    learned.learn(tiny_data(3), test=tiny_data(4))
    x = tiny_data(4)[0][:8]
    with pytest.raises(espn.EspnError, match="rule: 'entropy' infers the task, and task=1"):
        learned.predict(x, task=1, rule="entropy")
    with pytest.raises(espn.EspnError, match="same_task: True infers the task, and task=1"):
        learned.predict(x, task=1, same_task=True)
    with pytest.raises(espn.EspnError, match="same_task: must be True or False, got 'yes'"):
        learned.infer_task(x, same_task="yes")  # type: ignore[arg-type]
    with pytest.raises(LoggerError, match="log_every=5 sets how often the loggers named"):
        learner(log_every=5)
    with pytest.raises(LoggerError, match="<= 2\\^31 - 1, got 2147483648"):
        learner(loggers=[CSVLogger("unused")], log_every=2**31)
    assert learned.predict(x, task=1).tolist() == learned.predict(x, task=1, rule=None).tolist()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--log-every", "5"], "--log-every sets how often the loggers of --log read the loss"),
        (["--log", "csv", "--log-every", "2147483648"], "less than or equal to 2147483647"),
    ],
)
def test_the_cli_refuses_log_every_it_would_ignore(
    fake_mnist, fc_test_model, tmp_path, argv, message
) -> None:
    result = CliRunner().invoke(app, [*cli_options(tmp_path / "run"), *argv])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "run").exists()


def test_loggers_and_callbacks_are_checked_in_the_constructor(tmp_path: Path) -> None:
    csv = learner(tmp_path / "run", loggers="csv")  # one name, as --log takes it
    assert [type(c) for c in csv.callbacks.callbacks] == [CSVLogger, type(csv.run_dir)]
    for bad, message in [
        (Callback(), "callbacks: expected a list of Callback objects, got Callback; give it in"),
        ([object()], r"callbacks\[0\]: expected a Callback object, got object"),
        ([Callback], r"callbacks\[0\]: is the class Callback; give an object of it"),
    ]:
        with pytest.raises(espn.EspnError, match=message):
            learner(callbacks=bad)


def test_overwrite_starts_a_run_of_other_settings_over(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = learner(out, loggers="csv")
    first.learn(tiny_data(1), test=tiny_data(2))
    first.close()
    with pytest.raises(espn.EspnError) as saved:
        first.save(out)
    assert "pass overwrite=True to start over" in str(saved.value)
    assert "--" not in str(saved.value)
    with pytest.raises(LearnerError) as info:
        learner(out, epochs=(1, 2, 1))
    text = str(info.value)
    assert "epochs=[1, 1, 1] in the checkpoint, [1, 2, 1] now" in text
    assert "overwrite=True to start over" in text and "--" not in text
    second = learner(out, epochs=(1, 2, 1), overwrite=True)
    assert not (out / "results.json").exists() and not (out / "logs").exists()
    assert not list((out / "data").glob("task-*"))
    second.learn(tiny_data(3), test=tiny_data(4))
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["epochs"] == [1, 2, 1] and len(doc["task_names"]) == 1


@pytest.mark.slow  # torch.export of two sub-networks, about 10 s
def test_task_agnostic_evaluation_and_export_from_the_learner(tmp_path: Path) -> None:
    from espn.inference import evaluate_task_agnostic

    learned = learner()
    tests = [tiny_data(2), tiny_data(4)]
    learned.learn(tiny_data(1), test=tests[0])
    learned.learn(tiny_data(3), test=tests[1])
    doc = learned.evaluate(tests, task_agnostic=True, rule="entropy")
    direct = evaluate_task_agnostic(learned.supernet, learned.tasks, "entropy")  # type: ignore[arg-type]
    assert doc == direct
    assert learned.evaluate(task_agnostic=True) == evaluate_task_agnostic(
        learned.supernet,
        learned.tasks,  # type: ignore[arg-type]
    )
    with pytest.raises(espn.EspnError, match=r"give a list of 2 \(x, y\) test sets"):
        learned.evaluate([tests[0]], task_agnostic=True)
    with pytest.raises(espn.EspnError, match="rule: picks the task without it"):
        learned.evaluate(0, rule="entropy")  # type: ignore[call-overload]
    report = learned.export_task_agnostic(tmp_path / "agnostic.pt2", onnx=False, rule="entropy")
    assert report.tasks == 2 and report.checked_samples == sum(len(x) for x, _ in tests)
    program = torch.export.load(str(tmp_path / "agnostic.pt2")).module()
    x = tests[1][0]
    classes, tasks = program(x)
    assert torch.equal(tasks, learned.infer_task(x, rule="entropy"))
    assert torch.equal(classes, learned.predict(x, rule="entropy"))
    with pytest.raises(espn.EspnError, match="would replace"):
        learned.export_task_agnostic(tmp_path / "agnostic.pt2", onnx=False)


def test_espn_export_task_agnostic_of_an_instance_run_names_the_learner_call(tmp_path) -> None:
    class Net(SmallMLP):
        pass

    torch.manual_seed(0)
    sn = espn.wrap(Net(), torch.zeros(2, 1, 8, 8))
    learned = espn.ContinualLearner(sn, epochs=(1, 1, 1), batch_size=32, out=tmp_path / "run")
    learned.learn(tiny_data(1), test=tiny_data(2))
    argv = ["export", str(tmp_path / "run"), "--task-agnostic", "--out", str(tmp_path / "a.pt2")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert "learner.export_task_agnostic(" in result.output


def test_espn_error_is_importable_from_the_top_package() -> None:
    from espn import EspnError
    from espn.errors import EspnError as Home

    assert EspnError is Home and "EspnError" in espn.__all__


def test_a_sweep_line_says_what_its_seconds_count(tmp_path: Path) -> None:
    from espn.sweep.point import PointOutcome
    from espn.sweep.runner import outcome_line
    from espn.sweep.spec import Point

    point = Point("lr-0.01", {})
    doc = {"average_accuracy": 88.6666, "wall_time_s": 18.84}
    done = outcome_line(PointOutcome(point, "done", tmp_path, doc, None, tmp_path, 22.0))
    assert done.endswith("average accuracy 88.67%  run wall time 18.8s, this attempt 22.0s")
    reused = outcome_line(PointOutcome(point, "reused", tmp_path, doc, None, tmp_path))
    assert reused.endswith("run wall time 18.8s")


def test_stored_accuracies_are_the_same_numbers_everywhere(tmp_path: Path) -> None:
    """``accuracy_matrix``, ``results.json`` and ``tasks.csv`` hold the same unrounded
    accuracies (the share of test samples right, in percent): ``espn evaluate`` compares
    them exactly; printing rounds them to 2 decimals."""
    from espn.utils.io import read_csv

    out = tmp_path / "run"
    with learner(out, loggers="csv") as learned:
        learned.learn(tiny_data(1), test=tiny_data(2, n=96 - 3))  # 93 samples: 1/93 steps
    doc = json.loads((out / "results.json").read_text())
    row = read_csv(out / "logs" / "csv" / "tasks.csv")[0]
    assert learned.accuracy_matrix == doc["accuracy_matrix"]
    assert float(row["accuracy_0"]) == doc["accuracy_matrix"][0][0]
