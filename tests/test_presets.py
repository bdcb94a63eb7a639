"""Presets: shipped recipes, precedence (explicit options > preset > benchmark defaults) in the
Python API and on the command line, ``espn presets``, and malformed presets rejected clearly."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

import espn.api.experiment
from espn.cli.main import app
from espn.runs.config import ConfigError, RunConfig, make_config
from espn.settings.presets import describe, load_preset, preset_names
from helpers.errors import one_line_error

runner = CliRunner()


def test_shipped_presets_are_valid_configs(tmp_path):
    assert {"paper", "quick", "imagenet"} <= set(preset_names())
    for name in preset_names():
        assert describe(name)
        needs_folders = load_preset(name)["benchmark"] == "image-folders"
        cfg = make_config(preset=name, folders=(tmp_path,) if needs_folders else None)
        assert cfg.preset == name
        for key, value in load_preset(name).items():
            got = getattr(cfg, key)
            assert (list(got) if isinstance(got, tuple) else got) == value, (name, key)


def test_paper_preset_is_the_papers_splitcifar100_recipe():
    cfg = make_config(preset="paper")
    assert cfg.benchmark == "split-cifar100" and cfg.model == "resnet18-reduced"
    assert (cfg.optimizer, cfg.betas, cfg.lr, cfg.batch_size) == ("adam", (0.0, 0.999), 0.01, 128)
    assert cfg.epochs == (60, 90, 100) and cfg.alpha == 0.1 and cfg.tasks == 20
    quick = make_config(preset="quick")
    assert sum(quick.epochs) < 10 and quick.train_per_task is not None


def test_explicit_options_win_over_the_preset_which_wins_over_benchmark_defaults(tmp_path):
    preset = tmp_path / "mine.json"
    preset.write_text(json.dumps({"description": "d", "config": {"epochs": [1, 2, 3], "seed": 7}}))
    cfg = make_config(benchmark="permuted-mnist", preset=str(preset), seed=1)
    assert cfg.seed == 1  # explicit
    assert cfg.epochs == (1, 2, 3)  # preset over the benchmark's (3, 4, 3)
    assert (cfg.optimizer, cfg.lr, cfg.model) == ("rmsprop", 1e-3, "fc1024")  # benchmark's
    cfg = make_config(preset="quick", benchmark="split-cifar10", epochs=(0, 1, 0), lr=0.5)
    assert (cfg.benchmark, cfg.epochs, cfg.lr) == ("split-cifar10", (0, 1, 0), 0.5)
    assert cfg.train_per_task == 500  # from the preset
    # a run's saved config rebuilds the same config (load_run and resume rely on it)
    again = RunConfig(**cfg.model_dump(mode="json"))
    assert again == cfg


class Captured(Exception):
    """Raised by the fake experiment once it has recorded its config."""


@pytest.fixture
def captured(monkeypatch):
    """Replace the experiment by one that records the config the CLI built, then stops."""
    seen = []

    def fake_run(cfg, *args, **kwargs):
        seen.append(cfg)
        raise Captured

    monkeypatch.setattr(espn.api.experiment, "run_experiment", fake_run)
    return seen


def invoke(args: list[str]) -> None:
    result = runner.invoke(app, args, env={"ESPN_DEBUG": "1"})  # let Captured through
    assert isinstance(result.exception, Captured), result.output


def test_cli_options_given_explicitly_win_even_at_their_default_value(captured, tmp_path):
    preset = tmp_path / "p.json"
    preset.write_text(json.dumps({"config": {"penalty": 1e-3, "seed": 5, "pruner": "l1"}}))
    base = ["run", "--benchmark", "permuted-mnist", "--out", str(tmp_path), "--preset", str(preset)]
    invoke(base)
    own = captured[-1].method_options  # ESPN's own options since they moved off RunConfig
    assert (own["penalty"], captured[-1].seed, own["pruner"]) == (1e-3, 5, "l1")
    # the same values as the command's defaults, but typed: they win over the preset
    invoke([*base, "--penalty", "1e-4", "--seed", "0", "--pruner", "flop-aware"])
    own = captured[-1].method_options
    assert (own["penalty"], captured[-1].seed, own["pruner"]) == (1e-4, 0, "flop-aware")


def test_cli_preset_supplies_the_benchmark(captured, tmp_path):
    invoke(["run", "--preset", "paper", "--out", str(tmp_path), "--amp"])
    cfg = captured[-1]
    assert cfg.benchmark == "split-cifar100" and cfg.epochs == (60, 90, 100) and cfg.amp
    result = runner.invoke(app, ["run", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "no benchmark: give --benchmark NAME" in " ".join(result.output.split())


def test_espn_presets_lists_and_shows():
    result = runner.invoke(app, ["presets"])
    assert result.exit_code == 0
    assert "paper" in result.output and "quick" in result.output
    assert "SplitCIFAR100" in result.output
    result = runner.invoke(app, ["presets", "show", "paper"])
    assert result.exit_code == 0
    assert json.loads(result.output) == load_preset("paper")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON"),
        (json.dumps([1, 1, 1]), "must be a mapping of options (as `espn presets show` prints"),
        (json.dumps({"config": [1]}), "must be a mapping of options"),
        (json.dumps({"config": {}, "seed": 1}), "has 'seed' beside \"config\""),
        (json.dumps({"config": {"out": "x"}}), "may not set out"),
        (json.dumps({"config": {"learning_rate": 1}}), "sets unknown option(s) learning_rate"),
        (json.dumps({"config": {"gamma": 3}}), "gamma must be in (0, 1], got 3"),
    ],
)
def test_bad_presets_are_rejected_clearly(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        make_config(benchmark="permuted-mnist", preset=str(path))
    assert message in str(err.value)
    result = runner.invoke(
        app, ["run", "--benchmark", "permuted-mnist", "--preset", str(path), "--out", str(tmp_path)]
    )
    assert result.exit_code == 2 and message in " ".join(result.output.split())


def test_unknown_preset_names_the_choices(tmp_path):
    result = runner.invoke(app, ["run", "--preset", "fast", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown preset 'fast'; choose one of: imagenet, paper, quick" in " ".join(
        result.output.split()
    )
    result = runner.invoke(app, ["presets", "show", "fast"])
    assert result.exit_code == 2 and "unknown preset 'fast'" in result.output


def test_a_shown_preset_round_trips_through_a_file(captured, tmp_path):
    """``espn presets show quick > q.json; espn run --preset q.json`` runs what ``--preset
    quick`` runs; so does the same options written as YAML."""
    shown = runner.invoke(app, ["presets", "show", "quick"])
    assert shown.exit_code == 0, shown.output
    (tmp_path / "q.json").write_text(shown.output)
    yaml = pytest.importorskip("yaml")
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(json.loads(shown.output)))
    configs = {}
    for preset in ("quick", str(tmp_path / "q.json"), str(tmp_path / "q.yaml")):
        invoke(["run", "--preset", preset, "--out", str(tmp_path / "o")])
        configs[preset] = captured[-1].model_dump(exclude={"preset"})
    assert configs[str(tmp_path / "q.json")] == configs["quick"]
    assert configs[str(tmp_path / "q.yaml")] == configs["quick"]
    assert configs["quick"]["train_per_task"] == load_preset("quick")["train_per_task"]


def test_a_yaml_preset_file_is_read_and_checked(captured, tmp_path):
    path = tmp_path / "mine.yml"
    path.write_text("description: mine\nconfig:\n  epochs: [1, 2, 3]\n  seed: 7\n")
    pytest.importorskip("yaml")
    invoke(["run", "--benchmark", "permuted-mnist", "--preset", str(path), "--out", str(tmp_path)])
    assert (captured[-1].epochs, captured[-1].seed) == ((1, 2, 3), 7)
    path.write_text("epochs: [1, 2\n")
    result = runner.invoke(app, ["run", "--preset", str(path), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert f"preset file {path} is not valid YAML" in " ".join(result.output.split())


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_preset_nested_too_deep_is_refused_in_one_line(tmp_path, suffix):
    """100,000 nested lists (JSON or YAML flow style) meet results.json's 64-level limit,
    not the parser's recursion limit."""
    pytest.importorskip("yaml")
    path = tmp_path / f"deep{suffix}"
    path.write_text("[" * 100_000 + "]" * 100_000)
    result = runner.invoke(app, ["run", "--preset", str(path), "--out", str(tmp_path / "o")])
    line = one_line_error(result)
    assert f"preset file {path} nests deeper than the 64 levels espn reads" in line


def test_a_preset_that_is_a_device_or_a_fifo_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "preset.json"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        result = runner.invoke(app, ["run", "--preset", path, "--out", str(tmp_path / "o")])
        assert f"preset file {path} is not a regular file" in one_line_error(result)
