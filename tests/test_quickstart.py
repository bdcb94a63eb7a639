"""The README's first hour: ``quickstart.sh`` installs only what its job needs and keeps a
torch already installed; the README's CLI example is sized like the quickstart's job."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

import espn.api.experiment
from espn.cli.main import app
from espn.reproduce.common import planned_steps

ROOT = Path(__file__).resolve().parents[1]
FAKE_PYTHON = """#!/usr/bin/env bash
# records every call; "import torch" succeeds only when FAKE_TORCH is set
echo "python3 $*" >> "$LOG"
if [ "$1" = "-c" ]; then
  case "$2" in
    *print*) echo "torch==2.14.1" ;;
    *) [ -n "${FAKE_TORCH:-}" ] || exit 1 ;;
  esac
fi
for ((i = 1; i <= $#; i++)); do  # the constraints file, read while it exists
  if [ "${!i}" = "-c" ] && [ "$1" = "-m" ]; then j=$((i + 1)); echo "constraints: $(cat "${!j}")" >> "$LOG"; fi
done
"""


def quickstart(tmp_path: Path, torch_installed: bool) -> list[str]:
    """Run quickstart.sh with python3 and espn replaced by recorders; the calls made."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "espn").write_text('#!/usr/bin/env bash\necho "espn $*" >> "$LOG"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    log = tmp_path / "calls.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log)}
    if torch_installed:
        env["FAKE_TORCH"] = "1"
    subprocess.run(["bash", str(ROOT / "quickstart.sh")], env=env, check=True, timeout=60)
    return log.read_text().splitlines()


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(), reason="would run apt-get"
)
@pytest.mark.parametrize("torch_installed", [True, False])
def test_quickstart_installs_no_extras_and_keeps_an_installed_torch(tmp_path, torch_installed):
    calls = quickstart(tmp_path, torch_installed)
    installs = [c for c in calls if c.startswith("python3 -m pip install")]
    assert all("[" not in c for c in installs), installs  # no extras: no dev, onnx, ray
    assert installs[-1].endswith("-e .")
    if torch_installed:
        assert len(installs) == 1 and "torch==" not in installs[0].split("-c")[0]
        assert "constraints: torch==2.14.1" in calls  # pip may not replace it
    else:
        assert installs[0] == "python3 -m pip install -q torch==2.14.1 torchvision==0.29.1"
    assert calls[-1].startswith("espn run --benchmark rotated-fashion-mnist")


def commands(text: str) -> list[list[str]]:
    """The ``espn run`` command lines of a text (backslash continuations joined)."""
    joined = text.replace("\\\n", " ")
    return [shlex.split(m.split("#")[0])[2:] for m in re.findall(r"^\s*espn run .*$", joined, re.M)]


def steps_per_task(args: list[str], tmp_path: Path, monkeypatch) -> int:
    """Optimizer steps of one task of the run ``espn run ARGS`` would make (size rule
    included), from the configuration the real command line builds."""
    seen = []

    def capture(cfg, *a, **k):
        seen.append(cfg)
        raise KeyboardInterrupt

    monkeypatch.setattr(espn.api.experiment, "run_experiment", capture)
    args = [a if "$" not in a else "" for a in args if a != '"$@"']
    args = [*(a for a in args if a), "--out", str(tmp_path / "o")]
    CliRunner().invoke(app, ["run", *args])
    options = {k: v for k, v in seen[-1].model_dump().items() if v is not None}
    return sum(n for _, n in planned_steps(options, int(options["train_per_task"])))


def test_the_readme_cli_example_is_sized_like_the_quickstart(tmp_path, monkeypatch):
    (example,) = commands((ROOT / "README.md").read_text())
    (job,) = commands((ROOT / "quickstart.sh").read_text())
    ours = steps_per_task(example, tmp_path, monkeypatch)
    theirs = steps_per_task(job, tmp_path, monkeypatch)
    assert ours <= theirs, (ours, theirs)
