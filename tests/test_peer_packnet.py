"""benchmarks/peer_packnet.py on synthetic MNIST-shaped data: both libraries get the very same
tensors, espn's side runs the real PackNet on the given sequence, bad options exit 2."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

import espn.api.experiment as experiment_module
from espn.methods.base import METHODS
from espn.runs.config import make_config

# the peer comparison trains Avalanche and espn side by side: about a minute in all
pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "peer_packnet.py"
# espn's defaults with the size rule's reference at 1024 images: 4 steps per recipe epoch
TINY = ["--tasks", "2", "--train-per-task", "200", "--test-per-task", "100"]
TINY += ["--reference-size", "1024"]


@pytest.fixture(scope="module")
def peer():
    """The benchmark script, imported as a module."""
    spec = importlib.util.spec_from_file_location("peer_packnet", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["peer_packnet"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("peer_packnet", None)


def tiny(peer, tmp_path: Path, *extra: str):
    """Options, espn config and the task sequence of a tiny comparison."""
    args = peer.parse_args([*TINY, *extra])
    cfg = peer.espn_config(args, tmp_path / "espn")
    return args, cfg, experiment_module.build_benchmark(cfg)


def test_espn_runs_packnet_with_its_defaults_and_avalanche_as_many_steps(
    peer, fake_mnist, tmp_path: Path
) -> None:
    args, cfg, seq = tiny(peer, tmp_path)
    defaults = make_config(
        benchmark="rotated-fashion-mnist",
        method="packnet",
        tasks=2,
        train_per_task=200,
        test_per_task=100,
        reference_size=1024,
        out=tmp_path / "espn",
    )
    assert cfg == defaults  # nothing of the recipe is handed to espn
    recipe = peer.avalanche_recipe(args, cfg, len(seq.tasks[0].train))
    assert (recipe.optim, recipe.batch_size, recipe.keep) == (
        cfg.training_settings(),
        cfg.batch_size,
        cfg.alpha,
    )
    # 200 images at batch 256: 1 step per epoch; espn's size rule: 4 steps per recipe epoch
    result = peer.run_espn(cfg, seq)
    doc = json.loads((tmp_path / "espn" / "results.json").read_text())
    steps = [sum(p["steps"] for p in task) for task in doc["phases"]]
    assert steps == [4 * sum(cfg.epochs)] * 2 and len(result.accuracy) == 2
    assert recipe.epochs == steps[0]  # one step per Avalanche epoch on these tasks
    phases = METHODS.get("packnet")(cfg.method_config()).phases()
    last_prune = max(i for i, p in enumerate(phases) if p.prune_updates > 0)
    assert recipe.post_prune == sum(p["steps"] for p in doc["phases"][0][last_prune + 1 :])
    given = peer.avalanche_recipe(
        peer.parse_args([*TINY, "--epochs", "5", "--post-prune-epochs", "2"]), cfg, 200
    )
    assert (given.epochs, given.post_prune) == (5, 2)


def test_both_sides_get_the_inputs_espn_trains_and_tests_on(
    peer, fake_mnist, tmp_path: Path
) -> None:
    _, _, seq = tiny(peer, tmp_path)
    for task in seq.tasks:
        for split in ("train", "test"):
            x, y = peer.split_tensors(task, split)
            batches = list(task.batches(split, 64, shuffle=False))
            assert torch.equal(x, torch.cat([b for b, _ in batches]))
            assert torch.equal(y, torch.cat([c for _, c in batches]))
            assert len(y) == (200 if split == "train" else 100)
    # the tasks differ (rotations), so the comparison is not one task three times
    assert not torch.equal(
        peer.split_tensors(seq.tasks[0], "test")[0], peer.split_tensors(seq.tasks[1], "test")[0]
    )


def test_espn_side_trains_the_sequence_it_is_given(
    peer, fake_mnist, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, cfg, seq = tiny(peer, tmp_path)

    def no_rebuild(cfg):
        raise AssertionError("run_experiment rebuilt the benchmark instead of using seq")

    monkeypatch.setattr(experiment_module, "build_benchmark", no_rebuild)
    result = peer.run_espn(cfg, seq)
    doc = json.loads((tmp_path / "espn" / "results.json").read_text())
    assert result.accuracy == doc["final_accuracy"]
    assert len(result.accuracy) == len(result.seconds) == 2
    assert all(s > 0 for s in result.seconds)
    assert doc["task_names"] == [t.name for t in seq.tasks]
    # the kept share: ceil(0.05 x free weights) new weights at most per task
    free = doc["total_weights"]
    for new in doc["new_weights"]:
        assert 0 < new <= math.ceil(0.05 * free)
        free -= new


def test_main_prints_and_writes_the_comparison(
    peer, fake_mnist, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "peer.json"
    assert peer.main([*TINY, "--side", "espn", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    acc = doc["espn"]["accuracy"]
    assert len(acc) == 2 and doc["espn"]["average_accuracy"] == pytest.approx(sum(acc) / 2)
    assert "avalanche" not in doc
    printed = capsys.readouterr().out
    for name in doc["tasks"]:
        assert name in printed
    assert "average" in printed


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--epochs", "3", "--post-prune-epochs", "3"],
            "--post-prune-epochs must be in [0, --epochs), got 3 with --epochs 3",
        ),
        (["--epochs", "0"], "--epochs must be >= 1, got 0"),
        (["--reference-size", "0"], "reference_size must be >= 1, got 0"),
        (["--tasks", "0"], "tasks must be >= 1, got 0"),
    ],
)
def test_bad_options_exit_2_naming_the_value(
    peer, extra: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    assert peer.main([*TINY, "--side", "espn", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.slow  # importing Avalanche alone takes about 10 s of CPU
def test_avalanche_side_keeps_each_task_in_its_own_subnetwork(
    peer, fake_mnist, tmp_path: Path
) -> None:
    pytest.importorskip("avalanche")
    args, cfg, seq = tiny(peer, tmp_path)
    recipe = peer.avalanche_recipe(args, cfg, len(seq.tasks[0].train))
    both = peer.run_avalanche(seq, args, recipe)
    one = type(seq)(seq.name, seq.tasks[:1], seq.input_shape, False)
    first = peer.run_avalanche(one, args, recipe)
    assert len(both.accuracy) == len(both.seconds) == 2
    # task 1 scores the same alone and after task 2 was packed in: zero forgetting, and the
    # evaluation of task 1 runs task 1's sub-network
    assert both.accuracy[0] == first.accuracy[0]
    assert both.accuracy[0] > 50.0  # learned (10 classes: chance is 10%)
