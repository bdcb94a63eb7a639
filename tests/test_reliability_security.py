"""Opening a run directory never imports a module it names: a checkpoint's model reference
is imported only when the module is already imported, was named by the user in this
process, or the user opts in (``--trust-model-code``, ``espn.load(..., trust_model_code=True)``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import espn
import espn.models.reference as reference
from espn.cli.main import app
from espn.errors import EspnError
from espn.models.registry import MODELS
from helpers.errors import one_line_error

runner = CliRunner()

#: a model module that leaves a marker file beside itself when it is imported
MODULE = """
from pathlib import Path
from torch import nn

Path(__file__).with_suffix(".imported").write_text("imported")


class Net(nn.Module):
    def __init__(self, n_in: int = 16, n_classes: int = 3) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(n_in, 12), nn.ReLU())
        self.head = nn.Linear(12, n_classes)

    def forward(self, x):
        return self.head(self.body(x))
"""


def data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(48, 1, 4, 4, generator=gen), torch.randint(0, 3, (48,), generator=gen)


@pytest.fixture
def foreign_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, Path]:
    """A run saved by the API from module ``netmod_sec`` (then forgotten by this process, as
    if the run directory had been downloaded): the run, the module name, its marker."""
    name = "netmod_sec"
    code = tmp_path / "code"
    code.mkdir()
    (code / f"{name}.py").write_text(MODULE)
    marker = code / f"{name}.imported"
    monkeypatch.syspath_prepend(str(code))
    module = __import__(name)
    sn = espn.wrap(module.Net, torch.zeros(2, 1, 4, 4), n_in=16)
    learner = espn.ContinualLearner(sn, epochs=(1, 1, 1), lr=1e-2, batch_size=16)
    learner.learn(data(0), test=data(1))
    run = learner.save(tmp_path / "run")
    yield run, name, marker
    forget(name, marker)


def forget(name: str, marker: Path) -> None:
    """As in a new process: the module unimported, its factories neither named nor built."""
    sys.modules.pop(name, None)
    reference._TRUSTED.difference_update(
        {k for k in reference._TRUSTED if k.startswith(f"{name}:")}
    )
    for registered in [n for n in MODELS.names() if n.startswith(f"{name}:")]:
        MODELS._items.pop(registered, None)
    marker.unlink(missing_ok=True)


@pytest.mark.parametrize("command", ["evaluate", "info", "export"])
def test_a_run_directory_does_not_make_the_cli_import_its_module(foreign_run, command) -> None:
    run, name, marker = foreign_run
    forget(name, marker)
    args = [command, "--run", str(run)]
    if command == "export":
        args += ["--task", "0", "--out", str(run.parent / "t.pt2"), "--no-onnx"]
    if command == "info":  # reads storage alone: nothing to import, nothing to trust
        assert runner.invoke(app, args).exit_code == 0
    else:
        line = one_line_error(runner.invoke(app, args))
        assert f"names the model '{name}:Net(n_in=16)'" in line and "--trust-model-code" in line
    assert not marker.exists() and name not in sys.modules


def test_the_cli_opt_in_imports_it(foreign_run) -> None:
    run, name, marker = foreign_run
    forget(name, marker)
    result = runner.invoke(app, ["evaluate", "--run", str(run), "--trust-model-code"])
    assert result.exit_code == 0, result.output
    assert "all 1 tasks match results.json" in result.output and marker.exists()


def test_espn_load_refuses_then_opts_in(foreign_run) -> None:
    run, name, marker = foreign_run
    forget(name, marker)
    with pytest.raises(EspnError, match="trust_model_code=True"):
        espn.load(run)
    assert not marker.exists() and name not in sys.modules
    learner = espn.load(run, trust_model_code=True)
    assert marker.exists()
    doc = json.loads((run / "results.json").read_text())
    assert learner.evaluate(0) == doc["final_accuracy"][0]


def test_an_imported_module_is_not_enough_its_factory_given_to_espn_is(foreign_run) -> None:
    """Being imported does not make a module's functions safe to call with a run's
    arguments (espn's own modules are imported); a factory the user gave espn is theirs."""
    run, name, marker = foreign_run
    forget(name, marker)
    module = __import__(name)
    with pytest.raises(EspnError, match="neither one of espn's model builders"):
        espn.load(run)
    espn.wrap(module.Net, torch.zeros(2, 1, 4, 4), n_in=16)  # the script builds it itself
    assert espn.load(run).names == ["task 0"]


def _rename_model(out: Path, model: str) -> None:
    for path in (out / "checkpoint" / "manifest.json", out / "results.json"):
        doc = json.loads(path.read_text())
        if "model" in doc:
            doc["model"] = model
        doc["config"]["model"] = model
        path.write_text(json.dumps(doc))


@pytest.mark.parametrize("command", ["evaluate", "info", "from-run"])
def test_an_installed_module_a_checkpoint_names_is_not_imported(cli_run, command) -> None:
    """``"model": "this:s"``: importing it would print the Zen of Python."""
    sys.modules.pop("this", None)
    _rename_model(cli_run, "this:s")
    if command == "from-run":
        from helpers.deploy import cli_options

        out = cli_run.parent / "derived"
        args = [*cli_options(out), "--from-run", str(cli_run), "--after-task", "1"]
    else:
        args = [command, "--run", str(cli_run)]
    if command == "info":  # reads storage alone: nothing to import, nothing to trust
        assert runner.invoke(app, args).exit_code == 0
    else:
        line = one_line_error(runner.invoke(app, args))
        assert "'this:s'" in line and "--trust-model-code" in line
    assert "this" not in sys.modules
