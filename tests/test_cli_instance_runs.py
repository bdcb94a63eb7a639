"""``espn info`` and ``espn export`` on a run saved from a model instance (``learner.save`` of
an ``espn.wrap``'ed network only the user's code builds): ``info`` reads storage alone (no
model code imported), ``export`` says exactly what to do in Python, and doing it works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import espn
from espn.cli.main import app
from helpers.api_models import SmallMLP
from test_api import tiny_data

runner = CliRunner()


@pytest.fixture
def instance_run(tmp_path: Path) -> tuple[espn.ContinualLearner, Path]:
    """Two tasks learned into an instance of a custom nn.Module, saved by the learner."""
    torch.manual_seed(0)
    sn = espn.wrap(SmallMLP(hidden=16), torch.zeros(2, 1, 8, 8))
    assert sn.model_name == "<helpers.api_models.SmallMLP instance>"  # no reference to rebuild
    learner = espn.ContinualLearner(sn, gamma=0.5, alpha=0.3, epochs=(1, 1, 1), batch_size=16)
    learner.learn(tiny_data(1), test=tiny_data(2), name="first")
    learner.learn(tiny_data(3), test=tiny_data(4), name="second")
    return learner, learner.save(tmp_path / "run")


def rows(output: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("│").split("│")]
        for line in output.splitlines()
        if line.startswith("│")
    ]


def test_info_reads_a_model_instance_run_from_storage_alone(instance_run, tmp_path) -> None:
    """In a fresh process that cannot even import the model's module: every figure from the
    task records and the safetensors headers, equal to the learner's and the files' own."""
    learner, run = instance_run
    src = str(Path(espn.__file__).parents[1])  # espn only: helpers.api_models is not importable
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-m", "espn", "info", str(run)],
        capture_output=True,
        text=True,
        env=env | {"PYTHONPATH": src, "COLUMNS": "200"},
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "2/2 tasks finished" in out and "<helpers.api_models.SmallMLP instance>" in out
    manifest = json.loads((run / "checkpoint" / "manifest.json").read_text())
    report = learner.report()
    table = rows(out)
    assert len(table) == 2
    for t, cells in enumerate(table):
        stored = load_file(str(run / "checkpoint" / f"task-{t:04d}.safetensors"))

        def nbytes(*prefixes: str, stored: dict = stored) -> int:
            return sum(
                v.numel() * v.element_size() for k, v in stored.items() if k.startswith(prefixes)
            )

        masks, state, own = nbytes("weights.", "units."), nbytes("state."), nbytes("own.")
        assert cells[0] == str(t)
        assert cells[1] == f"{report[t]['flops_ratio']:.3f}"
        assert cells[2] == f"{report[t]['used_weights']:,}"
        assert cells[3] == f"{report[t]['new_weights']:,}"
        assert cells[4] == "+".join(sorted(set(manifest["tasks"][t]["masks"].values())))
        assert cells[5:] == [
            f"{masks:,}",
            f"{state:,}",
            f"{masks + state + own:,}",
            f"{(run / 'checkpoint' / f'task-{t:04d}.safetensors').stat().st_size:,}",
        ]
    on_disk = sum(p.stat().st_size for p in (run / "checkpoint").iterdir())
    assert f"checkpoint {on_disk / 2**10:.1f} KiB on disk" in " ".join(out.split())


def test_export_of_a_model_instance_run_says_what_to_pass_and_that_works(
    instance_run, tmp_path
) -> None:
    learner, run = instance_run
    target = tmp_path / "task1.pt2"
    result = runner.invoke(app, ["export", str(run), "--task", "1", "--out", str(target)])
    assert result.exit_code == 2
    line = " ".join(result.output.split())
    assert "an instance of helpers.api_models.SmallMLP" in line
    assert f"learner = espn.load({str(run)!r}, model=SmallMLP(...)); " in line
    assert f"learner.export(1, {str(target)!r})" in line
    assert not target.exists()
    # as the message says: the same network built again, passed to espn.load
    again = espn.load(run, model=SmallMLP(hidden=16))
    assert again.names == ["first", "second"]
    report = again.export(1, target, onnx=False)
    assert target.is_file() and report.flops == learner.report()[1]["flops"]
    x = tiny_data(4)[0][:8]
    program = torch.export.load(str(target)).module()
    assert torch.allclose(program(x), learner.supernet(x, task=1), atol=1e-5)
