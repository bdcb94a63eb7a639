"""Saving a run's supernet, and a task in training as the plain numbers, optimizer and
strategy state its caller hands over (:class:`TrainingSnapshot`), to a checkpoint (layout:
:mod:`espn.checkpoint.format`); reading it back is :mod:`espn.checkpoint.reader`'s.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import Tensor

from espn._version import __version__
from espn.checkpoint.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    CheckpointError,
    architecture,
    file_entry,
    fsync_dir,
    state_file,
    task_file,
)
from espn.supernet.masks import EXPLICIT_FORMS, Ownership, TaskMask, pack_bits
from espn.supernet.supernet import Supernet
from espn.utils.io import atomic_target, os_error_text, write_json_atomic


@dataclass
class TrainingSnapshot:
    """A task in training as its caller hands it to :meth:`CheckpointWriter.save`: where it
    stands (``position``: plain numbers and lists, stored as JSON), the optimizer's
    ``state_dict()["state"]`` (None: none yet) and the strategy's ``state_dict()``."""

    task: int
    position: dict[str, Any]
    optimizer: dict[int, dict[str, Any]] | None
    strategy: dict[str, Any]


@dataclass
class TrainingState(TrainingSnapshot):
    """A task caught between two epochs, as read back: what was saved and its working
    sub-network."""

    n_classes: int
    weight_masks: dict[str, Tensor]
    units: dict[str, Tensor]
    task_state: dict[str, Tensor]


@dataclass
class Checkpoint:
    """A fully validated checkpoint held in memory (CPU tensors)."""

    directory: Path
    manifest: dict[str, Any]
    shared: dict[str, Tensor]
    masks: list[TaskMask]
    rng: dict[str, Tensor]
    training: TrainingState | None = None
    #: the supernet's owner ids as bit-planes (see ``Ownership.packed``; None in a version-1
    #: checkpoint: derived from the masks)
    owner_ids: dict[str, Tensor] | None = None

    @property
    def tasks(self) -> list[dict[str, Any]]:
        """The manifest's per-task entries (name, budgets, results, accuracy row)."""
        return self.manifest["tasks"]

    @property
    def complete(self) -> bool:
        """Whether the run finished its last task (not only a mid-run save)."""
        return bool(self.manifest.get("complete"))


# ---------------------------------------------------------------------------- writing
def _flat(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """``tensors`` on the CPU, contiguous, no two sharing memory (safetensors refuses that):
    a tensor is copied only where it is not on the CPU or contiguous already, or shares the
    memory of one before it."""
    flat: dict[str, Tensor] = {}
    seen: set[int] = set()
    for k, v in tensors.items():
        t = v.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        seen.add(ptr)
        flat[k] = t
    return flat


def _save_tensors(path: Path, tensors: dict[str, Tensor]) -> dict[str, Any]:
    """Write a safetensors file atomically and durably; its manifest entry (name, size and
    SHA-256: read back from the page cache, which costs less than serialising to memory
    first)."""
    with atomic_target(path) as tmp:
        save_file(_flat(tensors), str(tmp))
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
    return file_entry(path)


def _rng_tensors(generator: torch.Generator | None) -> dict[str, Tensor]:
    rng = {"rng.torch": torch.get_rng_state()}
    if generator is not None:  # a supernet saved without its training engine has no batch order
        rng["rng.engine"] = generator.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["rng.cuda"] = torch.cuda.get_rng_state()
    return rng


class CheckpointWriter:
    """Writes a run's checkpoint; task files are written once, the state file every save."""

    def __init__(self, directory: Path | str, meta: dict[str, Any]) -> None:
        """Start a new checkpoint in ``directory``, removing an older one found there.

        ``meta`` holds ``model``, ``benchmark``, ``config`` and ``spec`` (input shape, classes,
        multi-head), which the manifest records so the supernet can be rebuilt from it.
        """
        self.directory = Path(directory)
        self.meta = meta
        self.tasks: list[dict[str, Any]] = []
        self.generation = 0
        self.started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self._forget()
        (self.directory / MANIFEST).unlink(missing_ok=True)
        self._clean(keep=set())

    @classmethod
    def resume(cls, checkpoint: Checkpoint) -> CheckpointWriter:
        """Continue writing the checkpoint that ``checkpoint`` was read from."""
        writer = cls.__new__(cls)
        m = checkpoint.manifest
        writer.directory = checkpoint.directory
        # the task count too, so that a resumed run's manifest still says how long it is
        writer.meta = {
            k: m[k] for k in ("model", "benchmark", "config", "spec", "n_tasks") if k in m
        }
        # accuracy rows live in version-2 task files (read back into the entries in memory)
        writer.tasks = [
            {k: v for k, v in t.items() if not (k == "accuracy" and "masks" in t and v is not None)}
            for t in m["tasks"]
        ]
        writer.generation = int(m["state"]["generation"])
        writer.started = m.get("started", "")
        writer._forget()
        return writer

    def _forget(self) -> None:
        """Start with empty caches of what the state file holds (see :meth:`_owner_planes`)."""
        self._owners: tuple[list[_Version], dict[str, Tensor], int] | None = None
        self._masks: dict[str, tuple[list[_Version], Tensor]] = {}

    def save(
        self,
        supernet: Supernet,
        task_results: list[dict[str, Any]],
        training: TrainingSnapshot | None = None,
        extra: dict[str, Any] | None = None,
        *,
        generator: torch.Generator | None = None,
        grad_scaler: dict[str, Any] | None = None,
    ) -> None:
        """Write the checkpoint: every committed task (its entry from ``task_results``: name,
        record, accuracy row), the shared weights, the RNG states (torch's, CUDA's, and the
        training's batch-order ``generator`` when given), the mixed-precision loss scale
        ``grad_scaler`` (a ``GradScaler.state_dict()``, None: none) and ``training``, the
        task in training. ``extra`` goes into the manifest as is.

        If a file cannot be written (a full disk), the files of this save are removed and
        :class:`CheckpointError` says so: the previous checkpoint is still complete.
        """
        try:
            self._save(supernet, task_results, training, extra, generator, grad_scaler)
        except (OSError, SafetensorError) as exc:
            self._clean(keep={t["file"] for t in self.tasks} | {state_file(self.generation)})
            reason = os_error_text(exc) if isinstance(exc, OSError) else str(exc)
            previous = (
                f"the previous checkpoint there ({len(self.tasks)} task(s) finished) is intact "
                "and --resume continues from it"
                if self.generation
                else "no earlier checkpoint was there"
            )
            raise CheckpointError(
                f"could not write the checkpoint in {self.directory} ({reason}); {previous}; "
                "the partly written files were removed"
            ) from None
        self._clean(keep={t["file"] for t in self.tasks} | {state_file(self.generation)})

    def _save(
        self,
        supernet: Supernet,
        task_results: list[dict[str, Any]],
        training: TrainingSnapshot | None,
        extra: dict[str, Any] | None,
        generator: torch.Generator | None,
        grad_scaler: dict[str, Any] | None,
    ) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tasks = list(self.tasks)  # the writer's own state changes only once the save succeeded
        for t in range(len(tasks), len(supernet.masks)):
            tasks.append(self._save_task(supernet, t, task_results))
        generation = self.generation + 1
        path = self.directory / state_file(generation)
        owner_planes, owner_bits = self._owner_planes(supernet.owners)
        tensors = {f"shared.{n}": layer.weight for n, layer in supernet.layers.items()}
        tensors |= {f"owner.{n}": planes for n, planes in owner_planes.items()}
        tensors |= _rng_tensors(generator)
        train_doc = None
        if training is not None:
            train_doc, train_tensors = self._training(supernet, training)
            tensors |= train_tensors
        state_entry = _save_tensors(path, tensors)
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "espn_version": __version__,
            "started": self.started,
            "saved": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            **self.meta,
            "architecture": architecture(supernet),
            "dense_flops": supernet.dense_flops,
            "total_weights": supernet.total_weights,
            "tasks": tasks,
            "state": {**state_entry, "generation": generation},
            "owner_bits": owner_bits,
            "training": train_doc,
            "grad_scaler": grad_scaler,
            **(extra or {}),
        }
        fsync_dir(self.directory)
        write_json_atomic(self.directory / MANIFEST, manifest)
        fsync_dir(self.directory)
        self.tasks, self.generation = tasks, generation

    def _save_task(
        self, supernet: Supernet, t: int, task_results: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Write committed task ``t``'s file and return its manifest entry."""
        mask = supernet.masks[t]
        info = dict(task_results[t]) if t < len(task_results) else {}
        row = info.pop("accuracy", None)
        state, cut = mask.alive_state(supernet.unit_state_groups())
        entry = _save_tensors(
            self.directory / task_file(t), _task_tensors(replace(mask, state=state), row)
        )
        return {
            "index": t,
            **entry,
            "masks": {k: mask.form(k) for k in mask.weights},
            "horizon": mask.horizon,
            "alive_only": cut,
            "n_classes": mask.n_classes,
            "new_weights": mask.new_weights,
            **info,
            # a row skipped by --eval-every is null; a task after MTL's row has none
            **(
                {"accuracy": None}
                if row is None and t < len(task_results) and "accuracy" in task_results[t]
                else {}
            ),
        }

    def _training(
        self, supernet: Supernet, training: TrainingSnapshot
    ) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """The manifest's ``training`` entry and the state file's tensors of the task in
        training (tensors of its strategy state, SupSup's scores, go to the file)."""
        optim_tensors, optim_scalars = _split_optimizer(training.optimizer or {})
        strategy_tensors = {k: v for k, v in training.strategy.items() if isinstance(v, Tensor)}
        tensors = self._training_tensors(supernet) | optim_tensors
        tensors |= {f"strategy.{k}": v for k, v in strategy_tensors.items()}
        doc = {
            "task": training.task,
            "n_classes": int(supernet._n_classes),
            "position": dict(training.position),
            "optimizer": training.optimizer is not None,
            "optimizer_scalars": optim_scalars,
            "strategy": {k: v for k, v in training.strategy.items() if k not in strategy_tensors},
        }
        return doc, tensors

    def _owner_planes(self, owners: Ownership) -> tuple[dict[str, Tensor], int]:
        """The owner ids as bit-planes and their bit count (:meth:`Ownership.packed`), packed
        anew only when an id changed (a commit) since the last save: every save of a task in
        training writes the same ones."""
        key = _versions(owners.ids)
        if self._owners is None or not _same(self._owners[0], key):
            self._owners = (key, owners.packed(), owners.bits)
        return self._owners[1], self._owners[2]

    def _training_tensors(self, supernet: Supernet) -> dict[str, Tensor]:
        """The working sub-network of the task in training: bit-packed weight masks (packed
        anew only where a mask changed since the last save: a prune event), unit masks, task
        state."""
        out = {}
        for n, layer in supernet.layers.items():
            key = _versions({n: layer.weight_mask})
            known = self._masks.get(n)
            if known is None or not _same(known[0], key):
                known = self._masks[n] = (key, pack_bits(layer.weight_mask.bool().cpu()))
            out[f"train.mask.{n}"] = known[1]
        out |= {f"train.units.{g}": a.cpu() for g, a in supernet.unit_masks().items()}
        out |= {f"train.state.{k}": v for k, v in supernet.task_state().items()}
        return out

    def _clean(self, keep: set[str]) -> None:
        """Delete checkpoint files (ours only, by pattern) that the manifest does not name."""
        if not self.directory.is_dir():
            return
        for pattern in ("task-*.safetensors", "state-*.safetensors", ".*.tmp"):
            for path in self.directory.glob(pattern):
                if path.name not in keep:
                    path.unlink(missing_ok=True)


def _task_tensors(mask: TaskMask, row: list[float] | None) -> dict[str, Tensor]:
    """A task file's tensors: explicit masks only (derived ones are their form and horizon in
    the manifest), bit-packed unit masks, task state, own weights, the statistics of
    task-agnostic prediction, its accuracy row."""
    out = {f"weights.{k}": v for k, v in mask.weights.items() if mask.form(k) in EXPLICIT_FORMS}
    out |= {f"units.{k}": pack_bits(v) for k, v in mask.units.items()}
    out |= {f"state.{k}": v for k, v in mask.state.items()}
    out |= {f"own.{k}": v for k, v in mask.own.items()}
    out |= {f"stats.{k}": v for k, v in mask.stats.items()}
    if row is not None:
        out["accuracy"] = torch.tensor(row, dtype=torch.float64)
    return out


#: a tensor as the caches of :class:`CheckpointWriter` know it: the tensor itself, its version
#: counter (every in-place change) and where its memory is (a ``.data`` replaced)
_Version = tuple[Tensor, int, int]


def _versions(tensors: dict[str, Tensor]) -> list[_Version]:
    return [(t, t._version, t.data_ptr()) for t in tensors.values()]


def _same(a: list[_Version], b: list[_Version]) -> bool:
    """Whether two :func:`_versions` lists name the same, unchanged tensors."""
    return len(a) == len(b) and all(
        x[0] is y[0] and x[1:] == y[1:] for x, y in zip(a, b, strict=True)
    )


def _split_optimizer(
    state: dict[int, dict[str, Any]],
) -> tuple[dict[str, Tensor], dict[str, dict[str, Any]]]:
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entries in state.items():
        for name, value in entries.items():
            if isinstance(value, Tensor):
                tensors[f"optim.{index}.{name}"] = value
            else:
                scalars.setdefault(str(index), {})[name] = value
    return tensors, scalars
