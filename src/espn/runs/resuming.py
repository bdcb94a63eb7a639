"""The checkpoint of one run directory as a learner writes it (:class:`RunCheckpoint`), and the
task in training it keeps: saved at an epoch's end (:func:`snapshot`), put back into a freshly
built learner to continue exactly where a killed run stopped (:func:`continue_training`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from espn.checkpoint import (
    Checkpoint,
    CheckpointWriter,
    TrainingSnapshot,
    TrainingState,
    read_checkpoint,
    restore,
    restore_working,
)
from espn.checkpoint.format import MANIFEST, checkpoint_dir
from espn.data.tasks import TaskSequence
from espn.inference.stored import check_statistics
from espn.methods.base import Strategy
from espn.runs.checks import RunMismatch, check_results_match, option_differences, run_meta
from espn.runs.config import RunConfig
from espn.runs.legacy import upgrade_saved_config
from espn.supernet.supernet import Supernet
from espn.training.engine import Engine
from espn.training.plan import TaskProgress

#: :class:`TaskProgress` fields the checkpoint stores as plain numbers (the optimizer's state
#: goes to the state file as tensors)
POSITION = tuple(f.name for f in fields(TaskProgress) if f.name != "optimizer")


def snapshot(task: int, progress: TaskProgress, strategy: Strategy) -> TrainingSnapshot:
    """Task ``task`` in training, at ``progress``, as the checkpoint stores it."""
    position = {k: getattr(progress, k) for k in POSITION}
    return TrainingSnapshot(task, position, progress.optimizer, strategy.state_dict())


def progress_of(training: TrainingState) -> TaskProgress:
    """Where the task in training read from a checkpoint continues (the engine's terms)."""
    return TaskProgress(**training.position, optimizer=training.optimizer)


def scaler_state(engine: Engine | None) -> dict[str, Any] | None:
    """The engine's mixed-precision loss scale (float16 on CUDA), which persists across tasks."""
    scaler = getattr(engine, "scaler", None)
    return scaler.state_dict() if scaler is not None and scaler.is_enabled() else None


def continue_training(
    ckpt: Checkpoint, supernet: Supernet, engine: Engine, strategy: Strategy
) -> None:
    """After :func:`espn.checkpoint.restore`: the task in training, the strategy's state, the loss
    scale and the RNGs, so that training continues as if never stopped."""
    tr = ckpt.training
    if tr is not None:
        restore_working(tr, supernet)
        device = next(supernet.parameters()).device
        strategy.load_state_dict(
            {k: v.to(device) if isinstance(v, Tensor) else v for k, v in tr.strategy.items()}
        )
    saved_scale = ckpt.manifest.get("grad_scaler")
    scaler = getattr(engine, "scaler", None)
    if saved_scale and scaler is not None and scaler.is_enabled():
        scaler.load_state_dict(saved_scale)
    torch.set_rng_state(ckpt.rng["torch"])
    if "engine" in ckpt.rng:  # not in a checkpoint saved without the engine
        engine.generator.set_state(ckpt.rng["engine"])
    if "cuda" in ckpt.rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(ckpt.rng["cuda"])


def finished(
    entries: list[dict[str, Any]],
) -> tuple[list[list[float] | None], list[dict[str, Any]]]:
    """The accuracy rows and records of a checkpoint's finished task entries."""
    rows = [
        None if e["accuracy"] is None else list(e["accuracy"]) for e in entries if "accuracy" in e
    ]
    return rows, [dict(e["record"]) for e in entries]


def training_position(task: int, progress: TaskProgress, strategy: Strategy) -> str:
    """Where a task's training stands in the engine's units: passes over its training data and
    optimizer steps of the phase in progress."""
    phases = strategy.phases()
    passes = f"{progress.epochs_done} pass{'es' * (progress.epochs_done != 1)}"
    if progress.phase >= len(phases):
        return f"task {task} continues after all its phases ({passes} over its training data done)"
    name, step = phases[progress.phase].name, progress.step
    at = (
        f"at the start of its {name} phase"
        if step == 0
        else f"in its {name} phase after {step} optimizer step{'s' * (step != 1)} of it"
    )
    return f"task {task} continues {at} ({passes} over its training data done)"


@dataclass
class RunCheckpoint:
    """The checkpoint of one run directory: the writer and where to pick up."""

    #: None: this process only reads the checkpoint (a data-parallel rank other than 0)
    writer: CheckpointWriter | None
    supernet: Supernet
    engine: Engine
    rows: list[list[float] | None]
    per_task: list[dict[str, Any]]
    training: TrainingState | None = None
    elapsed: float = 0.0
    summary: str = ""
    manifest: dict[str, Any] | None = None

    @classmethod
    def open(
        cls,
        cfg: RunConfig,
        seq: TaskSequence,
        supernet: Supernet,
        engine: Engine,
        strategy: Strategy,
        resume: bool,
        ignore: tuple[str, ...] = (),
        writes: bool = True,
    ) -> RunCheckpoint:
        """A fresh checkpoint in ``<out>/checkpoint``, or, with ``resume``, the saved one loaded
        into the freshly built ``supernet``, ``engine`` and ``strategy`` (without ``writes``,
        read only: nothing is written or removed).

        Resuming where no checkpoint was written yet (killed in the first epoch) starts over; a
        checkpoint that is there but unreadable, too new or of other options (but those in
        ``ignore``) is refused. Without ``resume`` the caller has checked ``check_out_dir``.
        """
        directory = checkpoint_dir(cfg.out)
        if not resume or not (directory / MANIFEST).exists():
            writer = CheckpointWriter(directory, run_meta(cfg, seq)) if writes else None
            note = f"no checkpoint in {directory}; starting from the first task" if resume else ""
            return cls(writer, supernet, engine, [], [], summary=note)
        ckpt = read_checkpoint(directory)
        saved = upgrade_saved_config(ckpt.manifest["config"])
        diffs = option_differences(saved, cfg, ignore)
        if diffs:
            raise RunMismatch(directory, diffs)
        check_results_match(cfg.out, ckpt.manifest)
        restore(ckpt, supernet, strategy.weights)
        check_statistics(supernet, ckpt.directory)
        continue_training(ckpt, supernet, engine, strategy)
        tr = ckpt.training
        where = "" if tr is None else "; " + training_position(tr.task, progress_of(tr), strategy)
        total = ckpt.manifest.get("n_tasks", len(seq))
        return cls(
            CheckpointWriter.resume(ckpt) if writes else None,
            supernet,
            engine,
            *finished(ckpt.tasks),
            training=ckpt.training,
            elapsed=float(ckpt.manifest.get("wall_time_s", 0.0)),
            summary=f"resuming {directory}: {len(ckpt.masks)}/{total} tasks done{where}",
            manifest=ckpt.manifest,
        )

    def resume_point(self, task: int) -> TaskProgress | None:
        """Where task ``task`` continues from (None: from its start)."""
        if self.training is not None and self.training.task == task:
            return progress_of(self.training)
        return None

    def save_progress(
        self,
        task: int,
        progress: TaskProgress,
        strategy: Strategy,
        seq: TaskSequence,
        extra: dict[str, Any],
    ) -> None:
        """Checkpoint task ``task`` in training (at an epoch's end)."""
        self._save(seq, extra | {"complete": False}, snapshot(task, progress, strategy))

    def task_done(self, seq: TaskSequence, elapsed: float, extra: dict[str, Any]) -> None:
        """Checkpoint after a task was committed and evaluated."""
        self.training = None
        complete = len(self.per_task) == len(seq)
        self._save(seq, extra | {"wall_time_s": elapsed, "complete": complete})

    def _save(
        self, seq: TaskSequence, extra: dict[str, Any], training: TrainingSnapshot | None = None
    ) -> None:
        if self.writer is not None:
            self.writer.save(
                self.supernet,
                self._results(seq),
                training=training,
                extra=extra,
                generator=self.engine.generator,
                grad_scaler=scaler_state(self.engine),
            )

    def _results(self, seq: TaskSequence) -> list[dict[str, Any]]:
        names = seq.names(len(self.per_task))
        return [
            {"name": names[t], "record": self.per_task[t]}
            | ({"accuracy": self.rows[t]} if t < len(self.rows) else {})
            for t in range(len(self.per_task))
        ]
