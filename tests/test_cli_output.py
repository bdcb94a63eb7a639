"""What the CLI prints when its output is not a terminal (a pipe, a log file): every table row
on one line, whatever its width (issue 48, item 20)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_a_table_piped_to_a_file_is_not_wrapped_at_80_columns(run_copy):
    path = run_copy / "results.json"
    doc = json.loads(path.read_text())
    doc["task_names"] = [f"permutation {t} of a benchmark with a long name" for t in range(3)]
    path.write_text(json.dumps(doc))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": SRC}
    result = subprocess.run(  # a real pipe, as a log file or another program reads it
        [sys.executable, "-m", "espn", "show", str(run_copy)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if "of a benchmark with" in line]
    assert len(rows) == 3 and max(map(len, rows)) > 80
    for t, row in enumerate(rows):
        cells = [c.strip() for c in row.split("│") if c.strip()]
        assert cells[:2] == [str(t), doc["task_names"][t]]
        assert cells[2] == f"{doc['final_accuracy'][t]:.2f}"
