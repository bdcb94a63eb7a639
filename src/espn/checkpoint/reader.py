"""Reading a checkpoint back: :func:`read_checkpoint` validates it completely and loads every
tensor before :func:`restore` changes anything in a supernet, so that nothing is ever
half-loaded; :func:`restore_working` puts a task in training back."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from espn.checkpoint.format import (
    CheckpointError,
    check_architecture,
    read_manifest,
    verify_file,
)
from espn.checkpoint.store import Checkpoint, TrainingState
from espn.supernet.masks import (
    EXPLICIT_FORMS,
    MASK_FORMS,
    Ownership,
    TaskMask,
    prefixed,
    unpack_bits,
)
from espn.supernet.supernet import Supernet


def _load_tensors(path: Path) -> dict[str, Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint file {path} cannot be read: {exc}") from None


def _read_task(
    path: Path, entry: dict[str, Any], tensors: dict[str, Tensor], arch: dict[str, Any]
) -> TaskMask:
    """A task's mask from its file: version 2 (entry names each layer's mask form) or
    version 1 (every mask bit-packed, unit masks as booleans, shapes in the entry)."""
    weights = prefixed(tensors, "weights.")
    state = prefixed(tensors, "state.")
    units = prefixed(tensors, "units.")
    mismatch = CheckpointError(f"checkpoint file {path}: weight masks do not match the manifest")
    forms: dict[str, str] = {}
    cut: dict[str, str] = {}
    horizon = -1
    if "masks" not in entry:  # version 1
        shapes = {k: tuple(v) for k, v in entry["shapes"].items()}
        if set(weights) != set(shapes):
            raise mismatch
        units = {k: v.bool() for k, v in units.items()}
    else:
        forms, horizon = dict(entry["masks"]), int(entry["horizon"])
        shapes = {k: tuple(v) for k, v in arch["layers"].items()}
        bad = {k: f for k, f in forms.items() if f not in MASK_FORMS}
        if (
            set(forms) != set(shapes)
            or bad
            or set(weights) != {k for k, f in forms.items() if f in EXPLICIT_FORMS}
        ):
            raise mismatch
        for k, f in forms.items():
            if f not in EXPLICIT_FORMS:
                weights[k] = torch.empty(0, dtype=torch.uint8)
        for g, packed in units.items():
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
        n_classes=int(entry["n_classes"]),
        new_weights=int(entry["new_weights"]),
        own=prefixed(tensors, "own."),
        forms=forms,
        horizon=horizon,
        stats=prefixed(tensors, "stats."),
    )


def read_checkpoint(directory: Path | str, manifest: dict[str, Any] | None = None) -> Checkpoint:
    """Read and validate a checkpoint: manifest (unless the caller read it), every file's size
    and SHA-256, tensor names.

    Version-1 checkpoints (every mask bit-packed, no owner ids) are read as they are and
    converted by :func:`restore`; a task's accuracy row, kept in its version-2 task file,
    is put back into its manifest entry (``"accuracy"``) in memory."""
    directory = Path(directory)
    manifest = read_manifest(directory) if manifest is None else manifest
    masks = []
    for entry in manifest["tasks"]:
        path = verify_file(directory, entry)
        tensors = _load_tensors(path)
        masks.append(_read_task(path, entry, tensors, manifest["architecture"]))
        if "accuracy" in tensors:
            entry["accuracy"] = tensors["accuracy"].tolist()
    tensors = _load_tensors(verify_file(directory, manifest["state"]))
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
    return Checkpoint(
        directory=directory,
        manifest=manifest,
        shared=prefixed(tensors, "shared."),
        masks=masks,
        rng=prefixed(tensors, "rng."),
        training=training,
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
    supernet.load_task_state(training.units, training.task_state)
    for name, layer in supernet.layers.items():
        mask = unpack_bits(training.weight_masks[name].to(layer.weight.device), layer.weight.shape)
        layer.weight_mask.copy_(mask.to(layer.weight_mask.dtype))
        layer.note_mask(binary=True)  # a step takes the lean path, as before the checkpoint
