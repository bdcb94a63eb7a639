"""``espn run``'s options are generated from their one declaration: every RunConfig field is
exactly one flag with the field's description as help, every flag is a field, a method's
declared option or one of the CLI's own switches, and a flag's value reaches the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import espn.api.experiment as experiment_module
from espn.cli.main import app, load_command
from espn.cli.options import NOT_FLAGS, flag
from espn.methods.base import declared_options
from espn.runs.config import RunConfig, make_config

runner = CliRunner()
#: the switches ``espn run`` has of its own (how to run, not what): no RunConfig field
CLI_ONLY = {"progress", "quiet", "resume", "overwrite", "log", "log_every", "distributed"}


def run_options() -> dict[str, list[str]]:
    """Parameter name -> its flags, as the click command of ``espn run`` has them."""
    command = load_command("run")
    return {p.name: [*p.opts, *p.secondary_opts] for p in command.params if p.opts}


def test_every_field_is_one_flag_and_every_flag_one_declaration() -> None:
    options = run_options()
    fields = [f for f in RunConfig.model_fields if f not in NOT_FLAGS]
    methods = set(declared_options())
    assert set(options) == set(fields) | methods | CLI_ONLY
    assert not (set(fields) & (methods | CLI_ONLY))  # no name declared twice
    for name in fields:
        assert flag(name) in options[name]
    flags = [f for opts in options.values() for f in opts]
    assert len(flags) == len(set(flags))  # no flag belongs to two options
    assert NOT_FLAGS == ("method_options",)  # given as the methods' own flags


def test_the_help_of_a_field_is_its_description() -> None:
    command = load_command("run")
    helps = {p.name: p.help for p in command.params}
    for name, field in RunConfig.model_fields.items():
        if name not in NOT_FLAGS:
            assert field.description and helps[name] == field.description, name


def test_flag_values_reach_the_configuration(tmp_path: Path, monkeypatch) -> None:
    """Each flag given on the command line builds the same configuration as the typed values
    given to make_config (the comma forms parsed by the fields' validators)."""
    seen: list[RunConfig] = []

    def capture(cfg: RunConfig, **kwargs: object) -> dict:
        seen.append(cfg)
        raise KeyboardInterrupt

    monkeypatch.setattr(experiment_module, "run_experiment", capture)
    given = {
        "benchmark": "permuted-mnist",
        "tasks": 3,
        "epochs": "2,1,1",
        "betas": "0.8,0.99",
        "warmup": 1,
        "penalty": 0.5,
        "prune_updates_per_epoch": 2,
        "task_affine": True,
        "amp": False,
        "compile": True,
        "train_sizes": "50,40,30",
        "task_order": "small-first",
        "eval_every": 2,
        "seed": 7,
        "out": str(tmp_path / "r"),
    }
    argv = ["run"]
    for name, value in given.items():
        if isinstance(value, bool):
            argv.append(flag(name) if value else f"--no-{flag(name)[2:]}")
        else:
            argv += [flag(name), str(value)]
    result = runner.invoke(app, argv)
    assert result.exit_code == 130, result.output  # stopped by capture, after the config
    typed = given | {"epochs": (2, 1, 1), "betas": (0.8, 0.99), "out": Path(given["out"])}
    assert seen == [make_config(**typed)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--betas", "0.9"], "--betas must be two comma-separated numbers B1,B2, got '0.9'"),
        (["--betas", "0.9,1.5"], "betas must be two numbers in [0, 1), got 0.9,1.5"),
        (["--prune-updates-per-epoch", "0"], "prune_updates_per_epoch must be >= 1, got 0"),
        (["--folders", ","], "--folders must list directories separated by commas, got ','"),
    ],
)
def test_new_flags_refuse_bad_values(tmp_path: Path, args: list[str], message: str) -> None:
    argv = ["run", "--benchmark", "permuted-mnist", "--out", str(tmp_path / "r"), *args]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_the_manuals_option_table_is_the_commands_own() -> None:
    """docs/cli.md's table of ``espn run`` options is generated from the command (rewrite it
    with ``python3 -m espn.cli.reference docs/cli.md``), so it lists every flag and no other."""
    from espn.cli.reference import run_options_table, with_table

    text = (Path(__file__).parents[1] / "docs" / "cli.md").read_text()
    assert with_table(text, run_options_table()) == text
    assert with_table(text, "| new |") != text
    with pytest.raises(ValueError, match="markers"):
        with_table("no table here", "| x |")
