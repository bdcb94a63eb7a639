"""A run directory as a learner writes and resumes it (:class:`RunDirectory`, the same for ``espn
run`` and ``ContinualLearner(..., out=DIR)``): checkpointed after every learned step and at an
epoch's end (:func:`snapshot`), so a killed run continues exactly (docs/checkpoints.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
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
from espn.checkpoint.format import MANIFEST, CheckpointError, checkpoint_dir
from espn.data.tasks import TaskSequence
from espn.evaluation.plots import plot_run
from espn.inference.stored import check_statistics
from espn.methods.base import Strategy
from espn.runs.checks import (
    RunMismatch,
    check_results_match,
    option_differences,
    results_document,
    run_meta,
)
from espn.runs.config import RunConfig
from espn.runs.legacy import upgrade_saved_config
from espn.supernet.supernet import Supernet
from espn.training.callbacks import Callback, EpochEnd
from espn.training.distributed import writes_files
from espn.training.engine import Engine
from espn.training.plan import TaskProgress
from espn.utils.io import os_error_text, write_json_atomic

#: The most checkpoints of a task in training per phase (a phase of more passes checkpoints
#: every k-th pass and its last), so that writing the run's state costs less than training it.
CHECKPOINTS_PER_PHASE = 50

#: Seconds between two checkpoints of a task in training, at least (a phase's last pass is
#: always checkpointed): a kill loses at most this much training. 0: every pass
#: :func:`checkpointed` names.
CHECKPOINT_SECONDS = 60.0

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


def checkpointed(epoch: int, n_epochs: int) -> bool:
    """Whether the end of pass ``epoch`` of a phase of ``n_epochs`` may be checkpointed: every pass,
    or every ``ceil(n_epochs / CHECKPOINTS_PER_PHASE)``-th and the last."""
    every = -(-n_epochs // CHECKPOINTS_PER_PHASE)
    return (epoch + 1) % every == 0 or epoch + 1 == n_epochs


def checkpoint_due(epoch: int, n_epochs: int, since: float) -> bool:
    """Whether pass ``epoch``'s end is checkpointed ``since`` seconds after the last checkpoint: a
    phase's last always, another :func:`checkpointed` names after :data:`CHECKPOINT_SECONDS`."""
    if epoch + 1 == n_epochs:
        return True
    return checkpointed(epoch, n_epochs) and since >= CHECKPOINT_SECONDS


class RunDirectory(Callback):
    """A learner's run directory, a callback: :meth:`open` starts or resumes its checkpoint,
    ``on_epoch_end`` checkpoints the task in training, :meth:`step_done` commits each learned
    step, ``on_run_end`` draws the plot.

    ``sequence`` gives the tasks as the run knows them, ``notes`` what the run could not do as
    asked; ``meta``, when given, what the manifest records, asked anew at every write (a Python
    run grows one task at a time).
    """

    def __init__(
        self,
        cfg: RunConfig,
        sequence: Callable[[], TaskSequence],
        notes: list[str] | None = None,
        meta: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.cfg, self.sequence, self.notes, self.meta = cfg, sequence, list(notes or []), meta
        self.out = Path(cfg.out)
        self.writes = writes_files()  # not a data-parallel rank other than 0, which only reads
        #: None: this process only reads the checkpoint
        self.writer: CheckpointWriter | None = None
        #: the finished steps' accuracy rows and tasks' records the checkpoint holds
        self.rows: list[list[float] | None] = []
        self.per_task: list[dict[str, Any]] = []
        self.training: TrainingState | None = None
        self.manifest: dict[str, Any] | None = None
        #: how the checkpoint was found ("" if not resumed)
        self.summary = ""
        self.doc: dict[str, Any] = {}
        self.start = time.perf_counter()
        #: when the checkpoint was last written (``time.monotonic()``)
        self.saved_at = time.monotonic()

    def open(
        self,
        supernet: Supernet,
        engine: Engine,
        strategy: Strategy,
        resume: bool,
        ignore: tuple[str, ...] = (),
    ) -> None:
        """Start a fresh checkpoint in ``<out>/checkpoint``, or, with ``resume``, load the saved
        one into the freshly built ``supernet``, ``engine`` and ``strategy``.

        Resuming where no checkpoint was written yet (killed in the first epoch) starts over; a
        checkpoint that is there but unreadable, too new or of other options (but those in
        ``ignore``) is refused. Without ``resume`` the caller has checked ``check_out_dir``.
        """
        self.supernet, self.engine, self.strategy = supernet, engine, strategy
        self.start, self.saved_at = time.perf_counter(), time.monotonic()
        directory, seq = checkpoint_dir(self.out), self.sequence()  # as it is before restoring
        if not resume or not (directory / MANIFEST).exists():
            self.writer = (
                CheckpointWriter(directory, run_meta(self.cfg, seq)) if self.writes else None
            )
            if resume:
                self.summary = f"no checkpoint in {directory}; starting from the first task"
            return
        ckpt = read_checkpoint(directory)
        saved = upgrade_saved_config(ckpt.manifest["config"])
        diffs = option_differences(saved, self.cfg, ignore)
        if diffs:
            raise RunMismatch(directory, diffs)
        check_results_match(self.out, ckpt.manifest)
        restore(ckpt, supernet, strategy.weights)
        check_statistics(supernet, ckpt.directory)
        continue_training(ckpt, supernet, engine, strategy)
        tr = self.training = ckpt.training
        where = "" if tr is None else "; " + training_position(tr.task, progress_of(tr), strategy)
        total = ckpt.manifest.get("n_tasks", len(seq))
        self.summary = f"resuming {directory}: {len(ckpt.masks)}/{total} tasks done{where}"
        self.writer = CheckpointWriter.resume(ckpt) if self.writes else None
        self.rows, self.per_task = finished(ckpt.tasks)
        self.manifest = ckpt.manifest
        self.start -= float(ckpt.manifest.get("wall_time_s", 0.0))

    def resume_point(self, task: int) -> TaskProgress | None:
        """Where task ``task`` continues from (None: from its start)."""
        if self.training is not None and self.training.task == task:
            return progress_of(self.training)
        return None

    def elapsed(self) -> float:
        """Wall time of the run so far, the time before a resumption included."""
        return time.perf_counter() - self.start

    def on_epoch_end(self, learner: Any, event: EpochEnd) -> None:
        """Checkpoint the task in training, at the passes :func:`checkpoint_due` names."""
        if not checkpoint_due(event.epoch, event.n_epochs, time.monotonic() - self.saved_at):
            return  # its position is not read: a slim copy's write-back waits
        if event.position is None:
            return
        training = snapshot(event.task, event.position, self.strategy)
        self._save({"wall_time_s": self.elapsed(), "complete": False}, training)

    def step_done(
        self, rows: list[list[float] | None], records: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """After a step: commit the checkpoint, then rewrite ``results.json`` from it."""
        self.rows, self.per_task, self.training = rows, records, None
        elapsed = self.elapsed()
        complete = len(records) == len(self.sequence())
        self._save({"wall_time_s": elapsed, "complete": complete})
        return self.write_results(elapsed)

    def _save(self, extra: dict[str, Any], training: TrainingSnapshot | None = None) -> None:
        """Write the checkpoint: the committed tasks (name, record, accuracy row), ``training``."""
        if self.writer is not None:
            if self.meta is not None:
                self.writer.meta = self.meta()
            names = self.sequence().names(len(self.per_task))
            results = [
                {"name": names[t], "record": record}
                | ({"accuracy": self.rows[t]} if t < len(self.rows) else {})
                for t, record in enumerate(self.per_task)
            ]
            self.writer.save(
                self.supernet,
                results,
                training=training,
                extra=extra,
                generator=self.engine.generator,
                grad_scaler=scaler_state(self.engine),
            )
        self.saved_at = time.monotonic()

    def write_results(self, elapsed: float | None = None) -> dict[str, Any]:
        """Rewrite ``results.json`` (atomically) for the tasks the checkpoint holds."""
        doc = results_document(self.cfg, self.sequence(), self.supernet, self.rows, self.per_task)
        doc |= {
            "warnings": self.notes,
            "wall_time_s": self.elapsed() if elapsed is None else elapsed,
        }
        try:
            if self.writes:
                write_json_atomic(self.out / "results.json", doc)
        except OSError as exc:
            raise CheckpointError(
                f"could not write {self.out / 'results.json'} ({os_error_text(exc)}); the "
                f"checkpoint in {checkpoint_dir(self.out)} is intact and resuming rewrites it"
            ) from None
        self.doc = doc
        return doc

    def plot(self) -> None:
        """Draw ``accuracy.png`` from the last ``results.json`` written."""
        rows = self.doc.get("accuracy_matrix") or []
        if self.writes and any(r is not None for r in rows):
            plot_run(self.doc, self.out / "accuracy.png")

    def on_run_end(self, learner: Any) -> None:
        self.plot()
