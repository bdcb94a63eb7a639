"""A run directory's checkpoint as files: what a run records about itself, the checks that a
directory may be written or resumed, and loading a finished run (the learner's checkpointing
while it learns is :mod:`espn.run_directory`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from espn.checkpoint.format import MANIFEST, CheckpointError, checkpoint_dir, manifest_or_none
from espn.checkpoint.legacy import upgrade_saved_config
from espn.checkpoint.manifest import check_against_results
from espn.checkpoint.store import Checkpoint, read_checkpoint, restore
from espn.config import RunConfig, make_config
from espn.data.tasks import TaskSequence
from espn.evaluation.results import read_results
from espn.models.reference import check_model_size, is_reference, reading_run, resolve
from espn.models.registry import MODELS, ModelSpec, build_supernet
from espn.preflight import check_device
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
    """The options (outside :data:`RESUMABLE_CHANGES` and ``ignore``) in which ``cfg``
    differs from the ``saved`` configuration of a run, each as ``"key=saved in the
    checkpoint, now now"``."""
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


def check_same_run(
    saved: dict[str, Any], cfg: RunConfig, where: Path, ignore: tuple[str, ...] = ()
) -> None:
    """Refuse to resume with options that change the results, naming each difference."""
    diffs = option_differences(saved, cfg, ignore)
    if diffs:
        raise CheckpointError(
            f"cannot resume {where}: it was made with different options ({'; '.join(diffs)}); "
            "rerun with the same options, or with --overwrite instead of --resume to start over"
        )


#: files and directories that mark a directory as holding a run's output
RUN_OUTPUTS = ("results.json", "accuracy.png", "checkpoint")


def check_out_dir(out: Path | str, resume: bool, overwrite: bool) -> None:
    """Refuse, before anything is computed, to start a run over anything that looks like an
    earlier run's output (``results.json``, ``accuracy.png``, a non-empty ``checkpoint/``)
    unless told to continue it (``resume``) or to replace it (``overwrite``); refuse to resume
    where the checkpoint is gone but results are there."""
    if resume and overwrite:
        raise CheckpointError("--resume and --overwrite exclude each other; choose one")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"--out {out} is a file, not a directory; choose another --out")
    if overwrite:
        return
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
            "missing), so there is nothing to continue from; pass --overwrite to start over "
            "and replace it, or another --out"
        )
    if found:
        raise CheckpointError(
            f"{out} already holds a run's output ({', '.join(found)}); pass --resume to "
            "continue it, --overwrite to start over and replace it, or another --out"
        )


def check_results_match(run_dir: Path | str, manifest: dict[str, Any]) -> None:
    """Refuse a run directory whose results.json is not of the run its checkpoint holds."""
    results = read_results(run_dir)
    reason = None if results is None else check_against_results(manifest, results)
    if reason is not None:
        raise CheckpointError(
            f"{run_dir}: the checkpoint and results.json do not belong together ({reason}); "
            "one of them was changed or replaced, so neither can be trusted"
        )


@dataclass
class LoadedRun:
    """A run's checkpoint loaded into a supernet rebuilt from its manifest alone."""

    config: RunConfig
    checkpoint: Checkpoint
    supernet: Supernet

    @property
    def n_tasks(self) -> int:
        """Tasks finished in the checkpoint."""
        return len(self.supernet.masks)

    def example_input(self, batch: int = 2) -> torch.Tensor:
        """A zero batch of model inputs (shapes only matter for tracing)."""
        shape = self.checkpoint.manifest["spec"]["input_shape"]
        device = next(self.supernet.parameters()).device
        return torch.zeros(batch, *shape, device=device)

    def check_task(self, task: int) -> None:
        """Raise :class:`CheckpointError` unless ``task`` is a finished task of the run."""
        if not 0 <= task < self.n_tasks:
            raise CheckpointError(
                f"task {task} is not in the checkpoint; it holds tasks 0..{self.n_tasks - 1}"
                if self.n_tasks
                else f"task {task} is not in the checkpoint; it holds no finished task yet"
            )


def load_run(
    run_dir: Path | str,
    device: str = "cpu",
    supernet: Supernet | None = None,
    trust_code: bool = False,
) -> LoadedRun:
    """Rebuild a run's supernet from ``<run_dir>/checkpoint`` and load every finished task.

    The model is built from the manifest's name (a registered model, or an import reference
    written by the Python API, see :mod:`espn.models.reference`), or given as a freshly
    built ``supernet`` (a model only the caller can build). A relative ``data_dir`` in the
    configuration (the test data the Python API saves) is read from ``run_dir``. A module
    the manifest names is imported only if ``trust_code`` (see
    :func:`espn.models.reference.reading_run`).
    """
    ckpt = read_checkpoint(checkpoint_dir(run_dir))
    m = ckpt.manifest
    check_results_match(run_dir, m)
    name = str(m["model"])
    with reading_run(run_dir, trust_code):
        if supernet is None and is_reference(name):
            resolve(name)
        if name not in MODELS and supernet is None:
            built_from = (
                "; it was built in Python from a model instance, so only its code can rebuild "
                "it: espn.load(run, model=...)"
                if name.startswith("<")
                else ""
            )
            raise CheckpointError(
                f"the checkpoint is of model {name!r}, which this espn does not know"
                f"{built_from}; known models: {', '.join(MODELS.names())}"
            )
        saved = upgrade_saved_config(m["config"])
        values = {k: v for k, v in saved.items() if k not in ("device", "out")}
        if values.get("data_dir") is not None and not Path(values["data_dir"]).is_absolute():
            values["data_dir"] = Path(run_dir) / values["data_dir"]
        cfg = make_config(**values, device=device, out=Path(run_dir))
    check_device(cfg.device)
    spec = m["spec"]
    if supernet is None:
        model_spec = ModelSpec(
            tuple(spec["input_shape"]),
            int(spec["n_classes"]),
            spec["multi_head"],
            cfg.task_affine,
            cfg.stream_pruning,
        )
        if not is_reference(name):  # a reference's arguments were sized when resolved
            # a registered builder converting a model may not build on "meta": not counted
            check_model_size(run_dir, name, lambda: MODELS.get(name)(model_spec), strict=False)
        example = torch.zeros(2, *spec["input_shape"], device=device)
        supernet = build_supernet(name, model_spec, example, cfg.seed, device)
    restore(ckpt, supernet)
    supernet.eval()
    return LoadedRun(cfg, ckpt, supernet)
