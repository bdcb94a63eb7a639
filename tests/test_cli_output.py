"""What the CLI prints when its output is not a terminal (a pipe, a log file): every table row
on one line, whatever its width (issue 48, item 20)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from espn.cli.main import app

runner = CliRunner()


def test_a_table_piped_to_a_file_is_not_wrapped_at_80_columns(run_copy):
    path = run_copy / "results.json"
    doc = json.loads(path.read_text())
    doc["task_names"] = [f"permutation {t} of a benchmark with a long name" for t in range(3)]
    path.write_text(json.dumps(doc))
    result = runner.invoke(app, ["show", str(run_copy)])  # output captured: not a terminal
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if "of a benchmark with" in line]
    assert len(rows) == 3 and max(map(len, rows)) > 80
    for t, row in enumerate(rows):
        cells = [c.strip() for c in row.split("│") if c.strip()]
        assert cells[:2] == [str(t), doc["task_names"][t]]
        assert cells[2] == f"{doc['final_accuracy'][t]:.2f}"
