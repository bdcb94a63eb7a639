"""The run directory a learner writes (``results.json``, ``checkpoint/``, ``accuracy.png``)
and resumes from: the same for ``espn run`` and for ``ContinualLearner(..., out=DIR)``.

After the epochs :func:`checkpoint_due` names (every phase's last, and within a phase one a
minute at most) the checkpoint holds the task in training; after every learned step the
checkpoint is committed first and ``results.json`` rewritten from it, so results never list a
task the checkpoint does not hold (a kill in between leaves results one task behind, and a
resumed run rewrites them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from espn import __version__
from espn.checkpoint import CheckpointWriter, TrainingState, read_checkpoint, restore
from espn.checkpoint.format import MANIFEST, CheckpointError, checkpoint_dir
from espn.checkpoint.lock import LOCK_FILE, RunLocked, holder, run_lock
from espn.config import RunConfig
from espn.data.tasks import TaskSequence
from espn.evaluation.metrics import (
    average_accuracy,
    backward_transfer,
    final_accuracy,
    forgetting,
)
from espn.evaluation.plots import plot_run
from espn.evaluation.storage import storage_report
from espn.inference.stored import check_statistics
from espn.methods.base import METHODS, Strategy
from espn.runs.checks import check_results_match, check_same_run, run_meta
from espn.runs.legacy import upgrade_saved_config
from espn.runs.training import continue_training, progress_of, scaler_state, snapshot
from espn.supernet.supernet import Supernet
from espn.training.callbacks import Callback, EpochEnd
from espn.training.distributed import writes_files
from espn.training.engine import Engine, TaskProgress
from espn.utils.io import os_error_text, write_json_atomic

#: The most checkpoints of a task in training per phase. A phase of more passes (the size rule
#: on small data: hundreds of passes of a few steps each) checkpoints every k-th pass and its
#: last, so that writing the run's state does not cost more than training it.
CHECKPOINTS_PER_PHASE = 50

#: Seconds of a phase that pass between two checkpoints of a task in training, at least (the
#: phase's last pass is checkpointed whenever it ends). A kill loses at most this much training
#: (and the passes up to the next one :func:`checkpointed` names); a save costs about 0.04 s
#: of CPU for FC1024, 0.25 s for a ResNet18 with Adam's state, so that checkpoints cost at
#: most a few thousandths of the training. 0: every pass :func:`checkpointed` names.
CHECKPOINT_SECONDS = 60.0


def checkpointed(epoch: int, n_epochs: int) -> bool:
    """Whether the end of pass ``epoch`` (from 0) of a phase of ``n_epochs`` passes may be
    checkpointed: every pass of a phase of at most :data:`CHECKPOINTS_PER_PHASE` passes, else
    every ``ceil(n_epochs / CHECKPOINTS_PER_PHASE)``-th and the last."""
    every = -(-n_epochs // CHECKPOINTS_PER_PHASE)
    return (epoch + 1) % every == 0 or epoch + 1 == n_epochs


def checkpoint_due(epoch: int, n_epochs: int, since: float) -> bool:
    """Whether the end of pass ``epoch`` of a phase of ``n_epochs`` passes is checkpointed,
    ``since`` seconds after the last checkpoint: always the phase's last pass; another pass
    :func:`checkpointed` names once :data:`CHECKPOINT_SECONDS` have passed."""
    if epoch + 1 == n_epochs:
        return True
    return checkpointed(epoch, n_epochs) and since >= CHECKPOINT_SECONDS


def results_document(
    cfg: RunConfig,
    seq: TaskSequence,
    supernet: Supernet,
    rows: list[list[float] | None],
    per_task: list[dict],
) -> dict[str, Any]:
    """The ``results.json`` document of a (possibly unfinished) run.

    ``rows`` has one accuracy row per training step (per task, or a single row for MTL's
    joint training), None where ``eval_every`` skipped the evaluation; ``per_task`` one
    record per learned task.
    """
    column = {k: [r[k] for r in per_task] for k in per_task[0]} if per_task else {}
    rows_seen = any(r is not None for r in rows)
    storage = storage_report(supernet, METHODS.get(cfg.method).weights)
    return {
        "espn_version": __version__,
        "method": cfg.method,
        "benchmark": cfg.benchmark,
        "model": cfg.model,
        "seed": cfg.seed,
        "gamma": cfg.gamma,
        "alpha": cfg.alpha,
        "config": cfg.model_dump(mode="json"),
        "task_names": seq.names(len(per_task)),
        "complete": len(per_task) == len(seq),
        "accuracy_matrix": rows,
        "final_accuracy": final_accuracy(rows) if rows_seen else [],
        "average_accuracy": average_accuracy(rows) if rows_seen else None,
        "forgetting": forgetting(rows) if rows_seen else [],
        "backward_transfer": backward_transfer(rows) if rows_seen else None,
        "dense_flops": supernet.dense_flops,
        "total_weights": supernet.total_weights,
        "storage_bytes": storage["total"],
        "storage": storage,
        **column,
    }


def training_position(task: int, progress: TaskProgress, strategy: Strategy) -> str:
    """Where a task's training stands, in the units the engine counts: passes over the task's
    training data (the size rule may make them more than ``--epochs`` asks) and optimizer
    steps of the phase in progress."""
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


#: run directories whose lock a learner of this process holds: resolved path -> the lock
#: (entered) and the :class:`DirectoryLock` it is held for now
_HELD: dict[Path, tuple[AbstractContextManager[Path], DirectoryLock]] = {}


class DirectoryLockError(CheckpointError):
    """A learner's run directory is written by another process, or by a newer learner of
    this process."""


class DirectoryLock:
    """A Python learner's hold on its run directory (``out=``): the lock ``espn run`` takes
    (:func:`espn.checkpoint.lock.run_lock`), so that a second process with the same
    directory is refused at once. A newer learner of the same process on the same directory
    (a notebook cell run again) takes the lock over, and the older one may no longer learn
    into it. Released by :meth:`release` (the learner's ``close()``) or when the process
    ends; :meth:`check` takes it again for a learner that learns after ``close()``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.key = out.resolve()
        self.check(take_over=True)

    def check(self, take_over: bool = False) -> None:
        """Hold the lock (take it if nobody in this process does); refuse if another
        process holds it, or, unless ``take_over``, a newer learner of this process."""
        held = _HELD.get(self.key)
        if held is not None and held[1] is not self and not take_over:
            raise DirectoryLockError(
                f"{self.out} is written by a newer ContinualLearner of this process (one "
                "made later with the same out=); learn with that one"
            )
        if held is not None:
            _HELD[self.key] = (held[0], self)
            return
        lock = run_lock(self.out)
        try:
            lock.__enter__()
        except RunLocked:
            raise DirectoryLockError(
                f"{self.out} is in use by another process ({holder(self.out / LOCK_FILE)}); "
                "wait for it to end, or pass another out="
            ) from None
        _HELD[self.key] = (lock, self)

    def release(self) -> None:
        """Give the lock up, if this learner holds it."""
        held = _HELD.get(self.key)
        if held is not None and held[1] is self:
            del _HELD[self.key]
            held[0].__exit__(None, None, None)


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
        check_same_run(saved, cfg, directory, ignore)
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
            rows=[
                None if t["accuracy"] is None else list(t["accuracy"])
                for t in ckpt.tasks
                if "accuracy" in t
            ],
            per_task=[dict(t["record"]) for t in ckpt.tasks],
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
        if self.writer is None:
            return
        self.writer.save(
            self.supernet,
            self._results(seq),
            training=snapshot(task, progress, strategy),
            extra=extra | {"complete": False},
            generator=self.engine.generator,
            grad_scaler=scaler_state(self.engine),
        )

    def task_done(self, seq: TaskSequence, elapsed: float, extra: dict[str, Any]) -> None:
        """Checkpoint after a task was committed and evaluated."""
        self.training = None
        if self.writer is None:
            return
        self.writer.save(
            self.supernet,
            self._results(seq),
            extra=extra | {"wall_time_s": elapsed, "complete": len(self.per_task) == len(seq)},
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


class RunDirectory(Callback):
    """A learner's run directory, written after every epoch and every learned step: a
    callback like the loggers (``on_epoch_end`` checkpoints the task in training where the
    engine says it stands, ``on_run_end`` draws the plot), which the learner also tells of
    each learned step (:meth:`step_done`, after it committed the step's tasks).

    ``sequence`` gives the tasks as the run knows them (the benchmark of ``espn run``; the
    tasks learned so far in Python), ``notes`` what the run could not do as asked; ``meta``,
    when given, what the manifest records about the run, asked anew at every write (a Python
    run grows one task at a time).
    """

    def __init__(
        self,
        cfg: RunConfig,
        sequence: Callable[[], TaskSequence],
        notes: list[str] | None = None,
        meta: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.cfg, self.sequence, self.notes = cfg, sequence, list(notes or [])
        self.meta = meta
        self.out = Path(cfg.out)
        self.checkpoint: RunCheckpoint | None = None
        self.strategy: Strategy | None = None
        self.start = time.perf_counter()
        #: when the checkpoint was last written (``time.monotonic()``)
        self.saved_at = time.monotonic()
        self.doc: dict[str, Any] = {}
        #: added to the manifest on every write (e.g. the fingerprints of a Python run's data)
        self.extra: Callable[[], dict[str, Any]] = dict
        #: whether this process writes the files (not a data-parallel rank other than 0,
        #: which reads a checkpoint to resume from only)
        self.writes = writes_files()

    def open(
        self,
        supernet: Supernet,
        engine: Engine,
        strategy: Strategy,
        resume: bool,
        ignore: tuple[str, ...] = (),
    ) -> RunCheckpoint:
        """Start the checkpoint, or restore it into the learner's freshly built parts."""
        self.checkpoint = RunCheckpoint.open(
            self.cfg, self.sequence(), supernet, engine, strategy, resume, ignore, self.writes
        )
        self.strategy = strategy
        self.start = time.perf_counter() - self.checkpoint.elapsed
        self.saved_at = time.monotonic()
        return self.checkpoint

    def resume_point(self, task: int) -> TaskProgress | None:
        """Where task ``task`` continues from (None: from its start)."""
        return self._ckpt().resume_point(task)

    def elapsed(self) -> float:
        """Wall time of the run so far, the time before a resumption included."""
        return time.perf_counter() - self.start

    def on_epoch_end(self, learner: Any, event: EpochEnd) -> None:
        """Checkpoint the task in training (step ``event.task``) where the engine says it
        stands after this pass (``event.position``), at the passes :func:`checkpoint_due`
        names."""
        ckpt = self._ckpt()
        if self.strategy is None:
            return
        if not checkpoint_due(event.epoch, event.n_epochs, time.monotonic() - self.saved_at):
            return  # its position is not read: a slim copy's write-back waits
        if event.position is None:
            return
        self._refresh()
        extra = self.extra() | {"wall_time_s": self.elapsed()}
        ckpt.save_progress(event.task, event.position, self.strategy, self.sequence(), extra)
        self.saved_at = time.monotonic()

    def step_done(
        self, supernet: Supernet, rows: list[list[float] | None], records: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """After a step: commit the checkpoint, then rewrite ``results.json`` from it (the
        order in which the two never disagree on the tasks finished); the new document."""
        ckpt = self._ckpt()
        ckpt.rows, ckpt.per_task = rows, records
        self._refresh()
        seq = self.sequence()
        elapsed = self.elapsed()
        ckpt.task_done(seq, elapsed, self.extra())
        self.saved_at = time.monotonic()
        return self.write_results(supernet, rows, records, elapsed)

    def write_results(
        self,
        supernet: Supernet,
        rows: list[list[float] | None],
        records: list[dict[str, Any]],
        elapsed: float | None = None,
    ) -> dict[str, Any]:
        """Rewrite ``results.json`` (atomically) for the tasks the checkpoint holds."""
        doc = results_document(self.cfg, self.sequence(), supernet, rows, records)
        doc |= {
            "warnings": self.notes,
            "wall_time_s": self.elapsed() if elapsed is None else elapsed,
        }
        if not self.writes:
            self.doc = doc
            return doc
        try:
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
        if not self.writes:
            return
        if self.doc and any(r is not None for r in self.doc.get("accuracy_matrix") or []):
            plot_run(self.doc, self.out / "accuracy.png")

    def on_run_end(self, learner: Any) -> None:
        self.plot()

    def _refresh(self) -> None:
        writer = self._ckpt().writer
        if self.meta is not None and writer is not None:
            writer.meta = self.meta()

    def _ckpt(self) -> RunCheckpoint:
        if self.checkpoint is None:
            raise RuntimeError("RunDirectory.open() was not called")
        return self.checkpoint
