"""Run directories changed by hand with their manifest's sizes and hashes made to match
(issue 48, items 4, 9, 11, 12): task statistics espn cannot have written, model references
that cannot build, a rule the tasks cannot run. Each is refused in one line naming what is
wrong, before any evaluation."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import espn
import espn.evaluation.metrics
from espn.checkpoint.format import CheckpointError, file_entry
from espn.cli.main import app
from helpers.errors import one_line_error

runner = CliRunner()


def tamper_stats(run: Path, task: int, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    """Apply ``change`` to task ``task``'s statistics (its ``stats.*`` tensors, by name) and
    record the file's new size and SHA-256 in the manifest, as a careful attacker would."""
    directory = run / "checkpoint"
    path = directory / f"task-{task:04d}.safetensors"
    tensors = load_file(str(path))
    stats = {k.removeprefix("stats."): v for k, v in tensors.items() if k.startswith("stats.")}
    change(stats)
    tensors = {k: v for k, v in tensors.items() if not k.startswith("stats.")}
    save_file(tensors | {f"stats.{k}": v.contiguous() for k, v in stats.items()}, str(path))
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["tasks"][task] |= {k: v for k, v in file_entry(path).items() if k != "file"}
    (directory / "manifest.json").write_text(json.dumps(manifest))


def _set(name: str, make: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[dict], None]:
    def change(stats: dict[str, torch.Tensor]) -> None:
        stats[name] = make(stats[name])

    return change


def _nan_at_one(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x.view(-1)[1] = float("nan")
    return x


def _without(name: str) -> Callable[[dict], None]:
    return lambda stats: stats.pop(name)


TAMPERED = [
    ("input_means", _set("input_means", _nan_at_one), "holds NaN or infinite values"),
    ("class_means", _set("class_means", lambda x: x + float("inf")), "holds NaN or infinite"),
    ("variance", _set("variance", torch.zeros_like), "holds a variance that is not above zero"),
    (
        "input_variance",
        _set("input_variance", torch.neg),
        "holds a variance that is not above zero",
    ),
    ("calibration", _set("calibration", _nan_at_one), "holds NaN or infinite values"),
    ("input_variance", _set("input_variance", lambda x: x[:5]), "has shape [5], not [784]"),
    ("input_means", _set("input_means", lambda x: x.double()), "is float64, not float32"),
    ("class_means", _set("class_means", lambda x: x.int()), "is int32, not float32"),
    (
        "calibration",
        _set("calibration", lambda x: torch.ones(9, 9)),
        "has shape [9, 9], not [4, 2]",
    ),
    (
        "class_means",
        _set("class_means", lambda x: torch.ones(10, 250, 1)),
        "has shape [10, 250, 1], not [",
    ),
]


@pytest.mark.parametrize(("name", "change", "words"), TAMPERED)
def test_tampered_statistics_are_refused_when_the_run_is_read(run_copy, name, change, words):
    tamper_stats(run_copy, 1, change)
    with pytest.raises(CheckpointError) as caught:
        espn.load(run_copy)
    message = str(caught.value)
    assert "\n" not in message
    assert f"task 1: statistic {name!r} {words}" in message
    assert "changed or damaged" in message


def test_the_cli_refuses_tampered_statistics_before_any_evaluation(run_copy, monkeypatch):
    """``espn evaluate --task-agnostic`` and ``espn export --task-agnostic`` on NaN input
    means: one line, exit 2, no accuracy computed and no file written."""
    tamper_stats(run_copy, 1, _set("input_means", _nan_at_one))
    calls = []
    monkeypatch.setattr(espn.evaluation.metrics, "task_accuracy", lambda *a, **k: calls.append(a))
    before = (run_copy / "results.json").read_bytes()
    line = one_line_error(runner.invoke(app, ["evaluate", str(run_copy), "--task-agnostic"]))
    assert "task 1: statistic 'input_means' holds NaN or infinite values" in line
    target = run_copy.parent / "agnostic.pt2"
    args = ["export", str(run_copy), "--task-agnostic", "--out", str(target), "--no-onnx"]
    line = one_line_error(runner.invoke(app, args))
    assert "task 1: statistic 'input_means' holds NaN or infinite values" in line
    assert calls == [] and not target.exists()
    assert (run_copy / "results.json").read_bytes() == before


def test_an_unknown_or_missing_statistic_is_named_as_such(run_copy):
    tamper_stats(run_copy, 1, lambda stats: stats.update(evil=torch.ones(3)))
    line = one_line_error(runner.invoke(app, ["evaluate", str(run_copy), "--task-agnostic"]))
    assert "task 1 stores unknown statistic(s) ['evil']" in line
    assert "have none" not in line
    tamper_stats(run_copy, 1, lambda stats: [stats.pop("evil"), stats.pop("calibration")])
    with pytest.raises(CheckpointError, match=r"task 1 stores no \['calibration'\]"):
        espn.load(run_copy)


def test_untampered_statistics_are_read(run_copy):
    """The check refuses only what espn never writes: the run as written loads, and a
    rewritten task file with the same tensors does too."""
    tamper_stats(run_copy, 2, lambda stats: None)
    learner = espn.load(run_copy)
    assert all(m.stats for m in learner.supernet.masks)


# ------------------------------------------------------------------ 11: trusted model code
def _edit_model(run: Path, model: str) -> None:
    for path in (run / "checkpoint" / "manifest.json", run / "results.json"):
        doc = json.loads(path.read_text())
        doc["config"]["model"] = model
        if "model" in doc:
            doc["model"] = model
        path.write_text(json.dumps(doc))


def test_a_trusted_reference_to_a_crafted_pt2_fails_in_one_line(run_copy, tmp_path):
    evil = tmp_path / "evil.pt2"
    evil.write_bytes(b"PK\x03\x04 crafted")
    _edit_model(run_copy, f"espn.export.export:load_exported(path={str(evil)!r})")
    result = runner.invoke(app, ["evaluate", str(run_copy), "--trust-model-code"])
    assert result.exit_code == 2, result.output
    # torch.export.load, trusted, logs its own traceback as a warning; espn prints one line
    ours = [line for line in result.output.splitlines() if "site-packages/torch" not in line]
    assert len(ours) == 1 and ours[0].startswith("error: model"), result.output
    assert "load_exported" in ours[0] and "cannot be built: BadZipFile" in ours[0]
    # trusted for that command only: the next read without the opt-in imports and calls nothing
    line = one_line_error(runner.invoke(app, ["evaluate", str(run_copy)]))
    assert "neither one of espn's model builders" in line and "--trust-model-code" in line


def test_a_trusted_reference_missing_an_argument_names_it(run_copy):
    _edit_model(run_copy, "espn.models.fc:FCNet(in_features=784, hidden=[64, 48], n_classes=3)")
    args = ["evaluate", str(run_copy), "--trust-model-code"]
    line = one_line_error(runner.invoke(app, args))
    assert "espn.models.fc:FCNet(" in line and "missing a required argument: 'multi_head'" in line
    assert "unexpected" not in line


# ------------------------------------------------------------------ 12: rule checked first
def test_a_rule_the_tasks_cannot_run_is_refused_before_any_evaluation(run_copy, monkeypatch):
    """supsup-oneshot superposes masks: tasks that prune units (espn) cannot run it."""
    calls = []
    monkeypatch.setattr(espn.evaluation.metrics, "task_accuracy", lambda *a, **k: calls.append(a))
    args = ["evaluate", str(run_copy), "--task-agnostic", "--rule", "supsup-oneshot"]
    result = runner.invoke(app, args)
    line = one_line_error(result)
    assert "rule 'supsup-oneshot' superposes" in line
    assert calls == [] and "match" not in result.output
