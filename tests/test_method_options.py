"""Methods own their settings: a method declared in this file alone gets its `espn run` flag,
validation and results.json entry; create_method; older runs' flat options; registration for
the duration of a test."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from espn.cli.main import app
from espn.methods import METHODS, MethodConfig, Option, Strategy
from espn.methods.base import declared_options
from espn.methods.packnet import PackNet
from espn.registry import Registry
from espn.runs.checks import option_differences
from espn.runs.config import ConfigError, make_config
from espn.runs.legacy import upgrade_saved_config
from espn.runs.method import create_method

runner = CliRunner()


def supsup_defaults(**given: Any) -> dict[str, Any]:
    """SupSup's settings: its declared defaults, with ``given`` in their place."""
    return {o.name: given.get(o.name, o.default) for o in METHODS.get("supsup").options}


TINY = ["--model", "fc-small", "--tasks", "2", "--epochs", "1,1,1", "--batch-size", "64"]


class Toy(PackNet):
    """PackNet with one option of its own, which it reports for every task."""

    name = "toy"
    options = (Option("toy_level", int, 3, "a level the test reads back", low=1, high=9),)

    def report(self) -> dict[str, Any]:
        return {"toy_level": self.settings["toy_level"]}


@pytest.fixture
def toy(fc_small_model: str) -> Iterator[type[Toy]]:
    """Method ``toy`` (and model ``fc-small``) registered for the duration of a test."""
    with METHODS.temporarily("toy", Toy):
        yield Toy


def help_text() -> str:
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def run_args(tmp_path, *args: str) -> list[str]:
    out = str(tmp_path / "run")
    return ["run", "--benchmark", "permuted-mnist", "--out", out, *TINY, "--no-progress", *args]


# ------------------------------------------------------------------- the CLI
def test_a_method_declared_in_a_test_file_gets_its_flag(toy):
    text = help_text()
    assert "--toy-level" in text
    assert "toy: a level the test reads back, in [1, 9]; default 3." in text
    assert "--supsup-k" in text and "--cpg-acc-loss" in text and "--rmn-l1" in text


def test_the_flag_leaves_with_the_method():
    with METHODS.temporarily("toy", Toy):
        assert "--toy-level" in help_text()
    assert "--toy-level" not in help_text() and "toy" not in METHODS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "toy", "--toy-level", "12"], "toy_level must be in [1, 9], got 12"),
        (["--method", "toy", "--toy-level", "0"], "toy_level must be in [1, 9], got 0"),
        (["--method", "toy", "--toy-level", "2.5"], "parse string as an integer"),
        (["--method", "espn", "--toy-level", "2"], "toy_level applies to method 'toy' only"),
        (["--method", "toy", "--supsup-k", "0.5"], "supsup_k applies to method 'supsup' only"),
    ],
)
def test_a_bad_value_is_refused_before_anything_runs(toy, tmp_path, args, message):
    result = runner.invoke(app, run_args(tmp_path, *args))
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "run").exists()


def test_a_good_value_reaches_the_strategy_and_results(toy, fake_mnist, tmp_path):
    result = runner.invoke(app, run_args(tmp_path, "--method", "toy", "--toy-level", "7"))
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["toy_level"] == [7, 7]  # what the strategy reported for each task
    assert doc["config"]["method_options"] == {"toy_level": 7}
    assert doc["forgetting"] == [0.0, 0.0]


def test_the_default_is_recorded_when_the_flag_is_not_given(toy):
    cfg = make_config(benchmark="permuted-mnist", method="toy")
    assert cfg.method_options == {"toy_level": 3}
    assert cfg.model_dump(mode="json")["method_options"] == {"toy_level": 3}


def test_the_interrupted_run_message_repeats_method_flags(toy, tmp_path):
    from espn.cli import main

    seen: list[str] = []

    def stop(cfg: Any, **kw: Any) -> dict:
        seen.append(cfg.method)
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("espn.api.experiment.run_experiment", stop)
        # a checkpoint holding one finished task (its manifest read as valid)
        mp.setattr("espn.checkpoint.format.manifest_or_none", lambda d: {"tasks": [{}]})
        result = runner.invoke(main.app, run_args(tmp_path, "--method", "toy", "--toy-level", "5"))
    assert seen == ["toy"]
    text = " ".join(result.output.split())
    assert result.exit_code == 130 and "(1 task(s) finished)" in text
    assert "--method toy" in text and "--toy-level 5" in text and text.endswith("--resume")


# ------------------------------------------------------------- configuration
def test_flat_options_from_presets_and_keywords_are_the_methods(tmp_path):
    preset = tmp_path / "p.json"
    values = {"benchmark": "permuted-mnist", "method": "supsup", "supsup_k": 0.3}
    preset.write_text(json.dumps({"description": "a test", "config": values}))
    assert make_config(preset=str(preset)).method_options == supsup_defaults(supsup_k=0.3)
    assert make_config(preset=str(preset), supsup_k=0.2).method_options == supsup_defaults(
        supsup_k=0.2
    )
    nested = make_config(benchmark="permuted-mnist", method="rmn", method_options={"rmn_l1": 0})
    assert nested.method_options["rmn_l1"] == 0.0
    assert nested.method_config().method_options["rmn_l1"] == 0.0
    with pytest.raises(ConfigError, match="unknown option 'rmn_x' of method 'rmn'; its options"):
        make_config(benchmark="permuted-mnist", method="rmn", method_options={"rmn_x": 1})
    with pytest.raises(ConfigError, match=r"supsup_k must be in \(0, 1\], got True"):
        make_config(benchmark="permuted-mnist", method="supsup", supsup_k=True)


def test_configurations_of_older_runs_with_flat_options_still_load():
    """espn before method-declared options saved every method's option flat, unset ones null."""
    now = make_config(benchmark="permuted-mnist", method="supsup", supsup_k=0.25)
    old = {k: v for k, v in now.model_dump(mode="json").items() if k != "method_options"}
    old |= {"supsup_k": 0.25, "cpg_acc_loss": None, "rmn_l1": None}
    # ... and ESPN's options at the top level, with SupSup's dense head of that time
    old |= {"pruner": "flop-aware", "penalty": 1.0, "flop_load": "output", "reuse": "all"}
    upgraded = upgrade_saved_config(old)
    then = {"supsup_head": "dense", "supsup_density": "uniform", "supsup_scale": "density"}
    assert upgraded["method_options"] == supsup_defaults(supsup_k=0.25, **then)
    assert not {"pruner", "penalty", "flop_load", "reuse"} & set(upgraded)
    assert not {"supsup_k", "cpg_acc_loss", "rmn_l1"} & set(upgraded)
    cfg = make_config(**upgraded)
    assert cfg.method_options == supsup_defaults(supsup_k=0.25, **then)
    assert option_differences(upgraded, cfg) == []  # resumable with the same options
    other = make_config(**(upgraded | {"method_options": {"supsup_k": 0.5}}))
    assert option_differences(upgraded, other) == [  # the method's options one by one
        "method_options.supsup_k=0.25 in the checkpoint, 0.5 now",
        "method_options.supsup_head='dense' in the checkpoint, 'masked' now",
        "method_options.supsup_density='uniform' in the checkpoint, 'erdos-renyi' now",
        "method_options.supsup_scale='density' in the checkpoint, 'fan-in' now",
    ]
    espn_run = upgrade_saved_config(
        {"benchmark": "permuted-mnist", "supsup_k": None, "cpg_acc_loss": None, "rmn_l1": None}
    )
    # ESPN's options as that espn ran them (before flop_load: total; free weights kept;
    # residual streams coupled; no L2 term on the masked weights)
    assert espn_run["method_options"] == {
        "pruner": "flop-aware",
        "penalty": 1.0,
        "flop_load": "total",
        "stream_pruning": "coupled",
        "reuse": "all",
        "polarization_t": 1.2,
        "masked_l2": 0.0,
        "free_init": "keep",
    }
    assert make_config(**espn_run).method_options == espn_run["method_options"]


# -------------------------------------------------------------- create_method
def test_create_method_takes_general_and_own_settings():
    espn = create_method("espn")
    assert espn.cfg.gamma == 0.2 and espn.prunes_units  # as on the CLI, not a dense "ESPN"
    assert create_method("packnet").cfg.gamma == 1.0
    assert create_method("individual").cfg.alpha == 1.0
    supsup = create_method("supsup", supsup_k=0.3, epochs=[1, 1, 1])
    assert supsup.k == 0.3 and supsup.settings == supsup_defaults(supsup_k=0.3)
    assert supsup.cfg.epochs == (1, 1, 1) and supsup.cfg.alpha == 1.0
    assert create_method(Toy, toy_level=4).settings == {"toy_level": 4}  # a class, unregistered
    assert create_method("rmn").settings["rmn_l1"] == 1e-6


@pytest.mark.parametrize(
    ("method", "settings", "message"),
    [
        ("espn", {"gama": 0.2}, "unknown setting 'gama' for method 'espn'; accepted: gamma, alpha"),
        ("espn", {"supsup_k": 0.3}, "supsup_k applies to method 'supsup' only, not 'espn'"),
        ("supsup", {"supsup_k": 1.5}, r"supsup_k must be in \(0, 1\], got 1.5"),
        ("cpg", {"cpg_acc_loss": -1}, r"cpg_acc_loss must be in \[0, 100\] \(accuracy points\)"),
        ("packnet", {"gamma": 0.5}, "method 'packnet' has no FLOP constraint; gamma must be 1"),
        ("espn", {"gamma": 0.0}, r"gamma must be in \(0, 1\], got 0.0"),
        ("espn", {"epochs": (1, 1), "warmup": 0}, "epochs must be three non-negative counts"),
        ("cpg", {"epochs": (1, 0, 1)}, "needs PRUNE >= 1, got 1,0,1"),
    ],
)
def test_create_method_refuses_what_the_method_does_not_accept(method, settings, message):
    with pytest.raises(ValueError, match=message):
        create_method(method, **settings)


def test_create_method_names_what_it_takes():
    with pytest.raises(TypeError, match=r"a method name .* or a Strategy subclass, got 3"):
        create_method(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown method 'ewc'; choose one of"):
        create_method("ewc")


def test_strategy_built_directly_gets_its_defaults_and_checks():
    assert METHODS.get("supsup")(MethodConfig()).k == 0.5
    with pytest.raises(ValueError, match=r"supsup_k must be in \(0, 1\], got 0"):
        METHODS.get("supsup")(MethodConfig(method_options={"supsup_k": 0}))


# ------------------------------------------------------------ declarations
def test_declarations_that_clash_are_refused():
    class Other(PackNet):
        name = "other"
        options = (Option("toy_level", float, 0.5, "the same name, another meaning"),)

    class Greedy(PackNet):
        name = "greedy"
        options = (Option("gamma", float, 0.5, "a general setting's name"),)

    clash = pytest.raises(ValueError, match="methods 'toy' and 'other' declare option")
    with METHODS.temporarily("toy", Toy), METHODS.temporarily("other", Other), clash:
        declared_options()
    general = pytest.raises(ValueError, match="declares option 'gamma', which is a general")
    with METHODS.temporarily("greedy", Greedy), general:
        declared_options()
    shared = {n: m for n, (_, m) in declared_options().items()}
    unit_pruning = ["espn", "individual"]  # ESPN's own since they left RunConfig
    assert shared == {
        "cpg_acc_loss": ["cpg"],
        "cpg_stop": ["cpg"],
        "cpg_train_acc": ["cpg"],
        "cpg_mask_lr": ["cpg"],
        "cpg_zero_released": ["cpg"],
        "pruner": unit_pruning,
        "penalty": unit_pruning,
        "flop_load": unit_pruning,
        "stream_pruning": unit_pruning,
        "reuse": unit_pruning,
        "polarization_t": unit_pruning,
        "masked_l2": ["espn", "individual", "packnet"],
        "free_init": ["espn", "packnet"],
        "packnet_prune": ["packnet"],
        "rmn_l1": ["rmn"],
        "rmn_threshold": ["rmn"],
        "rmn_budget": ["rmn"],
        "rmn_frozen_map": ["rmn"],
        "supsup_k": ["supsup"],
        "supsup_lr": ["supsup"],
        "supsup_head": ["supsup"],
        "supsup_density": ["supsup"],
        "supsup_scale": ["supsup"],
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "Bad-Name", "type": float, "default": 1.0}, "lower-case Python identifier"),
        ({"name": "k", "type": list, "default": []}, "is not one of float, int, str, bool"),
        ({"name": "k", "type": float, "default": 2.0, "high": 1.0}, "k must be <= 1, got 2.0"),
        ({"name": "k", "type": str, "default": "c", "choices": ("a", "b")}, "one of: a, b"),
    ],
)
def test_bad_declarations_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Option(help="h", **kwargs)


def test_option_values_are_typed_and_checked():
    level = Option("level", int, 1, "h", low=0, low_open=True)
    assert level.check(2.0) == 2 and level.accepted() == "> 0"
    with pytest.raises(ValueError, match=r"level must be > 0, got 2\.5"):
        level.check(2.5)
    rate = Option("rate", float, 0.1, "h")
    assert rate.check(1) == 1.0 and isinstance(rate.check(1), float)
    with pytest.raises(ValueError, match="rate must be a finite number, got inf"):
        rate.check(float("inf"))
    flag = Option("flag", bool, False, "h")
    with pytest.raises(ValueError, match="flag must be true or false, got 1"):
        flag.check(1)


# ------------------------------------------------------------ registration
def test_temporarily_registers_for_the_block_only():
    reg: Registry[int] = Registry("thing")
    reg.register("a")(1)
    reg.register("b")(2)
    with reg.temporarily("c", 3) as obj:
        assert obj == 3 and reg.get("c") == 3 and reg.names() == ["a", "b", "c"]
    assert reg.names() == ["a", "b"]
    with pytest.raises(RuntimeError), reg.temporarily("a", 10):
        assert reg.get("a") == 10
        raise RuntimeError("the block fails")
    assert reg.get("a") == 1 and reg.names() == ["a", "b"]  # the shadowed one, in its place


def test_the_strategy_base_declares_nothing():
    assert Strategy.options == ()


class Switches(PackNet):
    """PackNet with a flag and a choice of its own."""

    name = "switches"
    options = (
        Option("sw_fast", bool, False, "a flag"),
        Option("sw_mode", str, "a", "a choice", choices=("a", "b")),
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], {"sw_fast": False, "sw_mode": "a"}),
        (["--sw-fast", "--sw-mode", "b"], {"sw_fast": True, "sw_mode": "b"}),
        (["--no-sw-fast"], {"sw_fast": False, "sw_mode": "a"}),
    ],
)
def test_flags_and_choices_from_the_command_line(
    fc_small_model, tmp_path, monkeypatch, args, expected
):
    seen: list[dict] = []

    def record(cfg: Any, **kw: Any) -> dict:
        seen.append(cfg.method_options)
        raise KeyboardInterrupt  # stop before training: the configuration is what is tested

    monkeypatch.setattr("espn.api.experiment.run_experiment", record)
    with METHODS.temporarily("switches", Switches):
        result = runner.invoke(app, run_args(tmp_path, "--method", "switches", *args))
    assert result.exit_code == 130 and seen == [expected]


def test_a_choice_out_of_its_list_is_refused(fc_small_model, tmp_path):
    with METHODS.temporarily("switches", Switches):
        result = runner.invoke(app, run_args(tmp_path, "--method", "switches", "--sw-mode", "c"))
    assert result.exit_code == 2
    assert "sw_mode must be one of: a, b, got 'c'" in " ".join(result.output.split())


def test_every_method_file_of_the_package_registers_itself():
    """No list of methods to extend: each module of espn.methods is imported with it."""
    import pkgutil

    import espn.methods

    names = {m.name for m in pkgutil.iter_modules(espn.methods.__path__)}
    assert all(f"espn.methods.{n}" in sys.modules for n in names)
    defined = {
        cls.name
        for n in names
        for cls in vars(sys.modules[f"espn.methods.{n}"]).values()
        if isinstance(cls, type) and issubclass(cls, Strategy) and "name" in vars(cls)
    }
    assert (
        defined
        == set(METHODS.names())
        == {"cpg", "espn", "individual", "mtl", "packnet", "rmn", "supsup"}
    )


def test_the_torch_free_declarations_are_the_registered_methods_options():
    """The command line reads the methods' options from ``espn.settings.methods`` before any
    method (or torch) is loaded: they are each registered method's own, with the choices the
    code acting on them accepts."""
    from espn.pruning.pruner import PRUNERS
    from espn.settings.methods import FLOP_LOADS, METHOD_OPTIONS, PRUNER_NAMES, declared
    from espn.supernet import flops

    own = {m: METHODS.get(m).options for m in METHODS if METHODS.get(m).options}
    assert own == METHOD_OPTIONS
    assert declared(METHOD_OPTIONS) == declared_options()
    assert tuple(PRUNERS.names()) == PRUNER_NAMES
    assert FLOP_LOADS == flops.FLOP_LOADS


def test_a_run_recorded_with_flat_options_evaluates_and_resumes(
    fake_mnist, fc_small_model, tmp_path
):
    """A run written before options were declared (flat ``supsup_k``, the others null), when
    SupSup's head was dense and its density uniform."""
    then = ["--supsup-head", "dense", "--supsup-density", "uniform", "--supsup-scale", "density"]
    args = run_args(tmp_path, "--method", "supsup", *then, "--supsup-k", "0.25")
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    out = tmp_path / "run"
    for path in (out / "results.json", out / "checkpoint" / "manifest.json"):
        doc = json.loads(path.read_text())
        config = doc["config"]
        assert config.pop("method_options") == supsup_defaults(
            supsup_k=0.25, supsup_head="dense", supsup_density="uniform", supsup_scale="density"
        )
        config |= {"supsup_k": 0.25, "cpg_acc_loss": None, "rmn_l1": None}
        path.write_text(json.dumps(doc))
    evaluated = runner.invoke(app, ["evaluate", "--run", str(out)])
    assert evaluated.exit_code == 0, evaluated.output
    assert "all 2 tasks match results.json" in " ".join(evaluated.output.split())
    resumed = runner.invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    other = runner.invoke(app, [*args[:-1], "0.5", "--resume"])
    assert other.exit_code == 2
    assert "method_options.supsup_k=0.25 in the checkpoint, 0.5 now" in " ".join(
        other.output.split()
    )


def test_sweeps_and_presets_take_method_options_by_name():
    from espn.sweep import expand_spec

    spec = {"base": {"benchmark": "permuted-mnist", "method": "supsup"}}
    points = expand_spec(spec | {"grid": {"supsup_k": [0.3, 0.5]}})
    assert [p.options["supsup_k"] for p in points] == [0.3, 0.5]
    with pytest.raises(ValueError, match=r"supsup_k must be in \(0, 1\], got 2"):
        expand_spec(spec | {"grid": {"supsup_k": [2]}})
    with pytest.raises(ValueError, match=r"unknown option 'supsup_kk'; accepted: .*, supsup_k"):
        expand_spec(spec | {"grid": {"supsup_kk": [0.3]}})
