"""The options of a run that are not training settings, declared once (the ``espn run`` flags
are generated from them); :class:`espn.runs.config.RunConfig` adds the training settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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
