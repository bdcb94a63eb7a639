"""Run configuration: validated up front, with messages that name the bad value."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar, cast

import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from espn.data.registry import BENCHMARKS, RunDefaults
from espn.errors import EspnError
from espn.methods.base import (
    DEFAULT_GAMMA,
    METHODS,
    SCHEDULES,
    MethodConfig,
    Strategy,
    declared_options,
)
from espn.models.registry import MODELS
from espn.options import resolve_settings
from espn.training.optim import OPTIMIZERS, OptimConfig

#: orders in which a benchmark's tasks may be learned (see :mod:`espn.data.order`)
TASK_ORDERS = ("given", "random", "large-first", "small-first", "diverse")
#: largest accepted seed (the per-task generators mix seed and task index in 64 bits)
MAX_SEED = 2**32 - 1
#: largest accepted value of the other integer options (batch size, images per task, ...)
MAX_COUNT = 2**31 - 1
#: largest accepted ``image_size``: one 3 x 1024 x 1024 image is 3 MiB decoded
MAX_IMAGE_SIZE = 1024

#: what runs recorded before an option existed behaved as (read from older manifests)
LEGACY_DEFAULTS: dict[str, Any] = {
    "task_affine": True,
    "flop_load": "total",
    "warmup": 0,
    "finetune_schedule": "cosine",
    "task_seed": None,
    "class_order": None,
    "init_weights": None,
    "weight_decay": 0.0,
    "momentum": 0.0,
}
#: run options that became ESPN's own (``method_options``); older configurations have them
#: at the top level, also for methods that never read them
MOVED_TO_METHOD = ("pruner", "penalty", "flop_load", "reuse")
#: what methods did before their recipes became their references' (configurations saved
#: with the moved options at the top level are from then)
LEGACY_METHOD_OPTIONS: dict[str, Any] = {
    "free_init": "keep",
    "packnet_prune": "one-shot",
    "supsup_head": "dense",
    "cpg_zero_released": False,
}


def upgrade_saved_config(values: dict[str, Any]) -> dict[str, Any]:
    """A configuration saved by an older espn, completed with the values that reproduce what
    that espn did (its fine-tuning started from the run's learning rate); method options it
    recorded flat (``supsup_k``, unset ones as null; ESPN's ``pruner``, ``penalty``,
    ``flop_load``, ``reuse`` for every method) move into ``method_options``, which is
    completed with the method's options at what they were then (:data:`LEGACY_METHOD_OPTIONS`)
    or, for an option newer than the run, at its default."""
    values = dict(values)
    declared = declared_options()
    flat_era = any(k in values for k in declared)  # saved before options were the methods'
    legacy = {
        k: v
        for k, v in LEGACY_DEFAULTS.items()
        if k not in values and (flat_era or k not in MOVED_TO_METHOD)
    }
    upgraded = legacy | values
    if "finetune_lr" not in values:
        upgraded["finetune_lr"] = values.get("lr")
    method = values.get("method", "espn")
    if method not in METHODS:
        return gather_method_options(upgraded)
    strategy = METHODS.get(method)
    own = strategy.option_names()  # another method's (ESPN's options in a PackNet run): dropped
    upgraded = gather_method_options(
        {k: v for k, v in upgraded.items() if k not in declared or k in own}
    )
    given = dict(upgraded.get("method_options") or {})
    then = LEGACY_METHOD_OPTIONS if flat_era else {}
    upgraded["method_options"] = {
        o.name: given.get(o.name, then.get(o.name, o.default)) for o in strategy.options
    } | {k: v for k, v in given.items() if k not in own}  # unknown ones: refused on use
    return upgraded


def gather_method_options(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the methods' options given flat (``supsup_k=0.3``: CLI flags, presets,
    sweep points, older configurations) moved into ``method_options``; unset (None) ones
    dropped."""
    declared = declared_options()
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


FINETUNE_SCHEDULES = tuple(s for s in SCHEDULES if s != "ramp")


class ConfigError(EspnError, ValueError):
    """A configuration value is not accepted; the message says which and what would be."""


def check_device(device: str) -> str:
    """Accept ``cpu``, ``cuda`` or ``cuda:N`` when that device is usable here."""
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unknown device {device!r}; choose 'cpu', 'cuda' or 'cuda:N'") from None
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}; choose 'cpu', 'cuda' or 'cuda:N'")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: CUDA is not available here; use --device cpu")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present"
            )
    return device


T = TypeVar("T")


def resolved(value: T | None, name: str) -> T:
    """An option the configuration's validator fills in: never None in a configuration built
    by :func:`make_config` (or ``RunConfig(...)``), only in one made without validation."""
    if value is None:
        raise ConfigError(f"{name} was never resolved; build the configuration with make_config")
    return value


class RunConfig(BaseModel):
    """Everything a continual-learning run depends on. ``None`` means the benchmark's default."""

    # non-finite floats (inf, nan) are refused for every float option, one rule for all
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)

    benchmark: str
    method: str = "espn"
    model: str | None = None
    tasks: int | None = None
    gamma: float | None = None
    alpha: float | None = None
    epochs: tuple[int, int, int] | None = None
    optimizer: str | None = None
    lr: float | None = None
    batch_size: int | None = None
    weight_decay: float | None = None
    momentum: float | None = None
    betas: tuple[float, float] | None = None
    warmup: int | None = None
    finetune_lr: float | None = None
    finetune_schedule: str | None = None
    #: the method's own options (see ``Strategy.options``), completed with their defaults
    method_options: dict[str, Any] = {}
    task_affine: bool = False
    prune_updates_per_epoch: int = 4
    eval_every: int = 1
    train_per_task: int | None = None
    test_per_task: int | None = None
    seed: int = 0
    task_seed: int | None = None
    class_order: str | None = None
    init_weights: Path | None = None
    device: str = "cpu"
    data_dir: Path | None = None
    out: Path = Path("runs/latest")
    preset: str | None = None
    amp: bool = False
    folders: tuple[Path, ...] = ()
    image_size: int | None = None
    train_sizes: str | None = None
    task_order: str = "given"
    from_run: Path | None = None
    after_task: int | None = None
    step_floor: bool = Field(
        True,
        description="the size rule: every phase of a task smaller than the reference size "
        "trains at least as many optimizer steps as its epochs take on the reference size "
        "(more passes over the task's data); off: train by the epochs as given",
    )
    reference_size: int | None = Field(
        None,
        description="training images per task that the epoch counts are stated for (the "
        "size rule's reference); unset: the benchmark recipe's (60000 for the MNIST family, "
        "2500 for the CIFAR splits) when the epochs are the recipe's, none (epochs as "
        "given) when --epochs is given or the benchmark states none",
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """Options given (not None) win over the preset's, which fill in the rest."""
        if not isinstance(data, dict):
            return data
        if data.get("preset") is None:
            return _need_benchmark(gather_method_options(data))
        from espn.presets import load_preset, merge

        values = load_preset(str(data["preset"]))
        accepted = run_option_names(exclude=("preset", "out"))
        unknown = sorted(set(values) - set(accepted))
        if unknown:
            raise ValueError(
                f"preset {data['preset']!r} sets unknown option(s) {', '.join(unknown)}; "
                f"accepted: {', '.join(accepted)}"
            )
        method = data.get("method") or values.get("method") or "espn"
        if method in METHODS and not _takes_recipe_alpha(METHODS.get(method)):
            values.pop("alpha", None)  # e.g. Individual-gamma has no weight budget
        benchmark = str(data.get("benchmark") or values.get("benchmark"))
        if method in METHODS and benchmark in BENCHMARKS:  # the method's recipe wins
            regime = BENCHMARKS.get(benchmark).defaults.get("regime", "")
            for key in METHODS.get(method).run_defaults(regime):
                values.pop(key, None)
        return _need_benchmark(gather_method_options(merge(values, data)))

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, v: Any, info: Any) -> Any:
        """JSON ``true`` is not a number: a preset's ``"tasks": true`` would run 1 task."""
        annotation = str(cls.model_fields[info.field_name].annotation)
        values = v if isinstance(v, list | tuple) else (v,)
        if "bool" not in annotation and any(isinstance(x, bool) for x in values):
            raise ValueError(f"{info.field_name} must be a number, got {v!r}")
        return v

    @field_validator("benchmark")
    @classmethod
    def _benchmark(cls, v: str) -> str:
        BENCHMARKS.get(v)
        return v

    @field_validator("method")
    @classmethod
    def _method(cls, v: str) -> str:
        METHODS.get(v)
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        if v is not None and v not in MODELS:
            from espn.models.reference import is_reference, register_reference

            if is_reference(v):  # "package.module:Factory(key=value)"
                register_reference(v)
        if v is not None:
            MODELS.get(v)
        return v

    @field_validator("optimizer")
    @classmethod
    def _optimizer(cls, v: str | None) -> str | None:
        if v is not None and v not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {v!r}; choose one of: {', '.join(OPTIMIZERS)}")
        return v

    @field_validator("finetune_schedule")
    @classmethod
    def _finetune_schedule(cls, v: str | None) -> str | None:
        return None if v is None else _one_of("fine-tune schedule", v, FINETUNE_SCHEDULES)

    @field_validator("init_weights")
    @classmethod
    def _init_weights(cls, v: Path | None) -> Path | None:
        if v is not None and not Path(v).is_file():
            raise ValueError(f"init_weights: no file {v} (give a .safetensors or .pt file)")
        return v

    @field_validator(
        "tasks",
        "train_per_task",
        "test_per_task",
        "batch_size",
        "prune_updates_per_epoch",
        "eval_every",
        "image_size",
        "reference_size",
    )
    @classmethod
    def _positive(cls, v: int | None, info: Any) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"{info.field_name} must be >= 1, got {v}")
        if v is not None and v > MAX_COUNT:
            raise ValueError(f"{info.field_name} must be <= {MAX_COUNT}, got {v}")
        if info.field_name == "image_size" and v is not None and v > MAX_IMAGE_SIZE:
            raise ValueError(f"image_size must be <= {MAX_IMAGE_SIZE}, got {v}")
        return v

    @field_validator("lr", "finetune_lr")
    @classmethod
    def _lr(cls, v: float | None, info: Any) -> float | None:
        if v is not None and not v > 0:
            raise ValueError(f"{info.field_name} must be > 0, got {v}")
        return v

    @field_validator("weight_decay")
    @classmethod
    def _non_negative(cls, v: float | None, info: Any) -> float | None:
        if v is not None and v < 0:
            raise ValueError(f"{info.field_name} must be >= 0, got {v}")
        return v

    @field_validator("momentum")
    @classmethod
    def _momentum(cls, v: float | None) -> float | None:
        if v is not None and not 0 <= v < 1:
            raise ValueError(f"momentum must be in [0, 1), got {v}")
        return v

    @field_validator("epochs")
    @classmethod
    def _epochs(cls, v: tuple[int, int, int] | None) -> tuple[int, int, int] | None:
        if v is not None and (min(v) < 0 or sum(v) < 1 or max(v) > MAX_COUNT):
            raise ValueError(
                f"epochs must be three non-negative counts (pre-train, prune, fine-tune) "
                f"of at most {MAX_COUNT} "
                f"with at least one epoch, got {','.join(map(str, v))}"
            )
        return v

    @field_validator("seed", "task_seed")
    @classmethod
    def _seed(cls, v: int | None, info: Any) -> int | None:
        if v is not None and not 0 <= v <= MAX_SEED:
            raise ValueError(f"{info.field_name} must be in [0, {MAX_SEED}], got {v}")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        return check_device(v)

    @field_validator("train_sizes", mode="before")
    @classmethod
    def _train_sizes(cls, v: Any) -> str | None:
        return None if v is None else normalise_train_sizes(v)

    @field_validator("task_order")
    @classmethod
    def _task_order(cls, v: str) -> str:
        return _one_of("task order", v, TASK_ORDERS)

    @field_validator("from_run")
    @classmethod
    def _from_run(cls, v: Path | None) -> Path | None:
        return None if v is None else Path(v).resolve()  # the same run from any directory

    @field_validator("after_task")
    @classmethod
    def _after_task(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= MAX_COUNT:
            raise ValueError(f"after_task must be >= 1 (tasks kept from --from-run), got {v}")
        return v

    @model_validator(mode="after")
    def _resolve(self) -> RunConfig:
        bench = BENCHMARKS.get(self.benchmark)
        if self.tasks is not None and bench.max_tasks is not None and self.tasks > bench.max_tasks:
            raise ValueError(
                f"tasks must be <= {bench.max_tasks} for {self.benchmark}, got {self.tasks}"
            )
        strategy = METHODS.get(self.method)
        self._check_folders(bench.needs_folders)
        self._check_method_options(strategy)
        self._check_sequence(bench.class_orders)
        self._check_from_run(strategy)
        if self.init_weights is not None and not strategy.accepts_pretrained:
            raise ValueError(
                f"method {self.method!r} cannot start from a pretrained first task "
                "(init_weights); methods that can: "
                + ", ".join(n for n in METHODS.names() if METHODS.get(n).accepts_pretrained)
            )
        d = cast(
            RunDefaults, bench.defaults | strategy.run_defaults(bench.defaults.get("regime", ""))
        )
        self.tasks = self.tasks or (len(self.folders) if self.folders else bench.default_tasks)
        self.betas = self.betas or d.get("betas", (0.9, 0.999))
        self.gamma = (
            self.gamma
            if self.gamma is not None
            else (DEFAULT_GAMMA if strategy.uses_gamma else 1.0)
        )
        if not strategy.uses_alpha and self.alpha is None:
            self.alpha = 1.0
        elif self.alpha is None:
            self.alpha = strategy.default_alpha or float(d.get("alpha", 0.1))
        self.model = self.model or d.get("model", "fc1024")
        if self.reference_size is None and self.epochs is None:  # the recipe's epochs
            self.reference_size = d.get("reference_size")
        self.epochs = epochs = self.epochs or d.get("epochs", (3, 4, 3))
        self.optimizer = self.optimizer or d.get("optimizer", "adam")
        self.lr = lr = self.lr or d.get("lr", 1e-3)
        self.batch_size = self.batch_size or d.get("batch_size", 128)
        if self.weight_decay is None:
            self.weight_decay = d.get("weight_decay", 0.0)
        if self.momentum is None:
            self.momentum = d.get("momentum", 0.0)
        self._resolve_recipe(d, epochs[0], lr)
        self.task_train_sizes()  # a list of sizes must have one per task
        strategy.check_config(self.method_config())
        return self

    def _resolve_recipe(self, d: RunDefaults, pre: int, lr: float) -> None:
        """Warm-up and fine-tuning: given values, else the benchmark's recipe (``pre``
        pre-training epochs, learning rate ``lr``)."""
        if self.warmup is None:  # the recipe's, leaving at least one full pre-training epoch
            self.warmup = max(0, min(d.get("warmup", 0), pre - 1))
        self.finetune_schedule = self.finetune_schedule or d.get("finetune_schedule", "cosine")
        if self.finetune_lr is None:
            self.finetune_lr = d.get("finetune_lr", lr)
        if self.task_seed is None:
            self.task_seed = self.seed

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
        """``from_run`` and ``after_task`` go together, and name a checkpoint with at least
        ``after_task`` finished tasks of the same method (more is checked when the run starts,
        see :mod:`espn.checkpoint.continuation`)."""
        if (self.from_run is None) != (self.after_task is None):
            raise ValueError(
                "from_run and after_task go together: --from-run DIR --after-task K "
                "(learn on top of DIR's supernet as it was after its first K tasks)"
            )
        if self.from_run is None or self.after_task is None:
            return
        if Path(self.out).resolve() == self.from_run:
            raise ValueError(
                f"from_run {self.from_run} is this run's own --out; the run it starts from is "
                "only read, so give the new run another --out"
            )
        from espn.checkpoint.continuation import source_summary

        if strategy.training_tasks is not Strategy.training_tasks:
            raise ValueError(
                f"method {self.method!r} learns all its tasks at once, so it cannot learn new "
                "tasks on top of a finished run (from_run); use a sequential method"
            )
        method, done = source_summary(Path(self.from_run))
        if method != self.method:
            raise ValueError(
                f"from_run {self.from_run} is a run of method {method!r}; learning on top of "
                f"it needs the same method (--method {method}), got {self.method!r}"
            )
        if self.after_task > done:
            raise ValueError(
                f"after_task must be <= the {done} task(s) finished in {self.from_run}, "
                f"got {self.after_task}"
            )

    def task_train_sizes(self) -> list[int] | None:
        """The training-set size of each task (in the benchmark's given order) that
        ``train_sizes`` asks for, or None (``train_per_task`` for every task)."""
        if self.train_sizes is None or self.tasks is None:
            return None
        return resolve_train_sizes(self.train_sizes, self.tasks)

    def _check_method_options(self, strategy: type[Strategy]) -> None:
        """Options of one method given to another are refused (alpha from a preset is not);
        the method's own are checked against its declaration and completed with defaults."""
        owners = {
            n: m for n, (_, m) in declared_options().items() if n not in strategy.option_names()
        }
        self.method_options = resolve_settings(
            self.method, strategy.options, self.method_options, owners
        )

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

    def method_config(self) -> MethodConfig:
        """The method's settings (budgets, epochs, pruner) from this run configuration."""
        return MethodConfig(
            gamma=float(resolved(self.gamma, "gamma")),
            alpha=float(resolved(self.alpha, "alpha")),
            epochs=resolved(self.epochs, "epochs"),
            prune_updates_per_epoch=self.prune_updates_per_epoch,
            warmup=int(self.warmup or 0),
            finetune_lr=self.finetune_lr,
            finetune_schedule=str(self.finetune_schedule),
            task_affine=self.task_affine,
            settings=dict(self.method_options),
        )

    def floor_reference(self) -> int | None:
        """The reference data size the size rule applies (None: epochs as given); see
        :func:`espn.training.engine.plan_phase`."""
        return self.reference_size if self.step_floor else None

    def optim_config(self) -> OptimConfig:
        """The optimizer's settings from this run configuration."""
        return OptimConfig(
            name=str(self.optimizer),
            lr=float(resolved(self.lr, "lr")),
            weight_decay=float(resolved(self.weight_decay, "weight_decay")),
            momentum=float(resolved(self.momentum, "momentum")),
            betas=resolved(self.betas, "betas"),
        )


TRAIN_SIZES_HELP = (
    "comma-separated sizes, one per task (e.g. 2500,2500,100), or geometric:N1:N2 "
    "(task 1 gets N1, the last N2, geometric in between)"
)


def normalise_train_sizes(value: Any) -> str:
    """``train_sizes`` as given (a list of counts or a string), checked and written as the
    canonical string ``"2500,2500,100"`` or ``"geometric:N1:N2"``."""
    if isinstance(value, list | tuple):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ValueError(f"train_sizes must be {TRAIN_SIZES_HELP}, got {value!r}")
        value = ",".join(str(v) for v in value)
    if not isinstance(value, str):
        raise ValueError(f"train_sizes must be {TRAIN_SIZES_HELP}, got {value!r}")
    text = value.replace(" ", "")
    rule = text.startswith("geometric:")
    parts = text.removeprefix("geometric:").split(":" if rule else ",")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        sizes = []
    if not sizes or (rule and len(sizes) != 2):
        raise ValueError(f"train_sizes must be {TRAIN_SIZES_HELP}, got {value!r}")
    bad = [n for n in sizes if not 1 <= n <= MAX_COUNT]
    if bad:
        raise ValueError(f"train_sizes: every size must be in [1, {MAX_COUNT}], got {bad[0]}")
    return ("geometric:" if rule else "") + (":" if rule else ",").join(map(str, sizes))


def resolve_train_sizes(text: str, n_tasks: int) -> list[int]:
    """Per-task sizes of a canonical ``train_sizes`` string for ``n_tasks`` tasks: the list
    itself (one entry per task), or N1 * (N2/N1)^(t/(n-1)) rounded for ``geometric:N1:N2``."""
    if text.startswith("geometric:"):
        first, last = (int(v) for v in text.removeprefix("geometric:").split(":"))
        if n_tasks == 1:
            return [first]
        ratio = last / first
        return [max(1, round(first * ratio ** (t / (n_tasks - 1)))) for t in range(n_tasks)]
    sizes = [int(v) for v in text.split(",")]
    if len(sizes) != n_tasks:
        raise ValueError(
            f"train_sizes lists {len(sizes)} size(s) but the run has {n_tasks} task(s); "
            "give one size per task, or a rule such as geometric:N1:N2"
        )
    return sizes


def _one_of(what: str, value: str, accepted: tuple[str, ...]) -> str:
    if value not in accepted:
        raise ValueError(f"unknown {what} {value!r}; choose one of: {', '.join(accepted)}")
    return value


def _takes_recipe_alpha(strategy: type[Strategy]) -> bool:
    """Whether a recipe's (preset's, benchmark's) alpha applies to a method: not to one
    without a weight budget, nor to one whose own default differs (Individual: none)."""
    return strategy.uses_alpha and strategy.default_alpha is None


def _need_benchmark(data: dict[str, Any]) -> dict[str, Any]:
    if data.get("benchmark") is None:
        raise ValueError(
            "no benchmark: give --benchmark NAME (see `espn list`) or a preset that sets one; "
            f"benchmarks: {', '.join(BENCHMARKS.names())}"
        )
    return data


def run_option_names(exclude: tuple[str, ...] = ("out",)) -> list[str]:
    """The keyword options :func:`make_config` takes (presets, sweep specs): the run's
    fields, then every option a registered method declares (given flat, e.g. ``supsup_k``)."""
    fields = [f for f in RunConfig.model_fields if f not in exclude]
    return fields + [n for n in declared_options() if n not in fields]


def make_config(**values: Any) -> RunConfig:
    """Build a :class:`RunConfig`, turning validation errors into one readable ConfigError."""
    try:
        return RunConfig(**values)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "config"
            msg = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] == "finite_number":
                where = str(err["loc"][0]) if err["loc"] else where
                msg = f"must be a finite number, got {err['input']!r}"
            lines.append(f"{where}: {msg}")
        raise ConfigError("; ".join(lines)) from None
