"""Saving a run's supernet (and a task in training) to a checkpoint, and loading it back.

:class:`CheckpointWriter` writes the checkpoint after every task and the epochs its caller
picks (see :mod:`espn.checkpoint.format` for the layout and why it survives a kill at any moment);
:func:`read_checkpoint` validates a checkpoint completely and loads every tensor before
:func:`restore` changes anything in a supernet, so that nothing is ever half-loaded.

Only files: a task in training is stored as the plain numbers, optimizer state and strategy
state its caller hands over (:class:`TrainingSnapshot`), and read back as such
(:class:`TrainingState`); continuing its training is :mod:`espn.runs.training`'s.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from espn._version import __version__
from espn.checkpoint.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    CheckpointError,
    architecture,
    check_architecture,
    file_entry,
    fsync_dir,
    read_manifest,
    state_file,
    task_file,
    verify_file,
)
from espn.supernet.masks import (
    EXPLICIT_FORMS,
    MASK_FORMS,
    Ownership,
    TaskMask,
    pack_bits,
    unpack_bits,
)
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
class TrainingState:
    """A task caught between two epochs, as read back: its working sub-network, where it
    stands (``position``, as saved), the optimizer's and the strategy's state."""

    task: int
    n_classes: int
    position: dict[str, Any]
    optimizer: dict[int, dict[str, Any]] | None
    strategy: dict[str, Any]
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
    file_bytes: dict[str, int] = field(default_factory=dict)
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
            path = self.directory / task_file(t)
            mask = supernet.masks[t]
            info = dict(task_results[t]) if t < len(task_results) else {}
            row = info.pop("accuracy", None)
            state, cut = mask.alive_state(supernet.unit_state_groups())
            entry = _save_tensors(path, _task_tensors(replace(mask, state=state), row))
            tasks.append(
                {
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
            )
        generation = self.generation + 1
        path = self.directory / state_file(generation)
        owner_planes, owner_bits = self._owner_planes(supernet.owners)
        tensors = {f"shared.{n}": layer.weight for n, layer in supernet.layers.items()}
        tensors |= {f"owner.{n}": planes for n, planes in owner_planes.items()}
        tensors |= _rng_tensors(generator)
        train_doc = None
        if training is not None:
            optim_tensors, optim_scalars = _split_optimizer(training.optimizer or {})
            tensors |= self._training_tensors(supernet) | optim_tensors
            strategy_state = training.strategy  # tensors (SupSup's scores) go to the file
            strategy_tensors = {k: v for k, v in strategy_state.items() if isinstance(v, Tensor)}
            tensors |= {f"strategy.{k}": v for k, v in strategy_tensors.items()}
            train_doc = {
                "task": training.task,
                "n_classes": int(supernet._n_classes),
                "position": dict(training.position),
                "optimizer": training.optimizer is not None,
                "optimizer_scalars": optim_scalars,
                "strategy": {k: v for k, v in strategy_state.items() if k not in strategy_tensors},
            }
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


# ---------------------------------------------------------------------------- reading
def _load_tensors(path: Path) -> dict[str, Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint file {path} cannot be read: {exc}") from None


def prefixed(tensors: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The tensors whose names start with ``prefix``, by the rest of their names."""
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def _read_task(
    path: Path, entry: dict[str, Any], tensors: dict[str, Tensor], arch: dict[str, Any]
) -> TaskMask:
    """A task's mask from its file: version 2 (entry names each layer's mask form) or
    version 1 (every mask bit-packed, unit masks as booleans, shapes in the entry)."""
    weights = prefixed(tensors, "weights.")
    state = prefixed(tensors, "state.")
    n_classes, new_weights = int(entry["n_classes"]), int(entry["new_weights"])
    own = prefixed(tensors, "own.")
    if "masks" not in entry:  # version 1
        shapes = {k: tuple(v) for k, v in entry["shapes"].items()}
        if set(weights) != set(shapes):
            raise CheckpointError(f"checkpoint file {path}: weight masks do not match the manifest")
        units = {k: v.bool() for k, v in prefixed(tensors, "units.").items()}
        return TaskMask(
            weights=weights,
            shapes=shapes,
            units=units,
            state=state,
            n_classes=n_classes,
            new_weights=new_weights,
            own=own,
        )
    forms = dict(entry["masks"])
    shapes = {k: tuple(v) for k, v in arch["layers"].items()}
    bad = {k: f for k, f in forms.items() if f not in MASK_FORMS}
    if (
        set(forms) != set(shapes)
        or bad
        or set(weights) != {k for k, f in forms.items() if f in EXPLICIT_FORMS}
    ):
        raise CheckpointError(f"checkpoint file {path}: weight masks do not match the manifest")
    for k, f in forms.items():
        if f not in EXPLICIT_FORMS:
            weights[k] = torch.empty(0, dtype=torch.uint8)
    units = {}
    for g, packed in prefixed(tensors, "units.").items():
        size = int(arch["groups"].get(g, -1))
        fits = packed.dtype == torch.uint8 and packed.numel() == (size + 7) // 8
        units[g] = unpack_bits(packed, (size,)) if fits else packed.bool()
    # a missing or misshapen unit mask is reported by the tensor checks of restore()
    cut = {k: g for k, g in entry.get("alive_only", {}).items() if g in units}
    for key, group in cut.items():
        alive = int(units[group].sum())  # a unit may hold several values (a norm's channels)
        value = state.get(key)
        if value is None or value.dim() != 1 or not alive or value.numel() % alive:
            raise CheckpointError(f"checkpoint file {path}: task state {key!r} is cut")
    return TaskMask(
        weights=weights,
        shapes=shapes,
        units=units,
        state=TaskMask.expand_state(state, cut, units),
        n_classes=n_classes,
        new_weights=new_weights,
        own=own,
        forms=forms,
        horizon=int(entry["horizon"]),
        stats=prefixed(tensors, "stats."),
    )


def read_checkpoint(directory: Path | str) -> Checkpoint:
    """Read and validate a checkpoint: manifest, every file's size and SHA-256, tensor names.

    Version-1 checkpoints (every mask bit-packed, no owner ids) are read as they are and
    converted by :func:`restore`; a task's accuracy row, kept in its version-2 task file,
    is put back into its manifest entry (``"accuracy"``) in memory."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    sizes = {MANIFEST: (directory / MANIFEST).stat().st_size}
    masks = []
    for entry in manifest["tasks"]:
        path = verify_file(directory, entry)
        sizes[path.name] = entry["bytes"]
        tensors = _load_tensors(path)
        masks.append(_read_task(path, entry, tensors, manifest["architecture"]))
        if "accuracy" in tensors:
            entry["accuracy"] = tensors["accuracy"].tolist()
    path = verify_file(directory, manifest["state"])
    sizes[path.name] = manifest["state"]["bytes"]
    tensors = _load_tensors(path)
    owner_ids = prefixed(tensors, "owner.") if manifest["format_version"] >= 2 else None
    training = None
    doc = manifest.get("training")
    if doc is not None:
        optimizer: dict[int, dict[str, Any]] | None = None
        if doc["optimizer"]:
            optimizer = {}
            for key, value in prefixed(tensors, "optim.").items():
                index, name = key.split(".", 1)
                optimizer.setdefault(int(index), {})[name] = value
            for index, entries in doc["optimizer_scalars"].items():
                optimizer.setdefault(int(index), {}).update(entries)
        training = TrainingState(
            task=int(doc["task"]),
            n_classes=int(doc["n_classes"]),
            position=dict(doc["position"]),
            optimizer=optimizer,
            strategy=doc["strategy"] | prefixed(tensors, "strategy."),
            weight_masks=prefixed(tensors, "train.mask."),
            units={k: v.bool() for k, v in prefixed(tensors, "train.units.").items()},
            task_state=prefixed(tensors, "train.state."),
        )
        if training.task != len(masks):
            raise CheckpointError(
                f"{directory}: task {training.task} is in training but {len(masks)} are committed"
            )
    return Checkpoint(
        directory=directory,
        manifest=manifest,
        shared=prefixed(tensors, "shared."),
        masks=masks,
        rng=prefixed(tensors, "rng."),
        training=training,
        file_bytes=sizes,
        owner_ids=owner_ids,
    )


# ---------------------------------------------------------------------------- restoring
def _check_tensors(ckpt: Checkpoint, supernet: Supernet) -> None:
    """Every tensor must fit the supernet, before anything in it is changed."""
    where = ckpt.directory
    for name, layer in supernet.layers.items():
        w = ckpt.shared.get(name)
        if w is None or w.shape != layer.weight.shape:
            raise CheckpointError(f"{where}: shared weight of layer {name!r} missing or misshapen")
        if ckpt.owner_ids is not None:
            bits = ckpt.manifest.get("owner_bits")
            planes = ckpt.owner_ids.get(name)
            if (
                not isinstance(bits, int)
                or not 1 <= bits <= 63
                or planes is None
                or planes.dtype != torch.uint8
                or planes.numel() != bits * ((layer.weight.numel() + 7) // 8)
            ):
                raise CheckpointError(f"{where}: owner ids of layer {name!r} missing or cut")
    numel = {n: layer.weight.numel() for n, layer in supernet.layers.items()}

    def check_masks(
        what: str, weights: dict, units: dict, state: dict, forms: dict, keys: set[str]
    ) -> None:
        for name, n in numel.items():
            form = forms.get(name, "bits")
            payload = weights.get(name)
            fits = payload is not None and (
                (form == "bits" and payload.numel() == (n + 7) // 8)
                or (
                    form == "indices"
                    and payload.dtype == torch.int32
                    and bool(((payload >= 0) & (payload < n)).all())
                )
                or form not in EXPLICIT_FORMS
            )
            if not fits:
                raise CheckpointError(f"{where}: {what}: weight mask of {name!r} missing or cut")
            if form == "owned" and ckpt.owner_ids is None:
                raise CheckpointError(f"{where}: {what}: mask of {name!r} needs owner ids")
        for g, size in supernet.group_sizes.items():
            if g not in units or units[g].shape != (size,):
                raise CheckpointError(f"{where}: {what}: unit mask of group {g!r} missing or cut")
        if set(state) != keys:
            raise CheckpointError(f"{where}: {what}: task state does not match the model's")

    for t, mask in enumerate(ckpt.masks):
        if mask.shapes != {n: tuple(layer.weight.shape) for n, layer in supernet.layers.items()}:
            raise CheckpointError(f"{where}: task {t}: mask shapes differ from the model's")
        keys = supernet.task_state_keys(committed=True)
        check_masks(f"task {t}", mask.weights, mask.units, mask.state, mask.forms, keys)
    if ckpt.training is not None:
        tr = ckpt.training
        keys = supernet.task_state_keys()
        check_masks("task in training", tr.weight_masks, tr.units, tr.task_state, {}, keys)


def _owned_masks(
    ckpt: Checkpoint, supernet: Supernet, kind: str | None
) -> tuple[Ownership, list[TaskMask]]:
    """The checkpoint's owner ids and masks reading them, on the supernet's device.

    A version-1 checkpoint has no owner ids: each weight's owner is the first task (that does
    not keep its own weights) whose mask holds it, and every mask is converted to its smallest
    exact form, as if it had been committed by this espn (``kind``: the method's kind of
    weights; None: a task without its own weights is taken as one of shared weights).
    """
    device = next(iter(supernet.layers.values())).weight.device
    layout = supernet.owners.layout
    if ckpt.owner_ids is not None:
        planes = {n: ckpt.owner_ids[n].to(device) for n in layout}
        owners = Ownership.unpacked(
            layout, planes, int(ckpt.manifest["owner_bits"]), len(ckpt.masks)
        )
    else:
        owners = Ownership.empty(layout, device)
        for t, mask in enumerate(ckpt.masks):
            if not mask.own:
                owners.take({n: mask.weight_mask(n, device) for n in layout}, t)
    masks = []
    for t, mask in enumerate(ckpt.masks):
        # as commit_task does: only trained, shared weights may be stored as owned
        shared = kind == "shared" or (kind is None and not mask.own)
        if mask.forms:
            masks.append(replace(mask, owners=owners))
        else:
            dense = {n: mask.weight_mask(n) for n in layout}
            masks.append(
                TaskMask.from_dense(
                    dense,
                    mask.units,
                    mask.state,
                    mask.n_classes,
                    mask.new_weights,
                    mask.own,
                    owners=owners,
                    horizon=t if shared else -1,
                )
            )
    for t, mask in enumerate(masks):
        if mask.own and (
            set(mask.own) != set(layout)
            or any(mask.own[n].numel() != int(mask.weight_mask(n).sum()) for n in layout)
        ):
            raise CheckpointError(
                f"{ckpt.directory}: task {t}: its own weights do not fit its masks"
            )
    return owners, masks


@torch.no_grad()
def restore(ckpt: Checkpoint, supernet: Supernet, weights: str | None = None) -> None:
    """Load ``ckpt`` into a freshly built ``supernet``: shared weights, owner ids and every
    committed task (frozen weights are the owned ones). Validates first; converts a
    version-1 checkpoint (see :func:`_owned_masks`; ``weights`` is its method's kind of
    weights, ``"shared"``, ``"own"``, ..., where the caller knows the method).
    The task in training, if any, is :func:`restore_working`'s."""
    check_architecture(ckpt.manifest["architecture"], supernet, str(ckpt.manifest["model"]))
    _check_tensors(ckpt, supernet)
    if supernet.masks:
        raise ValueError("restore() needs a freshly built supernet with no task learned")
    owners, masks = _owned_masks(ckpt, supernet, weights)
    supernet.owners = owners
    supernet.masks = masks
    supernet.in_training = False
    supernet.active_task = None
    if supernet.masks:  # first: a task with its own weights (Individual) writes them in
        supernet.use_task(len(supernet.masks) - 1)
    for name, layer in supernet.layers.items():
        layer.weight.copy_(ckpt.shared[name].to(layer.weight.device))
        layer.frozen.copy_(owners.frozen(name))


@torch.no_grad()
def restore_working(training: TrainingState, supernet: Supernet) -> None:
    """Put the working sub-network of the task in training (its task state, unit and weight
    masks) back into ``supernet``, restored by :func:`restore` (which checked its tensors)."""
    supernet.begin_task(training.n_classes)
    for name, m in supernet.task_modules.items():
        m.load_task_state(prefixed(training.task_state, f"{name}."))
    for g, alive in training.units.items():
        every = bool(alive.all())
        for m in supernet.groups[g]:
            m.set_units(alive, every)
    for name, layer in supernet.layers.items():
        mask = unpack_bits(training.weight_masks[name].to(layer.weight.device), layer.weight.shape)
        layer.weight_mask.copy_(mask.to(layer.weight_mask.dtype))
        layer.note_mask(binary=True)  # a step takes the lean path, as before the checkpoint
