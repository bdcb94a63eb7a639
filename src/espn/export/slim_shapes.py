"""Widths written into ``forward`` (a ``view``/``reshape`` with ``self.hidden_dim``), refitted
to a slim copy from a full-width run's recorded shapes; see docs/architectures.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

_RESHAPES = (Tensor.reshape, Tensor.view, torch.reshape)

#: what is done at the ``k``-th reshape with its input: the shape arguments it runs with
Visit = Callable[[int, Tensor, tuple[Any, ...]], tuple[Any, ...]]


class _Reshapes(TorchFunctionMode):
    """Passes every reshape's input and shape arguments through ``visit``."""

    def __init__(self, visit: Visit) -> None:
        super().__init__()
        self.visit, self.calls = visit, 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _RESHAPES and args and isinstance(args[0], Tensor):
            args = (args[0], *self.visit(self.calls, args[0], tuple(args[1:])))
            self.calls += 1
        return func(*args, **(kwargs or {}))


def _fitted(value: Any, widths: dict[int, int]) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return widths.get(value, value)
    if isinstance(value, tuple | list):
        return type(value)(_fitted(v, widths) for v in value)
    return value


def _refit(full: list[tuple[int, ...]]) -> Visit:
    """The visit replacing full widths by slim ones (see the module docstring)."""

    def visit(k: int, x: Tensor, shape: tuple[Any, ...]) -> tuple[Any, ...]:
        before = full[k] if k < len(full) else None
        if before is None or len(before) != x.dim():
            return shape
        widths: dict[int, int] = {}
        for old, new in zip(before[1:], x.shape[1:], strict=True):
            if widths.setdefault(old, int(new)) != new:
                widths[old] = -2  # two dimensions of that width, now different: ambiguous
        # a number equal to the batch is the batch, not a width (a symbolic batch, as
        # torch.export runs it, is never a number here)
        batch = x.shape[0] if isinstance(x.shape[0], int) else None
        widths = {o: n for o, n in widths.items() if n not in (o, -2) and o != batch}
        return _fitted(shape, widths) if widths else shape

    return visit


class Refitted(nn.Module):
    """A slim copy run with its reshapes refitted (see the module docstring)."""

    def __init__(self, model: nn.Module, full: list[tuple[int, ...]]) -> None:
        super().__init__()
        self.model, self.full = model, full

    def forward(self, x: Tensor) -> Tensor:
        with _Reshapes(_refit(self.full)):
            out: Tensor = self.model(x)
        return out


@torch.no_grad()
def reshapes(wide: nn.Module, example: Tensor) -> list[tuple[int, ...]]:
    """The input shape of each reshape of ``wide`` (a copy at full width) run on ``example``."""
    full: list[tuple[int, ...]] = []

    def record(k: int, x: Tensor, shape: tuple[Any, ...]) -> tuple[Any, ...]:
        full.append(tuple(x.shape))
        return shape

    with _Reshapes(record):
        wide(example)
    return full


@torch.no_grad()
def refitted(slim: nn.Module, full: list[tuple[int, ...]], example: Tensor) -> nn.Module:
    """``slim``, in :class:`Refitted` where a reshape of it needs a width refitted (``full``:
    the :func:`reshapes` of the same copy at full width)."""
    refit = _refit(full)
    changed: list[bool] = []

    def probe(k: int, x: Tensor, shape: tuple[Any, ...]) -> tuple[Any, ...]:
        new = refit(k, x, shape)
        changed.append(new != shape)
        return new

    with _Reshapes(probe):
        slim(example)
    return Refitted(slim, full).eval() if any(changed) else slim
