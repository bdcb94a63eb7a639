"""The slim copy of a supernet's working sub-network (:class:`SlimNet`): the model with the
task's dead units removed, its tensors cut from the supernet's (:class:`Cut`), which
:mod:`espn.training.slim_step` trains and writes back. Guarded weights and residual streams
pruned per conv: docs/performance.md, "Training and evaluating at the sub-network's cost".
"""

from __future__ import annotations

import copy
import itertools
from typing import Any, cast

import torch
from torch import Tensor, nn

from espn.errors import EspnError
from espn.layers.batchnorm1d import TaskBatchNorm1d
from espn.supernet.fast import caches, stamp
from espn.supernet.layers import (
    MaskedConv2d,
    MaskedLayer,
    MaskedLinear,
    TaskBatchNorm2d,
    TaskBias,
    TaskGroupNorm,
    TaskHead,
    TaskSpecific,
    UnitGate,
    UnitModule,
    expand_units,
    with_unions,
)
from espn.supernet.supernet import Supernet

#: the module types a slim copy slices (exactly these: a subclass, e.g. a transformer's
#: token gate, may compute across units and is not sliced)
SLICED = (MaskedLinear, MaskedConv2d, UnitGate, TaskBatchNorm2d, TaskBatchNorm1d, TaskGroupNorm)
#: task modules a slim copy keeps as they are (their width is the task's classes)
KEPT = (TaskHead, TaskBias)


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


def _indices(kept: dict[str, Tensor], group: str | None, size: int) -> Tensor | None:
    """Kept feature indices of a side indexed by ``group`` in units of ``size`` (None: all)."""
    alive = None if group is None else expand_units(kept[group], size)
    return None if alive is None or bool(alive.all()) else alive.nonzero().flatten()


class Cut:
    """Where a slim copy's tensor sits in the supernet's: the kept indices of each leading
    dimension (None: all of it). A matrix cut along both dimensions also has its kept
    entries' flat positions, so that reading or writing the slice is one gather or scatter
    rather than one pass per dimension."""

    def __init__(self, index: tuple[Tensor | None, ...], shape: tuple[int, ...] = ()) -> None:
        self.index = index
        #: flat positions of the kept entries in a matrix of ``shape`` (None: not a matrix cut
        #: along both dimensions)
        self.flat: Tensor | None = None
        self.shape: tuple[int, ...] = ()
        rows, cols = index if len(index) == 2 else (None, None)
        if len(shape) == 2 and rows is not None and cols is not None:
            self.flat = (rows.view(-1, 1) * shape[1] + cols.view(1, -1)).view(-1)
            self.shape = (rows.numel(), cols.numel())

    def whole(self) -> bool:
        """Whether nothing is cut."""
        return all(i is None for i in self.index)


def _flat_path(t: Tensor, cut: Cut) -> Tensor | None:
    """``cut``'s flat positions where ``t`` (a matrix) can be read and written through them."""
    if cut.flat is None or t.dim() != 2 or not t.is_contiguous():
        return None
    return cut.flat.to(t.device)


def take(t: Tensor, cut: Cut) -> Tensor:
    """``t`` restricted to ``cut`` (a new tensor, or ``t`` itself where nothing is cut)."""
    flat = _flat_path(t, cut)
    if flat is not None:
        return t.view(-1).index_select(0, flat).view(cut.shape)
    for dim, i in enumerate(cut.index):
        if i is not None:
            t = t.index_select(dim, i.to(t.device))
    return t


@torch.no_grad()
def put(full: Tensor, cut: Cut, value: Tensor) -> None:
    """Write ``value`` into ``full`` where :func:`take` read it."""
    index = cut.index
    if cut.whole():
        full.copy_(value)
        return
    flat = _flat_path(full, cut)
    if flat is not None:
        full.view(-1).index_copy_(0, flat, value.reshape(-1))
        return
    at = [(dim, i) for dim, i in enumerate(index) if i is not None]
    if len(at) == 1:  # one indexed dimension: rows (or columns) copied in place
        full.index_copy_(at[0][0], at[0][1].to(full.device), value)
        return
    if len(index) == 2:  # the kept rows with their kept columns, then the rows
        rows, cols = (i.to(full.device) for i in index if i is not None)
        full.index_copy_(0, rows, full.index_select(0, rows).index_copy_(1, cols, value))
        return
    grids = []
    for dim, i in enumerate(index):
        i = torch.arange(full.shape[dim], device=full.device) if i is None else i.to(full.device)
        grids.append(i.view((-1,) + (1,) * (len(index) - dim - 1)))
    full.index_put_(tuple(grids), value)


#: the cut of a tensor a copy holds whole
WHOLE = Cut(())


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
        children = list(parent)
        for drop, after in itertools.pairwise(children):
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
    if isinstance(m, MaskedLayer | TaskSpecific) and type(m) not in SLICED + KEPT:
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
        kept = slice_units(supernet)
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
                cols = _indices(kept, reader.in_units, reader.in_unit_size)
                if cols is not None:
                    parent[i] = _SlimDropout(cast(nn.Dropout, drop).p, cols, reader.weight.shape[1])
        for name, m in self.model.named_modules():
            self._slice(name, m, kept)
        # a penalty weighs each gate/BatchNorm by its place in ``groups`` (WeightedL1's
        # lambda tensor): the copy's must list the supernet's groups and modules in its order
        if [(g, len(m)) for g, m in self.groups.items()] != [
            (g, len(m)) for g, m in supernet.groups.items()
        ]:
            raise SlimUnsupported("the copy's unit groups are not the supernet's, in its order")

    def _slice(self, name: str, m: nn.Module, kept: dict[str, Tensor]) -> None:
        if type(m) in (MaskedLinear, MaskedConv2d):
            assert isinstance(m, MaskedLinear | MaskedConv2d)
            self._slice_layer(name, m, kept)
        elif isinstance(m, UnitModule) and type(m) in SLICED:
            self._slice_units(name, m, kept)
        elif isinstance(m, TaskHead):
            cols = _indices(kept, m.in_units, m.in_unit_size)
            self._cut(name, m, "weight", Cut((None, cols)))
            m.in_features = m.weight.shape[1]

    def _cut(
        self, name: str, m: nn.Module, key: str, index: Cut, part: Tensor | None = None
    ) -> None:
        """Replace ``m``'s tensor ``key`` by its slice ``index`` (or by ``part``, computed
        from it), a tensor of its own, recording where it came from."""
        full = getattr(m, key)
        if part is None:
            part = take(full.detach(), index)
        if part is full or part._base is full:
            part = part.clone()
        if isinstance(full, nn.Parameter):
            setattr(m, key, nn.Parameter(part, requires_grad=full.requires_grad))
        else:
            setattr(m, key, part)
        self.index[f"{name}.{key}" if name else key] = index

    def _slice_layer(
        self, name: str, m: MaskedLinear | MaskedConv2d, kept: dict[str, Tensor]
    ) -> None:
        w = m.weight
        out_side = self.own if m.out_units in self.own else kept  # a writer: its own units
        rows = _indices(out_side, m.out_units, m.out_unit_size)
        cols = _indices(kept, m.in_units, m.in_unit_size)
        index = Cut((rows, cols), tuple(w.shape))
        # the copy's tensors are still the supernet's (see __init__): sliced, never written
        mask, frozen = take(m.weight_mask, index), take(m.frozen, index)
        trains = mask.bool() & ~frozen
        weight = take(m.weight.detach(), index) * mask  # zero outside the mask, as it trains
        self._cut(name, m, "weight", index, weight)
        self._cut(name, m, "weight_mask", index, mask)
        self._cut(name, m, "frozen", index, ~trains)  # what the guard keeps
        self.trains[name] = trains
        if isinstance(m, MaskedConv2d):
            if m.groups != 1:
                if m.out_channels % m.groups or (m.weight.shape[0] * m.groups) % m.out_channels:
                    raise SlimUnsupported(f"grouped conv {name!r} loses part of a group")
                m.groups = m.weight.shape[0] * m.groups // m.out_channels
            m.out_channels = m.weight.shape[0]
            m.in_channels = m.weight.shape[1] * m.groups
        else:
            m.out_features, m.in_features = m.weight.shape[0], m.weight.shape[1]
        # the weight is zero outside its mask and the guard keeps it so: the forward can use
        # it as it is, which MaskedLayer records as it records an all-ones mask
        caches(m)["_ones"] = stamp(m.weight_mask)
        self.layers[name] = m

    def _slice_units(self, name: str, m: UnitModule, kept: dict[str, Tensor]) -> None:
        units = self.own.get(m.group, kept[m.group])
        if m.group in self.own and int(units.sum()) < int(kept[m.group].sum()):
            stream = expand_units(kept[m.group], m.unit_size)
            mine = expand_units(units, m.unit_size)
            m.register_forward_hook(_Scatter((stream.cumsum(0) - 1)[mine], int(stream.sum())))
        # the copy's units are all alive (its unit mask is cut to them where any died)
        if bool(units.all()):
            m.note_units(True)
            self.groups.setdefault(m.group, []).append(m)
            return
        entries = expand_units(units, m.entries_per_unit).nonzero().flatten()
        per_entry = m.weight.numel()
        for key, t in list(m.named_parameters(recurse=False)) + list(
            m.named_buffers(recurse=False)
        ):
            if key == "unit_mask":
                self._cut(name, m, key, Cut((units.nonzero().flatten(),)))
            elif t.dim() == 1 and t.numel() == per_entry:
                self._cut(name, m, key, Cut((entries,)))
        width = m.weight.numel()
        if isinstance(m, TaskGroupNorm):
            per_group = per_entry // m.num_groups
            if width % per_group:
                raise SlimUnsupported(f"GroupNorm {name!r} loses part of a group")
            m.num_groups, m.num_channels = width // per_group, width
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.num_features = width
        m.note_units(True)
        self.groups.setdefault(m.group, []).append(m)

    def cut_names(self) -> frozenset[str]:
        """The copy's tensors cut from the supernet's (what its structure narrows)."""
        return frozenset(name for name, cut in self.index.items() if not cut.whole())

    def forward_working(self, x: Tensor) -> Tensor:
        """Logits of the slim sub-network (the name the supernet's training forward has)."""
        return cast(Tensor, self.model(x))
