"""A layer whose weights ``forward`` passes to a function instead of calling the layer
(Swin's ``F.linear(x, self.qkv.weight, self.qkv.bias)``): :class:`FunctionalRead` makes that
function call the layer, so that it is masked, gated, hooked and counted as any layer called
(docs/architectures.md, "Layers")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import resolve_name

from espn.layers.base import ConvertError


class FunctionalRead(nn.Module):
    """Holds ``layer``; its ``weight`` and ``bias`` are stand-ins (:class:`StandIn`): the
    function given them, ``function(x, weight, bias, ...)``, returns ``self(x)``, the layer
    called. The first such call (at wrap, on the plain layer) must compute exactly what the
    layer's call computes, and fixes ``function``."""

    function: Callable[..., Any] | None = None

    def __init__(self, name: str, layer: nn.Module) -> None:
        super().__init__()
        self.name = name
        self.layer = layer
        self.has_bias = getattr(layer, "bias", None) is not None

    @property
    def weight(self) -> Tensor:
        return StandIn.of(self, "weight")

    @property
    def bias(self) -> Tensor | None:
        return StandIn.of(self, "bias") if self.has_bias else None

    def __getattr__(self, name: str) -> Any:
        """The layer's other attributes that ``forward`` reads (a conv's ``stride``)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if "layer" not in self._modules:
                raise
            return getattr(self.own(), name)

    def own(self) -> nn.Module:
        """The layer itself, without the container and gate it is converted to (plain
        again in an exported copy, where ``forward`` reads its own weights)."""
        return next(m for m in self.layer.modules() if not isinstance(m, nn.Sequential))

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.layer(x)
        return out

    def call(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``func(*args, **kwargs)``, its arguments holding this layer's stand-ins: the layer
        called on ``args[0]``; refused unless that is what ``func`` computes."""
        x = args[0] if args else None
        if not isinstance(x, Tensor) or isinstance(x, StandIn) or self.function not in (None, func):
            raise self.refuse(func)
        out = self(x)
        if self.function is None:
            real = {"weight": self.layer.weight, "bias": getattr(self.layer, "bias", None)}

            def unpack(a: object) -> object:
                return real[a.part] if isinstance(a, StandIn) else a

            want = func(*map(unpack, args), **{k: unpack(v) for k, v in kwargs.items()})
            if not isinstance(want, Tensor) or not torch.equal(want, out):
                raise self.refuse(func)
            self.function = func
        return out

    def refuse(self, func: Callable[..., Any]) -> ConvertError:
        what = (resolve_name(func) or str(func)).removesuffix(".__get__")
        return ConvertError(
            f"forward() computes {what} on the weights of {self.name!r} without calling it; "
            "supported: passing them to the function that computes the layer's own call "
            f"({type(self.layer).__name__}: as F.linear(x, self.fc.weight, self.fc.bias)), "
            "nothing else"
        )


class StandIn(Tensor):
    """An empty tensor standing for a :class:`FunctionalRead`'s ``weight`` or ``bias``."""

    read: FunctionalRead
    part: str

    @staticmethod
    def of(read: FunctionalRead, part: str) -> StandIn:
        standin = Tensor._make_subclass(StandIn, torch.empty(0))
        standin.read, standin.part = read, part
        return standin

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        standin = next(a for a in (*args, *(kwargs or {}).values()) if isinstance(a, StandIn))
        return standin.read.call(func, args, kwargs or {})
