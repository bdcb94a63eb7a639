"""Loading a finished run: its supernet rebuilt from the checkpoint's manifest (or given by
the caller) and every finished task restored into it (``espn evaluate/export``, ``espn.load``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch import nn

from espn.checkpoint import Checkpoint, read_checkpoint, restore
from espn.checkpoint.format import CheckpointError, checkpoint_dir, read_manifest
from espn.inference.stored import check_statistics
from espn.methods.base import METHODS
from espn.models.reference import (
    ModelReferenceError,
    check_model_size,
    is_reference,
    reading_run,
    resolve,
)
from espn.models.registry import MODELS, ModelSpec, build_supernet
from espn.runs.checks import check_results_match
from espn.runs.config import RunConfig, make_config
from espn.runs.legacy import upgrade_saved_config
from espn.runs.preflight import check_device
from espn.settings.training import default
from espn.supernet.supernet import Supernet


class ModelNeeded(CheckpointError):
    """A run's model was given to ``espn.wrap`` as an instance: only the user's code builds
    it, so the run is loaded in Python with the model passed (the message says how)."""


def check_rebuildable(
    run_dir: Path | str, name: str, then: str = "learner.evaluate(task), learner.export(task, path)"
) -> None:
    """Raise :class:`ModelNeeded` for a run whose model ``name`` is an instance's, saying
    what to do instead, in Python: ``espn.load(run, model=...)``, then ``then``."""
    if not (name.startswith("<") and name.endswith(" instance>")):
        return
    cls = name[1 : -len(" instance>")]
    short = cls.rsplit(".", 1)[-1]
    raise ModelNeeded(
        f"{run_dir}: its model was given to espn.wrap() as an instance of {cls}, which only "
        f"your code can build, so it cannot be rebuilt from the run directory; in Python, "
        f"build the network as you did and pass it: learner = espn.load({str(run_dir)!r}, "
        f"model={short}(...)); {then}"
    )


def instance_name(model: nn.Module) -> str:
    """The name a run records for a model given as an instance (:func:`check_rebuildable`)."""
    return f"<{type(model).__module__}.{type(model).__qualname__} instance>"


def model_name(supernet: Supernet) -> str:
    """The name a run configuration gives the supernet's model (see :func:`known_model`)."""
    name = supernet.model_name or instance_name(supernet.model)
    known_model(name)
    return name


def known_model(name: str) -> None:
    """Let a run configuration name the model: a reference registered where it may be imported, else
    a factory saying that only the caller's code rebuilds it."""

    def resolves() -> bool:
        try:
            resolve(name)
        except ModelReferenceError:  # not trusted here: only the caller's code rebuilds it
            return False
        return True

    if name in MODELS or (is_reference(name) and resolves()):
        return

    def factory(spec: ModelSpec) -> nn.Module:
        raise CheckpointError(
            f"the checkpoint is of model {name!r}, built in Python from a model instance, so "
            "only its code can rebuild it: espn.load(run, model=...)"
        )

    factory.__doc__ = f"{name}: given to espn.wrap() as an instance (rebuilt by its code only)"
    MODELS.register(name)(factory)


def example_input(spec: dict[str, Any], device: str | torch.device) -> torch.Tensor:
    """A batch of 2 zero inputs of a checkpoint's ``spec`` (its input shape and dtype, float32
    when an older checkpoint does not say), to rebuild the model on."""
    dtype = getattr(torch, spec.get("input_dtype", "float32"))  # checked by the manifest
    return torch.zeros(2, *spec["input_shape"], dtype=dtype, device=device)


@dataclass
class SavedRun:
    """A run directory read once: its checkpoint's manifest, the configuration it records
    (upgraded and checked by this espn) and, on first use, its tensors, verified."""

    directory: Path
    manifest: dict[str, Any]
    config: RunConfig
    #: the supernet its tasks were restored into (:meth:`restore`)
    supernet: Supernet = field(init=False, repr=False, compare=False)

    @classmethod
    def read(
        cls, directory: Path | str, manifest: dict[str, Any], device: str, trust_code: bool = False
    ) -> SavedRun:
        """The run in ``directory``, whose ``manifest`` the caller has read, for ``device`` (a
        module the manifest names is imported only if ``trust_code``, see :func:`reading_run`).
        A ConfigError names a recorded value this espn refuses."""
        values = upgrade_saved_config(manifest["config"])
        values = {k: v for k, v in values.items() if k not in ("device", "out")}
        with reading_run(directory, trust_code):
            config = make_config(**values, device=device, out=Path(directory))
        return cls(Path(directory), manifest, config)

    @property
    def n_tasks(self) -> int:
        """Tasks finished in the checkpoint."""
        return len(self.manifest["tasks"])

    @cached_property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint's files, verified and loaded."""
        return read_checkpoint(checkpoint_dir(self.directory), self.manifest)

    def restore(self, supernet: Supernet) -> None:
        """Load every finished task into a freshly built ``supernet``, held as this run's."""
        self.supernet, method = supernet, self.config.method
        # the kind of weights of the run's method (None: one this espn does not know)
        weights = METHODS.get(method).weights if method in METHODS else None
        restore(self.checkpoint, supernet, weights)
        check_statistics(supernet, self.checkpoint.directory)


def load_run(
    run_dir: Path | str,
    device: str = default("device"),
    build: Callable[[dict[str, Any]], Supernet] | None = None,
    trust_code: bool = False,
) -> SavedRun:
    """Rebuild a run's supernet from ``<run_dir>/checkpoint`` (the manifest's model name, or
    ``build(manifest)``: the caller's code) and load every finished task. A relative
    ``data_dir`` is read from ``run_dir``; a module the manifest names is imported only if
    ``trust_code`` (see :func:`espn.models.reference.reading_run`)."""
    m = read_manifest(checkpoint_dir(run_dir))
    check_results_match(run_dir, m)
    name = str(m["model"])
    supernet = None if build is None else build(m)
    with reading_run(run_dir, trust_code):
        if supernet is not None:  # built by the caller's code: its name stands for it
            known_model(name)
        elif is_reference(name):
            resolve(name)
        else:
            check_rebuildable(run_dir, name)
            if name not in MODELS:
                raise CheckpointError(
                    f"the checkpoint is of model {name!r}, which this espn does not know; "
                    f"known models: {', '.join(MODELS.names())}"
                )
    saved = SavedRun.read(run_dir, m, device, trust_code)
    cfg = saved.config
    if cfg.data_dir is not None and not cfg.data_dir.is_absolute():  # read from run_dir
        cfg = saved.config = cfg.model_copy(update={"data_dir": Path(run_dir) / cfg.data_dir})
    check_device(cfg.device)
    spec = saved.checkpoint.manifest["spec"]  # every file verified before a model is built
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
        example = example_input(spec, device)
        with reading_run(run_dir, trust_code):  # --trust-model-code holds for this read only
            supernet = build_supernet(name, model_spec, example, cfg.seed, device)
    saved.restore(supernet)
    supernet.eval()
    supernet.model_name = name
    return saved
