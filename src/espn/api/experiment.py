"""``espn run``'s assembly: the benchmark and the supernet a run configuration names, handed to
the one learner with the run directory attached."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from espn.api.learner import ContinualLearner
from espn.checkpoint.format import checkpoint_dir, manifest_or_none
from espn.checkpoint.lock import run_lock
from espn.data.tasks import TaskSequence
from espn.runs.building import build_benchmark, build_supernet
from espn.runs.checks import check_out_dir, clear_run
from espn.runs.config import ConfigError, RunConfig, given_names, make_config
from espn.runs.from_run import SourceRun, adopt_tasks, check_compatible, open_source
from espn.runs.given import check_applicable
from espn.runs.preflight import check_run
from espn.runs.resuming import RunDirectory
from espn.supernet.pretrained import expected_shapes, load_weight_file
from espn.training.callbacks import Callback
from espn.training.capacity import TrainingStopped
from espn.training.distributed import join
from espn.training.loggers import logging_options

__all__ = ["build_benchmark", "build_supernet", "run", "run_experiment"]


def data_warnings(cfg: RunConfig, seq: TaskSequence) -> list[str]:
    """Requests the data could not honour (more images per task than there are)."""
    notes = []
    first = cfg.after_task or 0  # tasks kept from --from-run were checked by their run
    sizes = cfg.task_train_sizes()
    if sizes is not None:
        order = seq.info.get("given_positions")  # set by a --task-order other than given
        given = order if isinstance(order, list) else range(len(sizes))
        short = [
            (sizes[g], len(task.train))
            for g, task in zip(given, seq.tasks[first:], strict=True)
            if len(task.train) < sizes[g]
        ]
        if short:
            notes.append(
                f"train_sizes asks for up to {max(a for a, _ in short)} training images but "
                f"{len(short)} task(s) have fewer (as few as {min(h for _, h in short)}); "
                "all of theirs are used (results.json: train_samples per task)"
            )
    for split, asked in (("train", cfg.train_per_task), ("test", cfg.test_per_task)):
        if asked is None or (split == "train" and sizes is not None):
            continue
        have = min(len(task.split(split)) for task in seq.tasks[first:])
        if have < asked:
            notes.append(
                f"{split}_per_task {asked} is more than the {have} {split} images a task has; "
                f"all of them are used (results.json: {split}_samples per task)"
            )
    return notes


def run_experiment(
    cfg: RunConfig,
    progress: bool = True,
    on_task_end: Callable[[str], None] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    seq: TaskSequence | None = None,
    on_warning: Callable[[str], None] | None = None,
    loggers: Sequence[Callback | str] = (),
    log_every: int | None = None,
    distributed: bool = True,
) -> dict[str, Any]:
    """Run ``cfg`` to the end in its locked run directory (see docs/checkpoints.md); its
    ``results.json`` document.

    ``on_task_end`` receives a one-line summary per task, ``on_warning`` what the run could
    not do as asked; ``resume``/``overwrite`` are ``--resume``/``--overwrite``. A task that
    breaks a budget or learned from a non-finite loss stops the run (:class:`TrainingStopped`,
    the last good checkpoint kept). ``seq``: the benchmark ``cfg`` names, built by the caller.
    ``loggers``, ``log_every``, ``distributed`` as in :class:`ContinualLearner`.
    """
    logging_options(loggers, log_every)  # a bad name is refused before any work
    if cfg.data_dir is not None:  # stored: a relative one would be read from the run directory
        cfg = cfg.model_copy(update={"data_dir": cfg.data_dir.resolve()})
    check_run(cfg)
    source = open_source(cfg)
    check_out_dir(cfg.out, resume, overwrite)
    ranks = join(distributed, cfg.device)
    writer = ranks is None or ranks.writer
    if not writer:
        progress, on_task_end, on_warning = False, None, None
    with run_lock(cfg.out) if writer else nullcontext():
        check_out_dir(cfg.out, resume, overwrite)  # again, now that no other run can write
        if overwrite and writer:  # the earlier run's results go now, not after a task
            clear_run(cfg.out)
        try:
            return _run_locked(
                cfg,
                seq,
                source,
                resume,
                on_task_end,
                on_warning,
                progress=progress,
                loggers=loggers,
                log_every=log_every,
                distributed=distributed,
            )
        except TrainingStopped as exc:
            raise TrainingStopped(f"{exc}; {_kept(cfg)}") from None


def run(
    config: RunConfig | None = None,
    *,
    progress: bool = False,
    on_task_end: Callable[[str], None] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    loggers: Sequence[Callback | str] = (),
    log_every: int | None = None,
    distributed: bool = True,
    **options: Any,
) -> dict[str, Any]:
    """One run as ``espn run`` makes it, from Python: its ``results.json`` document.

    Give ``espn run``'s options as keywords or a ready ``RunConfig`` (each value checked before
    any work); what the run could not do as asked is issued as a Python warning; the other
    arguments as in :func:`run_experiment`. E.g. ``espn.run(benchmark="permuted-fashion-mnist",
    tasks=2, train_per_task=500, out="runs/mine")["average_accuracy"]``.
    """
    if config is not None and options:
        raise ConfigError(
            f"give a RunConfig or keyword options, not both (got {', '.join(sorted(options))})"
        )
    cfg = config if config is not None else make_config(**options)
    if config is None:
        check_applicable(given_names(options), cfg)
    return run_experiment(
        cfg,
        progress=progress,
        on_task_end=on_task_end,
        resume=resume,
        overwrite=overwrite,
        on_warning=lambda line: warnings.warn(line, UserWarning, stacklevel=3),
        loggers=loggers,
        log_every=log_every,
        distributed=distributed,
    )


def _kept(cfg: RunConfig) -> str:
    """Where a stopped run's last good state is, and how to go on from it."""
    directory = checkpoint_dir(cfg.out)
    manifest = manifest_or_none(directory)
    if manifest is None:
        return "no task was finished, so nothing was kept"
    done = len(manifest["tasks"])
    return (
        f"the last good checkpoint is {directory} ({done} task(s) finished, in "
        f"{Path(cfg.out) / 'results.json'})"
    )


def _run_locked(
    cfg: RunConfig,
    seq: TaskSequence | None,
    source: SourceRun | None,
    resume: bool,
    on_task_end: Callable[[str], None] | None,
    on_warning: Callable[[str], None] | None,
    **options: Any,
) -> dict[str, Any]:
    """Build the benchmark and model; learn them with the run directory attached."""
    seq = build_benchmark(cfg) if seq is None else seq
    if source is not None:
        check_compatible(cfg, source, seq)
    supernet = build_supernet(cfg, seq)
    learner = ContinualLearner.from_config(supernet, cfg, **options)
    learner.runner.check_gamma_reachable(cfg.model)
    notes = data_warnings(cfg, seq)
    if on_warning is not None:
        for note in notes:
            on_warning(note)
    rd = RunDirectory(cfg, lambda: seq, notes)
    adopt = None if source is None else (lambda: adopt_tasks(supernet, source))
    learner.open_run(rd, resume, adopt)
    if learner.ranks is not None:  # every rank has read the checkpoint before rank 0 writes
        learner.ranks.barrier()
    if rd.summary and on_task_end is not None:
        on_task_end(rd.summary)
    if rd.rows:  # resumed: results as the checkpoint holds them (a kill may have cut them)
        rd.write_results()
    pretrained = None
    if cfg.init_weights is not None and not rd.rows:
        pretrained = load_weight_file(cfg.init_weights)
        expected_shapes(supernet, seq.tasks[0].n_classes)  # refused now, not after training
    try:
        learner.learn_sequence(seq, pretrained=pretrained, on_line=on_task_end)
    finally:
        learner.close()  # the run directory's on_run_end draws accuracy.png
    return rd.doc
