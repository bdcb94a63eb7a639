"""Building blocks of a supernet.

Two kinds of modules make a network a supernet:

* masked layers (:class:`MaskedLinear`, :class:`MaskedConv2d`) whose weights are shared by
  all tasks; each carries the active task's weight mask and the set of frozen weights;
* task-specific modules (:class:`TaskSpecific`) whose parameters and buffers belong to one
  task at a time: the unit gates of fully-connected layers (:class:`UnitGate`), task-specific
  BatchNorm and GroupNorm (:class:`TaskBatchNorm2d`, :class:`TaskGroupNorm`), and heads
  (:class:`TaskBias`, :class:`TaskHead`).

Units (neurons or channels) are named by a *group*: every masked layer says which group
indexes its input and its output units, and every gate or BatchNorm belongs to one group.
Layers whose outputs are added together (a residual stream) either share one group, so that
their channels are kept or pruned together, or each have their own group, and the layers that
read the stream name a *union* of those groups (see :func:`union_alive`): a stream channel is
alive where any of its producers keeps it (the authors' per-conv pruning). A unit may span
several consecutive features (an attention head's ``head_dim`` values, a grouped
convolution's group of channels, a GroupNorm group): each layer and norm says how many on its
side (``*_unit_size``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeGuard

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class MaskedLayer(nn.Module):
    """Base of a layer whose weight is shared across tasks and masked per task (mixed into
    ``nn.Linear`` and ``nn.Conv2d``).

    Its state is the shared ``weight`` and the buffers named in :data:`BUFFERS`, declared
    below; a task's sub-network is the ``weight_mask`` the supernet swaps in for it.
    """

    #: the buffers a masked layer adds to its module's state, in registration order
    BUFFERS: ClassVar[tuple[str, ...]] = ("weight_mask", "frozen")

    weight: Tensor
    #: the active task's weight mask: 1.0 where it uses a weight, 0.0 elsewhere (float, the
    #: shape of ``weight``)
    weight_mask: Tensor
    #: weights an earlier task owns, which no later task may change (bool, the shape of
    #: ``weight``)
    frozen: Tensor
    #: unit groups indexing the layer's input and output units (None: not prunable)
    in_units: str | None
    out_units: str | None
    #: consecutive features one unit of ``in_units`` / ``out_units`` spans (an attention
    #: head spans ``head_dim`` features of its q, k, v and output projections; 1 elsewhere)
    in_unit_size: int = 1
    out_unit_size: int = 1

    def _init_masks(self, in_units: str | None, out_units: str | None) -> None:
        self.in_units = in_units
        self.out_units = out_units
        self.register_buffer("weight_mask", torch.ones_like(self.weight))
        self.register_buffer("frozen", torch.zeros_like(self.weight, dtype=torch.bool))
        self._ones: tuple[Tensor, int] | None = None
        self._binary: tuple[Tensor, int] | None = None
        self._count: tuple[Tensor, int, Tensor] | None = None
        self._keep: tuple[Tensor, int, Tensor, Tensor] | None = None
        self._free: tuple[Tensor, int, Tensor] | None = None
        self._thawed: tuple[Tensor, int, bool] | None = None
        self._product: tuple[Tensor, Tensor, Tensor, int, Tensor, int] | None = None
        #: the address and version of the gradient the last backward through the masked
        #: product gave the weight (see :meth:`grad_is_kept`)
        self._kept_grad: tuple[int, int] | None = None
        #: the weight, mask and frozen stamps (and the weight's address) under which the
        #: weight is known to be zero outside the mask (see :meth:`zero_pruned`)
        self._zero: tuple[Tensor, int, int, Tensor, int, Tensor, int] | None = None
        #: the frozen set and the flat index of a frozen weight found outside the mask
        self._stuck: tuple[Tensor, int, int] | None = None

    #: what the layer remembers about its own tensors between calls (see below): dropped
    #: from a copy or pickle, whose tensors are others (a step's product is not even a leaf)
    TRANSIENT: ClassVar[tuple[str, ...]] = (
        "_ones",
        "_binary",
        "_count",
        "_keep",
        "_free",
        "_thawed",
        "_product",
        "_kept_grad",
        "_zero",
        "_stuck",
    )

    def __getstate__(self) -> dict[str, Any]:
        state: dict[str, Any] = super().__getstate__()
        return state | dict.fromkeys(self.TRANSIENT)

    def note_mask(self, binary: bool = False) -> None:
        """Record whether ``weight_mask`` is all ones (one host read, at a mask change, never
        in a step): while that very tensor is unchanged since (same object, same version
        counter, which every in-place write bumps), :meth:`masked_weight` is the weight
        itself, with no product to compute and none to differentiate.

        ``binary``: the caller knows the mask holds only zeros and ones (it copied a boolean
        mask in, or zeroed entries of a mask noted binary), so that only whether it is all
        ones is read, in one cheaper pass.
        """
        mask = self.weight_mask
        if not binary:
            binary = bool(((mask == 0) | (mask == 1)).all())
        ones = binary and int(mask.bool().count_nonzero()) == mask.numel()
        self._ones = stamp(mask) if ones else None
        self._binary = stamp(mask) if binary else None
        frozen = self.frozen
        if not unchanged(self.__dict__.get("_thawed"), frozen):
            self._thawed = (*stamp(frozen), not bool(frozen.any()))

    def mask_is_binary(self) -> bool:
        """Whether ``weight_mask`` is known to hold only zeros and ones (see :meth:`note_mask`):
        a mask swapped or written since reads as not known."""
        return unchanged(self.__dict__.get("_binary"), self.weight_mask)

    def mask_is_ones(self) -> bool:
        """Whether ``weight_mask`` is known to be all ones (see :meth:`note_mask`); a mask
        swapped or written since reads as not known. Inside ``torch.compile`` it reads as not
        known: a compiled graph multiplies by the mask tensor, which a prune event updates
        in place, so that no Python value guards the graph (see :mod:`espn.training.compile`)."""
        if torch.compiler.is_compiling():
            return False
        return unchanged(self.__dict__.get("_ones"), self.weight_mask)

    def masked_weight(self) -> Tensor:
        """The weight with the active task's mask applied (zeros elsewhere).

        In a training step with the layer's own mask (noted by :meth:`note_mask` as all ones
        or 0/1, and unwritten since), the result comes from :class:`_TrainedWeight`, whose
        backward gives the weight the gradient of the task's trainable weights alone (in its
        mask and not frozen), bit for bit, with the masked-L2 term's gradient added in the
        same pass: the weight's gradient then needs no other masking pass (see
        :meth:`grad_is_kept`), and the product is remembered for the rest of the step (see
        :meth:`step_product`). Where the weight is known to be zero outside the mask (see
        :meth:`zero_outside_known`), the product is the weight itself, bit for bit, and is
        not computed.
        """
        weight, mask = self.weight, self.weight_mask
        if torch.compiler.is_compiling():
            # a compiled graph differentiates the product itself (the guard then masks the
            # gradient) and reads no Python state a prune event changes
            return weight * mask
        ones = self.mask_is_ones()
        training = torch.is_grad_enabled() and weight.requires_grad and not mask.requires_grad
        if not (training and (ones or self.mask_is_binary())):
            # no training step, or a mask not noted as binary since its last change (a mask
            # passed in through functional_call, soft or trained): differentiated as it is,
            # and no product of an earlier forward pass counts as this one's
            if torch.is_grad_enabled():
                self.__dict__["_product"] = None
            return weight if ones or self.zero_outside_known() else weight * mask
        keep = None if ones and self._nothing_frozen() else self._trainable_bits()
        bare = ones or self.zero_outside_known()
        product, sink = _TrainedWeight.apply(weight, None if bare else mask, keep, self)
        # written to the instance's dict directly: nn.Module.__setattr__ checks its
        # parameters, buffers and submodules first (a few microseconds per layer and step)
        self.__dict__["_product"] = (product, sink, *stamp(weight), *stamp(mask))
        return product

    @torch.no_grad()
    def zero_pruned(self, states: Sequence[Tensor] = ()) -> bool:
        """Zero every free weight outside the mask, and the same entries of ``states`` (the
        weight's optimizer state), at a prune event of a method whose free weights are set
        anew before a later task reads them: no forward pass of the task reads them (the
        product zeroes them), no gradient reaches them, and with zero state no optimizer
        step moves them. The weight is then known to be zero outside its mask, so that
        ``weight * mask`` is ``weight`` bit for bit (``x * 1`` is ``x``, ``0 * 0`` is ``0``
        with its sign) and :meth:`masked_weight` skips the product, until the weight, mask
        or frozen set is written otherwise than by a training step (see
        :meth:`note_trained`).

        Only for a mask noted as 0/1 with no frozen weight outside it (a frozen weight is
        never zeroed: an earlier task's weight in a unit this task pruned, or one it did not
        reuse); returns whether the layer knows its weight zero outside the mask. An
        all-ones mask needs nothing (the product is skipped already)."""
        mask, weight = self.weight_mask, self.weight
        if self.mask_is_ones() or not self.mask_is_binary():
            return False
        stuck = self.__dict__.get("_stuck")
        # the frozen weight found outside the mask at an earlier event still is (one read)
        if unchanged(stuck, self.frozen) and stuck and not bool(mask.reshape(-1)[stuck[2]]):
            return False
        free = self.free_bits()
        # the mask's bits: all ones (-1) in it, zero outside, as integers of the weight's
        # element size; an AND with them zeroes the outside, bit for bit, in one pass
        bits = mask.to(free.dtype).neg_()
        if not self._nothing_frozen():
            # a zero in ``bits | free`` is a frozen weight outside the mask (neither in it nor
            # free): the largest entry, if any is zero; remembered for the next event
            either = torch.bitwise_or(bits, free).view(-1)
            at = int(either.argmax())
            if not bool(either[at]):
                self._stuck = (*stamp(self.frozen), at)
                return False
        for tensor in (weight, *states):
            if tensor.dtype == weight.dtype:
                float_bits(tensor).bitwise_and_(bits)
            else:
                tensor.masked_fill_(bits == 0, 0.0)
        # the next step's trainable bits (see _trainable_bits), from the same mask bits
        self._keep = (*stamp(mask), free, bits.bitwise_and_(free))
        self._zero = (*stamp(weight), weight.data_ptr(), *stamp(mask), *stamp(self.frozen))
        return True

    def zero_outside_known(self) -> bool:
        """Whether the weight is known to be zero outside the mask (see :meth:`zero_pruned`):
        the weight (same address), mask and frozen set unwritten since it was noted, but by
        the training steps :meth:`note_trained` followed."""
        known = self.__dict__.get("_zero")
        if known is None or torch.compiler.is_compiling():
            return False
        weight = self.weight
        return (
            unchanged(known, weight)
            and known[2] == weight.data_ptr()
            and unchanged(known[3:5], self.weight_mask)
            and unchanged(known[5:], self.frozen)
        )

    def keeps_zero(self) -> bool:
        """Whether the coming optimizer step keeps the weight zero outside the mask: it is
        known to be now, and the gradient the step applies is the product's backward's,
        zero wherever the task may not train (see :meth:`grad_is_kept`). The engine asks
        before an optimizer step and calls :meth:`note_trained` after it."""
        return self.zero_outside_known() and self.grad_is_kept()

    def note_trained(self) -> None:
        """Carry the knowledge of :meth:`zero_pruned` over an optimizer step that
        :meth:`keeps_zero` allowed (an optimizer moves no weight whose gradient and state
        are zero, decay included; the frozen guard restores frozen weights only)."""
        known = self.__dict__.get("_zero")
        if known is not None:
            self._zero = (*stamp(self.weight), *known[2:])

    def _nothing_frozen(self) -> bool:
        """Whether ``frozen`` is known to hold no weight (noted by :meth:`note_mask`, and
        unwritten since): a step then has nothing to keep out of an all-ones mask."""
        known = self.__dict__.get("_thawed")
        return known is not None and unchanged(known, self.frozen) and bool(known[2])

    def step_product(self) -> Tensor | None:
        """This step's masked weight as the forward pass computed it (None: none is current:
        the weight or the mask changed since, or no training forward pass computed it)."""
        parts = self.step_parts()
        return None if parts is None else parts[0]

    def step_sink(self) -> Tensor | None:
        """Where the masked-L2 term's gradient enters this step's product (see
        :class:`_TrainedWeight`; None when :meth:`step_product` is None)."""
        parts = self.step_parts()
        return None if parts is None else parts[1]

    def step_parts(self) -> tuple[Tensor, Tensor] | None:
        """:meth:`step_product` and :meth:`step_sink` in one call (None: no product is
        current)."""
        known = self.__dict__.get("_product")
        if known is None or torch.compiler.is_compiling():
            return None
        product, sink, *stamps = known
        if unchanged(stamps[:2], self.weight) and unchanged(stamps[2:], self.weight_mask):
            return product, sink
        return None

    def grad_is_kept(self) -> bool:
        """Whether ``weight.grad`` is the gradient the masked product's backward wrote since
        :meth:`forget_kept_grad`, every weight the task may not train zeroed bit for bit,
        and unchanged since (its address and version counter)."""
        grad, known = self.weight.grad, self.__dict__.get("_kept_grad")
        return grad is not None and known == (grad.data_ptr(), grad._version)

    def forget_kept_grad(self) -> None:
        """Forget what an earlier backward pass wrote (called before each backward pass that
        :meth:`grad_is_kept` is asked about, so that no earlier gradient's address counts)."""
        self.__dict__["_kept_grad"] = None

    def _trainable_bits(self) -> Tensor:
        """All ones on the weights the task may train (in the mask, not frozen), zero
        elsewhere, as integers of the weight's element size (see :meth:`free_bits`); for a
        mask noted as 0/1 and unwritten since, rebuilt when it or ``frozen`` changed."""
        free = self.free_bits()
        if self.mask_is_ones():
            return free
        mask = self.weight_mask
        known = self.__dict__.get("_keep")
        if unchanged(known, mask) and known is not None and known[2] is free:
            return known[3]
        # a 0/1 mask as integers is 0/1, negated 0/-1 (all bits set): three integer passes
        keep = mask.to(free.dtype).neg_().bitwise_and_(free)
        self._keep = (*stamp(mask), free, keep)
        return keep

    def free_bits(self) -> Tensor:
        """All ones (-1) on every weight not frozen, zero on a frozen one, as integers of the
        weight's element size (an AND of a float's bits with it keeps the free entries, bit
        for bit); rebuilt when ``frozen`` changed (at a commit, never in a task's steps)."""
        frozen, dtype = self.frozen, _BITS[self.weight.element_size()]
        known = self.__dict__.get("_free")
        if unchanged(known, frozen) and known is not None and known[2].dtype == dtype:
            return known[2]
        free = frozen.logical_not().to(dtype).neg_()
        self._free = (*stamp(frozen), free)
        return free

    def mask_count(self) -> Tensor:
        """The number of weights in the mask, as a tensor (no host read), counted again only
        when the mask changed (inside ``torch.compile``: every time, see :meth:`mask_is_ones`)."""
        mask = self.weight_mask
        if torch.compiler.is_compiling():
            return mask.sum()
        known = self.__dict__.get("_count")
        if unchanged(known, mask) and known is not None:
            return known[2]
        count = mask.sum()
        self._count = (*stamp(mask), count)
        return count


def stamp(tensor: Tensor) -> tuple[Tensor, int]:
    """``tensor`` and its version counter (which every in-place write bumps): what a cache
    records to know later that its value was computed from this very tensor, unwritten since."""
    return tensor, tensor._version


def unchanged(known: Sequence[Any] | None, tensor: Tensor) -> bool:
    """Whether ``known`` starts with :func:`stamp` of ``tensor`` as it is now (same object,
    same version)."""
    return known is not None and known[0] is tensor and known[1] == tensor._version


#: the integer type of each floating-point size, to view a tensor's bits
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def float_bits(tensor: Tensor) -> Tensor:
    """``tensor``'s memory as integers of its element size (a view: writes go through)."""
    return tensor.view(_BITS[tensor.element_size()])


class _TrainedWeight(torch.autograd.Function):
    """A training step's masked weight, ``weight * mask`` (``weight`` itself, ``mask`` None,
    where the mask is all ones or the weight is known zero outside it), with a second
    output, ``sink``, a 0-d tensor whose only use is to carry the masked-L2 term's gradient
    divisor ``d`` back (see
    ``espn.pruning.regularisers.masked_weight_l2``). The backward writes the weight's
    gradient in place in the gradient of the product: ``grad + weight / d`` (where the term
    was used), then an AND of its bits with ``keep`` (all ones where the task trains the
    weight, zero elsewhere; None: every weight trains), exact for every value, NaN and inf
    included. On a kept entry the mask is 1, so ``weight / d`` is the term's gradient
    ``weight * mask / d`` there, and every other entry is zeroed. The term enters in one pass,
    ``addcdiv_`` with value 1: a quotient rounded, then a sum rounded, which is autograd's sum
    of the two gradients bit for bit at every entry, whatever the tensor's size (a fused
    multiply-add, as ``addcmul_`` computes on the CPU, would round once and differ). The layer
    learns the result's address and version, so that the frozen-weight guard can skip it (see
    ``MaskedLayer.grad_is_kept``)."""

    @staticmethod
    def forward(
        ctx: Any,
        weight: Tensor,
        mask: Tensor | None,
        keep: Tensor | None,
        layer: Any,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(weight, keep)
        ctx.layer = layer
        product = weight.view_as(weight) if mask is None else weight * mask
        return product, weight.new_empty(())

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        weight, keep = ctx.saved_tensors
        grad, divisor = grads
        if grad is None:
            if divisor is None:
                return None, None, None, None
            grad, owned = weight / divisor, True
        else:
            # the product feeds one operation of the layer's forward (a linear map, a
            # convolution), whose weight gradient is a fresh tensor no one else holds: it is
            # written in place where dense (not an expanded or transposed view)
            owned = _dense(grad)
            if divisor is not None:
                grad = grad.addcdiv_(weight, divisor) if owned else grad.addcdiv(weight, divisor)
                owned = True
        if keep is not None:
            out = grad if owned else torch.empty_like(grad)
            torch.bitwise_and(float_bits(grad), keep, out=float_bits(out))
            grad = out
            ctx.layer.__dict__["_kept_grad"] = (grad.data_ptr(), grad._version)
        return grad, None, None, None


def _dense(tensor: Tensor) -> bool:
    """Whether ``tensor`` is contiguous (or channels-last): each element its own memory."""
    if tensor.is_contiguous():
        return True
    return tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last)


def union_alive(units: Mapping[str, Tensor], members: tuple[str, ...]) -> Tensor:
    """The alive vector of a union of unit groups (a residual stream read by a later layer
    whose producers are pruned each on its own): a channel is alive where any member keeps it."""
    alive = units[members[0]].bool()
    for g in members[1:]:
        alive = alive | units[g].bool()
    return alive


def with_unions(
    units: Mapping[str, Tensor], unions: Mapping[str, tuple[str, ...]]
) -> dict[str, Tensor]:
    """``units`` completed with the alive vector of every union of groups."""
    return dict(units) | {u: union_alive(units, members) for u, members in unions.items()}


def expand_units(alive: Tensor, size: int) -> Tensor:
    """A per-unit vector repeated over the ``size`` consecutive features of each unit."""
    return alive if size == 1 else alive.repeat_interleave(size)


class MaskedLinear(nn.Linear, MaskedLayer):
    """``nn.Linear`` without bias whose weight is multiplied by the active task's mask.

    ``in_unit_size`` > 1: unit ``c`` of ``in_units`` owns the ``in_unit_size`` consecutive inputs
    ``c*k ... (c+1)*k - 1`` (a feature map of ``in_features / k`` channels flattened
    channel-major, ``x.flatten(1)`` of ``(C, H, W)``, with ``k = H*W``).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        in_units: str | None = None,
        out_units: str | None = None,
        in_unit_size: int = 1,
        out_unit_size: int = 1,
    ) -> None:
        super().__init__(in_features, out_features, bias=False)
        self._init_masks(in_units, out_units)
        self.in_unit_size = in_unit_size
        self.out_unit_size = out_unit_size

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.masked_weight())


#: how ``nn.Conv2d`` pads
PaddingMode = Literal["zeros", "reflect", "replicate", "circular"]


def conv_pair(value: int | tuple[int, ...]) -> tuple[int, int]:
    """A 2-D convolution's size argument (kernel size, stride, dilation) as a pair; accepts
    the ``tuple[int, ...]`` that ``nn.Conv2d`` stores."""
    if isinstance(value, int):
        return value, value
    height, width = value
    return height, width


def conv_padding(value: str | int | tuple[int, ...]) -> str | tuple[int, int]:
    """A 2-D convolution's padding: a mode name (``"same"``) or a pair."""
    return value if isinstance(value, str) else conv_pair(value)


class MaskedConv2d(nn.Conv2d, MaskedLayer):
    """``nn.Conv2d`` without bias whose weight is multiplied by the active task's mask.

    A grouped convolution (``groups`` > 1; depthwise when ``groups`` = input channels =
    output channels) maps input group ``k`` to output group ``k`` alone: its input and output
    groups are one unit group, named by ``out_units`` (``in_units`` stays None; the weight has
    ``in_channels / groups`` inputs per output channel, all in the output's own group). A unit
    spans ``out_unit_size`` output channels, a whole number of conv groups, so that a pruned
    unit removes whole groups on both sides.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] = 1,
        padding: int | tuple[int, ...] | str = 0,
        in_units: str | None = None,
        out_units: str | None = None,
        dilation: int | tuple[int, ...] = 1,
        padding_mode: PaddingMode = "zeros",
        groups: int = 1,
        in_unit_size: int = 1,
        out_unit_size: int = 1,
    ) -> None:
        if groups != 1 and in_units is not None:
            raise ValueError("a grouped conv's channels are its out_units; in_units must be None")
        if groups != 1 and groups % max(out_channels // out_unit_size, 1):
            raise ValueError(
                f"grouped conv with groups={groups}: a unit of {out_unit_size} of its "
                f"{out_channels} output channels is not a whole number of groups"
            )
        super().__init__(
            in_channels,
            out_channels,
            conv_pair(kernel_size),
            stride=conv_pair(stride),
            padding=conv_padding(padding),
            dilation=conv_pair(dilation),
            groups=groups,
            bias=False,
            padding_mode=padding_mode,
        )
        self._init_masks(in_units, out_units)
        self.in_unit_size = in_unit_size
        self.out_unit_size = out_unit_size

    @property
    def grouped(self) -> bool:
        """Whether input groups map to output groups alone (``groups`` > 1, depthwise too)."""
        return self.groups != 1

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(x, self.masked_weight(), None)


class TaskSpecific(nn.Module, ABC):
    """A module whose parameters and buffers are swapped in and out with the active task."""

    #: whether a committed task stores this module's state; a module that does not is
    #: rebuilt by :meth:`load_task_state` from nothing (e.g. a released gate: all ones)
    per_task: bool = True

    @abstractmethod
    def reset_task(self, n_classes: int) -> None:
        """Re-initialise for a new task (``n_classes`` matters to heads only)."""

    def task_state(self) -> dict[str, Tensor]:
        """A detached copy of this task's parameters and buffers."""
        return {k: v.detach().clone() for k, v in self.state_dict().items() if k != "unit_mask"}

    def load_task_state(self, state: dict[str, Tensor]) -> None:
        """Load a state from :meth:`task_state`; shapes may differ (heads of other tasks)."""
        own = dict(self.named_parameters()) | dict(self.named_buffers())
        for name, value in state.items():
            target = own[name]
            target.data = value.to(device=target.device, dtype=target.dtype).clone()


class UnitModule(TaskSpecific):
    """A task-specific module that scales units: its ``weight`` is the unit saliency (gamma).

    ``unit_mask`` (1 = alive) multiplies both the scale and the shift, so that a pruned unit
    outputs exactly zero. A unit spans ``unit_size`` consecutive features of the tensor the
    module scales; a gate holds one ``weight`` per unit, a norm one per feature (a
    BatchNorm after a grouped conv, a GroupNorm: ``unit_size`` channels per unit).
    """

    weight: Tensor
    bias: Tensor
    group: str
    #: 1.0 for an alive unit, 0.0 for a pruned one (one entry per unit)
    unit_mask: Tensor
    #: consecutive features one unit spans
    unit_size: int = 1

    def _init_units(self, group: str, n: int, unit_size: int = 1) -> None:
        if n % unit_size:
            raise ValueError(f"{n} features do not split into units of {unit_size}")
        self.group = group
        self.unit_size = unit_size
        self.register_buffer("unit_mask", torch.ones(n // unit_size))
        self._all_alive: tuple[Tensor, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # a copy's tensors are others (a deep copy keeps their version counters): what was
        # noted about this module's mask is not known of the copy's
        state: dict[str, Any] = super().__getstate__()
        return state | {"_all_alive": None}

    def note_units(self, all_alive: bool) -> None:
        """Record whether ``unit_mask`` is all ones, told by the caller that just wrote it (a
        task begins, units are set): while that very tensor is unwritten since (see
        :func:`stamp`), :meth:`all_alive` holds and a norm's forward uses its scale and shift
        as they are, with no product by the mask to compute or differentiate."""
        self._all_alive = stamp(self.unit_mask) if all_alive else None

    @torch.no_grad()
    def set_units(self, alive: Tensor, all_alive: bool) -> None:
        """Write the alive vector ``alive`` (any device and dtype) into ``unit_mask`` and note
        whether every unit is alive (``all_alive``, read once by the caller for a whole
        group; see :meth:`note_units`)."""
        self.unit_mask.copy_(alive.to(self.unit_mask.device, self.unit_mask.dtype))
        self.note_units(all_alive)

    def all_alive(self) -> bool:
        """Whether every unit is known to be alive (see :meth:`note_units`): a mask written or
        swapped since reads as not known, and so does any inside ``torch.compile`` (as
        ``MaskedLayer.mask_is_ones``)."""
        if torch.compiler.is_compiling():
            return False
        return unchanged(self.__dict__.get("_all_alive"), self.unit_mask)

    def masked_affine(self) -> tuple[Tensor, Tensor]:
        """The scale and shift masked by the task's units: ``weight`` and ``bias`` themselves
        where every unit is known alive (``x * 1`` is ``x`` bit for bit, and so is its
        gradient), else their products with :meth:`entry_mask`."""
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

    ``affine=False`` (the paper's default): a scale only, the saliency that unit pruning
    trains; once pruning is over the gate is *released* (scale 1 on every alive neuron, no
    longer trained), so a finished task is its binary masks alone and stores no gate state.
    ``affine=True`` (beyond the paper, ``--task-affine``): a per-task scale and shift,
    trained in every phase and stored with the task.
    """

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
        self._identity: tuple[Tensor, int] | None = None

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
        # a released scale gets no gradient, so no optimizer (momentum, decay) can move it
        released = bool(self.released)
        self.weight.requires_grad_(not released)
        # a released scale-only gate with every unit alive multiplies by ones: noted here
        # (one host read per release, never in a step), so that its forward is the identity
        ones = released and not self.affine and bool((self.weight * self.unit_mask == 1).all())
        self._identity = stamp(self.unit_mask) if ones else None

    def is_identity(self) -> bool:
        """Whether the gate is known to pass its input through unchanged: released, scale
        only, every unit alive, and its unit mask unwritten since (a unit pruned later, or a
        mask swapped, reads as not known). Inside ``torch.compile`` it reads as not known, as
        ``MaskedLayer.mask_is_ones`` does."""
        if torch.compiler.is_compiling():
            return False
        return unchanged(self.__dict__.get("_identity"), self.unit_mask)

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
        if not self.affine:
            return scale, None
        return scale, expand_units(self.bias * self.unit_mask, self.unit_size)

    def forward(self, x: Tensor) -> Tensor:
        if self.is_identity():
            return x  # x * 1, exactly, for every value
        shape = (1, -1) + (1,) * (x.dim() - 2)
        scale, shift = self.feature_affine()
        if shift is None:
            return x * scale.view(shape)
        return x * scale.view(shape) + shift.view(shape)


class TaskBatchNorm2d(nn.BatchNorm2d, UnitModule):
    """BatchNorm whose affine parameters and running statistics belong to the active task.

    Always affine and with running statistics, so none of these is None as in a general
    ``nn.BatchNorm2d``; ``momentum`` None (a converted model's) is a cumulative average.
    A unit spans ``unit_size`` channels (a group of channels of a grouped conv).
    """

    weight: nn.Parameter
    bias: nn.Parameter
    running_mean: Tensor
    running_var: Tensor
    num_batches_tracked: Tensor

    def __init__(self, n: int, group: str, unit_size: int = 1) -> None:
        super().__init__(n)
        self._init_units(group, n, unit_size)

    def reset_task(self, n_classes: int) -> None:
        self.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        return task_batch_norm(self, x)


#: while it holds a function, training task BatchNorms call it (``(norm, x, weight, bias,
#: factor) -> output``) for batch statistics taken over every data-parallel rank (see
#: :meth:`espn.training.distributed.Ranks.step`)
SYNCED_BATCH_NORM: list[Callable[..., Tensor]] = []


def task_batch_norm(norm: Any, x: Tensor) -> Tensor:
    """A task BatchNorm's forward (any dimension): batch statistics while training, the
    task's running statistics otherwise; scale and shift masked by the task's units."""
    weight, bias = norm.masked_affine()
    factor = 0.0 if norm.momentum is None else norm.momentum
    if norm.training:
        norm.num_batches_tracked.add_(1)
        if norm.momentum is None:  # cumulative moving average, as torch's BatchNorm
            factor = 1.0 / float(norm.num_batches_tracked)
        if SYNCED_BATCH_NORM:
            return SYNCED_BATCH_NORM[-1](norm, x, weight, bias, factor)
    return F.batch_norm(
        x, norm.running_mean, norm.running_var, weight, bias, norm.training, factor, norm.eps
    )


class TaskGroupNorm(nn.GroupNorm, UnitModule):
    """GroupNorm whose affine parameters belong to the active task; a unit is ``unit_size``
    consecutive channels, a whole number of its groups.

    Each group's statistics run over its own channels only, so a pruned unit (whole groups,
    its input exactly zero) changes no other group, outputs exactly zero (its scale and shift
    are masked), and the slim model's ``nn.GroupNorm(alive groups, alive channels)`` computes
    the same values. Always affine (a converted ``affine=False`` GroupNorm starts at scale 1,
    shift 0, which then trains per task).
    """

    weight: nn.Parameter
    bias: nn.Parameter

    def __init__(
        self, num_groups: int, num_channels: int, group: str, unit_size: int, eps: float = 1e-5
    ) -> None:
        super().__init__(num_groups, num_channels, eps=eps)
        if unit_size % (num_channels // num_groups):
            raise ValueError(
                f"a unit of {unit_size} channels is not a whole number of GroupNorm groups "
                f"({num_channels // num_groups} channels each)"
            )
        self._init_units(group, num_channels, unit_size)

    def reset_task(self, n_classes: int) -> None:
        self.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        weight, bias = self.masked_affine()
        return F.group_norm(x, self.num_groups, weight, bias, self.eps)


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
        #: inputs per unit of ``in_units`` (see :class:`MaskedLinear`)
        self.in_unit_size = in_unit_size
        self.out_unit_size = 1

    def reset_task(self, n_classes: int) -> None:
        device, dtype = self.weight.device, self.weight.dtype
        self.weight.data = torch.empty(n_classes, self.in_features, device=device, dtype=dtype)
        self.bias.data = torch.empty(n_classes, device=device, dtype=dtype)
        self.out_features = n_classes
        self.reset_parameters()

    def load_task_state(self, state: dict[str, Tensor]) -> None:
        """Load a task's head and resize ``out_features`` to its class count."""
        super().load_task_state(state)
        self.out_features = self.weight.shape[0]


def is_costed(module: nn.Module) -> TypeGuard[MaskedLayer | TaskHead]:
    """Layers whose FLOPs the supernet counts: masked layers and task heads."""
    return isinstance(module, MaskedLayer | TaskHead)


def shared_head(
    in_features: int, n_classes: int, in_units: str | None, task_bias: bool
) -> nn.Module:
    """A head shared by every task and masked like the other layers; with ``task_bias``
    (beyond the paper) each task adds its own output bias."""
    head = MaskedLinear(in_features, n_classes, in_units=in_units)
    return nn.Sequential(head, TaskBias(n_classes)) if task_bias else nn.Sequential(head)
