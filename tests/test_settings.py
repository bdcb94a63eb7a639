"""Each training setting declared once: one default per setting (``espn.settings.training``), read by
both front doors, one precedence (user > method recipe > preset > the regime's recipe >
default), and recipes declared once (``espn.settings.recipes``), named by benchmarks and presets."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import espn
from espn.data.registry import BENCHMARKS
from espn.methods import METHODS, MethodConfig
from espn.methods.base import Strategy, declared_options
from espn.models.registry import ModelSpec
from espn.runs.config import ConfigError, RunConfig, layered, make_config
from espn.runs.given import TRAINING_SETTINGS
from espn.settings import recipes
from espn.settings import training as settings
from espn.settings.presets import load_preset, preset_names
from espn.settings.recipes import REGIMES
from espn.settings.training import (
    DEFAULTS,
    OPTIMIZER_SETTINGS,
    RECIPE_SETTINGS,
    SETTING_NAMES,
    TrainingSettings,
)
from espn.training.optim import OptimConfig
from helpers.api_models import SmallMLP

SRC = Path(espn.__file__).parent
#: packages and modules where a setting's name means something else: the data's device and
#: task seed, an evaluation batch size, a model constructor's own parameters, the theory's
#: experiments, the values old checkpoints were written with, Avalanche's ``eval_every``
OTHER_MEANINGS = (
    "data/",
    "evaluation/",
    "inference/",
    "supernet/",
    "layers/",
    "models/",
    "theory/",
    "runs/legacy.py",
    "integrations/avalanche.py:eval_every",
    "api/tasks.py:task_agnostic",  # evaluate(task_agnostic=...): measure without the task id
    "api/tasks.py:batch_size",  # evaluate(batch_size=...): the evaluation's batch, not training's
)


def fc_learner(method: str | Strategy = "espn", **options: Any) -> espn.ContinualLearner:
    """The Python door on a small FC network (the ``mnist`` regime's recipe)."""
    torch.manual_seed(0)
    sn = espn.wrap(SmallMLP, torch.zeros(2, 1, 8, 8))
    return espn.ContinualLearner(sn, method, **options)


def test_a_default_read_from_one_place_is_what_both_doors_use(monkeypatch):
    """Change the defaults in espn.settings.training alone: ``espn run``'s configuration, the learner,
    its method and its optimizer all follow, where no recipe sets the setting."""
    moved = dataclasses.replace(
        DEFAULTS,
        alpha=0.25,
        gamma=0.4,
        optimizer="sgd",
        lr=0.02,
        betas=(0.5, 0.6),
        momentum=0.3,
        weight_decay=0.01,
        batch_size=7,
        epochs=(2, 1, 1),
        finetune_schedule="constant",
    )
    monkeypatch.setattr(settings, "DEFAULTS", moved)
    with REGIMES.temporarily("bare", {"regime": "mnist", "model": "fc1024"}):
        cli = make_config(benchmark="permuted-mnist", recipe="bare")
        learner = fc_learner(recipe="bare")
    names = ("alpha", "gamma", "optimizer", "lr", "betas", "momentum", "weight_decay")
    for name in (*names, "batch_size", "epochs", "finetune_schedule"):
        assert getattr(cli, name) == getattr(moved, name) == getattr(learner.cfg, name), name
    assert learner.strategy.cfg.alpha == 0.25 and learner.strategy.cfg.epochs == (2, 1, 1)
    optim = tuple(getattr(learner.optim, n) for n in OPTIMIZER_SETTINGS)
    assert optim == ("sgd", 0.02, 0.01, 0.3, (0.5, 0.6))
    assert learner.batch_size == 7


def test_one_stream_pruning_default_for_every_door_and_method():
    """The ESPN option, ``espn.wrap``, the model spec and every method's run configuration
    take the one default; the learner records the streams a default-wrapped ResNet has, so
    that a method pruning no units saves what its supernet is."""
    default = DEFAULTS.stream_pruning
    options = {o.name: o for o in METHODS.get("espn").options}
    assert options["stream_pruning"].default == default
    assert inspect.signature(espn.wrap).parameters["stream_pruning"].default == default
    assert ModelSpec((3, 8, 8), 2, True).stream_pruning == default
    for method in METHODS.names():
        cfg = make_config(benchmark="split-cifar10", method=method, model="resnet18-reduced")
        assert cfg.stream_pruning == default, method
    sn = espn.wrap("resnet18-reduced", torch.zeros(2, 3, 8, 8), n_classes=2)
    assert sn.stream_pruning == default
    for method in ("espn", "packnet"):
        assert espn.ContinualLearner(sn, method).cfg.stream_pruning == default


def test_layered_applies_each_level_in_order():
    """Each level wins over those below it; None means not given."""
    recipe = {"lr": 1, "momentum": 1, "batch_size": 1, "weight_decay": 1, "warmup": 5}
    preset = {"lr": 2, "momentum": 2, "batch_size": 2}
    method = {"lr": 3, "momentum": 3}
    values = layered({"lr": 4, "momentum": None}, method=method, preset=preset, recipe=recipe)
    assert (values["lr"], values["momentum"], values["batch_size"]) == (4, 3, 2)
    assert values["weight_decay"] == 1 and "alpha" not in values  # left to the default
    # a recipe's warm-up leaves one full pre-training epoch of the run's epochs
    assert layered({"epochs": "3,1,1"}, recipe=recipe)["warmup"] == 2
    assert layered({"epochs": (3, 1, 1), "warmup": 3}, recipe=recipe)["warmup"] == 3
    # a recipe's reference size goes with its epochs, a chosen one stays
    sized = {"epochs": (3, 4, 3), "reference_size": 60000}
    assert layered({}, recipe=sized)["reference_size"] == 60000
    assert "reference_size" not in layered({"epochs": (1, 1, 1)}, recipe=sized)
    assert "reference_size" not in layered({}, preset={"epochs": (1, 1, 1)}, recipe=sized)
    chosen = layered({"epochs": (1, 1, 1)}, preset={"reference_size": 9}, recipe=sized)
    assert chosen["reference_size"] == 9


def test_a_recipes_warmup_is_scaled_to_the_epochs_given():
    """The recipe's warm-up is a share of its pre-training epochs: epochs given (here to a
    conv network, the ``cifar`` recipe's 10 of 60) get the same share, not the recipe's 10
    cut to leave one pre-training epoch; a warm-up given is kept."""
    from helpers.api_models import SmallConvNet

    cifar = recipes.CIFAR
    assert layered({}, recipe=cifar)["warmup"] == 10
    got = {pre: layered({"epochs": (pre, 1, 1)}, recipe=cifar)["warmup"] for pre in (1, 2, 9, 30)}
    assert got == {1: 0, 2: 1, 9: 2, 30: 5}
    assert layered({}, preset={"epochs": (120, 1, 1)}, recipe=cifar)["warmup"] == 20
    assert layered({"epochs": (6, 4, 3)}, recipe=recipes.MNIST)["warmup"] == 2
    torch.manual_seed(0)
    sn = espn.wrap(SmallConvNet, torch.zeros(2, 1, 8, 8))
    learner = espn.ContinualLearner(sn, "espn", epochs=(10, 10, 10))
    phases = {p.name: p.epochs for p in learner.strategy.phases()}
    assert (learner.cfg.warmup, phases["warmup"], phases["pretrain"]) == (2, 2, 8)
    kept = espn.ContinualLearner(sn, "espn", epochs=(10, 10, 10), warmup=9)
    assert kept.cfg.warmup == 9


@pytest.mark.parametrize("door", ["espn run", "learner"])
def test_precedence_user_method_recipe_preset_regime_recipe(tmp_path: Path, door: str):
    """The same four levels through both doors: the ``mnist`` regime's recipe, a preset over
    it, CPG's recipe over the preset, the user's value over everything."""
    preset = tmp_path / "p.json"
    preset.write_text(json.dumps({"lr": 0.02, "batch_size": 48, "momentum": 0.5}))

    def resolve(method: str, **given: Any) -> RunConfig:
        if door == "espn run":
            return make_config(benchmark="permuted-mnist", method=method, **given)
        return fc_learner(method, **given).cfg

    regime = resolve("espn")
    assert (regime.lr, regime.batch_size) == (recipes.MNIST["lr"], recipes.MNIST["batch_size"])
    assert regime.momentum == DEFAULTS.momentum  # no level sets it: the default
    with_preset = resolve("espn", preset=str(preset))
    assert (with_preset.lr, with_preset.batch_size, with_preset.momentum) == (0.02, 48, 0.5)
    cpg = METHODS.get("cpg").recipe["mnist"]
    over = resolve("cpg", preset=str(preset), cpg_train_acc=0.0)
    assert (over.lr, over.batch_size, over.momentum) == (cpg["lr"], cpg["batch_size"], 0.9)
    mine = resolve("cpg", preset=str(preset), lr=0.3, batch_size=5, cpg_train_acc=0.0)
    assert (mine.lr, mine.batch_size, mine.momentum) == (0.3, 5, cpg["momentum"])


def _literal(node: ast.expr) -> bool:
    """A value written out in the source (not None, not a name referring to a declaration)."""
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return False
    return value is not None


def _declarations(path: Path) -> list[tuple[str, int, str]]:
    """Where ``path`` writes out a default of a training setting: class fields (their
    ``setting(default, ...)`` declarations too), keyword
    defaults, ``Option`` declarations and ``.get(name, fallback)`` fallbacks."""
    names = set(SETTING_NAMES) - {"method_options"}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        pairs: list[tuple[str, ast.expr]] = []
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            value = node.value  # a literal, or the declaration ``setting(default, help, ...)``
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "setting":
                value = value.args[0]
            pairs.append((node.target.id, value))
        elif isinstance(node, ast.FunctionDef):
            args = node.args.posonlyargs + node.args.args
            pairs += [
                (a.arg, d) for a, d in zip(args[::-1], node.args.defaults[::-1], strict=False)
            ]
            pairs += [
                (a.arg, d)
                for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
                if d
            ]
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            first = node.args[0]
            key = first.value if isinstance(first, ast.Constant) else None
            if getattr(node.func, "id", "") == "Option" and len(node.args) >= 3:
                pairs.append((str(key), node.args[2]))
            elif getattr(node.func, "attr", "") == "get" and len(node.args) == 2:
                pairs.append((str(key), node.args[1]))
        found += [(n, node.lineno, path.name) for n, v in pairs if n in names and _literal(v)]
    return found


def test_each_training_setting_has_one_declared_default():
    """Counted: the defaults live in TrainingSettings alone. MethodConfig is it, RunConfig
    and OptimConfig take theirs from it, no method declares one of its own, and no module
    writes one out (an AST scan of src/espn)."""
    assert MethodConfig is TrainingSettings
    for name in TRAINING_SETTINGS:
        if name in SETTING_NAMES and name != "method_options":
            assert RunConfig.model_fields[name].default in (None, getattr(DEFAULTS, name)), name
    optim = {f.name: f.default for f in dataclasses.fields(OptimConfig)}
    assert optim == {n: getattr(DEFAULTS, n) for n in OPTIMIZER_SETTINGS} | {"schedule": "phase"}
    for name in METHODS.names():
        for cls in METHODS.get(name).__mro__:
            if issubclass(cls, Strategy):
                assert not set(vars(cls)) & set(SETTING_NAMES), (name, cls)
    for name, (option, _) in declared_options().items():
        if name in SETTING_NAMES:
            assert option.default == getattr(DEFAULTS, name)
    written = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        if where == "settings/training.py" or any(where.startswith(p) for p in OTHER_MEANINGS):
            continue
        written += [d for d in _declarations(path) if f"{where}:{d[0]}" not in OTHER_MEANINGS]
    assert written == []
    # and the scan finds the declarations where they are
    assert {d[0] for d in _declarations(SRC / "settings" / "training.py")} >= set(SETTING_NAMES) - {
        "method_options",
        "finetune_lr",
        "reference_size",
        "shards",
    }


def _restated(values: dict[str, Any]) -> int:
    """How many of ``values`` repeat the value a registered recipe holds for the setting."""
    best = 0
    for recipe in (*REGIMES, *(BENCHMARKS.get(n).defaults for n in BENCHMARKS.names())):
        held = REGIMES.get(recipe) if isinstance(recipe, str) else recipe
        same = [k for k in RECIPE_SETTINGS if k in values and k in held]
        best = max(best, sum(tuple(_seq(values[k])) == tuple(_seq(held[k])) for k in same))
    return best


def _seq(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, list | tuple) else (value,)


def test_recipes_are_declared_once_and_named_elsewhere():
    """Benchmarks hold the recipe objects of espn.settings.recipes; shipped presets name a recipe and
    repeat none of its values; no dict in the source restates a recipe (three or more of a
    recipe's values) outside espn/settings/recipes.py."""
    assert BENCHMARKS.get("permuted-mnist").defaults is recipes.MNIST
    assert BENCHMARKS.get("tensors").defaults is recipes.MNIST
    assert BENCHMARKS.get("split-cifar100").defaults is recipes.CIFAR
    assert BENCHMARKS.get("split-fashion-mnist").defaults is recipes.FASHION
    assert BENCHMARKS.get("image-folders").defaults is recipes.FOLDERS
    for name in preset_names():
        values = load_preset(name)
        assert values.get("recipe") in REGIMES.names(), name
        assert _restated(values) == 0, name
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "recipes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
                try:
                    values = ast.literal_eval(node)
                except ValueError:
                    continue
                assert _restated(values) < 3, f"{path.name}:{node.lineno}"


def test_the_docs_name_each_setting_once_with_its_default():
    """docs/recipes.md holds the one table of the settings, each row's default the one in
    TrainingSettings; the Python and CLI pages link to it instead of repeating it."""
    docs = Path(__file__).parents[1] / "docs"
    rows: dict[str, list[str]] = {}
    for line in (docs / "recipes.md").read_text().splitlines():
        match = re.match(r"\| `(\w+)` \| ([^|]+) \|", line)
        if match and match.group(1) in SETTING_NAMES:
            rows.setdefault(match.group(1), []).append(match.group(2).strip())
    for name in set(SETTING_NAMES) - {"method_options"}:
        assert len(rows.get(name, [])) == 1, name
        value = getattr(DEFAULTS, name)
        shown = rows[name][0]
        assert shown.startswith("unset") if value is None else shown == str(value), name
    for page in ("python.md", "cli.md"):
        text = (docs / page).read_text()
        assert "recipes.md#training-settings-defaults-and-precedence" in text
        assert not re.search(r"^\| `(gamma|alpha|epochs|optimizer|lr)` \|", text, re.M), page


def test_a_built_strategy_fixes_the_settings_it_was_given_and_no_others():
    """A strategy from create_method fixes what was given there; one built by hand from
    TrainingSettings fixes what it reads itself (its epochs, budgets, ...) and what else it
    sets apart from the defaults; the rest follows the precedence for the network (here the
    ``mnist`` recipe), and a keyword naming a fixed one is refused."""
    made = espn.create_method("espn", gamma=0.5)
    learner = fc_learner(made, lr=0.02)
    assert (learner.cfg.gamma, learner.cfg.lr) == (0.5, 0.02)
    assert (learner.cfg.optimizer, learner.cfg.alpha) == ("rmsprop", recipes.MNIST["alpha"])
    with pytest.raises(espn.errors.EspnError, match=r"\['gamma'\] given with a built strategy"):
        fc_learner(espn.create_method("espn", gamma=0.5), gamma=0.3)
    by_hand = METHODS.get("espn")(TrainingSettings(epochs=(1, 1, 1), gamma=0.5, lr=0.02))
    learner = fc_learner(by_hand)
    assert (learner.cfg.epochs, learner.cfg.gamma, learner.cfg.lr) == ((1, 1, 1), 0.5, 0.02)
    assert learner.cfg.alpha == by_hand.cfg.alpha and learner.cfg.warmup == by_hand.cfg.warmup
    assert learner.cfg.batch_size == recipes.MNIST["batch_size"]
    with pytest.raises(espn.errors.EspnError, match=r"\['epochs'\] given with a built strategy"):
        fc_learner(METHODS.get("espn")(TrainingSettings()), epochs=(2, 2, 2))
    packnet = METHODS.get("packnet")(TrainingSettings(epochs=(1, 1, 1)))
    assert fc_learner(packnet).cfg.gamma == 1.0  # a budget it does not have is not fixed


def test_each_declaration_alone_reaches_the_flag_the_keyword_the_run_and_the_optimizer():
    """Adding a training setting is its declaration (and its docs row): every declared
    setting is an ``espn run`` flag, a keyword of the learner, a field of RunConfig (or, for
    ``stream_pruning``, the methods' option), and reaches the engine in the one settings
    object its optimizer is built from; each optimizer setting given as a keyword is the
    torch optimizer's."""
    from espn.cli.main import load_command
    from espn.cli.options import flag

    run = load_command("run")
    flags = {f for p in run.params for f in (*p.opts, *p.secondary_opts)}
    for name in SETTING_NAMES:
        if name == "method_options":
            continue
        assert flag(name) in flags, name
        if name != "stream_pruning":
            assert name in RunConfig.model_fields, name
            assert name in TRAINING_SETTINGS or name == "device", name
    given = {"lr": 0.02, "weight_decay": 0.01, "momentum": 0.3, "betas": (0.5, 0.6)}
    seen = set()
    for kind, torch_kind in (("sgd", torch.optim.SGD), ("adam", torch.optim.Adam)):
        learner = fc_learner(optimizer=kind, **given)
        assert learner.engine.optim == learner.cfg.training_settings()
        optimizer = learner.engine.build_optimizer().weights
        assert type(optimizer) is torch_kind
        group = optimizer.param_groups[0]
        for name in set(OPTIMIZER_SETTINGS) & set(group):
            assert group[name] == given[name], (kind, name)
            seen.add(name)
    assert seen == set(OPTIMIZER_SETTINGS) - {"optimizer"}


def test_a_recipe_sets_only_declared_recipe_settings():
    """A recipe's keys come from the declarations (``recipe=True``), its model and regime:
    those of the regimes, the benchmarks and every method's own recipe."""
    allowed = {"regime", "model", *RECIPE_SETTINGS}
    found = [REGIMES.get(n) for n in REGIMES.names()]
    found += [BENCHMARKS.get(n).defaults for n in BENCHMARKS.names()]
    found += [r for m in METHODS.names() for r in METHODS.get(m).recipe.values()]
    for recipe in found:
        assert set(recipe) <= allowed, sorted(set(recipe) - allowed)
    odd = REGIMES.temporarily("odd", {"regime": "mnist", "sideways": 1})
    with odd, pytest.raises(ValueError, match="sideways"):
        make_config(benchmark="permuted-mnist", recipe="odd")


def test_a_setting_newer_than_a_checkpoint_resumes_at_its_default(tmp_path: Path):
    """Adding a training setting needs no entry for older runs: a manifest saved before the
    setting existed reads as having run at its declared default, so resuming it with that
    default finds no difference, and with another value names the setting."""
    from espn.runs.checks import option_differences
    from espn.runs.legacy import LEGACY_DEFAULTS, upgrade_saved_config

    cfg = make_config(benchmark="permuted-mnist", model="fc1024", out=tmp_path / "run")
    method_options = set(declared_options())
    checked = 0
    for name in SETTING_NAMES:
        if name in method_options or name in LEGACY_DEFAULTS or name == "method_options":
            continue  # a method's option, or one that ran otherwise before it existed
        if getattr(cfg, name) != getattr(DEFAULTS, name):  # a recipe's value: not a default
            continue
        saved = cfg.model_dump(mode="json")
        del saved[name]
        assert option_differences(upgrade_saved_config(saved), cfg) == [], name
        checked += 1
    assert checked >= 15
    saved = cfg.model_dump(mode="json")
    del saved["weight_decay"]
    other = make_config(benchmark="permuted-mnist", model="fc1024", weight_decay=0.5)
    assert option_differences(upgrade_saved_config(saved), other) == [
        "weight_decay=0.0 in the checkpoint, 0.5 now"
    ]


def test_the_declarations_constraints_refuse_what_the_declaration_refuses(monkeypatch):
    """A run's configuration checks each training setting by pydantic constraints derived
    from its declaration, so a good value reaches no check of espn's own (the learning rate
    crosses no settings file to be checked); a value they refuse goes to the declaration's. Over a
    grid of values, each setting is accepted as the value its declaration makes of it, or
    refused with the declaration's own message."""
    from espn.settings.options import Option

    grid = [0, -1, 0.5, 1, 1.0, 2, 2.5, 2**31, 2**32, True, False, "a", "0.5", "3,4,3",
            "0.5,0.6", (0.5, 0.6), (1, 2, 3), [1, 2, 3], (1.0, 2.0, 3.0), (1, True, 1),
            1e39, -1e39, math.inf, math.nan, "cosine", "adam", "cpu"]  # fmt: skip
    for name, option in settings.OPTIONS.items():
        for value in grid:
            try:
                typed = option.check(value)
                items = typed if isinstance(typed, tuple) else (typed,)
                if name != "seed" and any(type(i) is int and i > settings.MAX_COUNT for i in items):
                    raise ValueError(f"{name} must be <= {settings.MAX_COUNT}, got {value}")
            except ValueError as exc:
                with pytest.raises(ConfigError, match=re.escape(f"{name}: {exc}")):
                    make_config(benchmark="permuted-mnist", **{name: value})
                continue
            try:
                cfg = make_config(benchmark="permuted-mnist", **{name: value})
            except ConfigError:
                continue  # refused for another reason (e.g. the warm-up within the epochs)
            got = cfg.method_options[name] if name == "stream_pruning" else getattr(cfg, name)
            assert (got, type(got)) == (typed, type(typed)), (name, value)
    seen: list[str] = []
    check = Option.check
    monkeypatch.setattr(Option, "check", lambda self, v: seen.append(self.name) or check(self, v))
    make_config(benchmark="permuted-mnist", lr=0.02, epochs=(1, 2, 1), betas=(0.5, 0.6))
    assert not {"lr", "epochs", "betas"} & set(seen)
