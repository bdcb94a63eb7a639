"""The options of a run that are not training settings, declared once (the ``espn run`` flags
are generated from them); :class:`espn.runs.config.RunConfig` adds the training settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from espn.settings.training import MAX_COUNT, MAX_SEED

#: largest accepted ``image_size``: one 3 x 1024 x 1024 image is 3 MiB decoded
MAX_IMAGE_SIZE = 1024


class RunFields(BaseModel):
    """What a run learns from and where it writes."""

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
    #: the method's own options (see ``Strategy.options``), completed with their defaults;
    #: on the command line each is a flag of its own (see ``espn.cli.options``)
    method_options: dict[str, Any] = Field({}, description="The method's own options.")
    train_per_task: int | None = Field(
        None, description="Keep a seeded subset of N training images per task."
    )
    test_per_task: int | None = Field(
        None, description="Keep a seeded subset of N test images per task."
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

    @field_validator("tasks", "train_per_task", "test_per_task", "image_size", "after_task")
    @classmethod
    def _positive(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"{info.field_name} must be >= 1, got {v}")
        if v is not None and v > MAX_COUNT:
            raise ValueError(f"{info.field_name} must be <= {MAX_COUNT}, got {v}")
        if info.field_name == "image_size" and v is not None and v > MAX_IMAGE_SIZE:
            raise ValueError(f"image_size must be <= {MAX_IMAGE_SIZE}, got {v}")
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

    @field_validator("task_seed")
    @classmethod
    def _seed(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v <= MAX_SEED:
            raise ValueError(f"task_seed must be in [0, {MAX_SEED}], got {v}")
        return v

    @field_validator("train_sizes", mode="before")
    @classmethod
    def _train_sizes(cls, v: Any) -> str | None:
        from espn.data.sizes import normalise_train_sizes

        return None if v is None else normalise_train_sizes(v)

    @field_validator("task_order")
    @classmethod
    def _task_order(cls, v: str) -> str:
        from espn.data.order import TASK_ORDERS

        if v not in TASK_ORDERS:
            raise ValueError(f"unknown task order {v!r}; choose one of: {', '.join(TASK_ORDERS)}")
        return v

    @field_validator("from_run")
    @classmethod
    def _from_run(cls, v: Path | None) -> Path | None:
        return None if v is None else Path(v).resolve()  # the same run from any directory
