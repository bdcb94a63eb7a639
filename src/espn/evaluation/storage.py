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
    """Bytes needed to store every learned task so that each can be run again, by part
    (docs/cli.md, ``storage``), identical tensors counted once: ``shared_weights`` (the owned
    weights' values; ``"fixed"``: a sign bit per weight and a float per layer; ``"own"``:
    none), ``owner_ids`` (when some mask is stored ``owned``), ``weight_masks`` (in their
    stored forms), ``unit_masks`` (a bit per unit, none where all are alive), ``task_state``
    (per-unit tensors cut to the alive units, as checkpoints store them), ``own_weights``,
    their ``total``, and ``one_dense_network`` for comparison (not in the total)."""
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
