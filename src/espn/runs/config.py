"""Run configuration: the one precedence of its options (:func:`layered`), validated up front,
with messages that name the bad value."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    BaseModel,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    create_model,
    field_validator,
    model_validator,
)

from espn.errors import EspnError
from espn.runs.fields import RunFields
from espn.settings.methods import known_options, resolve_settings
from espn.settings.options import FLOAT32_MAX
from espn.settings.recipes import REGIMES, Recipe
from espn.settings.training import (
    DEFAULTS,
    MAX_COUNT,
    OPTIONS,
    RECIPE_SETTINGS,
    SETTING_NAMES,
    TrainingSettings,
    default,
    describe,
)
from espn.utils.documents import describe_errors

if TYPE_CHECKING:
    from espn.methods.base import Strategy

    #: the training settings' fields, as type checkers see them (pydantic gets them from
    #: :func:`_fields`)
    _Settings = TrainingSettings
else:
    _Settings = object

#: a device name: cpu, cuda or cuda:N (whether this machine has it is checked before a run
#: starts, see :mod:`espn.runs.preflight`)
DEVICE = re.compile(r"(cpu|cuda)(:\d+)?")


def gather_method_options(
    values: dict[str, Any], strategy: type[Strategy] | None = None
) -> dict[str, Any]:
    """``values`` with the methods' options given flat (``supsup_k=0.3``) moved into
    ``method_options``, unset (None) ones dropped: the registered methods' and ``strategy``'s."""
    own = {o.name: (o, [strategy.name]) for o in strategy.options} if strategy else {}
    declared = known_options() | own
    clash = sorted(set(declared) & set(RunConfig.model_fields))
    if clash:
        raise ValueError(
            f"method option(s) {', '.join(clash)} of {declared[clash[0]][1][0]!r} clash with "
            "run options of the same name; the method must name them otherwise"
        )
    flat = {k: values[k] for k in values if k in declared}
    if not flat:
        return values
    given = dict(values.get("method_options") or {})
    rest = {k: v for k, v in values.items() if k not in flat}
    return rest | {"method_options": given | {k: v for k, v in flat.items() if v is not None}}


def given_names(values: dict[str, Any]) -> set[str]:
    """The names of the options ``values`` gives (not None), methods' options among them."""
    names = {k for k, v in values.items() if v is not None}
    return names | {k for k, v in dict(values.get("method_options") or {}).items() if v is not None}


class ConfigError(EspnError, ValueError):
    """A configuration value is not accepted; the message says which and what would be."""


class _Declared(BaseModel):
    """Every training setting checked by its declaration's pydantic constraints
    (:func:`_constrained`); a value they refuse (or the command line's ``"3,4,3"``) goes to the
    declaration's own check, which refuses it in its words or gives its typed value."""

    @field_validator(*OPTIONS, mode="wrap", check_fields=False)
    @classmethod
    def _setting(cls, v: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        try:
            return handler(v)
        except ValidationError:
            name = str(info.field_name)
        typed = OPTIONS[name].check(v)
        items = typed if isinstance(typed, tuple) else (typed,)
        if name != "seed" and any(type(i) is int and i > MAX_COUNT for i in items):
            raise ValueError(f"{name} must be <= {MAX_COUNT}, got {v}")
        return typed


def _constrained(name: str, optional: bool) -> Any:
    """Setting ``name``'s type (or None where ``optional``) with its declaration's bounds
    and choices as pydantic constraints, no looser than the declaration's own check: strict
    types, finite floats of float32's range, counts a C int holds."""
    option = OPTIONS[name]
    bounds: dict[str, Any] = {}
    if option.choices:
        bounds["pattern"] = "^(" + "|".join(map(re.escape, option.choices)) + ")$"
    if option.low is not None:
        bounds["gt" if option.low_open else "ge"] = option.low
    if option.high is not None:
        bounds["lt" if option.high_open else "le"] = option.high
    if option.type is float:
        bounds = {"ge": -FLOAT32_MAX, "le": FLOAT32_MAX, "allow_inf_nan": False} | bounds
    elif option.type is int and option.high is None:
        bounds["le"] = MAX_COUNT
    kind: Any = option.type
    if option.count:
        one = Annotated[kind, Strict(), Field(**bounds)]
        kind, bounds = tuple.__class_getitem__((one,) * option.count), {}
    return Annotated[kind | None if optional else kind, Strict(), Field(**bounds)]


#: the training settings given, checked before torch is loaded (:func:`make_config`)
_GIVEN: dict[str, Any] = {n: (_constrained(n, True), None) for n in OPTIONS}
_Given = create_model("_Given", __base__=_Declared, **_GIVEN)


class _Run(RunFields, _Declared, _Settings):  # type: ignore[misc]  # _Settings: to mypy only
    """:class:`RunFields` with the checks and the precedence of every option."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any, info: ValidationInfo) -> Any:
        """The options by the one precedence (:func:`layered`): given, the method's recipe,
        the preset, the recipe (``recipe``, else the benchmark's)."""
        from espn.data.registry import BENCHMARKS
        from espn.methods.base import METHODS

        if not isinstance(data, dict):
            return data
        preset: dict[str, Any] = {}
        if data.get("preset") is not None:
            from espn.settings.presets import load_preset

            preset = load_preset(str(data["preset"]))
            accepted = run_option_names(exclude=("preset", "out"))
            unknown = sorted(set(preset) - set(accepted))
            if unknown:
                raise ValueError(
                    f"preset {data['preset']!r} sets unknown option(s) {', '.join(unknown)}; "
                    f"accepted: {', '.join(accepted)}"
                )
        given = {k: v for k, v in data.items() if v is not None}
        source = given.get("recipe") or preset.get("recipe") or given.get("benchmark")
        source = source or preset.get("benchmark")
        method = given.get("method") or preset.get("method") or "espn"
        recipe: dict[str, Any] = {}
        if isinstance(source, str) and (source in REGIMES or source in BENCHMARKS):
            recipe = dict(recipe_defaults(source))
        own: dict[str, Any] = {}
        strategy = (info.context or {}).get("strategy")
        own_class = strategy is not None and strategy.name == method
        if isinstance(method, str) and (method in METHODS or own_class):
            own = _strategy(method, info).run_defaults(str(recipe.get("regime", "")))
        # options given as None are unset: those unset by default stay None (an assignment
        # validates every field), the others take their default
        fields = cls.model_fields
        unset = [
            k for k, v in data.items() if v is None and k in fields and fields[k].default is None
        ]
        values = dict.fromkeys(unset) | layered(data, method=own, preset=preset, recipe=recipe)
        values.pop("regime", None)
        if values.get("benchmark") is None:
            raise ValueError(
                "no benchmark: give --benchmark NAME (see `espn list`) or a preset that sets "
                f"one; benchmarks: {', '.join(BENCHMARKS.names())}"
            )
        return gather_method_options(values, strategy)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        """JSON ``true`` is not a number: a preset's ``"tasks": true`` would run 1 task."""
        annotation = str(cls.model_fields[str(info.field_name)].annotation)
        if "bool" not in annotation and isinstance(v, bool):
            raise ValueError(f"{info.field_name} must be a number, got {v!r}")
        return v

    @field_validator("benchmark")
    @classmethod
    def _benchmark(cls, v: str) -> str:
        from espn.data.registry import BENCHMARKS

        BENCHMARKS.get(v)
        return v

    @field_validator("recipe")
    @classmethod
    def _recipe(cls, v: str | None) -> str | None:
        if v is not None:
            recipe_defaults(v)
        return v

    @field_validator("method")
    @classmethod
    def _method(cls, v: str, info: ValidationInfo) -> str:
        _strategy(v, info)
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        if v is not None:
            from espn.models import resolve

            resolve(v)  # a registered name, or "package.module:Factory(key=value)"
        return v

    @field_validator("device", check_fields=False)
    @classmethod
    def _device(cls, v: str) -> str:
        if not DEVICE.fullmatch(v):
            raise ValueError(f"unknown device {v!r}; choose 'cpu', 'cuda' or 'cuda:N'")
        return v

    @model_validator(mode="after")
    def _resolve(self, info: ValidationInfo) -> _Run:
        from espn.data.registry import BENCHMARKS
        from espn.methods.base import METHODS, Strategy

        bench = BENCHMARKS.get(self.benchmark)
        if self.tasks is not None and bench.max_tasks is not None and self.tasks > bench.max_tasks:
            raise ValueError(
                f"tasks must be <= {bench.max_tasks} for {self.benchmark}, got {self.tasks}"
            )
        strategy = _strategy(self.method, info)
        self._check_folders(bench.needs_folders)
        # another method's options are refused; the method's own checked and completed
        self.method_options = resolve_settings(self.method, strategy.options, self.method_options)
        self._check_sequence(bench.class_orders)
        self._check_from_run(strategy)
        if self.init_weights is not None and not strategy.accepts_pretrained:
            raise ValueError(
                f"method {self.method!r} cannot start from a pretrained first task "
                "(init_weights); methods that can: "
                + ", ".join(n for n in METHODS.names() if METHODS.get(n).accepts_pretrained)
            )
        if self.task_agnostic and strategy.training_tasks is not Strategy.training_tasks:
            raise ValueError(
                f"task_agnostic prepares one sub-network per task; method {self.method!r} "
                "trains every task at once in one network: use one of espn, packnet, supsup, "
                "individual, cpg, rmn"
            )
        self.tasks = self.tasks or (len(self.folders) if self.folders else bench.default_tasks)
        # a setting still unset gets its default (reference_size's is None), finetune_lr the lr
        names = [n for n in SETTING_NAMES if n in type(self).model_fields]
        for name in sorted(names, key=lambda n: n == "finetune_lr"):
            if getattr(self, name) is None:
                setattr(self, name, self.lr if name == "finetune_lr" else default(name))
        self.task_seed = self.seed if self.task_seed is None else self.task_seed
        self.task_train_sizes()  # a list of sizes must have one per task
        strategy.check_config(self.training_settings())
        return self

    def _check_sequence(self, class_orders: tuple[str, ...]) -> None:
        if self.class_order is None:
            self.class_order = class_orders[0] if class_orders else None
        elif self.class_order not in class_orders:
            raise ValueError(
                f"class order {self.class_order!r} is not available for {self.benchmark}; "
                + (
                    f"choose one of: {', '.join(class_orders)}"
                    if class_orders
                    else "it has no class split (leave class_order unset)"
                )
            )

    def _check_from_run(self, strategy: type[Strategy]) -> None:
        """``from_run`` and ``after_task`` go together, for a sequential method, with another
        ``out`` (the run it names: :func:`espn.runs.from_run.open_source`)."""
        if (self.from_run is None) != (self.after_task is None):
            raise ValueError(
                "from_run and after_task go together: --from-run DIR --after-task K "
                "(learn on top of DIR's supernet as it was after its first K tasks)"
            )
        if self.from_run is None or self.after_task is None:
            return
        from espn.methods.base import Strategy

        out = Path(self.out).resolve()
        if out == self.from_run:
            raise ValueError(
                f"from_run {self.from_run} is this run's own --out; the run it starts from is "
                "only read, so give the new run another --out"
            )
        if out.is_relative_to(self.from_run):
            raise ValueError(
                f"--out {self.out} is inside from_run {self.from_run}; the run it starts from is "
                "only read, so give the new run an --out outside it"
            )
        if strategy.training_tasks is not Strategy.training_tasks:
            raise ValueError(
                f"method {self.method!r} learns all its tasks at once, so it cannot learn new "
                "tasks on top of a finished run (from_run); use a sequential method"
            )

    def task_train_sizes(self) -> list[int] | None:
        """Each task's training-set size ``train_sizes`` asks for, or None."""
        if self.train_sizes is None or self.tasks is None:
            return None
        from espn.data.sizes import resolve_train_sizes

        return resolve_train_sizes(self.train_sizes, self.tasks)

    def _check_folders(self, needed: bool) -> None:
        if needed and not self.folders:
            raise ValueError(
                f"benchmark {self.benchmark} needs its task directories: "
                "--folders DIR1,DIR2,... (one ImageFolder directory per task)"
            )
        if self.folders and not needed:
            raise ValueError(f"folders are only used by image-folders, not by {self.benchmark}")
        if self.image_size is not None and not needed:
            raise ValueError(
                f"image_size is only used by image-folders, not by {self.benchmark}; leave it unset"
            )
        if self.tasks is not None and self.folders and self.tasks > len(self.folders):
            raise ValueError(
                f"tasks must be <= the {len(self.folders)} folders given, got {self.tasks}"
            )

    def training_settings(self) -> TrainingSettings:
        """The resolved training settings of this run (method options included)."""
        values = {n: getattr(self, n) for n in SETTING_NAMES if n in type(self).model_fields}
        values["method_options"] = dict(self.method_options)
        return TrainingSettings(**values, stream_pruning=self.stream_pruning)

    #: the same settings, under the name the methods are built with
    method_config = training_settings

    @property  # type: ignore[misc]  # the field of TrainingSettings, to mypy
    def stream_pruning(self) -> str:
        """How the model's residual streams are built and pruned (the method's option)."""
        return str(self.method_options.get("stream_pruning", DEFAULTS.stream_pruning))

    #: the size rule's reference (:meth:`TrainingSettings.floor_reference`), read off these fields
    floor_reference = TrainingSettings.floor_reference


def layered(
    given: Mapping[str, Any],
    *,
    method: Mapping[str, Any] = {},
    preset: Mapping[str, Any] = {},
    recipe: Mapping[str, Any] = {},
) -> dict[str, Any]:
    """The one precedence of both front doors: every option ``given`` (None: not given)
    over the ``method``'s recipe, over the ``preset``'s options, over the ``recipe`` of the
    data's regime; settings none of them sets are left out (:meth:`_Run._resolve` gives them
    their defaults). A recipe's ``reference_size`` and ``warmup`` follow its epochs
    (docs/recipes.md says how)."""
    stated = {k: v for k, v in given.items() if v is not None}
    values = dict(recipe) | dict(preset) | dict(method) | stated
    # set by the user or the preset, not by a recipe
    chosen = {k for k in values if k in stated or (k in preset and k not in method)}
    if "epochs" in chosen and "reference_size" not in chosen:
        values.pop("reference_size", None)
    if "warmup" not in chosen and "warmup" in values:
        pre = _pre_epochs(values.get("epochs", DEFAULTS.epochs))
        if pre is not None:
            warmup = int(values["warmup"])
            own = _pre_epochs((dict(recipe) | dict(method)).get("epochs", DEFAULTS.epochs))
            if "epochs" in chosen and own:  # the recipe's share of the epochs given
                warmup = max(min(warmup, 1), int(warmup * pre / own + 0.5))
            values["warmup"] = max(0, min(warmup, pre - 1))
    return values


def _pre_epochs(epochs: Any) -> int | None:
    """The pre-training epochs of ``epochs`` as any layer gives them (a sequence, or the
    command line's ``"3,4,3"``); None when they cannot be read (validation says why)."""
    try:
        first = epochs.split(",")[0] if isinstance(epochs, str) else epochs[0]
        return int(first)
    except (TypeError, ValueError, IndexError):
        return None


def _fields() -> dict[str, Any]:
    """:class:`RunConfig`'s field of each training setting, from its declaration."""
    fields: dict[str, Any] = {}
    for name, option in OPTIONS.items():
        if name == "stream_pruning":  # the methods' own option (see ``Strategy.options``)
            continue
        if name in RECIPE_SETTINGS:
            fields[name] = (_constrained(name, True), Field(None, description=describe(name)))
        else:
            kind = _constrained(name, option.optional)
            fields[name] = (kind, Field(option.default, description=describe(name)))
    return fields


if TYPE_CHECKING:

    class RunConfig(_Run):  # type: ignore[misc]
        """Everything a continual-learning run depends on."""

else:
    RunConfig = create_model(
        "RunConfig",
        __base__=_Run,
        __module__=__name__,
        __doc__="Everything a continual-learning run depends on: the run's options and a "
        "field per training setting (:class:`espn.settings.training.TrainingSettings`).",
        **_fields(),
    )


def _strategy(name: str, info: ValidationInfo) -> type[Strategy]:
    """The method ``name``: the class being configured, else the registered one."""
    from espn.methods.base import METHODS

    strategy = (info.context or {}).get("strategy")
    return strategy if strategy is not None and strategy.name == name else METHODS.get(name)


def recipe_defaults(name: str) -> Recipe:
    """The values a recipe (a data regime, else a benchmark) gives options left out."""
    from espn.data.registry import BENCHMARKS

    if name in REGIMES:
        return REGIMES.get(name)
    if name in BENCHMARKS:
        return BENCHMARKS.get(name).defaults
    raise ValueError(
        f"unknown recipe {name!r}; choose a recipe ({', '.join(REGIMES.names())}) or a "
        f"benchmark ({', '.join(BENCHMARKS.names())})"
    )


def run_option_names(exclude: tuple[str, ...] = ("out",)) -> list[str]:
    """The keyword options :func:`make_config` takes, methods' options flat."""
    fields = [f for f in RunConfig.model_fields if f not in exclude]
    return fields + [n for n in known_options() if n not in fields]


def make_config(strategy: type[Strategy] | None = None, /, **values: Any) -> RunConfig:
    """A :class:`RunConfig`, a validation error as one readable ConfigError; ``strategy``: a
    method class that need not be registered. The settings and method options given are
    checked first against their declarations alone, before torch is loaded."""
    options = known_options()
    try:
        for name, value in values.items():
            if name in options and value is not None:
                options[name][0].check(value)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    try:
        _Given.model_validate({k: v for k, v in values.items() if k in OPTIONS})
        return RunConfig.model_validate(values, context={"strategy": strategy})
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc, "config")) from None
