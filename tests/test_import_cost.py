"""Start-up cost: ``import espn``, ``import espn.cli.main`` and the CLI's help and listing load
none of the heavy optional libraries (they cost seconds each at every command); the code that
needs one imports it where it is used. Each check runs in a fresh interpreter, since this test
process has imported most of them already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import espn

#: top-level packages and torch submodules that must load only where they are used
HEAVY = (
    "timm",
    "wandb",
    "tensorboard",
    "ray",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "avalanche",
    "matplotlib",
    "PIL",
    "torchvision",
    "torch_pruning",
    "torch._dynamo",
    "torch._inductor",
    "torch.utils.tensorboard",
)

#: prints the heavy modules loaded so far as JSON (the last line of stdout)
REPORT = (
    "import json, sys\n"
    f"heavy = {HEAVY!r}\n"
    "loaded = sorted(h for h in heavy if any(m == h or m.startswith(h + '.') for m in sys.modules))\n"
    "print(json.dumps(loaded))\n"
)


def _loaded_after(code: str) -> list[str]:
    """Heavy modules in ``sys.modules`` after a fresh interpreter runs ``code`` (this checkout's
    espn first on the path)."""
    env = dict(os.environ)
    src = str(Path(espn.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", code + "\n" + REPORT],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_espn_and_its_cli_loads_no_heavy_library() -> None:
    assert _loaded_after("import espn, espn.cli.main") == []


def test_cli_help_and_list_load_no_heavy_library() -> None:
    code = (
        "import contextlib, io, sys\n"
        "from espn.cli.main import main\n"
        "codes = []\n"
        "for argv in (['--help'], ['run', '--help'], ['list']):\n"
        "    sys.argv = ['espn', *argv]\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try:\n"
        "            main()\n"
        "        except SystemExit as exc:\n"
        "            codes.append(exc.code)\n"
        "assert codes == [0, 0, 0], codes\n"
    )
    assert _loaded_after(code) == []


def test_an_mlp_slim_copy_loads_no_heavy_library() -> None:
    """The slim copy of an MLP (every accuracy row of an FC run evaluates through one) is cut
    by espn's own slicing, without Torch-Pruning and what it imports."""
    code = (
        "import torch\n"
        "from espn.export.slim import slim_copy\n"
        "from espn.models.fc import FCNet\n"
        "from espn.supernet import Supernet\n"
        "x = torch.randn(4, 1, 8, 8)\n"
        "sn = Supernet(FCNet(64, [16, 8], 3, multi_head=True), x[:2])\n"
        "sn.begin_task(3)\n"
        "sn.set_unit_masks({g: torch.arange(n) % 2 == 0 for g, n in sn.group_sizes.items()})\n"
        "sn.commit_task()\n"
        "slim = slim_copy(sn, 0, x[:2])\n"
        "widths = [m.out_features for m in slim.modules() if isinstance(m, torch.nn.Linear)]\n"
        "assert widths == [8, 4, 3], widths\n"
    )
    assert _loaded_after(code) == []


def test_version_help_and_argument_errors_import_no_torch() -> None:
    """``espn --version``, ``espn --help``, a mistyped command and a command missing its
    argument answer before torch (or any command's module but the one named) is imported."""
    code = (
        "import contextlib, io, sys\n"
        "from espn.cli.main import main\n"
        "codes = []\n"
        "for argv in (['--version'], ['--help'], ['nosuch'], ['show'], ['evaluate', '--batch-size', '0']):\n"
        "    sys.argv = ['espn', *argv]\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            main()\n"
        "        except SystemExit as exc:\n"
        "            codes.append(exc.code)\n"
        "assert codes == [0, 0, 2, 2, 2], codes\n"
        "loaded = [m for m in ('torch', 'espn.runs.config', 'espn.cli.presets', 'espn.cli.sweep', "
        "'espn.reproduce', 'espn.theory') if m in sys.modules]\n"
        "assert loaded == [], loaded\n"
    )
    _loaded_after(code)


def test_the_help_lists_each_command_as_the_command_describes_itself() -> None:
    """``espn --help`` reads its lines from ``COMMANDS`` without building the commands: each
    is the loaded command's own first sentence, so the two cannot drift apart."""
    from espn.cli.main import COMMANDS, load_command

    for name, (_, _, line) in COMMANDS.items():
        assert load_command(name).get_short_help_str(limit=1000) == line, name


def test_argument_errors_are_refused_before_torch_is_loaded(tmp_path: Path) -> None:
    """A bad value of a training setting or of a method's own option, an unknown flag, a
    missing option and a run directory without results are refused (status 2) by ``espn run``,
    ``espn sweep``, ``espn show``, ``espn info`` and ``espn export`` without loading torch."""
    out = str(tmp_path / "r")
    run = ["run", "--benchmark", "permuted-mnist", "--out", out]
    code = (
        "import contextlib, io, sys\n"
        "from espn.cli.main import main\n"
        "codes = []\n"
        f"for argv in ({[*run, '--epochs', 'x']!r}, {[*run, '--lr', '-1']!r}, "
        f"{[*run, '--optimizer', 'lion']!r}, ['run', '--epochs', 'x'], "
        f"['show', {str(tmp_path / 'none')!r}], ['run', '--bogus'], ['sweep', '--bogus'], "
        f"['info', {str(tmp_path / 'none')!r}], "
        f"['export', {str(tmp_path / 'none')!r}, '--task', '0', '--out', 'x.pt2'], "
        f"{[*run, '--method', 'espn', '--gamma', '7']!r}, "
        f"{[*run, '--method', 'espn', '--penalty', '-1']!r}, "
        f"{[*run, '--method', 'cpg', '--cpg-stop', 'never']!r}):\n"
        "    sys.argv = ['espn', *argv]\n"
        "    with contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            main()\n"
        "        except SystemExit as exc:\n"
        "            codes.append(exc.code)\n"
        "assert codes == [2] * 12, codes\n"
        "assert 'torch' not in sys.modules\n"
    )
    assert _loaded_after(code) == []
    assert not (tmp_path / "r").exists()


def test_the_labs_answer_and_refuse_before_torch_is_loaded(tmp_path: Path) -> None:
    """``espn reproduce`` and ``espn theory`` list their commands and targets, and refuse an
    unknown option, target, scale or file, a target's missing data and a bad setting of a
    theory experiment (status 2), without loading torch."""
    out, none = str(tmp_path / "r"), str(tmp_path / "none")
    code = (
        "import contextlib, io, sys\n"
        "from espn.cli.main import main\n"
        "codes = []\n"
        "for argv in (['reproduce', '--help'], ['reproduce', 'list'], ['theory', '--help'], "
        f"['reproduce', '--bogus'], ['reproduce', 'table1', '--bogus'], ['reproduce', 'nosuch'], "
        f"['reproduce', 'list', '--bogus'], ['reproduce', 'report', {none!r}], "
        f"['reproduce', 'table1', '--scale', 'huge', '--out', {out!r}], "
        f"['reproduce', 'table-imagenet', '--scale', 'smoke', '--out', {out!r}], "
        f"['theory', '--bogus'], ['theory', 'mismatch', '--bogus'], ['theory', 'report', {none!r}], "
        f"['theory', 'sample-complexity', '--activation', 'tanh', '--out', {out!r}], "
        f"['theory', 'task-order', '--orders', 'random', '--out', {out!r}]):\n"
        "    sys.argv = ['espn', *argv]\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            main()\n"
        "        except SystemExit as exc:\n"
        "            codes.append(exc.code)\n"
        "assert codes == [0] * 3 + [2] * 12, codes\n"
        "assert 'torch' not in sys.modules\n"
    )
    assert _loaded_after(code) == []
    assert not (tmp_path / "r").exists()
