"""The fast path of a training step, behind one switch (:func:`enabled`): the reference step's
values with fewer passes over the weights (docs/performance.md, "The reference step and the
fast path"). A layer's knowledge of its tensors is cached under their version (:func:`stamp`)."""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch import Tensor

_ON = [True]


def is_on() -> bool:
    """Whether the fast path applies here: switched on (the default), and not compiling."""
    return _ON[0] and not torch.compiler.is_compiling()


@contextmanager
def enabled(on: bool) -> Iterator[None]:
    """Switch the fast path on or off within a ``with`` block (off: the reference step)."""
    before, _ON[0] = _ON[0], on
    try:
        yield
    finally:
        _ON[0] = before


def stamp(tensor: Tensor) -> tuple[Tensor, int]:
    """``tensor`` and its version counter: what a cache records to know later that its value
    was computed from this very tensor, unwritten since."""
    return tensor, tensor._version


def unchanged(known: Sequence[Any] | None, tensor: Tensor) -> bool:
    """Whether ``known`` starts with :func:`stamp` of ``tensor`` as it is now."""
    return known is not None and known[0] is tensor and known[1] == tensor._version


def caches(module: Any) -> dict[str, Any]:
    """``module``'s caches, by name: in its instance dict (``nn.Module.__setattr__`` costs
    microseconds per call), dropped from a copy or pickle (see :class:`_Caches`)."""
    found = module.__dict__.get("_fast")
    if found is None:
        found = module.__dict__["_fast"] = {}
    return cast(dict[str, Any], found)


def _cached(module: Any, name: str) -> Any:
    """What ``module`` cached under ``name`` (None: nothing)."""
    return caches(module).get(name)


def _known(module: Any, name: str) -> Any:
    """What ``module`` cached under ``name`` (None: nothing, or the fast path is off)."""
    return _cached(module, name) if is_on() else None


def memo(
    owner: Any, name: str, tensor: Tensor, compute: Callable[[], Any], use: bool = True
) -> Any:
    """``compute()``, cached on ``owner`` under ``name`` while ``tensor`` is unwritten since
    (``use`` False: computed, no cache read or written, as a compiled graph needs)."""
    if not use:
        return compute()
    known = _cached(owner, name)
    if unchanged(known, tensor):
        return known[2]
    value = compute()
    caches(owner)[name] = (*stamp(tensor), value)
    return value


#: the integer type of each floating-point size, to view a tensor's bits
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def float_bits(tensor: Tensor) -> Tensor:
    """``tensor``'s memory as integers of its element size (a view: writes go through)."""
    return tensor.view(_BITS[tensor.element_size()])


class _Caches:
    """A module with :func:`caches`, which a copy or pickle drops: its tensors are others (a
    deep copy keeps their version counters)."""

    def __getstate__(self) -> dict[str, Any]:
        state: dict[str, Any] = super().__getstate__()  # type: ignore[assignment]
        return {k: v for k, v in state.items() if k != "_fast"}


class UnitCaches(_Caches):
    """What a unit module (``UnitModule``) knows of its ``unit_mask``, told by the caller that
    just wrote it: every unit is alive (a norm's scale and shift need no mask), or the module
    passes its input through unchanged (a released gate)."""

    unit_mask: Tensor

    def note_units(self, all_alive: bool) -> None:
        """Record whether ``unit_mask`` is all ones."""
        caches(self)["_all_alive"] = stamp(self.unit_mask) if all_alive else None

    def all_alive(self) -> bool:
        """Whether every unit is known to be alive."""
        return unchanged(_known(self, "_all_alive"), self.unit_mask)

    def note_identity(self, identity: bool) -> None:
        """Record whether the module passes its input through unchanged."""
        caches(self)["_identity"] = stamp(self.unit_mask) if identity else None

    def is_identity(self) -> bool:
        """Whether the module is known to pass its input through unchanged."""
        return unchanged(_known(self, "_identity"), self.unit_mask)


class MaskCaches(_Caches):
    """What a masked layer (``MaskedLayer``) knows of its mask, frozen set and weight between
    calls, and the fast product built on it; every query answers "not known" where the fast
    path is off."""

    weight: Tensor
    weight_mask: Tensor
    frozen: Tensor

    def note_mask(self, binary: bool = False) -> None:
        """Record whether ``weight_mask`` is 0/1 (``binary``: the caller knows it is) and all
        ones: one host read, at a mask change, never in a step."""
        mask, frozen = self.weight_mask, self.frozen
        binary = binary or bool(((mask == 0) | (mask == 1)).all())
        ones = binary and int(mask.bool().count_nonzero()) == mask.numel()
        caches(self)["_ones"] = stamp(mask) if ones else None
        caches(self)["_binary"] = stamp(mask) if binary else None
        memo(self, "_thawed", frozen, lambda: not bool(frozen.any()))

    def mask_is_binary(self) -> bool:
        """Whether ``weight_mask`` is known to be 0/1 (noted, and unwritten since)."""
        return unchanged(_known(self, "_binary"), self.weight_mask)

    def mask_is_ones(self) -> bool:
        """Whether ``weight_mask`` is known to be all ones (noted, and unwritten since)."""
        return unchanged(_known(self, "_ones"), self.weight_mask)

    def fast_masked_weight(self) -> Tensor:
        """``MaskedLayer.masked_weight`` on the fast path: in a training step with a mask
        noted 0/1, :class:`_TrainedWeight`'s product (kept for :meth:`step_parts`); no
        product where the mask is all ones or the weight known zero outside it."""
        weight, mask = self.weight, self.weight_mask
        ones = self.mask_is_ones()
        bare = ones or self.zero_outside_known()
        training = torch.is_grad_enabled() and weight.requires_grad and not mask.requires_grad
        if not (training and (ones or self.mask_is_binary())):
            if torch.is_grad_enabled():
                caches(self)["_product"] = None
            return weight if bare else weight * mask
        keep = None if ones and self._nothing_frozen() else self._trainable_bits()
        product, sink = _TrainedWeight.apply(weight, None if bare else mask, keep, self)
        caches(self)["_product"] = (product, sink, *stamp(weight), *stamp(mask))
        return product

    @torch.no_grad()
    def zero_pruned(self, states: Sequence[Tensor] = ()) -> bool:
        """Zero every free weight outside a 0/1 mask, and the same entries of ``states`` (its
        optimizer state), so that the product is skipped until the weight, mask or frozen set
        is written otherwise than by a step :meth:`note_trained` followed. Not done (False)
        where a frozen weight lies outside the mask."""
        mask, weight = self.weight_mask, self.weight
        if self.mask_is_ones() or not self.mask_is_binary():
            return False
        free = self.free_bits()
        # the mask as bits: all ones (-1) in it, zero outside; an AND zeroes the outside
        bits = mask.to(free.dtype).neg_()
        # a zero in ``bits | free`` is a frozen weight outside the mask
        if not self._nothing_frozen() and not bool(torch.bitwise_or(bits, free).all()):
            return False
        for tensor in (weight, *states):
            if tensor.dtype == weight.dtype:
                float_bits(tensor).bitwise_and_(bits)
            else:
                tensor.masked_fill_(bits == 0, 0.0)
        caches(self)["_keep"] = (*stamp(mask), free, bits.bitwise_and_(free))
        known = (*stamp(weight), weight.data_ptr(), *stamp(mask), *stamp(self.frozen))
        caches(self)["_zero"] = known
        return True

    def zero_outside_known(self) -> bool:
        """Whether the weight is known to be zero outside the mask (see :meth:`zero_pruned`)."""
        known, weight = _known(self, "_zero"), self.weight
        return (
            unchanged(known, weight)
            and known[2] == weight.data_ptr()
            and unchanged(known[3:5], self.weight_mask)
            and unchanged(known[5:], self.frozen)
        )

    def keeps_zero(self) -> bool:
        """Whether the coming optimizer step keeps the weight zero outside the mask: it is now,
        and the step's gradient is the product's backward's (:meth:`grad_is_kept`)."""
        return self.zero_outside_known() and self.grad_is_kept()

    def note_trained(self) -> None:
        """Carry :meth:`zero_pruned`'s knowledge over a step :meth:`keeps_zero` allowed (an
        optimizer moves no weight whose gradient and state are zero, decay included)."""
        known = _cached(self, "_zero")
        if known is not None:
            caches(self)["_zero"] = (*stamp(self.weight), *known[2:])

    def _nothing_frozen(self) -> bool:
        known = _cached(self, "_thawed")
        return unchanged(known, self.frozen) and bool(known[2])

    def step_parts(self) -> tuple[Tensor, Tensor] | None:
        """This step's masked weight as the forward pass computed it, and the sink where the
        masked-L2 term's gradient enters it (None: not computed, or changed since)."""
        known = _known(self, "_product")
        if known is None:
            return None
        product, sink, *stamps = known
        if unchanged(stamps[:2], self.weight) and unchanged(stamps[2:], self.weight_mask):
            return product, sink
        return None

    def grad_is_kept(self) -> bool:
        """Whether ``weight.grad`` is the gradient the product's backward wrote since
        :meth:`forget_kept_grad` (every weight the task may not train zeroed), unchanged."""
        grad, known = self.weight.grad, _cached(self, "_kept_grad")
        return grad is not None and known == (grad.data_ptr(), grad._version)

    def forget_kept_grad(self) -> None:
        """Forget what an earlier backward pass wrote (called before each backward pass)."""
        caches(self)["_kept_grad"] = None

    def _trainable_bits(self) -> Tensor:
        """All ones on the weights the task may train (in the mask, not frozen), zero
        elsewhere, as integers of the weight's element size."""
        free = self.free_bits()
        if self.mask_is_ones():
            return free
        mask, known = self.weight_mask, _cached(self, "_keep")
        if unchanged(known, mask) and known[2] is free:
            return known[3]
        keep = mask.to(free.dtype).neg_().bitwise_and_(free)
        caches(self)["_keep"] = (*stamp(mask), free, keep)
        return keep

    def free_bits(self) -> Tensor:
        """All ones (-1) on every weight not frozen, zero on a frozen one, as integers of the
        weight's element size (an AND of a float's bits with it keeps the free entries)."""
        frozen, dtype = self.frozen, _BITS[self.weight.element_size()]
        known = _cached(self, "_free")
        if unchanged(known, frozen) and known[2].dtype == dtype:
            return known[2]
        free = frozen.logical_not().to(dtype).neg_()
        caches(self)["_free"] = (*stamp(frozen), free)
        return free

    def release(self) -> None:
        """Free the tensors kept between steps (at a task's end: the next computes them anew)."""
        for name in ("_free", "_keep", "_product"):
            caches(self).pop(name, None)

    def mask_count(self) -> Tensor:
        """The number of weights in the mask, as a tensor (no host read)."""
        mask = self.weight_mask
        return memo(self, "_count", mask, mask.sum, use=is_on())


class _TrainedWeight(torch.autograd.Function):
    """A training step's ``weight * mask`` (``weight`` itself, ``mask`` None, where exact) and
    a 0-d ``sink`` carrying the masked-L2 term's gradient divisor ``d`` back
    (``espn.pruning.regularisers.masked_weight_l2``). The backward writes the weight's
    gradient in place in the product's: ``grad + weight / d`` (one ``addcdiv_``, rounded as
    autograd's sum of the two gradients), then an AND of its bits with ``keep`` (all ones
    where the task trains the weight; None: every weight trains), exact for every value; the
    layer (held weakly: the product it caches holds this graph, a cycle never collected)
    learns the result's address and version, so that the frozen-weight guard skips it."""

    @staticmethod
    def forward(
        ctx: Any, weight: Tensor, mask: Tensor | None, keep: Tensor | None, layer: Any
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(weight, keep)
        ctx.layer = weakref.ref(layer)
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
            # the weight gradient of a linear map or convolution is a fresh tensor no one
            # else holds: written in place where dense
            owned = _dense(grad)
            if divisor is not None:
                grad = grad.addcdiv_(weight, divisor) if owned else grad.addcdiv(weight, divisor)
                owned = True
        if keep is not None:
            out = grad if owned else torch.empty_like(grad)
            torch.bitwise_and(float_bits(grad), keep, out=float_bits(out))
            grad = out
            caches(ctx.layer())["_kept_grad"] = (grad.data_ptr(), grad._version)
        return grad, None, None, None


def _dense(tensor: Tensor) -> bool:
    """Whether ``tensor`` is contiguous (or channels-last): each element its own memory."""
    if tensor.is_contiguous():
        return True
    return tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last)


class LeanRMSprop(torch.optim.RMSprop):
    """``torch.optim.RMSprop`` computing the same steps, bit for bit, without torch's slow CPU
    square root of the zeros a masked network's running mean ``v`` holds: it takes
    ``sqrt(max(v, tiny))``, which adds to ``eps`` as ``sqrt(v)`` does where ``eps`` absorbs
    ``sqrt(tiny)`` (docs/changelog.md). Elsewhere (a GPU, ``foreach``, ``centered``, ``eps``
    too small, the fast path off, ...) torch's own step runs; the state is torch's."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if not (is_on() and all(self._lean(group) for group in self.param_groups)):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
            momentum, decay = group["momentum"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad, state = param.grad, self.state[param]
                if not state:  # torch's initial state
                    state["step"] = torch.zeros((), dtype=_scalar_dtype())
                    state["square_avg"] = torch.zeros_like(param)
                    if momentum > 0:
                        state["momentum_buffer"] = torch.zeros_like(param)
                state["step"] += 1
                if decay != 0:
                    grad = grad.add(param, alpha=decay)
                square_avg = state["square_avg"].mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
                avg = torch.clamp_min(
                    square_avg, torch.finfo(param.dtype).tiny, out=self._avg(param)
                )
                avg = avg.sqrt_().add_(eps)
                if momentum > 0:
                    buf = state["momentum_buffer"].mul_(momentum).addcdiv_(grad, avg)
                    param.add_(buf, alpha=-lr)
                else:
                    param.addcdiv_(grad, avg, value=-lr)
        return loss

    def _avg(self, param: Tensor) -> Tensor:
        """The scratch tensor a step writes ``sqrt(v) + eps`` of ``param`` into (torch's step
        allocates it every time, on the CPU at the cost of its page faults)."""
        scratch: dict[Tensor, Tensor] = self.__dict__.setdefault("_scratch", {})
        avg = scratch.get(param)
        if avg is None or avg.shape != param.shape or avg.dtype != param.dtype:
            avg = scratch[param] = torch.empty_like(param)
        return avg

    def _lean(self, group: dict[str, Any]) -> bool:
        """Whether ``group`` takes the lean step: torch's single-tensor CPU path, float32 or
        float64 parameters, and an ``eps`` that absorbs ``sqrt(tiny)``."""
        if group["centered"] or group["maximize"] or group["differentiable"]:
            return False
        if group["foreach"] or group["capturable"] or isinstance(group["lr"], Tensor):
            return False
        params = group["params"]
        ok = (torch.float32, torch.float64)
        if not all(p.device.type == "cpu" and p.dtype in ok for p in params):
            return False
        if any(p.grad is not None and p.grad.is_sparse for p in params):
            return False
        return all(_eps_absorbs_tiny(group["eps"], d) for d in {p.dtype for p in params})


def _scalar_dtype() -> torch.dtype:
    """The dtype of torch's ``step`` counter (as ``torch.optim.optimizer._get_scalar_dtype``)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


@functools.cache
def _eps_absorbs_tiny(eps: float, dtype: torch.dtype) -> bool:
    """Whether ``eps + sqrt(tiny)`` rounds to ``eps`` in ``dtype`` with room to spare (then
    so does ``eps + sqrt(v)`` for every ``0 <= v < tiny``)."""
    value = torch.tensor(eps, dtype=dtype)
    return bool(value > 0) and bool(value + 4 * math.sqrt(torch.finfo(dtype).tiny) == value)
