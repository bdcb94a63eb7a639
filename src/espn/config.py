"""Run configuration: validated up front, with messages that name the bad value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from espn.data.registry import BENCHMARKS
from espn.methods.base import METHODS, MethodConfig
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
    betas: tuple[float, float] = (0.9, 0.999)
    pruner: str = "flop-aware"
    penalty: float = 1e-4
    reuse: str = "magnitude"
    prune_updates_per_epoch: int = 4
    train_per_task: int | None = None
    test_per_task: int | None = None
    seed: int = 0
    device: str = "cpu"
    data_dir: Path | None = None
    out: Path = Path("runs/latest")

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

    @field_validator(
        "tasks", "train_per_task", "test_per_task", "batch_size", "prune_updates_per_epoch"
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
        d = bench.defaults
        self.tasks = self.tasks or bench.default_tasks
        self.gamma = self.gamma if self.gamma is not None else (0.2 if strategy.uses_gamma else 1.0)
        self.alpha = self.alpha if self.alpha is not None else float(d.get("alpha", 0.1))
        self.model = self.model or str(d.get("model", "fc1024"))
        self.epochs = self.epochs or tuple(d.get("epochs", (3, 4, 3)))
        self.optimizer = self.optimizer or str(d.get("optimizer", "adam"))
        self.lr = self.lr or float(d.get("lr", 1e-3))
        self.batch_size = self.batch_size or int(d.get("batch_size", 128))
        return self

    def method_config(self) -> MethodConfig:
        return MethodConfig(
            gamma=float(self.gamma),
            alpha=float(self.alpha),
            epochs=self.epochs,
            pruner=self.pruner,
            penalty=self.penalty,
            reuse=self.reuse,
            prune_updates_per_epoch=self.prune_updates_per_epoch,
        )

    def optim_config(self) -> OptimConfig:
        return OptimConfig(
            name=str(self.optimizer),
            lr=float(self.lr),
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            betas=self.betas,
        )


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
