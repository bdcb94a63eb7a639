"""The input side of an exported task: the task's transform at evaluation is the program's
first step, so it takes raw inputs as the dataset stores them, and the sidecar records the
transform (docs/checkpoints.md)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from torch import Tensor, nn

from espn.utils.transforms import BatchTransform, identity


class WithInputs(nn.Module):
    """``model`` behind the task's input transform at evaluation: raw inputs -> logits."""

    def __init__(self, transform: BatchTransform, model: nn.Module) -> None:
        super().__init__()
        self.transform = transform
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model(self.transform(x, False))


def has_transform(transform: BatchTransform | None) -> bool:
    """Whether ``transform`` changes anything (a task of the user's own tensors has none)."""
    return transform is not None and transform is not identity


def _plain(value: Any) -> Any:
    """``value`` as JSON data: a tensor as a (nested) list, a tuple as a list."""
    if isinstance(value, Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if not str(k).startswith("_")}
    return value if isinstance(value, int | float | str | bool) or value is None else repr(value)


def describe_transform(transform: BatchTransform | None) -> dict[str, Any]:
    """Every step of ``transform`` as JSON data: the function and all its arguments (a
    permutation as its index list, a rotation's angle, the normalisation's mean and std),
    so that the sidecar says exactly what the program does to its inputs."""
    if not has_transform(transform):
        return {"function": None}
    if isinstance(transform, functools.partial):
        func = transform.func
        return {
            "function": f"{func.__module__}.{func.__qualname__}",
            "arguments": _plain(dict(transform.keywords)),
        }
    if dataclasses.is_dataclass(transform) and not isinstance(transform, type):
        kind = type(transform)
        fields = {f.name: getattr(transform, f.name) for f in dataclasses.fields(transform)}
        return {"function": f"{kind.__module__}.{kind.__qualname__}", "arguments": _plain(fields)}
    name = getattr(transform, "__qualname__", type(transform).__qualname__)
    return {"function": f"{getattr(transform, '__module__', '')}.{name}"}
