"""Following a task's training: a line at its start (steps per phase, passes over its data),
its estimated time, plain lines where the output is not a terminal, a line at its end."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import espn
import espn.training.progress as progress_module
from espn.cli.main import app
from espn.training.progress import ProgressBar
from helpers.api_models import SmallMLP
from helpers.deploy import cli_options
from test_api import tiny_data


class Terminal(io.StringIO):
    """A captured stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def learn_one(**options) -> dict:
    """One task of 96 samples at batch 16 (6 steps a pass), its record."""
    torch.manual_seed(0)
    sn = espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8))
    learner = espn.ContinualLearner(sn, epochs=(1, 2, 1), batch_size=16, **options)
    return learner.learn(tiny_data(1))


def test_the_progress_says_what_it_does_in_plain_lines(capsys, monkeypatch):
    """Not a terminal (captured): no bar, but the task's plan, its estimated time after its
    first steps, a line every ``every`` seconds (here every step) and its end."""
    monkeypatch.setattr(progress_module, "ESTIMATE_STEPS", 1)
    record = learn_one(callbacks=[ProgressBar(every=0.0)])
    lines = capsys.readouterr().err.splitlines()
    phases = record["phases"]
    total = sum(p["steps"] for p in phases)
    plan = ", ".join(f"{p['phase']} {p['steps']}" for p in phases)
    passes = sum(p["epochs"] for p in phases)
    assert lines[0] == (
        f"task 0: {total} optimizer steps ({plan}), {passes} passes over its 96 training samples"
    )
    assert re.fullmatch(r"task 0: 1 step took [\d.]+ s; about [\d.]+ (s|min) to go", lines[1])
    # a line at every step after the estimate but the last, with its phase and pass
    periodic = [re.match(r"task 0: step (\d+)/(\d+) \((\d+)%\), (\w+) pass", ln) for ln in lines]
    steps = [int(m[1]) for m in periodic if m]
    assert steps == list(range(2, total))
    assert all(int(m[2]) == total and int(m[3]) == 100 * int(m[1]) // total for m in periodic if m)
    assert {m[4] for m in periodic if m} == {p["phase"] for p in phases}
    assert re.fullmatch(rf"task 0: training ended, {total} steps in [\d.]+ s", lines[-1])
    assert len(lines) == 3 + len(steps) and "\r" not in "".join(lines)


def test_the_size_rule_is_named_where_it_adds_passes(capsys):
    record = learn_one(progress=True, reference_size=960)  # 10 times the task's samples
    first = capsys.readouterr().err.splitlines()[0]
    passes = sum(p["epochs"] for p in record["phases"])
    assert passes == 40
    assert first.endswith(
        "40 passes over its 96 training samples (the size rule: the recipe's 4 epochs are "
        "stated for more data)"
    )


def test_a_terminal_gets_the_bar_and_the_lines():
    out = Terminal()
    record = learn_one(callbacks=[ProgressBar(file=out)])
    total = sum(p["steps"] for p in record["phases"])
    drawn = out.getvalue()
    assert f"{total}/{total}" in drawn and "task 0 finetune pass 1/1" in drawn  # the bar
    assert f"task 0: {total} optimizer steps (" in drawn
    assert f"task 0: training ended, {total} steps in" in drawn


def test_disabled_shows_nothing():
    out = Terminal()
    learn_one(callbacks=[ProgressBar(disable=True, file=out)])
    assert out.getvalue() == ""


def test_espn_run_writes_the_lines_to_its_error_stream_unless_quiet(
    fake_mnist, fc_test_model, tmp_path: Path
):
    """``espn run`` into a log (not a terminal): plain lines per task on standard error,
    none with --quiet (only the final summary) or --no-progress."""
    options = [o for o in cli_options(tmp_path / "run") if o not in ("--no-progress", "--quiet")]
    options[options.index("--tasks") + 1] = "1"
    shown = CliRunner().invoke(app, options)
    assert shown.exit_code == 0, shown.output
    assert re.search(r"^task 0 \(permutation 0\): 16 optimizer steps \(", shown.stderr, re.M)
    assert re.search(r"^task 0: training ended, 16 steps in", shown.stderr, re.M)
    options[options.index("--out") + 1] = str(tmp_path / "quiet")
    quiet = CliRunner().invoke(app, [*options, "--quiet"])
    assert quiet.exit_code == 0, quiet.output
    assert "optimizer steps" not in quiet.output and "training ended" not in quiet.output


def test_a_task_name_from_data_cannot_act_on_the_terminal():
    out = io.StringIO()
    torch.manual_seed(0)
    sn = espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8))
    learner = espn.ContinualLearner(sn, epochs=(1, 0, 0), callbacks=[ProgressBar(file=out)])
    learner.learn(tiny_data(1), name="evil\x1b]0;owned\x07")
    assert "\x1b" not in out.getvalue() and "(evil\\x1b]0;owned\\x07)" in out.getvalue()


@pytest.mark.parametrize(
    "seconds,shown", [(3.04, "3.0 s"), (42.4, "42 s"), (366, "6.1 min"), (8280, "2.3 h")]
)
def test_durations_read_as_a_person_says_them(seconds: float, shown: str):
    assert progress_module.duration(seconds) == shown
