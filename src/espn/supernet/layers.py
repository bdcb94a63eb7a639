"""Building blocks of a supernet: the base of masked layers, whose weights all tasks share
(each concrete one lives next to its adapter in :mod:`espn.layers`), and task-specific modules
(gates, heads), swapped in with the active task. Units are named by *group*, *union* or
*concatenation* of groups (docs/architectures.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import ClassVar, TypeGuard

import torch
from torch import Tensor, nn

from espn.supernet.fast import MaskCaches, UnitCaches, is_on


class MaskedLayer(MaskCaches, nn.Module):
    """Base of a layer whose weight is shared across tasks and masked per task (mixed into
    ``nn.Linear`` and ``nn.Conv2d``): its state is the shared ``weight`` and the buffers named
    in :data:`BUFFERS`; a task's sub-network is the ``weight_mask`` the supernet swaps in."""

    #: the buffers a masked layer adds to its module's state, in registration order
    BUFFERS: ClassVar[tuple[str, ...]] = ("weight_mask", "frozen")

    weight: Tensor
    #: the active task's weight mask: 1.0 where it uses a weight, else 0.0 (``weight``'s shape)
    weight_mask: Tensor
    #: weights an earlier task owns, which no later task may change (bool)
    frozen: Tensor
    #: unit groups indexing the layer's input and output units (None: not prunable)
    in_units: str | None
    out_units: str | None
    #: consecutive features one unit of ``in_units`` / ``out_units`` spans (an attention
    #: head spans ``head_dim`` features of its q, k, v and output projections; 1 elsewhere)
    in_unit_size: int = 1
    out_unit_size: int = 1
    #: a linear layer applied across the token axis: the unit group of the channels it is
    #: applied over, one row each (None: it is applied over positions alone)
    row_units: str | None = None

    def _init_masks(
        self, in_units: str | None, out_units: str | None, in_size: int = 1, out_size: int = 1
    ) -> None:
        self.in_units, self.in_unit_size = in_units, in_size
        self.out_units, self.out_unit_size = out_units, out_size
        self.register_buffer("weight_mask", torch.ones_like(self.weight))
        self.register_buffer("frozen", torch.zeros_like(self.weight, dtype=torch.bool))

    def masked_weight(self) -> Tensor:
        """The weight with the active task's mask applied: ``weight * mask``, whose gradient is
        masked too (``grad * mask``; ``espn.training.optim.FrozenGuard`` zeroes the frozen
        weights'). The fast path (:mod:`espn.supernet.fast`) computes the same values."""
        if is_on():
            return self.fast_masked_weight()
        return self.weight * self.weight_mask


def with_unions(
    units: Mapping[str, Tensor],
    unions: Mapping[str, tuple[str, ...]],
    concats: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, Tensor]:
    """``units`` completed with the alive vector of every union of groups (a residual stream
    read by a later layer whose producers are pruned each on its own: a channel is alive where
    any member keeps it) and of every concatenation of groups (a layer reading ``torch.cat``
    of their features: its units are the members' units, in order)."""
    full = dict(units)
    for u, members in unions.items():
        full[u] = torch.stack([units[g].bool() for g in members]).any(0)
    cats = (concats or {}).items()
    return full | {c: torch.cat([full[g].bool() for g in members]) for c, members in cats}


def expand_units(alive: Tensor, size: int) -> Tensor:
    """A per-unit vector repeated over the ``size`` consecutive features of each unit."""
    return alive if size == 1 else alive.repeat_interleave(size)


class TaskSpecific(nn.Module, ABC):
    """A module whose parameters and buffers are swapped in and out with the active task."""

    #: whether a committed task stores this module's state; a module that does not is
    #: rebuilt by :meth:`load_task_state` from nothing (e.g. a released gate: all ones)
    per_task: bool = True

    @abstractmethod
    def reset_task(self, n_classes: int) -> None:
        """Re-initialise for a new task (``n_classes`` matters to heads only)."""

    def zero_dead(self, alive: dict[str, Tensor]) -> None:
        """Zero what this module holds for the dead units of ``alive`` (unit group -> alive
        units), so that a pruned feature is exactly zero; most modules hold nothing there."""

    def task_state(self) -> dict[str, Tensor]:
        """A detached copy of this task's parameters and buffers."""
        return {k: v.detach().clone() for k, v in self.state_dict().items() if k != "unit_mask"}

    def load_task_state(self, state: dict[str, Tensor]) -> None:
        """Load a state from :meth:`task_state`; shapes may differ (heads of other tasks)."""
        own = dict(self.named_parameters()) | dict(self.named_buffers())
        for name, value in state.items():
            target = own[name]
            target.data = value.to(device=target.device, dtype=target.dtype).clone()


class UnitModule(UnitCaches, TaskSpecific):
    """A task-specific module that scales units: its ``weight`` is the unit saliency (gamma);
    ``unit_mask`` (1 = alive) multiplies its scale and shift, so a pruned unit outputs exactly
    zero. A unit spans ``unit_size`` consecutive features; a gate holds one ``weight`` per
    unit, a norm one per feature."""

    weight: Tensor
    bias: Tensor
    group: str
    #: 1.0 for an alive unit, 0.0 for a pruned one (one entry per unit)
    unit_mask: Tensor
    #: consecutive features one unit spans
    unit_size: int = 1
    #: a norm's own re-initialisation (``nn.BatchNorm2d``'s, ...), what :meth:`reset_task` calls
    reset_parameters: Callable[[], None]

    def _init_units(self, group: str, n: int, unit_size: int = 1) -> None:
        if n % unit_size:
            raise ValueError(f"{n} features do not split into units of {unit_size}")
        self.group = group
        self.unit_size = unit_size
        self.register_buffer("unit_mask", torch.ones(n // unit_size))

    def reset_task(self, n_classes: int) -> None:
        """A norm's new task starts from its own ``reset_parameters``."""
        self.reset_parameters()

    @torch.no_grad()
    def set_units(self, alive: Tensor, all_alive: bool) -> None:
        """Write the alive vector ``alive`` (any device and dtype) into ``unit_mask``;
        ``all_alive``: whether every unit is, read once by the caller for a whole group."""
        self.unit_mask.copy_(alive.to(self.unit_mask.device, self.unit_mask.dtype))
        self.note_units(all_alive)

    def masked_affine(self) -> tuple[Tensor, Tensor]:
        """The scale and shift masked by the task's units (``weight`` and ``bias`` themselves
        where every unit is known alive: ``x * 1`` is ``x``, and so is its gradient)."""
        if self.all_alive():
            return self.weight, self.bias
        mask = self.entry_mask()
        return self.weight * mask, self.bias * mask

    @property
    def num_units(self) -> int:
        """Units (neurons, channels, groups of channels or heads) the module gates."""
        return int(self.unit_mask.numel())

    @property
    def entries_per_unit(self) -> int:
        """Entries of ``weight`` (and of every per-feature tensor) one unit holds."""
        return self.weight.numel() // self.num_units

    def entry_mask(self) -> Tensor:
        """``unit_mask`` repeated over each unit's entries of ``weight``."""
        return expand_units(self.unit_mask, self.entries_per_unit)

    def saliency(self) -> Tensor:
        """|gamma| per unit: the mean over a unit's entries (the entry itself for one)."""
        magnitude = self.weight.detach().abs()
        if self.entries_per_unit == 1:
            return magnitude
        return magnitude.view(self.num_units, -1).mean(1)


class UnitGate(UnitModule):
    """Per-neuron gate of a fully-connected layer: the neuron's BatchNorm-free gamma.
    ``affine=False`` (the paper's): a scale only, *released* when pruning ends (scale 1 on
    alive neurons, no longer trained), so a task stores no gate state; ``affine=True``
    (``--task-affine``): a per-task scale and shift, trained and stored with the task."""

    #: whether the gate was released (a 0-d bool)
    released: Tensor

    def __init__(self, n: int, group: str, affine: bool = False, unit_size: int = 1) -> None:
        super().__init__()
        self.affine = affine
        self.per_task = affine
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n), requires_grad=affine)
        self.register_buffer("released", torch.zeros((), dtype=torch.bool))
        self._init_units(group, n)
        self.unit_size = unit_size

    def reset_task(self, n_classes: int) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0)
            self.bias.zero_()
            self.released.fill_(False)
        self._follow_release()

    @torch.no_grad()
    def release(self) -> None:
        """End of pruning (non-affine gates): scale 1 on alive neurons, no more training."""
        if not self.affine:
            self.weight.copy_(self.unit_mask)
            self.released.fill_(True)
            self._follow_release()

    def _follow_release(self) -> None:
        # a released scale gets no gradient, so no optimizer (momentum, decay) can move it;
        # one that multiplies by ones is noted the identity (one host read per release)
        released = bool(self.released)
        self.weight.requires_grad_(not released)
        ones = released and not self.affine and bool((self.weight * self.unit_mask == 1).all())
        self.note_identity(ones)

    def load_task_state(self, state: dict[str, Tensor]) -> None:
        """Load a task's gate; a non-affine gate of a committed task is simply released."""
        if state or self.affine:
            super().load_task_state(state)
            self._follow_release()
        else:
            self.release()

    def feature_affine(self) -> tuple[Tensor, Tensor | None]:
        """The per-feature scale and shift (None for a scale-only gate) this gate applies:
        one gate entry over the ``unit_size`` features of its unit."""
        scale = expand_units(self.weight * self.unit_mask, self.unit_size)
        shift = expand_units(self.bias * self.unit_mask, self.unit_size) if self.affine else None
        return scale, shift

    def feature_shape(self, x: Tensor) -> tuple[int, ...]:
        """The shape a per-feature vector takes to scale ``x``: features on dimension 1."""
        return (1, -1) + (1,) * (x.dim() - 2)

    def forward(self, x: Tensor) -> Tensor:
        if self.is_identity():
            return x  # x * 1, exactly, for every value
        shape = self.feature_shape(x)
        scale, shift = self.feature_affine()
        out = x * scale.view(shape)
        return out if shift is None else out + shift.view(shape)


class TaskBias(TaskSpecific):
    """A per-task output bias for a head shared (and masked) across tasks."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n))

    def reset_task(self, n_classes: int) -> None:
        with torch.no_grad():
            self.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        return x + self.bias


class TaskChannelBias(TaskBias):
    """A per-task bias on the channels (dim 1) of a feature map: the bias of a layer whose
    output scales features instead of being one (the excitation of a squeeze-excitation
    block), kept per task so that no task changes another's."""

    def forward(self, x: Tensor) -> Tensor:
        return x + self.bias.view((1, -1) + (1,) * (x.dim() - 2))


class TaskHead(nn.Linear, TaskSpecific):
    """A classifier owned by one task (multi-head setting); its width follows the task."""

    def __init__(
        self, in_features: int, n_classes: int, in_units: str | None = None, in_unit_size: int = 1
    ) -> None:
        super().__init__(in_features, n_classes)
        self.in_units = in_units
        self.out_units: str | None = None
        #: inputs per unit of ``in_units`` (see :class:`MaskedLayer`)
        self.in_unit_size = in_unit_size
        self.out_unit_size = 1

    def reset_task(self, n_classes: int) -> None:
        self.weight.data = self.weight.new_empty(n_classes, *self.weight.shape[1:])
        self.bias.data = self.bias.new_empty(n_classes)
        self.out_features = n_classes
        self.reset_parameters()

    def load_task_state(self, state: dict[str, Tensor]) -> None:
        """Load a task's head and resize ``out_features`` to its class count."""
        super().load_task_state(state)
        self.out_features = self.weight.shape[0]


def is_costed(module: nn.Module) -> TypeGuard[MaskedLayer | TaskHead]:
    """Layers whose FLOPs the supernet counts: masked layers and task heads (conv ones too)."""
    return isinstance(module, MaskedLayer | TaskHead)
