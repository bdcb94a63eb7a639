"""``--init-weights`` files that are not plain finite float state dicts are refused with one
line, before anything is trained: pickles (without torch's unsafe advice), text files,
NaN/Inf values, integer weights."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from typer.testing import CliRunner

import espn
from espn.cli.main import app
from espn.supernet.pretrained import (
    PretrainedError,
    adopt_pretrained,
    expected_shapes,
    load_weight_file,
)
from helpers.errors import one_line_error

runner = CliRunner()


@pytest.mark.parametrize("suffix", [".pt", ".bin", ".pth"])
def test_a_pickle_is_refused_without_advising_weights_only_false(tmp_path, suffix) -> None:
    path = tmp_path / f"w{suffix}"
    torch.save(nn.Linear(2, 2), path)  # a whole module: a pickle of Python objects
    with pytest.raises(PretrainedError) as err:
        load_weight_file(path)
    message = str(err.value)
    assert "\n" not in message and "weights_only=False" not in message
    assert "holds Python objects besides tensors" in message


def test_a_pickle_given_to_espn_run_is_one_line_error(tmp_path, fake_mnist, fc_test_model) -> None:
    path = tmp_path / "w.pt"
    torch.save(nn.Linear(2, 2), path)
    args = ["run", "--benchmark", "permuted-mnist", "--model", "fc-test", "--tasks", "2"]
    args += ["--epochs", "1,1,1", "--init-weights", str(path), "--out", str(tmp_path / "r")]
    line = one_line_error(runner.invoke(app, args))
    assert "holds Python objects besides tensors" in line and "weights_only=False" not in line


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_a_text_file_is_refused(tmp_path, suffix) -> None:
    path = tmp_path / f"w{suffix}"
    path.write_text(json.dumps({"fc.weight": [[1, 2], [3, 4]]}))
    with pytest.raises(PretrainedError, match="is not a weight file espn reads") as err:
        load_weight_file(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_refused(tmp_path, bad) -> None:
    path = tmp_path / "w.safetensors"
    w = torch.zeros(3, 4)
    w[1, 2] = bad
    save_file({"layer.weight": w}, str(path))
    with pytest.raises(PretrainedError, match=r"layer\.weight holds NaN or infinite values"):
        load_weight_file(path)


def test_integer_weights_are_refused_before_anything_changes() -> None:
    sn = espn.wrap(
        nn.Sequential(nn.Flatten(), nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)), torch.zeros(2, 4)
    )
    shapes = expected_shapes(sn, 3)
    tensors = {k: torch.ones(s) for k, s in shapes.items()}
    first = next(k for k in shapes if k.endswith(".weight"))
    tensors[first] = torch.ones(shapes[first], dtype=torch.int64)
    with pytest.raises(PretrainedError, match=f"pretrained {first} is int64"):
        adopt_pretrained(sn, tensors, 3)
    assert len(sn.masks) == 0


def test_a_replaced_from_run_source_is_named(cli_run, tmp_path) -> None:
    """A run made on top of ``--from-run SRC``: once SRC is replaced by another run,
    ``evaluate`` of the derived run names the replaced source (not "tasks differ")."""
    from helpers.deploy import cli_options

    derived = tmp_path / "derived"
    args = [*cli_options(derived), "--from-run", str(cli_run), "--after-task", "1"]
    assert runner.invoke(app, args).exit_code == 0
    assert runner.invoke(app, ["evaluate", "--run", str(derived)]).exit_code == 0
    again = [*cli_options(cli_run), "--seed", "1", "--overwrite"]
    assert runner.invoke(app, again).exit_code == 0
    line = one_line_error(runner.invoke(app, ["evaluate", "--run", str(derived)]))
    assert f"continues --from-run {cli_run}, which was replaced since" in line
