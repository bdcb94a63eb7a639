"""The schema of a checkpoint's ``manifest.json``, checked once where it is read
(:func:`espn.checkpoint.format.read_manifest`); fields a model does not name are kept
(``extra="allow"``), so a reader of version N ignores additions of N+1.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from espn.utils.limits import MAX_CLASSES, MAX_INPUT_DIMS, MAX_INPUT_VALUES, MAX_MODEL_VALUES

#: a checkpoint file name: a plain name (no directory part) ending in .safetensors
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.safetensors")


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, protected_namespaces=())


class FileEntry(_Model):
    """A file the manifest names, with its size and SHA-256."""

    file: str
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("file")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if not FILE_NAME.fullmatch(v) or ".." in v:
            raise ValueError(
                f"file name {v!r} is not a plain *.safetensors name inside the checkpoint directory"
            )
        return v


class Spec(_Model):
    """What the model is built for: input shape and dtype, classes, one head or one per task."""

    input_shape: list[int] = Field(min_length=1, max_length=MAX_INPUT_DIMS)
    #: float32, or int64 token ids (a model whose first layer is an embedding)
    input_dtype: Literal["float32", "int64"] = "float32"
    n_classes: int = Field(ge=1, le=MAX_CLASSES)
    multi_head: bool

    @field_validator("input_shape")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(d < 1 for d in v):
            raise ValueError(f"every input dimension must be >= 1, got {v}")
        if math.prod(v) > MAX_INPUT_VALUES:
            raise ValueError(
                f"an input of shape {v} holds {math.prod(v)} values, more than the "
                f"{MAX_INPUT_VALUES} espn allocates for one sample"
            )
        return v


class Architecture(_Model):
    """Layer shapes, unit groups and task modules the checkpoint was written for."""

    layers: dict[str, list[int]]
    groups: dict[str, int]
    task_modules: dict[str, str]

    @model_validator(mode="after")
    def _bounded(self) -> Architecture:
        shapes = [*self.layers.values(), *([g] for g in self.groups.values())]
        if any(d < 0 for shape in shapes for d in shape):
            raise ValueError("layer shapes and unit groups must not be negative")
        values = sum(math.prod(shape) for shape in self.layers.values())
        if values > MAX_MODEL_VALUES or any(g > MAX_MODEL_VALUES for g in self.groups.values()):
            raise ValueError(
                f"its layers hold {values} weights, more than the {MAX_MODEL_VALUES} espn "
                "allocates for a run directory"
            )
        return self


class TaskRecord(_Model):
    """A learned task's budgets and costs, as results.json reports them (a library user's
    checkpoint may leave them out)."""

    flops: int | float | None = None
    flops_ratio: int | float | None = None
    new_weights: int | None = Field(default=None, ge=0)
    weight_budget: int | None = Field(default=None, ge=0)


class TaskEntry(FileEntry):
    """One committed task: its file, classes and results; format 1 also lists its mask
    shapes, format 2 the form of each layer's mask (``masks``) and its ``horizon``."""

    index: int = Field(ge=0)
    shapes: dict[str, list[int]] | None = None
    masks: dict[str, str] | None = None
    horizon: int | None = None
    n_classes: int = Field(ge=1, le=MAX_CLASSES)
    new_weights: int = Field(ge=0)
    name: str | None = None
    record: TaskRecord | None = None
    accuracy: list[int | float] | None = None

    @field_validator("accuracy")
    @classmethod
    def _percentages(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and not all(math.isfinite(a) and 0 <= a <= 100 for a in v):
            raise ValueError("accuracies must be percentages in [0, 100]")
        return v


class StateEntry(FileEntry):
    """The current shared-state file and the save number that wrote it."""

    generation: int = Field(ge=1)


class Position(_Model):
    """Where the task in training stands (see :class:`espn.training.plan.TaskProgress`)."""

    phase: int = Field(ge=0)
    epoch: int = Field(ge=0)
    step: int = Field(ge=0)
    prunes_done: int = Field(ge=0)
    epochs_done: int = Field(ge=0)
    loss: int | float
    #: the phases before ``phase``: what each ran (older checkpoints: absent)
    phases_run: list[dict[str, Any]] = []
    #: the task's training time before the save (older checkpoints: absent, read as 0)
    seconds: int | float = 0.0
    #: the steps of phase ``phase`` so far that trained a slim copy (older checkpoints: absent)
    slim_steps: int = Field(0, ge=0)


class Training(_Model):
    """The task in training, if the save was made between two of its epochs."""

    task: int = Field(ge=0)
    n_classes: int = Field(ge=1, le=MAX_CLASSES)
    position: Position
    optimizer: bool
    optimizer_scalars: dict[str, dict[str, Any]]
    strategy: dict[str, Any]


class Manifest(_Model):
    """``manifest.json`` of format ``espn-checkpoint`` (see :mod:`espn.checkpoint.format`)."""

    format: str
    format_version: int = Field(ge=1)
    espn_version: str | None = None
    model: str
    benchmark: str
    method: str | None = None
    config: dict[str, Any]
    spec: Spec
    n_tasks: int | None = Field(default=None, ge=1)
    architecture: Architecture
    tasks: list[TaskEntry]
    state: StateEntry
    training: Training | None = None
    complete: bool | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        for i, entry in enumerate(self.tasks):
            if entry.index != i:
                raise ValueError(f"tasks[{i}] has index {entry.index}; entries must be 0, 1, ...")
        names = [t.file for t in self.tasks] + [self.state.file]
        if len(set(names)) != len(names):
            raise ValueError("two entries name the same file")
        for key in ("model", "benchmark", "method"):
            mine, recorded = getattr(self, key), self.config.get(key)
            if mine is not None and recorded is not None and mine != recorded:
                raise ValueError(
                    f"{key} is {mine!r} but the recorded configuration says {recorded!r}"
                )
        if self.n_tasks is not None and len(self.tasks) > self.n_tasks:
            raise ValueError(f"{len(self.tasks)} tasks committed of a run of {self.n_tasks}")
        if self.training is not None and self.training.task != len(self.tasks):
            raise ValueError(
                f"task {self.training.task} is in training but {len(self.tasks)} are committed"
            )
        if self.complete and self.n_tasks is not None and len(self.tasks) != self.n_tasks:
            raise ValueError(f"marked complete with {len(self.tasks)} of {self.n_tasks} tasks")
        return self
