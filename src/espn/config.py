"""Run configuration: validated up front, with messages that name the bad value."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from espn.data.order import TASK_ORDERS
from espn.data.registry import BENCHMARKS
from espn.data.sizes import MAX_COUNT, normalise_train_sizes, resolve_train_sizes
from espn.errors import EspnError
from espn.methods.base import METHODS, SCHEDULES, Strategy, declared_options
from espn.options import resolve_settings
from espn.recipes import REGIMES, Recipe
from espn.settings import SETTING_NAMES, TrainingSettings, complete, default, layered
from espn.training.optim import OPTIMIZERS, OptimConfig

#: largest accepted seed (the per-task generators mix seed and task index in 64 bits)
MAX_SEED = 2**32 - 1
#: largest accepted ``image_size``: one 3 x 1024 x 1024 image is 3 MiB decoded
MAX_IMAGE_SIZE = 1024
#: largest magnitude a float option may have: training runs in float32, where a larger
#: learning rate or weight decay overflows to infinity
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


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


#: tuple fields given as one comma-separated string: element type, count, the form in words
COMMA_FORMS: dict[str, tuple[type, int, str]] = {
    "epochs": (int, 3, "three comma-separated integers PRE,PRUNE,FINE (e.g. 3,4,3)"),
    "betas": (float, 2, "two comma-separated numbers B1,B2"),
}

FINETUNE_SCHEDULES = tuple(s for s in SCHEDULES if s != "ramp")


class ConfigError(EspnError, ValueError):
    """A configuration value is not accepted; the message says which and what would be."""


def check_device(device: str) -> str:
    """Accept ``cpu``, ``cuda`` or ``cuda:N`` (whether this machine has it is checked before a
    run starts, see :mod:`espn.preflight`)."""
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unknown device {device!r}; choose 'cpu', 'cuda' or 'cuda:N'") from None
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}; choose 'cpu', 'cuda' or 'cuda:N'")
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

    benchmark: str = Field(
        description="Benchmark name (see `espn list`); required unless the preset sets one."
    )
    method: str = Field("espn", description="Method (see `espn list`).")
    model: str | None = Field(None, description="Model name; default: the benchmark's.")
    tasks: int | None = Field(
        None,
        description="Number of tasks; default: the benchmark's (36 MNIST family, "
        "20 SplitCIFAR100, 5 SplitCIFAR10/SplitFashionMNIST).",
    )
    gamma: float | None = Field(
        None,
        description=(
            "FLOPs budget per task, in (0, 1]; methods without a FLOP constraint accept only "
            f"1; default: {default('gamma')} (see docs/recipes.md, Training settings)."
        ),
    )
    alpha: float | None = Field(
        None,
        description=(
            "Weight allocation in (0, 1]; methods without a weight budget accept only 1; "
            "default: the recipe's (see docs/recipes.md, Training settings)."
        ),
    )
    epochs: tuple[int, int, int] | None = Field(
        None,
        description=(
            "PRE,PRUNE,FINE epochs per task, e.g. 3,4,3, stated for the reference size (see "
            "--step-floor); default: the recipe's (see docs/recipes.md, Training settings)."
        ),
    )
    optimizer: str | None = Field(
        None,
        description=(
            "sgd, nesterov, adam or rmsprop; default: the recipe's (see docs/recipes.md, "
            "Training settings)."
        ),
    )
    lr: float | None = Field(
        None,
        description=(
            "Learning rate; default: the recipe's (see docs/recipes.md, Training settings)."
        ),
    )
    batch_size: int | None = Field(
        None,
        description="Batch size; default: the recipe's (see docs/recipes.md, Training settings).",
    )
    weight_decay: float | None = Field(
        None,
        description=(
            "Weight decay (never reaches frozen weights); default: the recipe's (see "
            "docs/recipes.md, Training settings)."
        ),
    )
    momentum: float | None = Field(
        None,
        description=(
            "Momentum of SGD and RMSprop; default: the recipe's (see docs/recipes.md, "
            "Training settings)."
        ),
    )
    betas: tuple[float, float] | None = Field(
        None,
        description=(
            "B1,B2: Adam's betas; default: the recipe's (see docs/recipes.md, Training settings)."
        ),
    )
    warmup: int | None = Field(
        None,
        description=(
            "Warm-up epochs (free weights only, lr ramp), taken from pre-training; default: "
            "the recipe's (see docs/recipes.md, Training settings)."
        ),
    )
    finetune_lr: float | None = Field(
        None,
        description=(
            "Fine-tuning learning rate; default: the recipe's (see docs/recipes.md, Training "
            "settings); unset there: --lr."
        ),
    )
    finetune_schedule: str | None = Field(
        None,
        description=(
            "Fine-tuning schedule: 'cosine' or 'constant'; default: the recipe's (see "
            "docs/recipes.md, Training settings)."
        ),
    )
    #: the method's own options (see ``Strategy.options``), completed with their defaults;
    #: on the command line each is a flag of its own (see ``espn.cli.options``)
    method_options: dict[str, Any] = Field({}, description="The method's own options.")
    task_affine: bool = Field(
        default("task_affine"),
        description="Beyond the paper: per-task unit scale and shift (FC gates, BatchNorm "
        "affine for every method) and a per-task bias on a shared head.",
    )
    prune_updates_per_epoch: int = Field(
        default("prune_updates_per_epoch"),
        description="Pruning steps per pruning epoch (the schedule's granularity).",
    )
    eval_every: int = Field(
        default("eval_every"),
        description="Evaluate all tasks so far after every K-th task and the last "
        "(accuracy-matrix rows; skipped rows are null).",
    )
    train_per_task: int | None = Field(
        None, description="Keep a seeded subset of N training images per task."
    )
    test_per_task: int | None = Field(
        None, description="Keep a seeded subset of N test images per task."
    )
    seed: int = Field(
        default("seed"), description="Seed of initialisation, batch order and augmentation."
    )
    task_seed: int | None = Field(
        None,
        description="Seed of the task sequence (permutations, rotation/class order, subsets); "
        "default: --seed.",
    )
    class_order: str | None = Field(
        None,
        description="Split benchmarks: 'random' (from the task seed) or 'superclass' (CIFAR-100).",
    )
    init_weights: Path | None = Field(
        None,
        description="Adopt task 0 from pretrained weights (.safetensors or .pt state dict): "
        "its non-zero weights are frozen as the first task.",
    )
    device: str = Field(default("device"), description="cpu, cuda or cuda:N.")
    data_dir: Path | None = Field(
        None, description="Dataset root (default $ESPN_DATA or ~/.cache/espn/data)."
    )
    out: Path = Field(
        Path("runs/latest"),
        description="Run directory for results.json, accuracy.png and checkpoint/.",
        json_schema_extra={"cli_required": True},
    )
    preset: str | None = Field(
        None,
        description="Recipe (see `espn presets`) or a .json/.yaml file of options; explicit "
        "options win over it.",
    )
    amp: bool = Field(
        default("amp"),
        description="Mixed precision: bfloat16 autocast (float16 + loss scaling on a GPU "
        "without bfloat16); on a CPU it warns (rarely faster there).",
    )
    compile: bool = Field(
        default("compile"),
        description="Compile the training step with torch.compile (on CUDA: CUDA graphs and "
        "channels_last convolutions): for a GPU, where a small network's step is "
        "launch-bound; the first steps of a run compile (see docs/performance.md).",
    )
    slim_training: bool = Field(
        default("slim_training"),
        description="Fine-tune each task (and prune it between prune events, once units are "
        "dead) on a physically slimmed copy of its sub-network (alive units only) and evaluate learned tasks through cached slim copies, where that "
        "is exact (docs/performance.md); --no-slim-training: the masked supernet for both.",
    )
    task_agnostic: bool = Field(
        default("task_agnostic"),
        description="Prepare every task for prediction without the task id: train it to reject "
        "its own inputs shifted, calibrate its scores on a held-out tenth of its training data, "
        "and evaluate every task-inference rule at the end (docs/task-agnostic.md).",
    )
    recipe: str | None = Field(
        None,
        description=(
            "Whose recipe fills the options left out: a recipe ('mnist': FC networks on small "
            "images, 'cifar': conv networks, 'imagenet': the cifar one on ResNet50) or a "
            "benchmark's name; default: the benchmark's."
        ),
    )
    folders: tuple[Path, ...] = Field(
        (), description="image-folders: DIR1,DIR2,... one ImageFolder directory per task."
    )
    image_size: int | None = Field(
        None, description="image-folders: side of the square images (default 224)."
    )
    train_sizes: str | None = Field(
        None,
        description="Training images per task, in the given task order: N1,N2,... (one per "
        "task) or geometric:N1:N2 (N1 for the first task, N2 for the last); overrides "
        "--train-per-task.",
    )
    task_order: str = Field(
        "given",
        description="Order the tasks are learned in: given, random (from the task seed), "
        "large-first, small-first (training-set size) or diverse (most diverse first).",
    )
    from_run: Path | None = Field(
        None,
        description="Learn this run's tasks on top of the supernet of the finished run DIR as "
        "it was after its first --after-task tasks (DIR is only read).",
    )
    after_task: int | None = Field(
        None, description="With --from-run: how many of its tasks to keep (K >= 1)."
    )
    step_floor: bool = Field(
        default("step_floor"),
        description="The size rule: every phase of a task smaller than the reference size "
        "trains at least as many optimizer steps as its epochs take on the reference size "
        "(more passes over the task's data); off: train by the epochs as given.",
    )
    reference_size: int | None = Field(
        None,
        description=(
            "Training images per task that the epoch counts are stated for (the size rule's "
            "reference); unset: the recipe's when the epochs are the recipe's, none (epochs "
            "as given) when --epochs is given or the recipe states none."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """The options of the run by the one precedence (:func:`espn.settings.layered`):
        those given (not None), then the method's recipe, then the preset's, then the
        recipe's (``recipe``, else the benchmark's), then the defaults."""
        if not isinstance(data, dict):
            return data
        preset: dict[str, Any] = {}
        if data.get("preset") is not None:
            from espn.presets import load_preset

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
        if isinstance(source, str) and _is_recipe(source):
            recipe = dict(recipe_defaults(source))
        own: dict[str, Any] = {}
        if isinstance(method, str) and method in METHODS:
            own = METHODS.get(method).run_defaults(str(recipe.get("regime", "")))
        # options given as None are unset: those unset by default stay None (an assignment
        # validates every field), the others take their default
        fields = cls.model_fields
        unset = [
            k for k, v in data.items() if v is None and k in fields and fields[k].default is None
        ]
        values = dict.fromkeys(unset) | layered(data, method=own, preset=preset, recipe=recipe)
        values.pop("regime", None)
        return _need_benchmark(gather_method_options(values))

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, v: Any, info: Any) -> Any:
        """JSON ``true`` is not a number: a preset's ``"tasks": true`` would run 1 task."""
        annotation = str(cls.model_fields[info.field_name].annotation)
        values = v if isinstance(v, list | tuple) else (v,)
        if "bool" not in annotation and any(isinstance(x, bool) for x in values):
            raise ValueError(f"{info.field_name} must be a number, got {v!r}")
        return v

    @field_validator("*")
    @classmethod
    def _float32(cls, v: Any, info: Any) -> Any:
        """Every float option fits float32, the dtype training runs in (``--lr 1e308`` would
        overflow to infinity in the first step)."""
        values = v if isinstance(v, tuple) else (v,)
        if any(isinstance(x, float) and abs(x) > FLOAT32_MAX for x in values):
            raise ValueError(
                f"{info.field_name} must be at most {FLOAT32_MAX:.4g} in magnitude (training "
                f"runs in float32), got {v!r}"
            )
        return v

    @field_validator("benchmark")
    @classmethod
    def _benchmark(cls, v: str) -> str:
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
    def _method(cls, v: str) -> str:
        METHODS.get(v)
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        if v is not None:
            from espn.models import resolve

            resolve(v)  # a registered name, or "package.module:Factory(key=value)"
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

    @field_validator("epochs", "betas", mode="before")
    @classmethod
    def _comma_text(cls, v: Any, info: Any) -> Any:
        """``"3,4,3"`` / ``"0.9,0.999"`` (the command line's form) -> a tuple of numbers."""
        if not isinstance(v, str):
            return v
        kind, count, form = COMMA_FORMS[info.field_name]
        values = _comma_separated(v, kind)
        if values is None or len(values) != count:
            raise ValueError(f"--{info.field_name} must be {form}, got {v!r}")
        return values

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not all(0 <= b < 1 for b in v):
            raise ValueError(f"betas must be two numbers in [0, 1), got {v[0]:g},{v[1]:g}")
        return v

    @field_validator("folders", mode="before")
    @classmethod
    def _folders_text(cls, v: Any) -> Any:
        """``"a,b"`` (the command line's form) -> (Path("a"), Path("b"))."""
        if not isinstance(v, str):
            return v
        parts = tuple(Path(p.strip()) for p in v.split(",") if p.strip())
        if not parts:
            raise ValueError(f"--folders must list directories separated by commas, got {v!r}")
        return parts

    @field_validator("epochs", mode="before")
    @classmethod
    def _three_epochs(cls, v: Any) -> Any:
        if isinstance(v, list | tuple) and len(v) != 3:
            raise ValueError(
                "epochs must be three non-negative counts (pre-train, prune, fine-tune), "
                f"got {len(v)} ({','.join(map(str, v))})"
            )
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
        if self.task_agnostic and strategy.training_tasks is not Strategy.training_tasks:
            raise ValueError(
                f"task_agnostic prepares one sub-network per task; method {self.method!r} "
                "trains every task at once in one network: use one of espn, packnet, supsup, "
                "individual, cpg, rmn"
            )
        self.tasks = self.tasks or (len(self.folders) if self.folders else bench.default_tasks)
        fields = [n for n in SETTING_NAMES if n in type(self).model_fields]
        settings = complete({n: getattr(self, n) for n in fields})
        for name in fields:
            setattr(self, name, settings[name])
        if self.finetune_lr is None:  # unset: the run's learning rate
            self.finetune_lr = self.lr
        if self.task_seed is None:
            self.task_seed = self.seed
        self.task_train_sizes()  # a list of sizes must have one per task
        strategy.check_config(self.method_config())
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
        ``out`` (the run it names is checked before the run starts, see :mod:`espn.preflight`)."""
        if (self.from_run is None) != (self.after_task is None):
            raise ValueError(
                "from_run and after_task go together: --from-run DIR --after-task K "
                "(learn on top of DIR's supernet as it was after its first K tasks)"
            )
        if self.from_run is None or self.after_task is None:
            return
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

    def training_settings(self) -> TrainingSettings:
        """The resolved training settings of this run, as the learner and the method get
        them (the method's own options as ``method_options``)."""
        values = {n: getattr(self, n) for n in SETTING_NAMES if n in type(self).model_fields}
        return TrainingSettings(
            **values
            | {
                "gamma": float(resolved(self.gamma, "gamma")),
                "alpha": float(resolved(self.alpha, "alpha")),
                "epochs": resolved(self.epochs, "epochs"),
                "method_options": dict(self.method_options),
                "stream_pruning": self.stream_pruning,
            }
        )

    #: the method's settings (the name it had before :class:`TrainingSettings`)
    method_config = training_settings

    @property
    def stream_pruning(self) -> str:
        """How the model's residual streams are built and pruned (the method's
        ``stream_pruning``; methods that do not prune units leave it at its default, where
        it changes nothing)."""
        return str(self.method_options.get("stream_pruning", default("stream_pruning")))

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


def _comma_separated(text: str, kind: type) -> tuple[Any, ...] | None:
    """``"1,2"`` as a tuple of ``kind`` (int or float), or None when a part is not one."""
    try:
        return tuple(kind(v) for v in text.split(","))
    except ValueError:
        return None


def _one_of(what: str, value: str, accepted: tuple[str, ...]) -> str:
    if value not in accepted:
        raise ValueError(f"unknown {what} {value!r}; choose one of: {', '.join(accepted)}")
    return value


def _is_recipe(name: str) -> bool:
    return name in REGIMES or name in BENCHMARKS


def recipe_defaults(name: str) -> Recipe:
    """The values a recipe gives the options left out: a data regime's (``mnist``,
    ``cifar``), else the benchmark's of that name."""
    if name in REGIMES:
        return REGIMES.get(name)
    if name in BENCHMARKS:
        return BENCHMARKS.get(name).defaults
    raise ValueError(
        f"unknown recipe {name!r}; choose a recipe ({', '.join(REGIMES.names())}) or a "
        f"benchmark ({', '.join(BENCHMARKS.names())})"
    )


def _need_benchmark(data: dict[str, Any]) -> dict[str, Any]:
    if data.get("benchmark") is None:
        raise ValueError(
            "no benchmark: give --benchmark NAME (see `espn list`) or a preset that sets one; "
            f"benchmarks: {', '.join(BENCHMARKS.names())}"
        )
    return data


#: the run options that shape how tasks are learned, whatever the data (the training
#: settings, :class:`~espn.settings.TrainingSettings`, that are run options, and a preset):
#: the settings of :class:`espn.ContinualLearner` under the same names (the others say which
#: data to learn, and where results go)
TRAINING_SETTINGS = (
    *(n for n in SETTING_NAMES if n in RunConfig.model_fields and n != "device"),
    "preset",
)


def run_option_names(exclude: tuple[str, ...] = ("out",)) -> list[str]:
    """The keyword options :func:`make_config` takes (presets, sweep specs): the run's
    fields, then every option a registered method declares (given flat, e.g. ``supsup_k``)."""
    fields = [f for f in RunConfig.model_fields if f not in exclude]
    return fields + [n for n in declared_options() if n not in fields]


def check_applicable(given: dict[str, Any], cfg: RunConfig) -> None:
    """Refuse options the user gave explicitly (``given``: the keywords of ``espn.run``, the
    flags of ``espn run``) that this run would ignore: the size rule's ``reference_size``
    with ``step_floor`` off, ``stream_pruning`` on a model whose residual streams it does
    not build, and a method's own options its other settings leave unused (see
    :meth:`Strategy.check_given`). Saved configurations, which record every option, are not
    checked."""
    from espn.models.resnet import STREAM_MODELS

    names = {k for k, v in given.items() if v is not None}
    names |= {k for k, v in dict(given.get("method_options") or {}).items() if v is not None}
    if "reference_size" in names and not cfg.step_floor:
        raise ConfigError(
            "reference_size: the size rule is off (step_floor false, --no-step-floor), so "
            "the reference size it is stated for cannot apply; leave --reference-size out or "
            "turn the size rule on"
        )
    if "stream_pruning" in names and cfg.model not in STREAM_MODELS:
        raise ConfigError(
            f"stream_pruning: it sets how espn's registered ResNets ({', '.join(STREAM_MODELS)}) "
            f"build their residual streams; model {cfg.model!r} has none it builds (a "
            "converted model's streams are coupled), so leave --stream-pruning out"
        )
    strategy = METHODS.get(cfg.method)
    try:
        strategy.check_given(cfg.method_options, names & set(strategy.option_names()))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def make_config(**values: Any) -> RunConfig:
    """Build a :class:`RunConfig`, turning validation errors into one readable ConfigError."""
    try:
        return RunConfig(**values)
    except ValidationError as exc:
        raise config_error(exc) from None


def config_error(exc: ValidationError) -> ConfigError:
    """A :class:`RunConfig` validation error as one line, ``field: what is wrong``."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "config"
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "finite_number":
            where = str(err["loc"][0]) if err["loc"] else where
            msg = f"must be a finite number, got {err['input']!r}"
        lines.append(f"{where}: {msg}")
    return ConfigError("; ".join(lines))
