"""Run configuration: validated up front, with messages that name the bad value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from espn.data.registry import BENCHMARKS
from espn.methods.base import METHODS, MethodConfig, Strategy
from espn.models.registry import MODELS
from espn.pruning.pruner import PRUNERS
from espn.training.optim import OPTIMIZERS, OptimConfig

REUSE_POLICIES = ("magnitude", "all")


class ConfigError(ValueError):
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


def _in_unit_interval(name: str, value: float | None) -> float | None:
    if value is not None and not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {value}")
    return value


class RunConfig(BaseModel):
    """Everything a continual-learning run depends on. ``None`` means the benchmark's default."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

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
    weight_decay: float = 0.0
    momentum: float = 0.0
    betas: tuple[float, float] | None = None
    pruner: str = "flop-aware"
    penalty: float = 1e-4
    supsup_k: float | None = None
    reuse: str = "magnitude"
    prune_updates_per_epoch: int = 4
    eval_every: int = 1
    train_per_task: int | None = None
    test_per_task: int | None = None
    seed: int = 0
    device: str = "cpu"
    data_dir: Path | None = None
    out: Path = Path("runs/latest")
    preset: str | None = None
    amp: bool = False
    folders: tuple[Path, ...] = ()
    image_size: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """Options given (not None) win over the preset's, which fill in the rest."""
        if not isinstance(data, dict):
            return data
        if data.get("preset") is None:
            return _need_benchmark(data)
        from espn.presets import load_preset, merge

        values = load_preset(str(data["preset"]))
        unknown = sorted(set(values) - set(cls.model_fields))
        if unknown:
            raise ValueError(
                f"preset {data['preset']!r} sets unknown option(s) {', '.join(unknown)}; "
                f"accepted: {', '.join(f for f in cls.model_fields if f not in ('preset', 'out'))}"
            )
        return _need_benchmark(merge(values, data))

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
        if v is not None:
            MODELS.get(v)
        return v

    @field_validator("pruner")
    @classmethod
    def _pruner(cls, v: str) -> str:
        PRUNERS.get(v)
        return v

    @field_validator("optimizer")
    @classmethod
    def _optimizer(cls, v: str | None) -> str | None:
        if v is not None and v not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {v!r}; choose one of: {', '.join(OPTIMIZERS)}")
        return v

    @field_validator("reuse")
    @classmethod
    def _reuse(cls, v: str) -> str:
        if v not in REUSE_POLICIES:
            raise ValueError(
                f"unknown reuse policy {v!r}; choose one of: {', '.join(REUSE_POLICIES)}"
            )
        return v

    @field_validator("gamma")
    @classmethod
    def _gamma(cls, v: float | None) -> float | None:
        return _in_unit_interval("gamma", v)

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, v: float | None) -> float | None:
        return _in_unit_interval("alpha", v)

    @field_validator("supsup_k")
    @classmethod
    def _supsup_k(cls, v: float | None) -> float | None:
        return _in_unit_interval("supsup_k", v)

    @field_validator(
        "tasks",
        "train_per_task",
        "test_per_task",
        "batch_size",
        "prune_updates_per_epoch",
        "eval_every",
        "image_size",
    )
    @classmethod
    def _positive(cls, v: int | None, info: Any) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"{info.field_name} must be >= 1, got {v}")
        return v

    @field_validator("lr")
    @classmethod
    def _lr(cls, v: float | None) -> float | None:
        if v is not None and not v > 0:
            raise ValueError(f"lr must be > 0, got {v}")
        return v

    @field_validator("weight_decay", "penalty")
    @classmethod
    def _non_negative(cls, v: float, info: Any) -> float:
        if v < 0:
            raise ValueError(f"{info.field_name} must be >= 0, got {v}")
        return v

    @field_validator("momentum")
    @classmethod
    def _momentum(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError(f"momentum must be in [0, 1), got {v}")
        return v

    @field_validator("epochs")
    @classmethod
    def _epochs(cls, v: tuple[int, int, int] | None) -> tuple[int, int, int] | None:
        if v is not None and (min(v) < 0 or sum(v) < 1):
            raise ValueError(
                f"epochs must be three non-negative counts (pre-train, prune, fine-tune) "
                f"with at least one epoch, got {','.join(map(str, v))}"
            )
        return v

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"seed must be >= 0, got {v}")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        return check_device(v)

    @model_validator(mode="after")
    def _resolve(self) -> RunConfig:
        bench = BENCHMARKS.get(self.benchmark)
        if self.tasks is not None and bench.max_tasks is not None and self.tasks > bench.max_tasks:
            raise ValueError(
                f"tasks must be <= {bench.max_tasks} for {self.benchmark}, got {self.tasks}"
            )
        strategy = METHODS.get(self.method)
        if not strategy.uses_gamma and self.gamma not in (None, 1.0):
            raise ValueError(
                f"method {self.method!r} has no FLOP constraint; gamma must be 1 or unset, "
                f"got {self.gamma}"
            )
        self._check_folders(bench.needs_folders)
        self._check_method_options(strategy)
        d = bench.defaults
        self.tasks = self.tasks or (len(self.folders) if self.folders else bench.default_tasks)
        self.betas = self.betas or tuple(d.get("betas", (0.9, 0.999)))
        self.gamma = self.gamma if self.gamma is not None else (0.2 if strategy.uses_gamma else 1.0)
        if not strategy.uses_alpha:
            self.alpha = 1.0
        elif self.alpha is None:
            self.alpha = strategy.default_alpha or float(d.get("alpha", 0.1))
        self.model = self.model or str(d.get("model", "fc1024"))
        self.epochs = self.epochs or tuple(d.get("epochs", (3, 4, 3)))
        self.optimizer = self.optimizer or str(d.get("optimizer", "adam"))
        self.lr = self.lr or float(d.get("lr", 1e-3))
        self.batch_size = self.batch_size or int(d.get("batch_size", 128))
        return self

    def _check_method_options(self, strategy: type[Strategy]) -> None:
        """Options of one method given to another are refused (alpha from a preset is not)."""
        if self.supsup_k is not None and self.method != "supsup":
            raise ValueError(
                f"supsup_k applies to method 'supsup' only, not {self.method!r}; leave it unset"
            )
        if not strategy.uses_gamma and self.pruner != "flop-aware":
            pruning = ", ".join(n for n in METHODS.names() if METHODS.get(n).uses_gamma)
            raise ValueError(
                f"method {self.method!r} prunes no units, so pruner {self.pruner!r} would be "
                f"ignored; pruners apply to: {pruning}"
            )
        if self.method == "supsup" and self.supsup_k is None:
            self.supsup_k = 0.5
        if strategy.uses_alpha or self.alpha in (None, 1.0):
            return
        if self.preset is not None:
            from espn.presets import load_preset

            if load_preset(self.preset).get("alpha") == self.alpha:
                return
        raise ValueError(
            f"method {self.method!r} has no weight budget; alpha must be 1 or unset, "
            f"got {self.alpha}"
        )

    def _check_folders(self, needed: bool) -> None:
        if needed and not self.folders:
            raise ValueError(
                f"benchmark {self.benchmark} needs its task directories: "
                "--folders DIR1,DIR2,... (one ImageFolder directory per task)"
            )
        if self.folders and not needed:
            raise ValueError(f"folders are only used by image-folders, not by {self.benchmark}")
        if self.tasks is not None and self.folders and self.tasks > len(self.folders):
            raise ValueError(
                f"tasks must be <= the {len(self.folders)} folders given, got {self.tasks}"
            )

    def method_config(self) -> MethodConfig:
        """The method's settings (budgets, epochs, pruner) from this run configuration."""
        return MethodConfig(
            gamma=float(self.gamma),
            alpha=float(self.alpha),
            epochs=self.epochs,
            pruner=self.pruner,
            penalty=self.penalty,
            reuse=self.reuse,
            prune_updates_per_epoch=self.prune_updates_per_epoch,
            supsup_k=float(self.supsup_k or 0.5),
        )

    def optim_config(self) -> OptimConfig:
        """The optimizer's settings from this run configuration."""
        return OptimConfig(
            name=str(self.optimizer),
            lr=float(self.lr),
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            betas=self.betas,
        )


def _need_benchmark(data: dict[str, Any]) -> dict[str, Any]:
    if data.get("benchmark") is None:
        raise ValueError(
            "no benchmark: give --benchmark NAME (see `espn list`) or a preset that sets one; "
            f"benchmarks: {', '.join(BENCHMARKS.names())}"
        )
    return data


def make_config(**values: Any) -> RunConfig:
    """Build a :class:`RunConfig`, turning validation errors into one readable ConfigError."""
    try:
        return RunConfig(**values)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "config"
            msg = str(err["msg"]).removeprefix("Value error, ")
            lines.append(f"{where}: {msg}")
        raise ConfigError("; ".join(lines)) from None
