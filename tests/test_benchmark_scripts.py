"""The scripts in benchmarks/ run against the library as it is now (their smallest settings).

Nothing here is timed: each script checks what it measures (the exported model against the
supernet, FrozenGuard against the boolean guard, espn's fused optimizers against torch's
default ones, task 0's logits after task 1) and fails loudly when that breaks; these tests
only require that they finish and report it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_script(name: str, *args: str) -> str:
    """Run ``benchmarks/name`` on the CPU; its standard output (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_inference_speed_prunes_to_the_target_and_exports() -> None:
    out = run_script(
        "inference_speed.py",
        *("--devices", "cpu", "--models", "fc1024", "--gammas", "0.5", "--batches", "1"),
        *("--token-models", "vit-p4", "--token-batches", "1", "--repeats", "1", "--block", "0.01"),
    )
    rows = [row for row in map(str.split, out.splitlines()) if row[1:2] == ["cpu"]]
    assert [r[0] for r in rows] == ["fc1024", "vit-p4"]
    for row in rows:
        assert float(row[3]) <= 0.5  # the random sub-network's FLOPs ratio meets gamma


def test_frozen_guard_matches_the_boolean_guard() -> None:
    out = run_script("frozen_guard.py", "--models", "fc1024", "--seconds", "0.05")
    assert any(line.split()[:1] == ["fc1024"] for line in out.splitlines())


def test_cifar_epoch_time_trains_a_task() -> None:
    out = run_script("cifar_epoch_time.py", "--train", "64", "--test", "32", "--batch-size", "32")
    assert "per epoch of 64 images" in out


@pytest.mark.slow  # a torchvision ResNet18, about 25 s
def test_torchvision_table_keeps_task_0() -> None:
    out = run_script("torchvision_table.py", "--models", "resnet18", "--per-task", "8")
    assert "task 0 bit-identical after task 1: True" in out


def test_optimizer_step_agrees_with_torch() -> None:
    out = run_script("optimizer_step.py", "--models", "fc1024", "--seconds", "0.05")
    rows = [row.split() for row in out.splitlines() if row.split()[:1] == ["fc1024"]]
    assert [r[1] for r in rows] == ["sgd", "nesterov", "adam", "rmsprop"]


def test_step_cost_times_every_phase_against_the_plain_loop() -> None:
    out = run_script(
        "step_cost.py",
        *("--models", "fc1024", "--methods", "espn,packnet", "--steps", "1", "--repeats", "1"),
        *("--batch", "8", "--threads", "1"),
    )
    rows = [row.split() for row in out.splitlines() if row.split()[:1] == ["fc1024"]]
    # each method against the plain loop and the plain loop with the recipe's L2 term
    assert [r[1:4:2] for r in rows] == [
        [m, b] for m in ("ESPN-0.2", "packnet") for b in ("plain", "plain+L2")
    ]
    # baseline ms, ms and (ratio) of pre-training, pruning, fine-tuning, slim pruning, slim
    # fine-tuning, event ms
    for row in rows:
        assert len(row) == 16 and all(r.endswith("x)") for r in row[6:15:2])
    # espn's milliseconds are the same in both rows of a method; the baselines differ
    for espn, l2 in zip(rows[::2], rows[1::2], strict=True):
        assert espn[5:15:2] == l2[5:15:2] and espn[15] == l2[15]


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(),
    reason="apt-get install dataset-fashion-mnist (done by .ci/run)",
)
def test_whole_task_compares_espn_run_with_the_plain_loop_step_for_step() -> None:
    out = run_script(
        "whole_task.py",
        *("--train-per-task", "300", "--test-per-task", "100", "--epochs", "1,2,1"),
        *("--data-dir", "/usr/share/datasets"),
    )
    rows = [
        row.split() for row in out.splitlines() if row.split()[:1] in (["ESPN-0.2"], ["packnet"])
    ]
    assert [r[0] for r in rows] == ["ESPN-0.2", "packnet"]
    for row in rows:
        # 2 batches of 256 per pass over 300 images, 1 + 2 + 1 passes
        assert int(row[1]) == 2 * (1 + 2 + 1)
        # espn / plain, espn / plain with the recipe's L2 term, the whole runs' ratio
        assert row[4].endswith("x") and row[6].endswith("x") and row[9].endswith("x")
        assert float(row[5]) > 0  # both recipes have the L2 term: the loop ran
        assert all(0.0 <= float(r.rstrip("%")) <= 100.0 for r in row[11:13])


@pytest.mark.slow  # two 1-task runs, about 10 s of CPU
@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(),
    reason="apt-get install dataset-fashion-mnist (done by .ci/run)",
)
def test_slim_paths_compares_the_two_runs_at_every_prune_event() -> None:
    out = run_script(
        "slim_paths.py",
        *("--tasks", "1", "--train-per-task", "256", "--test-per-task", "64", "--epochs", "1,1,1"),
    )
    events = [
        row.split() for row in out.splitlines() if row.split()[:1] in (["1"], ["2"], ["3"], ["4"])
    ]
    assert [int(e[0]) for e in events] == [1, 2, 3, 4]  # one prune epoch: 4 events
    assert all(e[1:] == ["0", "0"] for e in events)  # masked until then in both runs
    steps = {
        line.split(":")[0]: int(line.split("; ")[1].split()[0])
        for line in out.splitlines()
        if "steps on slim copies" in line
    }
    assert steps["masked"] == 0 < steps["slim"]  # the fine-tuning's copy


def test_step_pairs_times_every_phase_step_by_step() -> None:
    out = run_script(
        "step_pairs.py",
        *("--models", "vit-p4", "--methods", "espn,packnet", "--steps", "3", "--skip", "1"),
        *("--batch", "4", "--threads", "1"),
    )
    rows = [row.split() for row in out.splitlines() if row.split()[:1] == ["vit-p4"]]
    # each method against the plain step and the plain step with the recipe's L2 term
    assert [r[1:4:2] for r in rows] == [
        [m, b] for m in ("ESPN-0.2", "packnet") for b in ("plain", "plain+L2")
    ]
    for row in rows:  # baseline ms, then each phase: name, ms, (ratio)
        assert row[5::3] == ["pretrain", "prune", "finetune"]
        assert all(r.startswith("(") and r.endswith("x)") for r in row[7::3])
    for espn, l2 in zip(rows[::2], rows[1::2], strict=True):  # espn's ms in both rows
        assert espn[6::3] == l2[6::3]


def test_step_pairs_control_times_a_plain_twin_against_the_plain_step() -> None:
    out = run_script(  # espn's reference step (the fast path off)
        "step_pairs.py",
        *("--models", "fc1024", "--methods", "individual", "--steps", "3", "--skip", "1"),
        *("--batch", "4", "--threads", "1", "--control", "--reference"),
    )
    rows = [row.split() for row in out.splitlines() if row.split()[:1] == ["fc1024"]]
    assert [r[3] for r in rows] == ["plain", "plain+L2", "control"]
    plain, control = rows[0], rows[2]
    assert control[4] == plain[4]  # the control's baseline is the plain step
    assert all(r.startswith("(") and r.endswith("x)") for r in control[7::3])


@pytest.mark.slow  # five tasks of two networks each, a reference, every score: ~25 s
@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(),
    reason="apt-get install dataset-fashion-mnist (done by .ci/run)",
)
def test_routing_study_scores_every_recipe() -> None:
    out = run_script(
        "routing_study.py",
        *("--train", "100", "--test", "100", "--epochs", "1", "--lifts"),
        *("--joint", "cnn3-classes", "--joint-epochs", "1"),
    )
    shares = {  # | recipe | test | held-out |
        row[1].strip(): [float(row[2]), float(row[3])]
        for row in (line.split("|") for line in out.splitlines())
        if len(row) == 5 and row[2].strip()[:1].isdigit()
    }
    density = ["input-subspace", "input-subspace+flips/shifts"]
    recipes = ["max-logit", "mahalanobis", "rotation-logit", "rotation-softmax"]
    expected = [*(d + a for d in density for a in ("", ", flip-averaged")), *recipes]
    raw = [name.removesuffix(", raw") for name in shares if name.endswith(", raw")]
    assert raw == [*expected, "rotation-mahalanobis"]
    assert all(0 <= v <= 100 for pair in shares.values() for v in pair)
    # the input density alone tells these tasks apart far above chance (20%)
    assert shares["input-subspace, raw"][0] > 50
    assert "reference cnn3-classes (sees every task)" in shares
