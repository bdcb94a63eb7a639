"""What a run records about itself (its checkpoint's meta, :func:`results_document`), the
checks that a directory may be written or resumed, and a Python learner's hold on it
(:class:`DirectoryLock`)."""

from __future__ import annotations

import shutil
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from espn._version import __version__
from espn.checkpoint.format import MANIFEST, CheckpointError, checkpoint_dir, manifest_or_none
from espn.checkpoint.lock import LOCK_FILE, RunLocked, holder, run_lock
from espn.data.tasks import TaskSequence
from espn.evaluation.metrics import (
    average_accuracy,
    backward_transfer,
    final_accuracy,
    forgetting,
)
from espn.evaluation.results import read_results
from espn.evaluation.storage import storage_report
from espn.methods.base import METHODS
from espn.runs.config import RunConfig
from espn.runs.legacy import upgrade_saved_config
from espn.supernet.supernet import Supernet

#: configuration fields that may differ between a run and its resumption
RESUMABLE_CHANGES = ("out", "device", "data_dir")


def run_meta(cfg: RunConfig, seq: TaskSequence) -> dict[str, Any]:
    """What a checkpoint records about its run, enough to rebuild the supernet."""
    return {
        "model": cfg.model,
        "benchmark": cfg.benchmark,
        "method": cfg.method,
        "config": cfg.model_dump(mode="json"),
        "spec": {
            "input_shape": list(seq.input_shape),
            "n_classes": seq.n_classes if len(seq) else 1,  # a Python run before its first task
            "multi_head": seq.multi_head,
        },
        "n_tasks": len(seq),
    }


def option_differences(
    saved: dict[str, Any], cfg: RunConfig, ignore: tuple[str, ...] = ()
) -> list[str]:
    """The options (but :data:`RESUMABLE_CHANGES` and ``ignore``) in which ``cfg`` differs from a
    run's ``saved`` one, as ``"key=saved in the checkpoint, now now"``."""
    now = cfg.model_dump(mode="json")
    # an option newer than the checkpoint was, in effect, at its default
    was = {k: saved.get(k, RunConfig.model_fields[k].default) for k in now}
    # the method's options one by one: ``method_options.supsup_k=0.25 in the checkpoint, ...``
    for part in (was, now):
        part |= {f"method_options.{k}": v for k, v in (part.pop("method_options") or {}).items()}
    now |= {k: None for k in was if k not in now}
    was |= {k: None for k in now if k not in was}
    return [
        f"{key}={was[key]!r} in the checkpoint, {now[key]!r} now"
        for key in now
        if key not in RESUMABLE_CHANGES and key not in ignore and was[key] != now[key]
    ]


def saved_config(out: Path | str) -> dict[str, Any] | None:
    """The configuration recorded in ``out``'s checkpoint manifest, if one is readable."""
    manifest = manifest_or_none(checkpoint_dir(out))
    return None if manifest is None else upgrade_saved_config(dict(manifest["config"]))


class RunMismatch(CheckpointError):
    """A run directory resumed with other options; ``diffs`` names each."""

    def __init__(self, where: Path, diffs: list[str]) -> None:
        self.where, self.diffs = where, diffs
        super().__init__(
            f"cannot resume {where}: it was made with different options ({'; '.join(diffs)}); "
            "rerun with the same options, or with --overwrite instead of --resume to start over"
        )


#: files and directories that mark a directory as holding a run's output
RUN_OUTPUTS = ("results.json", "accuracy.png", "checkpoint")

#: where a run's loggers write (see :mod:`espn.training.loggers`)
LOGS_DIR = "logs"


def check_out_dir(out: Path | str, resume: bool, overwrite: bool, python: bool = False) -> None:
    """Refuse, before anything is computed, to start a run over an earlier run's output
    (:data:`RUN_OUTPUTS`) unless ``resume`` or ``overwrite``, and to resume where only results
    are left; the messages name the CLI's options, or with ``python`` the learner's."""
    if resume and overwrite:
        raise CheckpointError("--resume and --overwrite exclude each other; choose one")
    if overwrite:  # an --out that is a file is refused by the run lock
        return
    out = Path(out)
    replace, other = (
        ("overwrite=True", "another directory") if python else ("--overwrite", "another --out")
    )
    cont = "" if python else "--resume to continue it, "
    manifest = checkpoint_dir(out) / MANIFEST
    found = [
        name
        for name in RUN_OUTPUTS
        if (out / name).is_file() or ((out / name).is_dir() and any((out / name).iterdir()))
    ]
    if resume:
        if manifest.exists() or not (out / "results.json").exists():
            return
        raise CheckpointError(
            f"cannot resume {out}: it holds results.json but no checkpoint ({manifest} is "
            f"missing), so there is nothing to continue from; pass {replace} to start over "
            f"and replace it, or {other}"
        )
    if found:
        raise CheckpointError(
            f"{out} already holds a run's output ({', '.join(found)}); pass {cont}"
            f"{replace} to start over and replace it, or {other}"
        )


def clear_run(out: Path | str) -> None:
    """Remove an earlier run's results, plot and logs from ``out`` (``--overwrite``; a linked
    ``logs`` is unlinked, not followed); the checkpoint is replaced on the first write."""
    out = Path(out)
    for name in ("results.json", "accuracy.png"):
        (out / name).unlink(missing_ok=True)
    logs = out / LOGS_DIR
    if logs.is_symlink() or logs.is_file():
        logs.unlink()
    elif logs.is_dir():
        shutil.rmtree(logs)


def check_results_match(run_dir: Path | str, manifest: dict[str, Any]) -> None:
    """Refuse a run directory whose results.json is not of the run its checkpoint holds.

    A run commits the checkpoint of a finished step, then rewrites results.json from it, so
    results may be behind the checkpoint by the tasks of that step (a kill in between; the
    resumed run rewrites them); runs of espn 0.1.0 wrote them the other way round, so results
    may also be ahead of a checkpoint that still holds that task in training."""
    results = read_results(run_dir)
    if results is None:
        return
    ours, theirs = (
        {k: v for k, v in doc.items() if k not in RESUMABLE_CHANGES}
        for doc in (results.get("config") or {}, manifest["config"])
    )
    if theirs.get("benchmark") == "tensors":  # a Python run: it grows one task at a time
        ours.pop("tasks", None)
    have, done = len(results.get("task_names") or []), len(manifest["tasks"])
    # an option one of them predates (an older espn wrote it) is not a difference
    if any(ours[k] != theirs[k] for k in ours.keys() & theirs.keys()):
        reason = "results.json was written with other options than the checkpoint"
    elif have > done and manifest.get("training") is None:
        reason = f"results.json records {have} finished task(s), the checkpoint {done}"
    else:
        return
    raise CheckpointError(
        f"{run_dir}: the checkpoint and results.json do not belong together ({reason}); "
        "one of them was changed or replaced, so neither can be trusted"
    )


def results_document(
    cfg: RunConfig,
    seq: TaskSequence,
    supernet: Supernet,
    rows: list[list[float] | None],
    per_task: list[dict],
) -> dict[str, Any]:
    """The ``results.json`` document of a (possibly unfinished) run: ``rows`` one accuracy row
    per training step (None: not evaluated), ``per_task`` one record per learned task."""
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


#: run directories whose lock a learner of this process holds: resolved path -> the lock
#: (entered) and the :class:`DirectoryLock` it is held for now
_HELD: dict[Path, tuple[AbstractContextManager[Path], DirectoryLock]] = {}


class DirectoryLockError(CheckpointError):
    """A learner's run directory is written by another process or learner."""


class DirectoryLock:
    """A Python learner's hold on its run directory (``out=``): ``espn run``'s lock, so that a
    second process is refused at once; a newer learner of this process on the same directory
    (a notebook cell run again) takes it over. :meth:`check` takes it again after
    :meth:`release`."""

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
