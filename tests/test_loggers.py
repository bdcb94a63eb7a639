"""The experiment loggers (CSV, TensorBoard, W&B offline) fed the learner's events, their
files read back; the factory's checks; the loss read only on logged steps."""

from __future__ import annotations

import glob
import math
from types import SimpleNamespace
from typing import Any

import pytest

import espn.training.loggers.base as logger_base
from espn.registry import UnknownNameError
from espn.runs.config import RunConfig
from espn.training.callbacks import Callback, CallbackList, EpochEnd, StepEnd, TaskEnd
from espn.training.loggers import (
    CSVLogger,
    LoggerError,
    LoggerUnavailable,
    TensorBoardLogger,
    make_loggers,
)
from espn.utils.io import read_csv
from helpers.logs import tensorboard_scalars, tensorboard_texts, wandb_run

#: per task: (phase, steps in that phase), 2 epochs of train then 1 of fine-tune
PHASES = [("train", 8), ("finetune", 4)]
STEPS_PER_EPOCH = 4
ROWS = [[91.25], [91.25, 87.5], [91.25, 87.5, 93.0]]


class CountedLoss:
    """A stand-in for the step's device tensor that counts how often it is read."""

    reads = 0

    def __init__(self, value: float) -> None:
        self.value = value

    def __float__(self) -> float:
        CountedLoss.reads += 1
        return self.value


def loss_at(task: int, step: int) -> float:
    return 2.0 / (step + task + 1)


def lr_at(task: int, step: int) -> float:
    return 0.01 * 0.5 ** (step // 6) + task * 1e-4


def record_of(task: int) -> dict[str, Any]:
    return {
        "flops_ratio": 0.125 + task / 100,
        "used_weights": 1000 * (task + 1),
        "new_weights": 1000,
        "seconds": 1.5 + task,
    }


def feed_task(cb: Callback, task: int, start_step: int = 1, rows=ROWS) -> None:
    """The events of one task as the learner sends them, from ``start_step`` on."""
    cb.on_task_start(None, task, f"task{task}")
    step = 0
    for phase, n in PHASES:
        n_epochs = n // STEPS_PER_EPOCH
        for epoch in range(n_epochs):
            for _ in range(STEPS_PER_EPOCH):
                step += 1
                if step >= start_step:
                    loss = CountedLoss(loss_at(task, step))
                    cb.on_step_end(None, StepEnd(task, phase, step, loss, lr_at(task, step)))  # type: ignore[arg-type]
            if step >= start_step:
                cb.on_epoch_end(
                    None, EpochEnd(task, phase, epoch, n_epochs, step, loss_at(task, step), 0.25)
                )
    cb.on_task_end(None, TaskEnd(task, f"task{task}", rows[task], record_of(task)))


def feed_run(cb: Callback, tasks: int = 3, rows=ROWS) -> None:
    cb.on_run_start(None)
    for t in range(tasks):
        feed_task(cb, t, rows=rows)
    cb.on_run_end(None)


def test_loss_is_read_only_on_logged_steps(tmp_path):
    """The step's loss is a device tensor: every logger reads it every log_every steps only."""
    CountedLoss.reads = 0
    feed_run(CSVLogger(tmp_path, log_every=3), tasks=1)
    assert CountedLoss.reads == 12 // 3


def test_csv_holds_steps_epochs_and_tasks(tmp_path):
    feed_run(CSVLogger(tmp_path / "csv", log_every=2))
    steps = read_csv(tmp_path / "csv" / "steps.csv")
    expected = [(t, s) for t in range(3) for s in range(2, 13, 2)]
    assert [(int(r["task"]), int(r["step"])) for r in steps] == expected
    for r in steps:
        t, s = int(r["task"]), int(r["step"])
        assert float(r["loss"]) == loss_at(t, s)
        assert float(r["lr"]) == lr_at(t, s)
        assert r["phase"] == ("train" if s <= 8 else "finetune")
        assert float(r["elapsed_seconds"]) >= 0
    epochs = read_csv(tmp_path / "csv" / "epochs.csv")
    assert [(r["task"], r["phase"], r["epoch"], r["step"]) for r in epochs[:3]] == [
        ("0", "train", "0", "4"),
        ("0", "train", "1", "8"),
        ("0", "finetune", "0", "12"),
    ]
    tasks = read_csv(tmp_path / "csv" / "tasks.csv")
    assert [r["name"] for r in tasks] == ["task0", "task1", "task2"]
    for t, r in enumerate(tasks):
        got = [float(r[f"accuracy_{j}"]) for j in range(t + 1)]
        assert got == ROWS[t]
        assert all(r[f"accuracy_{j}"] == "" for j in range(t + 1, 3))  # not learned yet
        assert float(r["average_accuracy"]) == pytest.approx(sum(ROWS[t]) / (t + 1))
        rec = record_of(t)
        assert float(r["flops_ratio"]) == rec["flops_ratio"]
        assert int(r["used_weights"]) == rec["used_weights"]
        assert int(r["new_weights"]) == rec["new_weights"]
        assert float(r["seconds"]) == rec["seconds"]


def test_csv_unevaluated_row_leaves_empty_cells(tmp_path):
    rows = [[90.0], None, [90.0, 80.0, 70.0]]
    feed_run(CSVLogger(tmp_path, log_every=4), rows=rows)
    tasks = read_csv(tmp_path / "tasks.csv")
    assert [tasks[1][f"accuracy_{j}"] for j in range(3)] == ["", "", ""]
    assert tasks[1]["average_accuracy"] == ""
    assert tasks[1]["flops_ratio"] == repr(record_of(1)["flops_ratio"])


def test_csv_continues_a_resumed_run_without_repeats(tmp_path):
    """A process killed in task 1 after its first epoch was written; the next one resumes
    task 1 at step 5: the rows of task 0 and task 1's first epoch stay, none is repeated."""
    first = CSVLogger(tmp_path, log_every=1)
    first.on_run_start(None)
    feed_task(first, 0)
    first.on_task_start(None, 1, "task1")
    for step in range(1, 7):  # killed during the second epoch: steps 5, 6 not on disk
        first.on_step_end(None, StepEnd(1, "train", step, CountedLoss(9.0), 0.1))  # type: ignore[arg-type]
        if step == 4:
            first.on_epoch_end(None, EpochEnd(1, "train", 0, 2, 4, 9.0, 0.25))
    assert len(read_csv(tmp_path / "steps.csv")) == 12 + 4
    second = CSVLogger(tmp_path, log_every=1)
    second.on_run_start(None)
    feed_task(second, 1, start_step=5)
    feed_task(second, 2)
    second.on_run_end(None)
    steps = [(int(r["task"]), int(r["step"])) for r in read_csv(tmp_path / "steps.csv")]
    assert steps == [(t, s) for t in range(3) for s in range(1, 13)]
    losses = {
        (int(r["task"]), int(r["step"])): float(r["loss"]) for r in read_csv(tmp_path / "steps.csv")
    }
    assert losses[(1, 4)] == 9.0 and losses[(1, 5)] == loss_at(1, 5)  # kept, then rewritten
    epochs = [(int(r["task"]), int(r["step"])) for r in read_csv(tmp_path / "epochs.csv")]
    assert epochs == [(t, s) for t in range(3) for s in (4, 8, 12)]
    assert [r["task"] for r in read_csv(tmp_path / "tasks.csv")] == ["0", "1", "2"]


@pytest.mark.parametrize(
    "text", ["task,step\n0,one\n", "when,what\n1,2\n", "task,step\n0\n", "\xff\xfe\x00"]
)
def test_a_foreign_csv_is_refused(tmp_path, text):
    (tmp_path / "steps.csv").write_bytes(text.encode("latin-1"))
    with pytest.raises(LoggerError, match=r"steps.csv is not a table the CSV logger wrote"):
        CSVLogger(tmp_path)


def test_a_new_run_replaces_old_rows(tmp_path):
    feed_run(CSVLogger(tmp_path, log_every=1), rows=[[10.0], [10.0, 20.0], [10.0, 20.0, 30.0]])
    feed_run(CSVLogger(tmp_path, log_every=1), tasks=1)
    assert len(read_csv(tmp_path / "steps.csv")) == 12
    tasks = read_csv(tmp_path / "tasks.csv")
    assert len(tasks) == 1 and float(tasks[0]["accuracy_0"]) == ROWS[0][0]


def test_tensorboard_events_hold_every_metric(tmp_path):
    pytest.importorskip("tensorboard")
    feed_run(TensorBoardLogger(tmp_path / "tb", log_every=4))
    scalars = tensorboard_scalars(tmp_path / "tb")
    for t in range(3):
        assert scalars[f"loss/task_{t}"] == [(s, pytest.approx(loss_at(t, s))) for s in (4, 8, 12)]
        assert scalars[f"lr/task_{t}"] == [(s, pytest.approx(lr_at(t, s))) for s in (4, 8, 12)]
        assert [s for s, _ in scalars[f"epoch_loss/task_{t}"]] == [4, 8, 12]
        assert tensorboard_texts(tmp_path / "tb", f"phase/task_{t}/text_summary") == [
            (4, "train"),
            (12, "finetune"),
        ]
    for j in range(3):  # task j's accuracy after learning each task t >= j
        assert scalars[f"accuracy/task_{j}"] == [(t, ROWS[t][j]) for t in range(j, 3)]
    assert scalars["accuracy/average"] == [
        (t, pytest.approx(sum(r) / len(r))) for t, r in enumerate(ROWS)
    ]
    assert scalars["flops_ratio"] == [
        (t, pytest.approx(record_of(t)["flops_ratio"])) for t in range(3)
    ]
    assert scalars["weights/used"] == [(t, record_of(t)["used_weights"]) for t in range(3)]
    assert scalars["weights/new"] == [(t, 1000) for t in range(3)]
    assert scalars["time/task_seconds"] == [(t, record_of(t)["seconds"]) for t in range(3)]
    elapsed = [v for _, v in scalars["time/elapsed_seconds"]]
    assert elapsed == sorted(elapsed) and elapsed[0] >= 0


def test_wandb_offline_needs_no_account(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from espn.training.loggers import WandbLogger

    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no login anywhere
    logger = WandbLogger(tmp_path / "logs", log_every=6, run_name="tiny")
    assert logger.mode == "offline"
    learner = SimpleNamespace(cfg=RunConfig(benchmark="permuted-mnist", gamma=0.3))
    logger.on_run_start(learner)  # its run settings become the W&B config
    feed_run(logger, tasks=2)
    wandb.teardown()  # the W&B service writes the run's file out in the background until here
    rows, config = wandb_run(tmp_path / "logs")
    assert config["gamma"] == 0.3 and config["benchmark"] == "permuted-mnist"
    steps = [r for r in rows if "loss/task_0" in r or "loss/task_1" in r]
    assert [(r["task_step"], r["phase"]) for r in steps] == [(6, "train"), (12, "finetune")] * 2
    assert math.isclose(steps[0]["loss/task_0"], loss_at(0, 6), rel_tol=1e-6)
    tasks = [r for r in rows if "tasks_learned" in r]
    assert [[r[f"accuracy/task_{j}"] for j in range(t + 1)] for t, r in enumerate(tasks)] == ROWS[
        :2
    ]
    assert [r["flops_ratio"] for r in tasks] == [record_of(t)["flops_ratio"] for t in range(2)]
    assert [r["weights/used"] for r in tasks] == [1000, 2000]


def test_wandb_mode_is_checked(monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    from espn.training.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(LoggerError, match=r"WANDB_MODE 'sometimes'.*offline, online, disabled"):
        WandbLogger(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "online")
    assert WandbLogger(tmp_path).mode == "online"  # the user asked: nothing started yet
    assert WandbLogger(tmp_path, mode="offline").mode == "offline"


def test_make_loggers_builds_each_named_logger_in_the_run_directory(tmp_path):
    pytest.importorskip("tensorboard")
    mine = Callback()
    loggers = make_loggers(" tensorboard, csv ", tmp_path, log_every=5)
    assert [type(x) for x in loggers] == [TensorBoardLogger, CSVLogger]
    assert all(x.log_every == 5 for x in loggers)  # type: ignore[attr-defined]
    assert make_loggers(["csv", mine], tmp_path)[1] is mine
    assert make_loggers("", tmp_path) == [] and make_loggers([], tmp_path) == []
    feed_run(CallbackList(loggers), tasks=1)
    assert (tmp_path / "logs" / "csv" / "tasks.csv").is_file()
    assert glob.glob(str(tmp_path / "logs" / "tensorboard" / "events.out.tfevents.*"))


@pytest.mark.parametrize(
    ("names", "error", "message"),
    [
        (
            "csv,tensorbored",
            UnknownNameError,
            "unknown logger 'tensorbored'; choose one of: csv, tensorboard, wandb",
        ),
        (["csv", "CSV"], LoggerError, "logger 'csv' is given twice"),
        ([3], LoggerError, "a logger is a name (csv, tensorboard, wandb) or a Callback, got 3"),
    ],
)
def test_make_loggers_rejects_bad_names_before_writing(tmp_path, names, error, message):
    with pytest.raises(error) as info:
        make_loggers(names, tmp_path / "run")
    assert str(info.value) == message
    assert not (tmp_path / "run").exists()


def test_a_named_logger_needs_a_run_directory(tmp_path):
    mine = CSVLogger(tmp_path / "mine")
    assert make_loggers([mine], None) == [mine]
    with pytest.raises(LoggerError, match="the csv logger writes into the run directory"):
        make_loggers([mine, "csv"], None)


def test_make_loggers_rejects_bad_log_every(tmp_path):
    for bad in (0, -1, 2.5, True):
        with pytest.raises(LoggerError, match="log_every must be a whole number >= 1"):
            make_loggers("csv", tmp_path, log_every=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_missing_extra_is_named(tmp_path, monkeypatch, name):
    real = logger_base.importlib.util.find_spec
    monkeypatch.setattr(
        logger_base.importlib.util, "find_spec", lambda m, *a: None if m == name else real(m, *a)
    )
    with pytest.raises(LoggerUnavailable) as info:
        make_loggers(f"csv,{name}", tmp_path / "run")
    assert f"pip install 'espn[{name}]'" in str(info.value)
    assert f"the {name} logger needs the {name!r} package" in str(info.value)
    assert not (tmp_path / "run").exists()
