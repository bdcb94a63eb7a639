"""Learning new tasks on top of a finished run (``--from-run DIR --after-task K``): the source's
checkpoint is only read, its supernet cut back to its first K tasks, and the new run's sequence
is those K tasks followed by its own (see docs/checkpoints.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from espn.checkpoint.format import (
    CheckpointError,
    checkpoint_dir,
    manifest_or_none,
    read_manifest,
)
from espn.data.tasks import TaskSequence
from espn.methods.base import METHODS
from espn.runs.config import ConfigError, RunConfig
from espn.runs.loading import SavedRun
from espn.runs.resuming import finished
from espn.supernet.supernet import Supernet


@dataclass
class SourceRun(SavedRun):
    """The run ``--from-run`` names, of which the first ``keep`` tasks are kept."""

    keep: int


def open_source(cfg: RunConfig) -> SourceRun | None:
    """The run ``cfg.from_run`` names (None: none), read only from its checkpoint manifest: a
    run of the same method with at least ``after_task`` finished tasks, whose options are valid
    here (more is checked when the run starts, :func:`check_compatible`)."""
    if cfg.from_run is None or cfg.after_task is None:
        return None
    directory = Path(cfg.from_run)
    try:
        manifest = read_manifest(checkpoint_dir(directory))
    except CheckpointError as exc:
        raise ConfigError(
            f"config: from_run {directory}: {exc} (give the --out of a finished espn run)"
        ) from None
    method, done = str(manifest["method"]), len(manifest["tasks"])
    if method != cfg.method:
        raise ConfigError(
            f"config: from_run {directory} is a run of method {method!r}; learning on top "
            f"of it needs the same method (--method {method}), got {cfg.method!r}"
        )
    if cfg.after_task > done:
        raise ConfigError(
            f"config: after_task must be <= the {done} task(s) finished in {directory}, "
            f"got {cfg.after_task}"
        )
    try:  # a module it names is imported only if --model names it
        config = SavedRun.read(directory, manifest, cfg.device).config
    except ConfigError as exc:
        raise ConfigError(f"from_run {directory}: its options are not valid here: {exc}") from None
    return SourceRun(directory, manifest, config, int(cfg.after_task))


def check_compatible(cfg: RunConfig, source: SourceRun, seq: TaskSequence) -> None:
    """Refuse, before anything is trained, a run whose supernet differs from the source's."""
    m = source.manifest
    spec = m["spec"]
    checks = (
        ("model", m["model"], cfg.model),
        ("task_affine", source.config.task_affine, cfg.task_affine),
        ("input shape", tuple(spec["input_shape"]), tuple(seq.input_shape)),
        ("multi-head", bool(spec["multi_head"]), seq.multi_head),
    )
    for what, theirs, ours in checks:
        if theirs != ours:
            raise ConfigError(
                f"--from-run {source.directory}: its {what} is {theirs!r} but this run's is "
                f"{ours!r}; the new tasks must fit the same supernet"
            )
    if not seq.multi_head and seq.n_classes != int(spec["n_classes"]):
        raise ConfigError(
            f"--from-run {source.directory}: its shared head has {spec['n_classes']} classes "
            f"but this run's tasks need {seq.n_classes}"
        )


@torch.no_grad()
def adopt_tasks(
    supernet: Supernet, source: SourceRun
) -> tuple[list[list[float] | None], list[dict[str, Any]]]:
    """Load the source's first ``keep`` tasks into a freshly built ``supernet``; their
    accuracy rows and per-task records, as the new run's first rows and records."""
    fresh = {n: layer.weight.detach().clone() for n, layer in supernet.layers.items()}
    source.restore(supernet)
    shared = METHODS.get(source.config.method).weights == "shared"
    k = source.keep
    supernet.masks = supernet.masks[:k]
    owners = supernet.owners
    for ids in owners.ids.values():  # weights of later tasks: free again
        ids.masked_fill_((ids >= k) & (ids != owners.free_id), owners.free_id)
    for name, layer in supernet.layers.items():
        layer.frozen.copy_(owners.frozen(name))
        if shared:  # free weights start as the new run's initialisation, not as trained later
            layer.weight.copy_(torch.where(layer.frozen, layer.weight, fresh[name]))
    supernet.active_task = None
    supernet.use_task(k - 1)
    return finished(source.checkpoint.tasks[:k])


def check_source_unchanged(
    run_dir: Path | str, cfg: RunConfig, tasks: list[dict[str, Any]]
) -> None:
    """Refuse to rebuild the tasks a run inherited from ``--from-run`` when that source was removed
    or replaced since; ``tasks``: the run's checkpoint task entries."""
    if cfg.from_run is None or cfg.after_task is None:
        return
    keep = int(cfg.after_task)
    source = Path(cfg.from_run)
    manifest = manifest_or_none(checkpoint_dir(source))
    if manifest is None or len(manifest["tasks"]) < keep:
        raise CheckpointError(
            f"{run_dir} continues --from-run {source}, which no longer holds a finished run "
            f"of {keep} task(s); its first {keep} task(s) cannot be rebuilt without it"
        )
    for t, (ours, theirs) in enumerate(zip(tasks[:keep], manifest["tasks"][:keep], strict=True)):
        for key in ("record", "accuracy"):
            if (
                ours.get(key) is not None
                and theirs.get(key) is not None
                and ours[key] != theirs[key]
            ):
                raise CheckpointError(
                    f"{run_dir} continues --from-run {source}, which was replaced since (task "
                    f"{t}'s {key} differs from the one this run inherited), so its first "
                    f"{keep} task(s) cannot be rebuilt; restore that run, or rerun this one"
                )
