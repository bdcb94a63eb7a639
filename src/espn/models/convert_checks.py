"""What :func:`espn.models.convert.to_supernet` proves before it hands a converted model over
(its dense FLOPs as measured, and a random task's slim copy run, compared and counted), or a
one-line refusal: see docs/architectures.md ("What wrap checks")."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from espn.layers import ConvertError
from espn.layers.base import module_outputs
from espn.supernet.flops import run_eval

if TYPE_CHECKING:
    from espn.supernet.supernet import Supernet

#: the batch sizes a task's slim copy must run at (the example's too): one sample, and an
#: odd batch that no example batch size divides into
PROBE_BATCHES = (1, 3)
#: outputs of the slim copy must match the supernet's within this (times max(1, |output|))
PROBE_TOLERANCE = 1e-4


def module_flops(model: nn.Module, example: Tensor) -> dict[str, int]:
    """FLOPs of one sample of ``example`` through ``model`` per module path (``""``: the whole
    model), counted as :func:`espn.export.export.measured_flops` counts them, in eval mode."""
    from espn.export.export import flop_counter  # it imports the supernet

    counter = flop_counter()
    with counter:
        run_eval(model, example[:1], grad=True)
    counts = counter.get_flop_counts().items()
    flops = {k.partition(".")[2]: sum(ops.values()) for k, ops in counts if k != "Global"}
    flops[""] = int(counter.get_total_flops())
    return flops


def check_flops_counted(measured: dict[str, int], model: nn.Module, example: Tensor) -> None:
    """Refuse converted ``model`` unless espn's dense count equals ``measured`` (the user's
    model, :func:`module_flops`), naming the deepest module whose FLOPs differ. A module
    whose layers' channels are all kept whole (one unit: never pruned) costs what it
    measured: its products (Swin's window attention) are noted as its ``espn_products``."""
    from espn.supernet.supernet import Supernet  # it imports the layers

    sn = Supernet(model, example)
    if measured[""] == sn.dense_flops:
        return
    costs = [(c.name, c.flops(sn.widths)) for c in sn.costs]

    def counted(path: str) -> float:
        inside = (f for n, f in costs if path in ("", n) or n.startswith(f"{path}."))
        return sum(inside)

    for path in sorted(measured, key=lambda p: -p.count(".")):
        layers = [m for n, m in sn.layers.items() if n.startswith(f"{path}.")]
        sides = [g for m in layers for g in (m.in_units, m.out_units) if g is not None]
        extra = measured[path] - counted(path)
        if path and extra > 0 and layers and all(sn.widths[g] == 1 for g in sides):
            model.get_submodule(path).espn_products = extra  # type: ignore[assignment]
            costs.append((path, extra))
    wrong = [p for p in measured if measured[p] != counted(p)]
    if not wrong:
        return
    depth = max(p.count(".") + bool(p) for p in wrong)
    path = next(p for p in wrong if p.count(".") + bool(p) == depth)  # the first called
    where = f"module {path!r}" if path else "forward()"
    raise ConvertError(
        f"{where} costs {measured[path]} FLOPs per sample (FlopCounterMode) but espn counts "
        f"{counted(path):.0f}: it multiplies by something that is not a layer's weight (a "
        "hand-written attention's q @ k, a bare parameter used as a weight), which espn could "
        "neither count nor prune; supported: weights in nn.Linear/nn.Conv layers, attention "
        "in nn.MultiheadAttention, nn.TransformerEncoderLayer or a module of its own holding "
        "a qkv and an output projection"
    )


def _inputs(example: Tensor, batch: int) -> Tensor:
    """A batch of ``batch`` inputs like ``example``: random floats, or ``example``'s rows
    repeated (token ids, whose valid range only the example knows)."""
    if example.is_floating_point():
        gen = torch.Generator().manual_seed(batch)
        return torch.randn((batch, *example.shape[1:]), generator=gen).to(example)
    return example[torch.arange(batch) % len(example)]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def check_task_cut(model: nn.Module, example: Tensor) -> None:
    """Refuse converted ``model`` unless a random task's slim copy runs at every batch size
    of :data:`PROBE_BATCHES` and the example's, computes the masked supernet's outputs and
    costs what espn counts. ``model`` itself is untouched (a copy is probed), and so is
    torch's random state (the probe's task heads draw from it)."""
    with torch.random.fork_rng(devices=[example.device] if example.is_cuda else []):
        _check_task_cut(model, example)


def random_units(
    group_sizes: dict[str, int], gen: torch.Generator, keep: float = 0.5
) -> dict[str, Tensor]:
    """Per unit group of ``group_sizes``: about ``keep`` of its units alive, at least one
    (drawn from ``gen``): a task's units for probing how a sub-network is cut."""
    units = {}
    for group, size in group_sizes.items():
        alive = torch.rand(size, generator=gen) < keep
        alive[torch.randint(size, (1,), generator=gen)] = True
        units[group] = alive
    return units


def _mixing_module(full: nn.Module, slim: nn.Module, x: Tensor) -> str | None:
    """The first module (as forward() finishes them), not of espn's own, whose outputs in
    ``slim`` (a task's slim copy of ``full``, the supernet's model on that task) are not among
    its outputs in ``full``, where dead features are exactly zero: one that mixes features."""
    kept = dict(slim.named_modules())
    hooked = [
        n
        for n, m in full.named_modules()
        if n and n in kept and not type(m).__module__.startswith("espn.")
    ]
    with torch.no_grad():
        outs = [module_outputs(net, hooked, x)[1] for net in (full, slim)]
    for name, got in outs[1].items():
        got, want = got.double().flatten(), outs[0][name].double().flatten().sort().values
        at = torch.searchsorted(want, got).clamp(max=len(want) - 1)
        near = torch.minimum((want[at] - got).abs(), (want[(at - 1).clamp(min=0)] - got).abs())
        if bool((near > PROBE_TOLERANCE * got.abs().clamp(min=1)).any()):
            return name
    return None


def _random_task(model: nn.Module, example: Tensor) -> Supernet:
    """A supernet of a copy of ``model`` holding one committed task of random units and
    per-task parameters (a weight near 1, the rest near 0); the copy shares the masked
    layers' weights, which a task leaves as they are (a model's largest tensors, not copied)."""
    from espn.supernet.layers import MaskedLayer
    from espn.supernet.supernet import Supernet

    shared = {id(m.weight): m.weight for m in model.modules() if isinstance(m, MaskedLayer)}
    sn = Supernet(copy.deepcopy(model, memo=shared), example)
    gen = torch.Generator().manual_seed(0)
    sn.begin_task(2)
    with torch.no_grad():
        for m in sn.task_modules.values():
            for name, p in m.named_parameters():
                p.copy_(float(name == "weight") + 0.2 * torch.randn(p.shape, generator=gen))
    sn.set_unit_masks(random_units(sn.group_sizes, gen))
    sn.eval()
    sn.commit_task()
    return sn


def _check_task_cut(model: nn.Module, example: Tensor) -> None:
    from espn.export.export import exported, measured_flops
    from espn.export.slim import slim_copy

    sn = _random_task(model, example)

    def refuse(what: str, why: str = "") -> ConvertError:
        why = why or (
            "a width written into forward() that could not be refitted, or a reshape that "
            "espn does not follow"
        )
        return ConvertError(f"a task's sub-network of {type(model).__name__} {what}: {why}")

    try:
        slim = slim_copy(sn, 0, example)
    except Exception as exc:  # the user's forward may raise anything on the copy
        raise refuse(f"cannot be cut out ({_first_line(exc)})") from None
    counted = sn.flops(sn.masks[0].units)
    for batch in (*PROBE_BATCHES, len(example)):
        x = _inputs(example, batch)
        try:
            with torch.no_grad():
                got = slim(x)
        except Exception as exc:  # the user's forward on fewer features
            raise refuse(
                f"does not run once its dead units are removed (batch of {batch}: "
                f"{_first_line(exc)})"
            ) from None
        with torch.no_grad():
            expected = sn(x, task=0)
        scale = max(1.0, float(expected.abs().max()))
        if got.shape != expected.shape or not bool(
            ((got - expected).abs() <= PROBE_TOLERANCE * scale).all()
        ):
            where = _mixing_module(sn.model, slim, x[:1])
            raise refuse(
                f"computes other outputs once its dead units are removed (batch of {batch})",
                f"module {where!r} ({type(model.get_submodule(where)).__name__}) mixes "
                "features (a statistic over the channels, as ConvNeXt V2's GlobalResponseNorm "
                "or an RMS norm over a map's channels), which espn does not follow; supported "
                "norms: nn.LayerNorm (also over an NCHW map's channels), nn.BatchNorm, "
                "nn.GroupNorm"
                if where
                else "forward() moves channels where espn does not follow them (a reshape or "
                "an index that reorders channels)",
            )
    flops = measured_flops(slim, example)
    if flops != counted:
        why = "forward() computes on features that espn does not follow"
        raise refuse(f"costs {flops} FLOPs (FlopCounterMode) where espn counts {counted:.0f}", why)
    try:
        exported(slim, _inputs(example, 2))
    except Exception as exc:  # torch.export raises many kinds of errors on what it cannot run
        raise refuse(
            f"cannot be captured by torch.export ({_first_line(exc)})",
            "forward() branches on the values of a tensor (data-dependent control flow)?",
        ) from None
