"""benchmarks/model_matrix.py: the verdicts it gives, the FLOPs it compares, the table it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def matrix(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import model_matrix

    return model_matrix


def counted(model: nn.Module, x: torch.Tensor) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model.eval()(x[:1])
    return int(counter.get_total_flops())


def test_a_network_that_works_is_checked_on_real_flops(matrix) -> None:
    (entry,) = [e for e in matrix.entries() if e.name == "hand/cnn1d"]
    row = matrix.check(entry, matrix.Settings(per_task=40, timing_batches=[]))
    assert row["verdict"] == "works", f"{row['verdict']} at {row.get('stage')}: {row.get('reason')}"
    model, x = entry.build()
    assert row["dense_flops"] == counted(model, x) > 0
    assert len(row["tasks"]) == 2
    for task in row["tasks"]:  # the loaded export's count, pruned, equal to espn's own count
        assert 0 < task["measured_flops"] < row["dense_flops"]
        assert task["measured_flops"] == task["reported_flops"]
        assert task["measured_ratio"] == pytest.approx(task["reported_ratio"], rel=0.01)


def test_a_network_espn_refuses_gets_its_one_line_reason(matrix) -> None:
    nothing = matrix.Entry("test/no-weights", "test", lambda: (nn.Flatten(), torch.zeros(2, 3)))
    row = matrix.check(nothing, matrix.Settings(timing_batches=[]))
    assert row["verdict"] == "refused" and row["stage"] == "wrap"
    assert row["reason"] and "\n" not in row["reason"]


def test_the_table_counts_every_verdict(matrix) -> None:
    rows = [
        {
            "name": "a",
            "verdict": "works",
            "input": [3, 32, 32],
            "speedup": {"1": 1.5},
            "tasks": [{"reported_ratio": 0.5, "measured_ratio": 0.5}],
        },
        {"name": "b", "verdict": "refused", "reason": "a | b"},
        {
            "name": "c",
            "verdict": "broken",
            "problem": "flops",
            "stage": "FLOPs check",
            "reason": "x",
        },
    ]
    lines = matrix.table(rows).splitlines()
    assert lines[0] == "3 models: 1 works, 1 refused, 1 broken (1 flops)."
    assert lines[4] == "| a | 3x32x32 | works | 0.500 / 0.500 | 1.50x |  |"
    assert lines[5] == "| b |  | refused |  |  | a \\| b |"
    assert lines[6] == "| c |  | broken: flops |  |  | at FLOPs check: x |"
    assert matrix.table(rows, total=103).startswith("3 of 103 models: 1 works,")


@pytest.mark.slow  # two small models through the script, each in its own process
def test_the_script_writes_the_table_into_the_page(tmp_path: Path) -> None:
    page = tmp_path / "models.md"
    page.write_text(
        "# Models\n\nabove\n\n<!-- model-matrix:start -->\nold\n<!-- model-matrix:end -->\n\nbelow\n"
    )
    out = tmp_path / "matrix.json"
    only = "hand/cnn1d,hand/token-embedding"
    command = [sys.executable, str(BENCHMARKS / "model_matrix.py"), "--only", only]
    command += ["--out", str(out), "--docs", str(page), "--timing-batches", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["models"]
    assert sorted(rows) == sorted(only.split(","))
    assert rows["hand/cnn1d"]["verdict"] == "works" and rows["hand/cnn1d"]["speedup"]["1"] > 0
    text = page.read_text()
    head = "# Models\n\nabove\n\n<!-- model-matrix:start -->\n2 of "  # of every model it knows
    assert text.startswith(head) and " models: 2 works" in text
    assert text.endswith("<!-- model-matrix:end -->\n\nbelow\n") and "old" not in text
    assert "| hand/cnn1d | 3x64 | works |" in text
    # a second run resumes: nothing left to check
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.stdout.startswith("0 of 2 models to check")
