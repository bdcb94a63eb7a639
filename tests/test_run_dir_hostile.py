"""A run directory is data: hostile ones (issue 37, items 1-4) make espn run no code they
name, reach no network, write nothing outside, print no terminal escapes and allocate
nothing beyond the stated limits. Each test builds one hostile directory from a real run
and checks the one-line refusal and that the payload left no trace."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
import torch.hub
import torchvision.models  # noqa: F401  (imported, as in any process that used torchvision)
from typer.testing import CliRunner

import espn
import espn.data.mnist as mnist_module
import espn.export.export  # imported, as in any process that exported
from espn.cli.main import app
from espn.data.sources import DatasetUnavailable, load_mnist_like
from espn.errors import EspnError
from espn.sweep.spec import SweepError, expand_spec
from espn.utils.commands import console
from espn.utils.limits import MAX_MODEL_VALUES
from espn.utils.text import printable
from helpers.errors import one_line_error
from helpers.mnist import synthetic_mnist

runner = CliRunner()


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, list]:
    """Every way out to the network recorded (and failing), ``$TORCH_HOME`` a fresh path."""
    calls: dict[str, list] = {"urlopen": [], "download": []}

    def urlopen(*args, **kwargs):
        calls["urlopen"].append(args)
        raise OSError("network access in a test")

    def download(url, *args, **kwargs):
        calls["download"].append(url)
        raise OSError("network access in a test")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(torch.hub, "download_url_to_file", download)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    return calls


def edit(run: Path, **config: object) -> None:
    """Change the recorded configuration (and the model, if given) consistently in the
    manifest and results.json, as an attacker crafting a run directory would."""
    for path in (run / "checkpoint" / "manifest.json", run / "results.json"):
        doc = json.loads(path.read_text())
        doc["config"].update(config)
        if "model" in config and "model" in doc:
            doc["model"] = config["model"]
        path.write_text(json.dumps(doc))


def edit_manifest(run: Path, key: str, value: object) -> None:
    path = run / "checkpoint" / "manifest.json"
    doc = json.loads(path.read_text())
    doc[key] = value
    path.write_text(json.dumps(doc))


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")} if root.exists() else set()


READERS = ["evaluate", "info", "export", "load"]


def read(run: Path, how: str) -> str:
    """Open ``run`` the way ``how`` says and return its one-line refusal."""
    if how == "load":
        with pytest.raises(EspnError) as caught:
            espn.load(run)
        message = str(caught.value)
        assert "\n" not in message
        return message
    args = [how, "--run", str(run)]
    if how == "export":
        args += ["--task", "0", "--out", str(run.parent / "t0.pt2"), "--no-onnx"]
    return one_line_error(runner.invoke(app, args))


# ------------------------------------------------------------------ 1: code execution
@pytest.mark.parametrize("how", READERS)
def test_an_espn_function_that_unpickles_is_not_a_model_builder(
    run_copy, tmp_path, monkeypatch, how
):
    """``espn.export.export:load_exported`` is imported and annotated ``-> nn.Module``, but
    ``torch.export.load`` unpickles the file it names: it is never called."""
    ran = tmp_path / "payload-ran"

    def payload(*args, **kwargs):  # what unpickling a crafted .pt2 could do
        ran.write_text("ran")
        raise RuntimeError("payload")

    monkeypatch.setattr(torch.export, "load", payload)
    evil = tmp_path / "evil.pt2"
    evil.write_bytes(b"PK\x03\x04 crafted")
    edit(run_copy, model=f"espn.export.export:load_exported(path={str(evil)!r})")
    if how == "info":  # reads storage alone: builds no model, so it names none and calls none
        result = runner.invoke(app, ["info", str(run_copy)])
        assert result.exit_code == 0, result.output
        assert not ran.exists()
        return
    line = read(run_copy, how)
    assert "'espn.export.export:load_exported'" in line
    assert "neither one of espn's model builders" in line and "trust" in line
    assert not ran.exists()


# ------------------------------------------------------------------ 2: network, writes
@pytest.mark.parametrize(
    "model",
    [
        "torchvision.models:resnet18(weights='IMAGENET1K_V1')",
        "torchvision.models:resnet18(num_classes=10, pretrained=True)",
        "torchvision.models:get_model(name='resnet18', weights='IMAGENET1K_V1')",
    ],
)
@pytest.mark.parametrize("how", ["evaluate", "load"])
def test_a_model_asking_for_pretrained_weights_downloads_nothing(
    run_copy, tmp_path, offline, model, how
):
    edit(run_copy, model=model)
    line = read(run_copy, how)
    assert "pretrained weights" in line or "neither one of espn's model builders" in line
    assert offline == {"urlopen": [], "download": []}
    assert not (tmp_path / "torch-home").exists()


def test_a_recorded_data_dir_is_only_read(run_copy, tmp_path, offline, monkeypatch) -> None:
    monkeypatch.setattr(mnist_module, "load_mnist_like", load_mnist_like)  # the real loader
    elsewhere = tmp_path / "somewhere" / "else"
    edit(run_copy, data_dir=str(elsewhere))
    before = files_under(tmp_path)
    line = one_line_error(runner.invoke(app, ["evaluate", "--run", str(run_copy)]))
    assert offline["urlopen"] == [] and not (tmp_path / "somewhere").exists()
    assert files_under(tmp_path) == before
    assert f"mnist is not in {elsewhere}" in line and "downloads nothing" in line
    assert "--data-dir" in line


def test_evaluate_reads_the_data_from_data_dir(run_copy, tmp_path, offline, monkeypatch) -> None:
    """``--data-dir`` overrides the recorded one (the only place data is looked for)."""
    seen = []
    data = synthetic_mnist()

    def loader(name, root, download):
        seen.append((root, download))
        return data

    monkeypatch.setattr(mnist_module, "load_mnist_like", loader)
    edit(run_copy, data_dir=str(tmp_path / "gone"))
    given = tmp_path / "mine"
    result = runner.invoke(app, ["evaluate", "--run", str(run_copy), "--data-dir", str(given)])
    assert result.exit_code == 0, result.output
    assert seen and all(s == (given.resolve(), False) for s in seen)


def test_the_loader_without_download_creates_nothing(tmp_path, offline) -> None:
    with pytest.raises(DatasetUnavailable) as caught:
        load_mnist_like("mnist", tmp_path / "data", download=False)
    assert "\n" not in str(caught.value) and "downloads nothing" in str(caught.value)
    assert not (tmp_path / "data").exists() and offline["urlopen"] == []


def test_an_espn_builder_is_rebuilt_without_opt_in(run_copy) -> None:
    """The fixed list: espn's model classes (and torchvision's) with literal arguments."""
    doc = json.loads((run_copy / "checkpoint" / "manifest.json").read_text())
    spec = doc["spec"]
    edit(
        run_copy,
        model="espn.models.fc:FCNet(in_features=784, hidden=[64, 48], "
        f"n_classes={spec['n_classes']}, multi_head={spec['multi_head']})",
    )
    result = runner.invoke(app, ["evaluate", "--run", str(run_copy)])
    assert result.exit_code == 0, result.output
    assert "all 3 tasks match results.json" in result.output


# ------------------------------------------------------------------ 3: terminal escapes
ESCAPES = "\x1b]0;pwned\x07\x1b[2J"


def test_show_prints_no_terminal_escapes(run_copy, monkeypatch) -> None:
    monkeypatch.setattr(console, "width", 200)  # every cell on one line
    path = run_copy / "results.json"
    doc = json.loads(path.read_text())
    doc["task_names"][1] = f"task{ESCAPES}one"
    path.write_text(json.dumps(doc))
    result = runner.invoke(app, ["show", str(run_copy)])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "task\\x1b]0;pwned\\x07\\x1b[2Jone" in result.output


def test_an_error_quoting_a_path_prints_no_terminal_escapes(tmp_path) -> None:
    where = tmp_path / f"run{ESCAPES}"
    where.mkdir()
    result = runner.invoke(app, ["show", str(where)])
    assert result.exit_code == 2 and "\x1b" not in result.output
    assert printable(str(where)) in " ".join(result.output.split())


def test_printable_escapes_controls_and_bidi_overrides() -> None:
    assert printable("a\x1b[2Jb\u202ec\td\x9b") == "a\\x1b[2Jb\\u202ec\\x09d\\x9b"
    assert printable("ünïcode ok") == "ünïcode ok"
    assert printable("a\nb\x1b", lines=True) == "a\nb\\x1b"


# ------------------------------------------------------------------ 4: sizes
def test_deeply_nested_results_json_is_refused(run_copy) -> None:
    (run_copy / "results.json").write_text("[" * 200_000 + "]" * 200_000)
    line = one_line_error(runner.invoke(app, ["show", str(run_copy)]))
    assert "nests JSON deeper than the 64 levels" in line


def test_deeply_nested_manifest_is_refused(run_copy) -> None:
    (run_copy / "checkpoint" / "manifest.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    line = one_line_error(runner.invoke(app, ["evaluate", "--run", str(run_copy)]))
    assert "nests JSON deeper than the 64 levels" in line


def test_a_huge_json_file_is_refused_before_it_is_read(run_copy, monkeypatch) -> None:
    monkeypatch.setattr("espn.utils.io.MAX_JSON_BYTES", 1000)
    line = one_line_error(runner.invoke(app, ["show", str(run_copy)]))
    assert "larger than the 1000 espn reads" in line


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("input_shape", [1, 2**20, 2**20], "more than the 16777216 espn allocates for one sample"),
        ("n_classes", 10**12, "less than or equal to 100000"),
    ],
)
def test_a_recorded_size_beyond_the_limit_is_refused(run_copy, key, value, words) -> None:
    path = run_copy / "checkpoint" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["spec"][key] = value
    path.write_text(json.dumps(doc))
    line = one_line_error(runner.invoke(app, ["evaluate", "--run", str(run_copy)]))
    assert words in line


def test_recorded_layer_shapes_beyond_the_limit_are_refused(run_copy) -> None:
    path = run_copy / "checkpoint" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["architecture"]["layers"]["features.0"] = [2**20, 2**20]
    path.write_text(json.dumps(doc))
    line = one_line_error(runner.invoke(app, ["info", "--run", str(run_copy)]))
    assert f"more than the {MAX_MODEL_VALUES} espn allocates" in line


def test_a_builder_given_huge_widths_is_sized_before_it_is_built(run_copy) -> None:
    edit(
        run_copy,
        model="espn.models.fc:FCNet(in_features=784, hidden=[1000000000000], n_classes=10, "
        "multi_head=False)",
    )
    line = one_line_error(runner.invoke(app, ["evaluate", "--run", str(run_copy)]))
    assert f"more than the {MAX_MODEL_VALUES} espn builds for a run directory" in line


def test_a_sweep_name_template_with_a_huge_width_is_refused() -> None:
    spec = {
        "base": {"benchmark": "permuted-mnist", "tasks": 2},
        "grid": {"seed": [0, 1]},
        "name": "s{seed:>1000000}",
    }
    with pytest.raises(SweepError, match="widths and precisions up to 64 are accepted"):
        expand_spec(spec)
    assert sys.getsizeof(spec["name"]) < 1000
