"""What it costs to store a run's learned tasks, counted the same way for every method."""

from __future__ import annotations

import hashlib

from torch import Tensor

from espn.supernet.supernet import Supernet


def _digest(t: Tensor) -> str:
    data = t.detach().cpu().contiguous().numpy().tobytes()
    return hashlib.sha1(str(t.dtype).encode() + data).hexdigest()


def _distinct_bytes(tensors: list[Tensor]) -> int:
    """Bytes of the distinct tensors among ``tensors`` (identical copies are stored once)."""
    seen: dict[str, int] = {}
    for t in tensors:
        seen.setdefault(_digest(t), t.numel() * t.element_size())
    return sum(seen.values())


def _shared_bytes(supernet: Supernet, weights: str, element: dict[str, int]) -> int:
    """The ``shared_weights`` part of :func:`storage_report` (``element``: each layer's
    bytes per weight)."""
    if weights == "fixed":
        return sum((m.weight.numel() + 7) // 8 + element[n] for n, m in supernet.layers.items())
    if weights not in ("shared", "own"):
        raise ValueError(f"unknown weights {weights!r}; choose 'shared', 'own' or 'fixed'")
    if weights == "own" or not supernet.masks:
        return 0
    return sum(int(supernet.owners.frozen(n).sum()) * element[n] for n in supernet.layers)


def storage_report(supernet: Supernet, weights: str) -> dict[str, int]:
    """Bytes needed to store every learned task so that each can be run again, by part.

    * ``shared_weights``: for ``weights="shared"`` the values of the weights some task uses
      (the owned weights: the union of the masks), for ``"fixed"`` (SupSup's signed
      constants) one sign bit per weight plus one float per layer, for ``"own"``
      (Individual) nothing: each task stores its own weights (``own_weights``: the values
      inside its mask).
    * ``owner_ids``: the supernet's owner-id tensors (one small integer per weight, for all
      tasks together), counted when some task's mask is stored as the weights it and earlier
      tasks own.
    * ``weight_masks``: each task's mask in the form it is stored in (see
      :mod:`espn.supernet.masks`): nothing for a mask derived from owner ids or from its unit
      masks, else bit-packed or as indices; identical masks are stored once.
    * ``unit_masks``: one bit per unit per task, except that a unit mask keeping every unit
      costs nothing, and identical ones are stored once.
    * ``task_state``: gates or BatchNorm and heads of each task, identical tensors stored once
      (so MTL's shared network state counts once and each task's head block once); a per-unit
      tensor whose dead units are exactly zero (gates, BatchNorm scale and shift) counts its
      alive units only, as checkpoints store it (see :meth:`TaskMask.alive_state`).

    ``total`` is their sum; ``one_dense_network`` (the dense supernet's weights) is given for
    comparison and is not part of the total.
    """
    masks = supernet.masks
    element = {n: layer.weight.element_size() for n, layer in supernet.layers.items()}
    shared = _shared_bytes(supernet, weights, element)
    owned = any(m.form(n) == "owned" for m in masks for n in m.weights)
    weight_masks = sum(
        _distinct_bytes([m.weights[n] for m in masks if m.weights[n].numel()])
        for n in supernet.layers
    )
    unit_masks = sum(
        len({_digest(m.units[g]) for m in masks if not bool(m.units[g].all())}) * ((size + 7) // 8)
        for g, size in supernet.group_sizes.items()
    )
    groups = supernet.unit_state_groups()
    states = [m.alive_state(groups)[0] for m in masks]  # as checkpoints store them
    keys = sorted({k for s in states for k in s})
    task_state = sum(_distinct_bytes([s[k] for s in states if k in s]) for k in keys)
    own = sum(v.numel() * v.element_size() for m in masks for v in m.own.values())
    report = {
        "shared_weights": shared,
        "owner_ids": supernet.owners.nbytes() if owned else 0,
        "weight_masks": weight_masks,
        "unit_masks": unit_masks,
        "task_state": task_state,
        "own_weights": own,
    }
    report["total"] = sum(report.values())
    report["one_dense_network"] = sum(
        m.weight.numel() * element[n] for n, m in supernet.layers.items()
    )
    return report
