"""One task numbering everywhere: the run's plot (``accuracy.png``) numbers tasks from 0, as
``results.json``, ``espn show`` and the per-task lines do."""

from __future__ import annotations

import json

from matplotlib.figure import Figure
from typer.testing import CliRunner

from espn.cli.main import app
from helpers.deploy import cli_options


def test_accuracy_png_numbers_tasks_from_0(fake_mnist, fc_test_model, tmp_path, monkeypatch):
    drawn: list[tuple[list[float], list[str]]] = []
    save = Figure.savefig

    def record(fig, *args, **kwargs):  # the bars' centres and tick labels of each panel
        for ax in fig.axes:
            centres = [p.get_x() + p.get_width() / 2 for p in ax.patches]
            drawn.append((centres, [t.get_text() for t in ax.get_xticklabels()]))
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*cli_options(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    assert (out / "accuracy.png").stat().st_size > 0
    assert len(doc["final_accuracy"]) == 3
    # the plot is redrawn after every task: the last one has both panels (accuracy, FLOPs) for
    # tasks 0..2, and every earlier one numbers its tasks from 0 too
    assert drawn[-2:] == [([0.0, 1.0, 2.0], ["0", "1", "2"])] * 2
    assert all(labels == [str(i) for i in range(len(labels))] for _, labels in drawn)
