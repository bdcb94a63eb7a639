"""The slim copy of a supernet's working sub-network (:class:`SlimNet`): the model with the
task's dead units removed, each module cut by its layer adapter's ``slice`` (the export's
cut), which :mod:`espn.training.slim_step` trains and writes back. Guarded weights and residual streams
pruned per conv: docs/performance.md, "Training and evaluating at the sub-network's cost".
"""

from __future__ import annotations

import copy
import functools
import itertools
from typing import Any, cast

import torch
from torch import Tensor, nn

from espn.errors import EspnError
from espn.layers import ExportError, exported_adapter
from espn.layers.base import Cut, flat_path, kept, narrow, unit_cuts
from espn.layers.linear import MaskedLinear
from espn.supernet.fast import caches, stamp
from espn.supernet.layers import (
    MaskedLayer,
    TaskBias,
    TaskHead,
    TaskSpecific,
    UnitGate,
    UnitModule,
    expand_units,
    with_unions,
)
from espn.supernet.supernet import Supernet

#: task modules a copy takes without a layer adapter: a gate (cut to its units) and a shared
#: head's per-task bias (kept: its width is the task's classes)
KEPT = (UnitGate, TaskBias)


class SlimUnsupported(EspnError, ValueError):
    """The model holds a module a slim copy cannot slice exactly; the phase trains the masked
    supernet instead."""


def slice_units(supernet: Supernet) -> dict[str, Tensor]:
    """The units a slim copy keeps, per unit group, union and concatenation: the alive ones;
    for groups joined through unions of groups (a residual stream pruned per conv), every unit
    alive in any group of the joined set, so that the stream has one width wherever it is
    added."""
    units = supernet.unit_masks()
    parent = {g: g for g in units}

    def root(g: str) -> str:
        while parent[g] != g:
            g = parent[g]
        return g

    for members in supernet.unions.values():
        for g in members[1:]:
            parent[root(g)] = root(members[0])
    joined: dict[str, Tensor] = {}
    for g, alive in units.items():
        r = root(g)
        joined[r] = alive if r not in joined else joined[r] | alive
    kept = {g: joined[root(g)] for g in units}
    kept |= {u: kept[members[0]] for u, members in supernet.unions.items()}
    return with_unions(kept, {}, supernet.concats)


@torch.no_grad()
def put(full: Tensor, cut: Cut, value: Tensor) -> None:
    """Write ``value`` into ``full`` where :func:`espn.layers.base.take` read it."""
    if cut.whole():
        full.copy_(value)
        return
    flat = flat_path(full, cut)
    if flat is not None:
        full.view(-1).index_copy_(0, flat, value.reshape(-1))
        return
    at = [(dim, i.to(full.device)) for dim, i in enumerate(cut.index) if i is not None]
    if len(at) == 1:  # one indexed dimension: rows (or columns) copied in place
        full.index_copy_(*at[0], value)
        return
    # a weight cut along dimensions 0 and 1: the kept rows with their kept columns, then the rows
    (_, rows), (_, cols) = at
    full.index_copy_(0, rows, full.index_select(0, rows).index_copy_(1, cols, value))


class _Scatter:
    """A forward hook putting a stream writer's own alive features (dim 1) at their places
    among the stream's (zeros elsewhere, as the supernet's writer outputs there)."""

    def __init__(self, places: Tensor, width: int) -> None:
        self.places, self.width = places, width

    def __call__(self, module: nn.Module, inputs: Any, out: Tensor) -> Tensor:
        shape = (out.shape[0], self.width, *out.shape[2:])
        return out.new_zeros(shape).index_copy(1, self.places.to(out.device), out)


class _SlimDropout(nn.Module):
    """A copy's ``nn.Dropout`` whose input holds features ``index`` (its last dimension) of
    the supernet's ``width``: it draws the noise the supernet's dropout draws, over the whole
    width (the same random numbers, from the same generator: ``bernoulli_(1 - p)`` then
    ``/ (1 - p)``, as torch's dropout computes it, bit for bit), and multiplies its input by
    the kept features' noise, so that every kept feature is dropped and scaled exactly as in
    the supernet. It draws in the order of a contiguous input (torch's dropout draws in the
    order of its input's memory): a linear layer's input is one, as the flattened or pooled
    features before a head are; one laid out otherwise would get the same noise in another
    order, which no test here would see."""

    def __init__(self, p: float, index: Tensor, width: int) -> None:
        super().__init__()
        self.p, self.index, self.width = p, index, width

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p == 1.0:  # as torch's: zeros, no random number drawn
            return x * x.new_zeros(())
        noise = x.new_empty((*x.shape[:-1], self.width)).bernoulli_(1.0 - self.p)
        return x * noise.div_(1.0 - self.p).index_select(-1, self.index.to(x.device))


def _dropout_readers(model: nn.Module) -> dict[int, MaskedLinear | TaskHead]:
    """Per ``nn.Dropout`` (by id) directly followed, in an ``nn.Sequential``, by a linear layer
    (masked or a head, the first of a nested ``nn.Sequential``): that layer, whose input
    units say which of the dropout's features a copy keeps (see :class:`_SlimDropout`)."""
    readers: dict[int, MaskedLinear | TaskHead] = {}
    for parent in model.modules():
        if not isinstance(parent, nn.Sequential):
            continue
        for drop, after in itertools.pairwise(parent):
            while isinstance(after, nn.Sequential) and len(after) > 0:
                after = after[0]
            if type(drop) is nn.Dropout and type(after) in (MaskedLinear, TaskHead):
                readers[id(drop)] = cast(MaskedLinear | TaskHead, after)
    return readers


def refusal(name: str, m: nn.Module, readers: dict[int, Any] | None = None) -> str | None:
    """Why a slim copy cannot hold module ``m`` (named ``name``) exactly, whatever units are
    alive (None: it can): a masked or task module of a type it does not slice, a dropout
    unless it feeds a linear layer straight (``readers``, see :func:`_dropout_readers`), or
    another module holding tensors of its own (docs/performance.md)."""
    adapter = exported_adapter(m)
    sliced = adapter is not None and type(m) in adapter.exports  # cut by its adapter's slice
    if isinstance(m, MaskedLayer | TaskSpecific) and not sliced and type(m) not in KEPT:
        return f"module {name!r} ({type(m).__name__}) is not sliced"
    if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 and id(m) not in (readers or {}):
        return f"module {name!r} ({type(m).__name__}) draws random masks"
    own = next(m.parameters(recurse=False), None) is not None or (
        next(m.buffers(recurse=False), None) is not None
    )
    if own and not isinstance(m, MaskedLayer | UnitModule | TaskHead | TaskBias):
        return f"module {name!r} ({type(m).__name__}) holds its own tensors"
    return None


def slim_refusal(model: nn.Module) -> str | None:
    """Why no slim copy of ``model`` can be exact (None: one may be, depending on its alive
    units): checked before a copy is built, so that a prune phase of a model the copy cannot
    hold pays no copy at its prune events."""
    readers = _dropout_readers(model)
    whys = (refusal(name, m, readers) for name, m in model.named_modules())
    return next((why for why in whys if why is not None), None)


class SlimNet(nn.Module):
    """The working sub-network of a supernet with its dead units removed, ready to train.

    ``layers`` and ``groups`` mirror the supernet's, so that the strategy's masked-L2 term,
    saliency clamps and the frozen guard run on the copy unchanged; a slim layer's ``frozen``
    marks every weight the task may not change (frozen or outside its mask).
    """

    def __init__(self, supernet: Supernet) -> None:
        super().__init__()
        if (why := slim_refusal(supernet.model)) is not None:  # before any copy is made
            raise SlimUnsupported(why)
        units = slice_units(supernet)
        alive = supernet.unit_masks()
        #: groups writing into a residual stream pruned per conv: their layers keep their own
        #: alive units, scattered into the stream's width after their gate/BatchNorm
        self.own = {g: alive[g] for members in supernet.unions.values() for g in members}
        # the masked layers' full-size tensors are not copied: each is sliced from the
        # supernet's below (a copy built at every prune event pays for no full-size copy)
        shared = {
            id(t): t
            for layer in supernet.layers.values()
            for t in (layer.weight, layer.weight_mask, layer.frozen)
        }
        self.model = copy.deepcopy(supernet.model, memo=shared)
        #: per slimmed tensor's name (as in the supernet's model): where it was cut from
        self.index: dict[str, Cut] = {}
        #: per slim masked layer's name: the weights the task trains (free and in its mask)
        self.trains: dict[str, Tensor] = {}
        self.layers: dict[str, MaskedLayer] = {}
        self.groups: dict[str, list[UnitModule]] = {}
        #: as the supernet's flag: the copy is always of the task in training
        self.in_training = True
        # a dropout feeding a linear layer whose inputs are cut draws the supernet's noise
        readers = _dropout_readers(self.model)
        for parent in [s for s in self.model.modules() if isinstance(s, nn.Sequential)]:
            for i, drop in enumerate(list(parent)):
                if (reader := readers.get(id(drop))) is None:
                    continue
                cols = kept(units, reader.in_units, reader.in_unit_size)
                if cols is not None:
                    parent[i] = _SlimDropout(cast(nn.Dropout, drop).p, cols, reader.weight.shape[1])
        for name, m in self.model.named_modules():
            self._slice(name, m, units)
        # a penalty weighs each gate/BatchNorm by its place in ``groups`` (WeightedL1's
        # lambda tensor): the copy's must list the supernet's groups and modules in its order
        if [(g, len(m)) for g, m in self.groups.items()] != [
            (g, len(m)) for g, m in supernet.groups.items()
        ]:
            raise SlimUnsupported("the copy's unit groups are not the supernet's, in its order")

    def _slice(self, name: str, m: nn.Module, units: dict[str, Tensor]) -> None:
        """Cut ``m`` to the copy's units (a writer into a residual stream pruned per conv: to
        its own, scattered into the stream's width), recording where each tensor came from."""
        group = m.group if isinstance(m, UnitModule) else getattr(m, "out_units", None)
        if group in self.own:
            mine = self.own[group]
            if isinstance(m, UnitModule) and int(mine.sum()) < int(units[group].sum()):
                stream, own = (expand_units(a, m.unit_size) for a in (units[group], mine))
                m.register_forward_hook(_Scatter((stream.cumsum(0) - 1)[own], int(stream.sum())))
            units = units | {group: mine}
        adapter = exported_adapter(m)
        if type(m) is UnitGate:
            cuts = narrow(m, unit_cuts(m, functools.partial(kept, units)))
        elif adapter is not None and isinstance(m, MaskedLayer | TaskSpecific):
            try:
                cuts = adapter.slice(m, units)
            except ExportError as exc:
                raise SlimUnsupported(f"module {name!r}: {exc}") from None
        else:
            return
        self.index |= {f"{name}.{key}" if name else key: cut for key, cut in cuts.items()}
        if isinstance(m, MaskedLayer):
            # zero outside its mask, as it trains, and the guard keeps it so: the forward can
            # use the weight as it is, which MaskedLayer records as it records an all-ones mask
            trains = m.weight_mask.bool() & ~m.frozen
            m.weight.data.mul_(m.weight_mask)
            m.frozen = ~trains  # what the guard keeps
            self.trains[name] = trains
            caches(m)["_ones"] = stamp(m.weight_mask)
            self.layers[name] = m
        elif isinstance(m, UnitModule):  # the copy's units are all alive
            m.note_units(True)
            self.groups.setdefault(m.group, []).append(m)

    def cut_names(self) -> frozenset[str]:
        """The copy's tensors cut from the supernet's (what its structure narrows)."""
        return frozenset(name for name, cut in self.index.items() if not cut.whole())

    def forward_working(self, x: Tensor) -> Tensor:
        """Logits of the slim sub-network (the name the supernet's training forward has)."""
        return cast(Tensor, self.model(x))
