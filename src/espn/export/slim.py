"""A task's sub-network as a plain PyTorch model, cut by swapping modules (:func:`slim_copy`,
:func:`plain_copy`, :func:`fold_batchnorm`); see docs/architectures.md, "One adapter per
layer type"."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from typing import cast

import torch
from torch import Tensor, nn

from espn.export.slim_shapes import refitted, reshapes
from espn.layers import ExportError, LayerAdapter, adapter_for, exported_adapter
from espn.layers.base import Cut, exporter, kept, module_outputs, param, take
from espn.layers.batchnorm2d import SplitNorm
from espn.layers.functional import FunctionalRead
from espn.layers.parameters import TaskParameters, TaskTokens, kept_features
from espn.supernet.flops import run_eval
from espn.supernet.layers import (
    MaskedLayer,
    TaskBias,
    TaskHead,
    TaskSpecific,
    UnitGate,
    UnitModule,
    is_costed,
    with_unions,
)
from espn.supernet.supernet import Supernet

__all__ = ["ExportError", "fold_batchnorm", "plain_copy", "slim_copy"]


def _use_task(supernet: Supernet, task: int) -> None:
    if not 0 <= task < len(supernet.masks):
        raise ExportError(f"task {task} is not learned (tasks 0..{len(supernet.masks) - 1})")
    supernet.use_task(task)


def _example(supernet: Supernet, example: Tensor | None) -> Tensor:
    """``example`` (two samples of it), or zeros of the supernet's input shape."""
    device = next(supernet.parameters()).device
    if example is not None:
        return example[:2].to(device)
    ids = any(
        nn.Embedding in getattr(exported_adapter(m), "source", ()) for m in supernet.modules()
    )
    return torch.zeros((2, *supernet.input_shape), device=device, dtype=torch.long if ids else None)


def _feeds(
    model: nn.Module,
    example: Tensor,
    layer: Callable[[nn.Module], bool],
    follower: Callable[[nn.Module], bool],
) -> dict[str, str]:
    """Per module ``follower`` names whose input is the output of one ``layer`` module called
    once: that layer's name (found by running ``model`` on ``example`` in eval mode)."""
    made: dict[int, tuple[str, Tensor]] = {}
    read: dict[str, Tensor] = {}
    calls: dict[str, int] = {}

    def output(name: str) -> Callable[..., None]:
        def hook(m: nn.Module, inputs: tuple[object, ...], out: object) -> None:
            calls[name] = calls.get(name, 0) + 1
            if isinstance(out, Tensor):
                made[id(out)] = (name, out)

        return hook

    def input_of(name: str) -> Callable[..., None]:
        def hook(m: nn.Module, inputs: tuple[object, ...]) -> None:
            if inputs and isinstance(inputs[0], Tensor):
                read[name] = inputs[0]

        return hook

    handles = []
    for name, m in model.named_modules():
        if layer(m):
            handles.append(m.register_forward_hook(output(name)))
        elif follower(m):
            handles.append(m.register_forward_pre_hook(input_of(name)))
    run_eval(model, example, handles)
    feeds = {}
    for name, x in read.items():
        source = made.get(id(x))
        if source is not None and source[1] is x and calls[source[0]] == 1:
            feeds[name] = source[0]
    return feeds


def _only_reader(model: nn.Module, example: Tensor, pairs: dict[str, str]) -> dict[str, str]:
    """The pairs of :func:`_feeds` in which the follower is the only reader of the layer's
    output (counted on ``model``'s autograd graph, built by running it once)."""
    with torch.enable_grad():
        out, outputs = module_outputs(model, set(pairs.values()), example)
    readers: dict[tuple[object, int], int] = {}
    seen, todo = set(), [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for nxt, index in node.next_functions:
            if nxt is not None:
                readers[(nxt, index)] = readers.get((nxt, index), 0) + 1
                todo.append(nxt)
    return {
        f: name
        for f, name in pairs.items()
        if name in outputs
        and outputs[name].grad_fn is not None
        and readers.get((outputs[name].grad_fn, outputs[name].output_nr), 0) == 1
    }


class Pick(nn.Module):
    """Reads channels ``index`` (dim 1) of its input: a layer reading a per-conv stream."""

    index: Tensor

    def __init__(self, index: Tensor) -> None:
        super().__init__()
        self.register_buffer("index", index)

    def forward(self, x: Tensor) -> Tensor:
        return x.index_select(1, self.index)


class Place(Pick):
    """Puts its input's channels at their places in a per-conv stream: stream channel ``i`` is
    input channel ``index[i]``, a zero where ``index[i]`` is the input's width."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([x, torch.zeros_like(x[:, :1])], 1).index_select(1, self.index)


def _streams(
    supernet: Supernet, units: dict[str, Tensor]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Per unit group and union of a per-conv stream: the position of each of its alive
    channels in its stream (the channels any writer of the stream keeps), and the stream."""
    sets: list[tuple[set[str], set[str]]] = []
    for union, members in supernet.unions.items():
        joined = [s for s in sets if s[0] & set(members)]
        groups, names = set(members), {union}
        for s in joined:
            groups |= s[0]
            names |= s[1]
            sets.remove(s)
        sets.append((groups, names))
    position: dict[str, Tensor] = {}
    stream: dict[str, Tensor] = {}
    for groups, names in sets:
        alive = torch.zeros_like(units[next(iter(groups))])
        for g in groups:
            alive |= units[g]
        place = torch.cumsum(alive.long(), 0) - 1
        for g in groups | names:
            position[g] = place[units[g].nonzero().flatten()]
            stream[g] = alive
    return position, stream


def _affine(
    m: nn.Module, layer: nn.Module, units: dict[str, Tensor]
) -> tuple[Tensor | None, Tensor | None]:
    """The per-feature scale and shift of gate or task bias ``m`` at the alive outputs of
    ``layer`` (the espn layer it follows): the rows of ``layer``'s cut, as a training step
    folds a gate into them (no cut where ``units`` is empty: a full-width copy)."""
    if isinstance(m, UnitGate):
        scale, shift = m.feature_affine()
    else:
        assert isinstance(m, TaskBias)
        scale, shift = None, m.bias
    if units:
        cut = exporter(layer).cuts(layer, functools.partial(kept, units))["weight"]
        rows = Cut(cut.index[:1])
        scale, shift = (None if t is None else take(t, rows) for t in (scale, shift))
    return scale, shift


@torch.no_grad()
def _swap(supernet: Supernet, units: dict[str, Tensor] | None, example: Tensor) -> nn.Module:
    """A copy of the supernet's model with every espn module swapped for its plain module:
    sliced to ``units`` (None: at full width, see :func:`plain_copy`)."""
    model = supernet.model
    feeds = _feeds(
        model,
        example,
        lambda m: isinstance(m, MaskedLayer | TaskHead),
        lambda m: isinstance(m, UnitModule | TaskBias),
    )
    originals = dict(model.named_modules())
    # the tensors of the modules swapped out below are not copied: the copy shares them
    # until the swap (a copy of the whole supernet would cost as much as its weights)
    shared = {
        id(t): t
        for m in originals.values()
        if _swapped(m) or isinstance(m, UnitGate | TaskBias | TaskParameters | TaskTokens)
        for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))
    }
    copied = copy.deepcopy(model, memo=shared)
    position: dict[str, Tensor] = {}
    stream: dict[str, Tensor] = {}
    full = units
    if units is not None:
        full = with_unions(units, supernet.unions, supernet.concats)
    if full is not None and supernet.unions:
        position, stream = _streams(supernet, full)
    cut = full or {}
    #: per layer: the gate or norm reading its output (where a stream writer's channels leave)
    after = {layer: f for f, layer in feeds.items()}
    folds = {
        f: layer for f, layer in feeds.items() if isinstance(originals[f], UnitGate | TaskBias)
    }
    for name, m in originals.items():
        if isinstance(m, UnitGate | TaskBias) and name not in folds:
            raise ExportError(
                f"{type(m).__name__} {name!r} must directly follow a linear or conv layer "
                "called once, to be folded into that layer"
            )
    _replace(copied, originals, full, position, stream, example.device)
    for gate, layer_name in folds.items():
        layer = copied.get_submodule(layer_name)
        plain = layer[-1] if isinstance(layer, nn.Sequential) else layer
        scale, shift = _affine(originals[gate], originals[layer_name], cut)
        exporter(originals[layer_name]).fold_affine(plain, scale, shift)
        copied.set_submodule(gate, nn.Identity())
    for name, m in originals.items():
        if isinstance(m, FunctionalRead):  # forward() reads the plain layer's own weights
            copied.set_submodule(name, cast(FunctionalRead, copied.get_submodule(name)).own())
    for writer, name in _writers(supernet, originals, stream, after):
        own = cut[writer]
        rank = torch.cumsum(own.long(), 0) - 1
        kept = stream[writer].nonzero().flatten()
        index = torch.where(own[kept], rank[kept], torch.full_like(kept, int(own.sum())))
        copied.set_submodule(
            name, nn.Sequential(copied.get_submodule(name), Place(index.to(example.device)))
        )
    return copied.eval()


def _swapped(m: nn.Module) -> bool:
    """Whether ``m`` is swapped for its adapter's plain module (:func:`_replace`)."""
    return isinstance(m, MaskedLayer | TaskHead) or (
        isinstance(m, TaskSpecific) and exported_adapter(m) is not None
    )


def _replace(
    copied: nn.Module,
    originals: dict[str, nn.Module],
    full: dict[str, Tensor] | None,
    position: dict[str, Tensor],
    stream: dict[str, Tensor],
    device: torch.device,
) -> None:
    """Swap each espn layer of ``copied`` (``originals``: the supernet's modules, by name) for
    its adapter's plain module, sliced to ``full`` (None: at full width), a reader of a
    per-conv stream behind a :class:`Pick` of its channels; cut the task's bare parameters."""
    for name, m in originals.items():
        if _swapped(m):
            adapter = exporter(m)
            new = adapter.plain(m) if full is None else adapter.slim(m, full)
            if is_costed(m) and m.in_units in position:
                if m.in_unit_size != 1:
                    raise ExportError(f"layer {name!r} reads a stream in blocks of features")
                index = position[m.in_units]
                if not torch.equal(index.cpu(), torch.arange(int(stream[m.in_units].sum()))):
                    new = nn.Sequential(Pick(index.to(device)), new)
            copied.set_submodule(name, new)
        elif isinstance(m, TaskParameters):
            for target, group in zip(m.targets, m.groups, strict=True):
                _cut_parameter(copied, target, full, group)
            parent, _, leaf = name.rpartition(".")
            delattr(copied.get_submodule(parent), leaf)  # the model reads them where they are
        elif isinstance(m, TaskTokens):
            for target in ("cls_token", "pos_embed"):
                _cut_parameter(copied, f"{name}.{target}" if name else target, full, m.group)
    for name, m in originals.items():
        if isinstance(m, SplitNorm):  # its parts are plain now: one norm of them all
            copied.set_submodule(name, cast(SplitNorm, copied.get_submodule(name)).joined())


def _writers(
    supernet: Supernet,
    originals: dict[str, nn.Module],
    stream: dict[str, Tensor],
    after: dict[str, str],
) -> Iterator[tuple[str, str]]:
    """Per layer writing into a per-conv stream: its unit group and the module whose output
    is placed in the stream (its gate or norm, else the layer)."""
    members = {g for ms in supernet.unions.values() for g in ms}
    for name, m in originals.items():
        if isinstance(m, MaskedLayer) and m.out_units in members and m.out_units in stream:
            if isinstance(m, nn.Conv2d) and m.groups != 1:
                raise ExportError("a grouped convolution cannot read or write a per-conv stream")
            yield m.out_units, after.get(name, name)


@torch.no_grad()
def _cut_parameter(
    model: nn.Module, target: str, units: dict[str, Tensor] | None, group: str | None
) -> None:
    """Keep parameter ``target`` of ``model`` at the alive features (:func:`channel_axis`) of
    ``group`` (all where ``units`` is None: a full-width copy)."""
    value: Tensor = model.get_parameter(target)
    keep = None if units is None else kept(units, group, 1)
    value = kept_features(value, keep)
    parent, _, leaf = target.rpartition(".")
    setattr(model.get_submodule(parent), leaf, param(value))


def plain_copy(supernet: Supernet, task: int, example: Tensor | None = None) -> nn.Module:
    """Task ``task``'s sub-network as plain torch modules at full width, in eval mode: weight
    masks multiplied in, gates and task biases folded into the layer before them, task
    BatchNorm and heads loaded. The supernet is left on task ``task``."""
    _use_task(supernet, task)
    return _swap(supernet, None, _example(supernet, example))


def slim_copy(supernet: Supernet, task: int, example_input: Tensor | None = None) -> nn.Module:
    """:func:`plain_copy` with task ``task``'s dead units removed: every layer keeps the rows
    and columns of its alive units (``example_input``: a batch of model inputs, run once to
    find which layer each gate follows); widths written into ``forward``'s reshapes are
    refitted (:mod:`espn.export.slim_shapes`)."""
    _use_task(supernet, task)
    units = {g: a.bool() for g, a in supernet.masks[task].units.items()}
    for group, alive in units.items():
        if not bool(alive.any()):
            raise ExportError(f"task {task}: unit group {group!r} has no alive unit")
    example = _example(supernet, example_input)
    # the full-width copy, run once for its reshapes, is freed before the slim one is cut
    wide = {g: torch.ones_like(a) for g, a in units.items()}
    shapes = reshapes(_swap(supernet, wide, example), example)
    return refitted(_swap(supernet, units, example), shapes, example)


@torch.no_grad()
def fold_batchnorm(model: nn.Module, example: Tensor) -> nn.Module:
    """Fold every eval-mode BatchNorm that reads the output of a layer it folds into (a conv
    of its dimension; a linear layer for ``BatchNorm1d``), called once and read by it alone,
    into that layer's weight and bias, in place; returns ``model``. Computed in float64 and
    rounded once (outputs change by float32 rounding: docs/checkpoints.md)."""

    def role(r: str) -> Callable[[nn.Module], bool]:
        return lambda m: getattr(adapter_for(m), "role", None) == r

    pairs = _only_reader(model, example, _feeds(model, example, role("layer"), role("norm")))
    for norm_name, layer_name in pairs.items():
        bn = model.get_submodule(norm_name)
        fused = cast(LayerAdapter, adapter_for(bn)).fold_norm(
            model.get_submodule(layer_name).eval(), bn.eval()
        )
        if fused is not None:
            model.set_submodule(layer_name, fused)
            model.set_submodule(norm_name, nn.Identity())
    return model
