""":class:`LayerAdapter`: what one plain torch layer type means to espn, registered by type
(:func:`register`); see docs/architectures.md, "One adapter per layer type"."""

from __future__ import annotations

import copy
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

import torch
from torch import Tensor, nn
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks
from torch.utils.hooks import RemovableHandle

from espn.errors import EspnError
from espn.supernet.fast import memo
from espn.supernet.layers import (
    MaskedLayer,
    TaskBias,
    TaskChannelBias,
    TaskHead,
    UnitGate,
    UnitModule,
    expand_units,
)

#: what a layer does in a unit group
Role = Literal["layer", "norm", "attention"]


class ConvertError(EspnError, ValueError):
    """The network uses something the converter cannot express; the message says what."""


class ExportError(EspnError, ValueError):
    """A sub-network cannot be turned into a plain or slim model; the message says why."""


@dataclass
class Placement:
    """Where the converter placed one layer: its unit groups and how it is wrapped."""

    name: str
    #: unit group of its inputs / outputs (None: not prunable), features per unit on each side
    in_group: str | None = None
    out_group: str | None = None
    in_unit: int = 1
    out_unit: int = 1
    #: a norm's group and channels per unit
    norm_group: str | None = None
    norm_unit: int = 1
    #: a norm over concatenated feature maps: each member's unit group and channels, in order
    concat: tuple[tuple[str, int], ...] = ()
    #: whether the layer is the model's output (the task head)
    head: bool = False
    multi_head: bool = True
    task_affine: bool = False
    #: a gate follows the layer (its channels have no norm, or a bias no BatchNorm absorbs)
    gated: bool = False
    #: the layer's output scales features (a squeeze-excitation): a per-task bias, no gate
    scales: bool = False
    #: features on the last dimension of its output (a token tensor): a token gate
    tokens: bool = False
    #: a linear layer applied across the token axis: the unit group of the channels it is
    #: applied over (its rows, whose alive count scales its FLOPs)
    rows: str | None = None


def param(t: Tensor) -> nn.Parameter:
    """A detached copy of ``t`` as a parameter."""
    return nn.Parameter(t.detach().clone())


def call_hooked(model: nn.Module, hooks: list[RemovableHandle], *args: Any, **kw: Any) -> Any:
    """``model(*args, **kw)`` with ``hooks`` (registered for this one run), removed after."""
    try:
        return model(*args, **kw)
    finally:
        for h in hooks:
            h.remove()


def module_outputs(
    model: nn.Module, names: Iterable[str], *args: Any, **kw: Any
) -> tuple[Any, dict[str, Tensor]]:
    """``model(*args, **kw)`` and the tensor output of each module of ``names`` in that run,
    in the order forward() finishes them."""
    outputs: dict[str, Tensor] = {}

    def keep(name: str) -> Callable[..., None]:
        def hook(m: nn.Module, inputs: tuple[object, ...], out: object) -> None:
            if isinstance(out, Tensor):
                outputs[name] = out

        return hook

    hooks = [model.get_submodule(n).register_forward_hook(keep(n)) for n in names]
    return call_hooked(model, hooks, *args, **kw), outputs


def holding(module: nn.Module, weight: Tensor, bias: Tensor | None = None) -> nn.Module:
    """Plain ``module`` given copies of ``weight`` (and ``bias``), on their device and dtype."""
    module.weight = param(weight)
    if bias is not None:
        module.bias = param(bias)
    return module.to(device=weight.device, dtype=weight.dtype)


def hooked(m: nn.Module) -> bool:
    """Whether a forward hook would see ``m``'s call (its own or a global one)."""
    return bool(
        m._forward_hooks
        or m._forward_pre_hooks
        or _global_forward_hooks
        or _global_forward_pre_hooks
    )


class TokenGate(UnitGate):
    """A :class:`UnitGate` scaling the last dimension (token features; docs/transformers.md);
    one unit spans ``unit_size`` features."""

    def feature_shape(self, x: Tensor) -> tuple[int, ...]:
        return (-1,)


class Cut:
    """Where a slice of a tensor sits in the whole: the kept indices of each leading dimension
    (None: all of it). A matrix cut along both dimensions also has its kept entries' flat
    positions, so that reading or writing the slice is one gather or scatter rather than one
    pass per dimension."""

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


#: the cut of a tensor kept whole
WHOLE = Cut(())


def flat_path(t: Tensor, cut: Cut) -> Tensor | None:
    """``cut``'s flat positions where ``t`` (a matrix) can be read and written through them."""
    if cut.flat is None or t.dim() != 2 or not t.is_contiguous():
        return None
    return cut.flat.to(t.device)


def take(t: Tensor, cut: Cut) -> Tensor:
    """``t`` restricted to ``cut`` (a new tensor, or ``t`` itself where nothing is cut)."""
    flat = flat_path(t, cut)
    if flat is not None:
        return t.view(-1).index_select(0, flat).view(cut.shape)
    for dim, i in enumerate(cut.index):
        if i is not None:
            t = t.index_select(dim, i.to(t.device))
    return t


def kept(units: dict[str, Tensor], group: str | None, size: int) -> Tensor | None:
    """Indices of the alive features of a side indexed by ``group`` in units of ``size``
    (None: every feature, alive or not prunable): a :data:`Keep` once ``units`` is given."""
    alive = None if group is None else expand_units(units[group], size)
    return None if alive is None or bool(alive.all()) else alive.nonzero().flatten()


#: which features a task keeps: ``keep(group, size)``, the indices of the alive features of a
#: side indexed by unit group ``group`` in units of ``size`` features (None: all of them)
Keep = Callable[[str | None, int], Tensor | None]


def alive_index(m: UnitModule, size: int | None = None) -> Tensor | None:
    """:func:`kept` for unit module ``m``'s group in units of ``size`` features (None: its
    ``unit_size``), read from its ``unit_mask`` once per change of it (a host read at a prune
    event or a task switch, never in a step)."""
    mask, size = m.unit_mask, size or m.unit_size
    index = memo(m, f"_alive{size}", mask, lambda: kept({m.group: mask}, m.group, size))
    return cast(Tensor | None, index)


def alive_keep(*modules: UnitModule) -> Keep:
    """The :data:`Keep` of the units alive in ``modules``' unit masks, one module per unit
    group (:func:`alive_index`, each asked once): a step reading live tensors at their
    adapter's cuts, its masks unchanged while it runs."""
    by_group = {m.group: m for m in modules}
    known: dict[tuple[str, int], Tensor | None] = {}

    def keep(group: str | None, size: int) -> Tensor | None:
        if group is None:
            return None
        if (group, size) not in known:
            known[group, size] = alive_index(by_group[group], size)
        return known[group, size]

    return keep


def narrow(m: nn.Module, cuts: dict[str, Cut]) -> dict[str, Cut]:
    """Replace each tensor of ``m`` named in ``cuts`` by its slice there, a tensor of its own
    (the one replaced is never written); a unit module's units are then all alive (its unit
    mask all ones); returns ``cuts``."""
    for key, cut in cuts.items():
        full = getattr(m, key)
        part = full.detach().clone() if cut.whole() else take(full.detach(), cut)
        if isinstance(full, nn.Parameter):
            part = nn.Parameter(part, requires_grad=full.requires_grad)
        setattr(m, key, part)
    if isinstance(m, UnitModule):
        m.unit_mask = torch.ones_like(m.unit_mask)
    return cuts


def unit_cuts(m: UnitModule, keep: Keep) -> dict[str, Cut]:
    """The cut of unit module ``m`` (a gate or norm) to the alive units of its group: every
    tensor of one entry per feature at the alive entries, its unit mask at the alive units
    (nothing where every unit is alive)."""
    entries = keep(m.group, m.entries_per_unit)
    if entries is None:
        return {}
    per_entry, cut = m.weight.numel(), Cut((entries,))
    own = {**m._parameters, **m._buffers}.items()
    cuts = {k: cut for k, t in own if t is not None and t.dim() == 1 and t.numel() == per_entry}
    return cuts | {"unit_mask": Cut((keep(m.group, 1),))}


class LayerAdapter(ABC):
    """One layer type as espn sees it (see the module docstring); stateless, one instance."""

    #: the plain torch types this adapter converts (subclasses too, unless closer adapted)
    source: ClassVar[tuple[type[nn.Module], ...]] = ()
    #: the espn module types it exports back to plain torch modules
    exports: ClassVar[tuple[type[nn.Module], ...]] = ()
    role: ClassVar[Role] = "layer"
    #: works on token features (last dimension): refused on channels pruned in blocks
    tokens: ClassVar[bool] = False
    #: a norm that absorbs the bias of the layer right before it
    absorbs_bias: ClassVar[bool] = False
    #: a norm of each channel on its own: one over concatenated feature maps is split into
    #: one per member (``Placement.concat``)
    per_channel: ClassVar[bool] = False
    #: may be the model's output layer (the classifier)
    can_be_head: ClassVar[bool] = False
    #: its output may scale features (the excitation of a squeeze-excitation block)
    may_scale: ClassVar[bool] = False
    #: reads a flattened feature map (channels x positions inputs per channel)
    reads_flattened: ClassVar[bool] = False
    #: its outputs may be token tensors (features last, then gated by a TokenGate)
    token_outputs: ClassVar[bool] = False

    def check(self, name: str, m: nn.Module) -> None:
        """Refuse (one-line :class:`ConvertError`) a module of this type espn cannot express."""

    @abstractmethod
    def width(self, m: nn.Module, out_side: bool) -> int:
        """Features on the output (``out_side``) or input side of ``m``."""

    def groups(self, m: nn.Module) -> int:
        """Groups its channels come in (a grouped conv's ``groups``; 1 for most layers)."""
        return 1

    def depthwise(self, m: nn.Module) -> bool:
        """Whether its input channels are its output channels (a depthwise conv)."""
        return False

    def group_count(self, name: str, m: nn.Module) -> tuple[str, int] | None:
        """A description and the group count that a unit of its channels must hold whole (a
        grouped conv's groups, a GroupNorm's groups), or None."""
        return None

    @abstractmethod
    def convert(self, m: nn.Module, place: Placement) -> nn.Module:
        """The espn module(s) replacing ``m`` once placed in its unit groups."""

    # ----------------------------------------------------------------- export
    def plain(self, m: nn.Module) -> nn.Module:
        """The plain torch module computing what espn module ``m`` computes for the active
        task at full width (masks multiplied in)."""
        raise ExportError(f"no plain torch equivalent for {type(m).__name__}")

    def cuts(self, m: nn.Module, keep: Keep) -> dict[str, Cut]:
        """Where espn module ``m`` is cut to the features ``keep`` says a task keeps: the cut
        of each of its tensors, by name (a task norm's: :func:`unit_cuts`). The one decision
        of a layer type's cut: its :meth:`slice` narrows ``m`` through it (training's slim
        copy, the slim export), and the ViT's step on its alive units reads ``m``'s live
        tensors through it."""
        if isinstance(m, UnitModule):
            return unit_cuts(m, keep)
        raise ExportError(f"{type(m).__name__} cannot be sliced")

    def slice(self, m: nn.Module, units: dict[str, Tensor]) -> dict[str, Cut]:
        """Narrow espn module ``m`` in place to its :meth:`cuts` at ``units`` (unit group ->
        alive units), its sizes set to match (:meth:`resize`); the cuts, through which
        training's slim copy writes its tensors back."""
        cuts = narrow(m, self.cuts(m, functools.partial(kept, units)))
        self.resize(m)
        return cuts

    def resize(self, m: nn.Module) -> None:
        """Set the sizes of ``m``, its tensors just narrowed (its sizes still the old ones),
        to its tensors' (none here)."""

    @torch.no_grad()
    def slim(self, m: nn.Module, units: dict[str, Tensor]) -> nn.Module:
        """The plain torch module computing what ``m`` computes on its alive features: the
        plain module of its slice."""
        m = copy.deepcopy(m)
        self.slice(m, units)
        return self.plain(m)

    def fold_affine(self, layer: nn.Module, scale: Tensor | None, shift: Tensor | None) -> None:
        """Make plain ``layer`` compute ``layer(x) * scale + shift`` per output feature."""
        raise ExportError(f"a gate cannot be folded into a {type(layer).__name__}")

    def fold_norm(self, layer: nn.Module, norm: nn.Module) -> nn.Module | None:
        """Plain ``layer`` with this plain eval-mode norm folded in, or None if it cannot."""
        return None


class WeightAdapter(LayerAdapter):
    """A layer of shared weights (masked per task), gated or scaling as placed."""

    @abstractmethod
    def masked(self, m: nn.Module, place: Placement) -> nn.Module:
        """The masked layer holding ``m``'s weights."""

    def per_task_head(self, m: nn.Module, place: Placement) -> TaskHead:
        """The per-task head of output layer ``m`` (an adapter with ``can_be_head``)."""
        raise ConvertError(f"{type(m).__name__} {place.name!r} cannot be a classifier")

    @torch.no_grad()
    def task_head(self, m: nn.Module, place: Placement) -> nn.Module:
        """The head replacing output layer ``m``, its weights and bias copied: a per-task head
        with ``place.multi_head``, else ``m`` shared and masked, followed by a per-task bias
        (on the output features: dimension 1 of a conv's output) with ``place.task_affine``."""
        weight, bias = m.weight, getattr(m, "bias", None)
        assert isinstance(weight, Tensor)
        bias = torch.zeros(weight.shape[0]) if bias is None else bias
        if place.multi_head:
            head = self.per_task_head(m, place)
            head.weight.copy_(weight)
            head.bias.copy_(bias)
            return head
        shared = self.masked(m, Placement(place.name, place.in_group, None, place.in_unit))
        if not place.task_affine:
            return nn.Sequential(shared)
        task_bias = (TaskChannelBias if weight.dim() > 2 else TaskBias)(len(bias))
        task_bias.bias.copy_(bias)
        return nn.Sequential(shared, task_bias)

    @torch.no_grad()
    def convert(self, m: nn.Module, place: Placement) -> nn.Module:
        if place.head:
            return self.task_head(m, place)
        layer = self.masked(m, place)
        bias = getattr(m, "bias", None)
        if place.scales and place.out_group is not None and not place.gated:
            # a feature scale: a dead channel multiplies a zero feature, so no gate; its bias
            # is kept per task so that no task changes another's
            scale_bias = TaskChannelBias(self.width(m, True))
            if bias is not None:
                scale_bias.bias.copy_(bias)
            return nn.Sequential(layer, scale_bias)
        if place.gated:
            assert place.out_group is not None
            gate_type = TokenGate if place.tokens else UnitGate
            units = self.width(m, True) // place.out_unit
            gate = gate_type(
                units, place.out_group, affine=place.task_affine, unit_size=place.out_unit
            )
            return nn.Sequential(layer, gate)
        return layer

    def cuts(self, m: nn.Module, keep: Keep) -> dict[str, Cut]:
        """A head's weight at the columns of its alive inputs; a masked layer's weight and
        masks at the rows of its alive outputs (dimension 0) and those columns (dimension 1)."""
        if isinstance(m, TaskHead):
            return {"weight": Cut((None, keep(m.in_units, m.in_unit_size)))}
        assert isinstance(m, MaskedLayer)
        rows = keep(m.out_units, m.out_unit_size)
        cut = Cut((rows, keep(m.in_units, m.in_unit_size)), tuple(m.weight.shape))
        return dict.fromkeys(("weight", *MaskedLayer.BUFFERS), cut)

    def resize(self, m: nn.Module) -> None:
        """A linear layer's (a head's too) sizes; a subclass sets those of its others."""
        if isinstance(m, nn.Linear):
            m.out_features, m.in_features = m.weight.shape[:2]

    @torch.no_grad()
    def fold_affine(self, layer: nn.Module, scale: Tensor | None, shift: Tensor | None) -> None:
        """Output features on the weight's first dimension; the shift becomes (or joins) the
        bias (no bias is added where there is neither a bias nor a shift)."""
        weight = layer.weight
        assert isinstance(weight, Tensor)
        shape = (-1,) + (1,) * (weight.dim() - 1)
        if scale is not None:
            weight.mul_(scale.view(shape))
        current = getattr(layer, "bias", None)
        if current is not None:
            bias = current
        elif shift is not None:
            bias = torch.zeros_like(shift)
        else:
            return
        if scale is not None:
            bias = bias * scale
        layer.bias = param(bias if shift is None else bias + shift)


#: adapters by the plain torch type they convert, and by the espn type they export
_SOURCES: dict[type[nn.Module], LayerAdapter] = {}
_EXPORTS: dict[type[nn.Module], LayerAdapter] = {}


def register(cls: type[LayerAdapter]) -> type[LayerAdapter]:
    """Class decorator: register one instance of adapter ``cls`` under its types."""
    adapter = cls()
    for types, table in ((cls.source, _SOURCES), (cls.exports, _EXPORTS)):
        for t in types:
            if t in table:
                raise ValueError(f"{t.__name__} already has the adapter {type(table[t]).__name__}")
            table[t] = adapter
    return cls


def _nearest(table: dict[type[nn.Module], LayerAdapter], m: nn.Module) -> LayerAdapter | None:
    for t in type(m).__mro__:
        if t in table:
            return table[t]
    return None


def adapter_for(m: nn.Module) -> LayerAdapter | None:
    """The adapter converting plain module ``m`` (its nearest registered class), or None."""
    return _nearest(_SOURCES, m)


def exported_adapter(m: nn.Module) -> LayerAdapter | None:
    """The adapter exporting espn module ``m``, or None (not a layer type: a gate, tokens)."""
    return _nearest(_EXPORTS, m)


def exporter(m: nn.Module) -> LayerAdapter:
    """:func:`exported_adapter`, required: a one-line :class:`ExportError` where ``m`` has none."""
    adapter = exported_adapter(m)
    if adapter is None:
        raise ExportError(f"module {type(m).__name__} has no plain torch equivalent")
    return adapter


def layer_types() -> tuple[type[nn.Module], ...]:
    """The plain types of layers with weights (Torch-Pruning's roots of unit groups)."""
    return tuple(t for t, a in _SOURCES.items() if a.role == "layer")


def source_names() -> str:
    """The plain types the converter supports, for messages."""
    return ", ".join(sorted(f"nn.{t.__name__}" for t in _SOURCES))
