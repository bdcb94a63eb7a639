"""The size rule: a phase of a task smaller than the reference size runs the reference's
optimizer steps (the same for every method), a larger task keeps its epochs, prune steps
spread over the lengthened phase, and zero forgetting and resume stay exact."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import espn.data.mnist as mnist_module
from espn.api.experiment import run_experiment
from espn.methods.base import METHODS, Phase, Strategy
from espn.models.registry import MODELS
from espn.reproduce.common import planned_steps
from espn.reproduce.continual import (
    CIFAR_TASK_SIZE,
    MNIST_TASK_SIZE,
    mnist_paper_steps,
    split_paper_steps,
)
from espn.reproduce.target import TARGETS, Options, parse_name
from espn.runs.config import make_config
from espn.training.callbacks import Callback, EpochStart, StepEnd, TrainStart
from espn.training.plan import plan_phase, prune_points
from helpers.deploy import Killed, fc_test, kill_at_step, run_options, watch_engines
from helpers.mnist import synthetic_mnist

BATCH = 128
TRAIN = 400  # the fake data's training images per task: 4 batches of 128 (the last of 16)


@pytest.fixture(autouse=True)
def tiny(fake_mnist, fc_test_model):
    """Every run here trains model ``fc-test`` on the fake data."""


class StepCounter(Callback):
    """Every optimizer step the engine takes, as (task index, phase name), in order
    (``seen``): a step counts where one of torch's optimizers stepped (torch's hook on every
    optimizer's ``step``) since the step before; the events say which task and phase."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str]] = []
        self.task, self.phase, self.stepped = -1, "", False

    def on_train_start(self, learner, event: TrainStart) -> None:
        self.task = event.task

    def on_epoch_start(self, learner, event: EpochStart) -> None:
        self.phase = event.phase

    def on_step_end(self, learner, event: StepEnd) -> None:
        if self.stepped:
            self.seen.append((self.task, self.phase))
        self.stepped = False


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, str]]]:
    """The optimizer steps of every engine in the test (see :class:`StepCounter`)."""
    counter = StepCounter()
    watch_engines(monkeypatch, counter)
    handle = register_optimizer_step_post_hook(lambda *_: setattr(counter, "stepped", True))
    yield counter.seen
    handle.remove()


def recipe_phases(cfg) -> list[Phase]:
    """The phases the method's recipe states (in epochs), from the configuration alone."""
    return METHODS.get(cfg.method)(cfg.method_config()).phases()


def test_the_rule_in_numbers() -> None:
    """A 1000-image task at batch 256 under the MNIST reference (60000): 235 steps per recipe
    epoch, as on 60000 images; 60000 or more images: epochs as given."""
    phase = Phase("prune", 4)
    small = plan_phase(phase, math.ceil(1000 / 256), math.ceil(60000 / 256))
    assert (small.steps, small.epochs, small.recipe_epochs) == (4 * 235, 235, 4)
    assert small.epochs * 4 >= small.steps > (small.epochs - 1) * 4  # the last pass is cut
    same = plan_phase(phase, 235, 235)
    assert (same.steps, same.epochs) == (4 * 235, 4)
    large = plan_phase(phase, math.ceil(120000 / 256), 235)
    assert (large.steps, large.epochs) == (4 * 469, 4)  # no cap: twice the reference's
    assert plan_phase(phase, 4, None).steps == 16  # the rule off: epochs as given


@pytest.mark.parametrize("method", METHODS.names())
def test_every_method_gets_the_reference_steps_per_phase(
    method: str, tmp_path: Path, seen: list[tuple[int, str]]
) -> None:
    """Reference 1536 images at batch 128 = 12 steps per recipe epoch; the tasks have 400
    images (4 steps per epoch): every phase that runs takes epochs x 12 optimizer steps."""
    reference = 1536
    # RMN's threshold rule keeps every weight in so short a run: the next task would get
    # none, and the run stops before it (docs/methods.md); espn's allocation leaves room
    budget = {"rmn_budget": 0.5} if method == "rmn" else {}
    cfg = make_config(
        **run_options(tmp_path / "run", method=method, tasks=2, reference_size=reference),
        **budget,
    )
    doc = run_experiment(cfg, progress=False)
    phases = recipe_phases(cfg)
    per_reference = math.ceil(reference / BATCH)
    per_epoch = math.ceil(TRAIN * (2 if method == "mtl" else 1) / BATCH)
    for task, record in enumerate(doc["phases"]):
        if method == "mtl":  # one joint task of every task's images, trained once
            assert record == doc["phases"][0]
            task = 0
        counted = Counter(name for t, name in seen if t == task)
        assert [p["phase"] for p in record] == [p.name for p in phases]
        for phase, entry in zip(phases, record, strict=True):
            assert entry["recipe_epochs"] == phase.epochs
            assert entry["steps"] == counted[phase.name]
            if entry["steps"]:  # not a phase the method skipped (CPG's later rounds)
                assert entry["steps"] == phase.epochs * per_reference
                assert entry["epochs"] == math.ceil(entry["steps"] / per_epoch)
    assert doc["config"]["reference_size"] == reference and doc["config"]["step_floor"]


def test_a_task_larger_than_the_reference_keeps_its_epochs(
    tmp_path: Path, seen: list[tuple[int, str]]
) -> None:
    cfg = make_config(**run_options(tmp_path / "run", tasks=1, reference_size=200))
    doc = run_experiment(cfg, progress=False)
    counted = Counter(name for _, name in seen)
    for phase, entry in zip(recipe_phases(cfg), doc["phases"][0], strict=True):
        assert entry["epochs"] == entry["recipe_epochs"] == phase.epochs
        assert entry["steps"] == counted[phase.name] == phase.epochs * math.ceil(TRAIN / BATCH)


def test_off_trains_by_epochs_and_given_epochs_state_no_reference(tmp_path: Path) -> None:
    off = make_config(benchmark="rotated-fashion-mnist", step_floor=False, out=tmp_path)
    assert off.reference_size == 60000 and off.floor_reference() is None
    recipe = make_config(benchmark="split-cifar100", out=tmp_path)
    assert recipe.floor_reference() == 2500
    given = make_config(benchmark="rotated-fashion-mnist", epochs=(1, 1, 1), out=tmp_path)
    assert given.reference_size is None  # epochs given: stated for the user's own data
    assert make_config(preset="paper", out=tmp_path).floor_reference() == 2500


def test_prune_steps_spread_over_the_lengthened_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seen: list[tuple[int, str]]
) -> None:
    """ESPN's prune steps fall at ``prune_points`` of the floored phase, the last at its end."""
    cfg = make_config(**run_options(tmp_path / "run", tasks=1, reference_size=1536))
    at: list[int] = []
    espn = METHODS.get("espn")
    real = espn.prune_step

    def prune_step(self: Strategy, supernet, progress: float) -> None:
        at.append(sum(1 for _, name in seen if name == "prune"))
        real(self, supernet, progress)

    monkeypatch.setattr(espn, "prune_step", prune_step)
    run_experiment(cfg, progress=False)
    prune = next(p for p in recipe_phases(cfg) if p.name == "prune")
    steps = prune.epochs * 12
    assert at == prune_points(steps, prune.prune_updates) and at[-1] == steps == 24


def test_zero_forgetting_with_the_rule(tmp_path: Path) -> None:
    """A task's accuracy is the same after every later task (bit-identical sub-networks)."""
    cfg = make_config(**run_options(tmp_path / "run", reference_size=1536))
    doc = run_experiment(cfg, progress=False)
    rows = doc["accuracy_matrix"]
    for t in range(len(rows)):
        assert len({row[t] for row in rows[t:]}) == 1
    assert all(sum(p["steps"] for p in task) == 4 * 12 for task in doc["phases"])


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The uninterrupted run (reference 640) that each killed-and-resumed run must equal."""
    out = tmp_path_factory.mktemp("reference") / "run"
    data = synthetic_mnist()
    with pytest.MonkeyPatch.context() as mp, MODELS.temporarily("fc-test", fc_test):
        mp.setattr(mnist_module, "load_mnist_like", lambda *a, **k: data)
        doc = run_experiment(make_config(**run_options(out, reference_size=640)), progress=False)
    return out, doc


# 400 images, batch 128, reference 640: 5 steps per recipe epoch (2 passes: 4 + 1); epochs
# 1,2,1: 5 + 10 + 5 = 20 steps per task. 5 = the cut second pass of pre-training, 14 = the
# cut third pass of pruning (steps 6-9, 10-13, 14-15), 28 = task 2, pruning
@pytest.mark.parametrize("kill", [5, 14, 28])
def test_resume_stays_exact_with_the_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kill: int, reference_run: tuple[Path, dict]
) -> None:
    reference_dir, reference = reference_run
    out = tmp_path / "run"
    cfg = make_config(**run_options(out, reference_size=640))
    with monkeypatch.context() as mp:
        kill_at_step(mp, kill)
        with pytest.raises(Killed):
            run_experiment(cfg, progress=False)
    resumed = run_experiment(cfg, progress=False, resume=True)
    assert resumed["accuracy_matrix"] == reference["accuracy_matrix"]
    assert resumed["phases"] == reference["phases"]
    assert [sum(p["steps"] for p in t) for t in resumed["phases"]] == [20, 20, 20]
    for name in ("state", "tasks"):
        ref = json.loads((reference_dir / "checkpoint/manifest.json").read_text())[name]
        got = json.loads((out / "checkpoint/manifest.json").read_text())[name]
        if name == "state":
            assert got["sha256"] == ref["sha256"]
        else:
            assert [t["sha256"] for t in got] == [t["sha256"] for t in ref]
    assert torch.equal(torch.tensor(resumed["flops"]), torch.tensor(reference["flops"]))


# ------------------------------------------------------- reproduce --scale cpu, no training
@pytest.mark.parametrize("target", ["table1", "fig-alpha-gamma", "fig-mnist"])
def test_cpu_scale_points_have_the_papers_steps_per_phase(target: str, tmp_path: Path) -> None:
    """Every cpu-scale point of the paper-regime targets plans, per phase, the optimizer steps
    of the paper's run of the same method (SplitCIFAR100: 2500-image tasks; MNIST: 60000),
    from the configurations alone; MTL's one joint task is the exception (fewer tasks than 20)."""
    points = [
        p for stage in TARGETS.get(target).stages(Options(scale="cpu"), tmp_path) for p in stage
    ]
    assert points
    for point in points:
        _, series, _ = parse_name(point.name)
        if target == "fig-mnist":
            assert "train_per_task" not in point.options  # the full training set
            ours = planned_steps(point.options, MNIST_TASK_SIZE)
            theirs = mnist_paper_steps(series)
        else:
            assert point.options["train_per_task"] == CIFAR_TASK_SIZE
            method = "espn-0.2" if target == "fig-alpha-gamma" else series
            if method == "mtl":
                continue
            ours = planned_steps(point.options, CIFAR_TASK_SIZE)
            theirs = split_paper_steps(method)
        assert ours == theirs and sum(n for _, n in ours) > 0
    espn = planned_steps(points[0].options | {"method": "espn", "gamma": 0.2}, 1000)
    if target == "fig-mnist":  # and so does a 1000-image task, by the size rule
        assert espn == mnist_paper_steps("rotated+espn-0.2")
        assert sum(n for _, n in espn) == 10 * 235
    else:
        assert sum(n for _, n in split_paper_steps("espn-0.2")) == 250 * 20
