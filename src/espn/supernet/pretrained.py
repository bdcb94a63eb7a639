"""A first task adopted from pretrained weights, as the paper's sparse ImageNet-pretrained
ResNet50: its non-zero weights become task 0's (frozen for later tasks), its norms and head
its task state. Weight files are read without pickles.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor

from espn.errors import EspnError
from espn.supernet.layers import TaskHead
from espn.supernet.masks import prefixed
from espn.supernet.supernet import Supernet


class PretrainedError(EspnError, ValueError):
    """A pretrained weight file cannot be read or does not fit the supernet."""


def load_weight_file(path: Path | str) -> dict[str, Tensor]:
    """The tensors of a state-dict file (``.safetensors``, or torch's ``.pt``/``.pth`` read
    with ``weights_only=True``); a ``{"state_dict": ...}`` wrapper and a ``module.`` prefix
    (DataParallel) are removed."""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            raw: object = load_file(str(path))
        else:
            raw = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise PretrainedError(f"cannot read pretrained weights {path}: {exc}") from None
    except Exception as exc:  # a file of another kind: torch and safetensors raise anything
        text = str(exc).strip()
        if isinstance(exc, pickle.UnpicklingError) and "unsupported global" in text.lower():
            raise PretrainedError(  # not torch's message: it advises weights_only=False, unsafe
                f"{path} holds Python objects besides tensors, which espn does not load (a "
                "pickle can run code); save only the state dict, best as .safetensors"
            ) from None
        first = text.splitlines()[0][:120] if text else ""
        raise PretrainedError(
            f"{path} is not a weight file espn reads (.safetensors, or a torch state dict "
            f"of tensors): {type(exc).__name__}" + (f" ({first})" if first else "")
        ) from None
    if isinstance(raw, Mapping) and isinstance(raw.get("state_dict"), Mapping):
        raw = raw["state_dict"]
    if not isinstance(raw, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in raw.items()
    ):
        raise PretrainedError(f"{path} is not a state dict (a mapping of names to tensors)")
    for key, value in raw.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise PretrainedError(f"{path}: {key} holds NaN or infinite values")
    return {k.removeprefix("module."): v for k, v in raw.items()}


def _own_tensors(supernet: Supernet) -> dict[str, Tensor]:
    """The tensors a pretrained first task provides, as the supernet holds them: the masked
    layers' weights and the state of every task module a task stores."""
    weights = {f"{n}.weight": layer.weight for n, layer in supernet.layers.items()}
    return weights | supernet.task_state(committed=True)


def expected_shapes(supernet: Supernet, n_classes: int) -> dict[str, tuple[int, ...]]:
    """Every tensor a pretrained first task of ``n_classes`` classes must provide, with its
    shape (a head's first dimension is the task's class count)."""
    heads = {
        f"{name}.{key}"
        for name, m in supernet.task_modules.items()
        if isinstance(m, TaskHead)
        for key in m.state_dict()
    }
    own = _own_tensors(supernet).items()
    return {k: (n_classes, *v.shape[1:]) if k in heads else tuple(v.shape) for k, v in own}


@torch.no_grad()
def adopt_pretrained(
    supernet: Supernet, tensors: dict[str, Tensor], n_classes: int, weights: str = "shared"
) -> None:
    """Commit ``tensors`` as the supernet's next task: its non-zero weights are the task's
    mask (every unit alive), its BatchNorms and head its state; ``weights`` as in
    :meth:`Supernet.commit_task` (``"own"``: Individual keeps its own copy). Missing or
    misshapen tensors are refused before anything changes."""
    shapes = expected_shapes(supernet, n_classes)
    missing = sorted(set(shapes) - set(tensors))
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise PretrainedError(f"the pretrained weights lack {', '.join(missing[:5])}{more}")
    own = _own_tensors(supernet)
    for key, shape in shapes.items():
        if tuple(tensors[key].shape) != shape:
            raise PretrainedError(
                f"pretrained {key} has shape {tuple(tensors[key].shape)}, the supernet needs "
                f"{shape} (a head must have the first task's {n_classes} classes)"
            )
        if own[key].is_floating_point() and not tensors[key].is_floating_point():
            raise PretrainedError(
                f"pretrained {key} is {str(tensors[key].dtype).removeprefix('torch.')}; the "
                "supernet needs floating-point values there"
            )
    empty = [n for n in supernet.layers if not bool(tensors[f"{n}.weight"].any())]
    if empty:
        which = "every masked layer" if len(empty) == len(supernet.layers) else empty[0]
        raise PretrainedError(
            f"the pretrained weights of {which} are all zero: the adopted task would hold "
            f"no weight there ({len(empty)} of {len(supernet.layers)} layers empty), so no "
            "input could reach its output; give a trained state dict (zeros are pruned "
            "weights)"
        )
    supernet.begin_task(n_classes)
    given = {k: tensors[k] for k in shapes}
    for name, m in supernet.task_modules.items():
        if m.per_task:
            m.load_task_state(prefixed(given, f"{name}."))
    for name, layer in supernet.layers.items():
        weight = tensors[f"{name}.weight"].to(layer.weight.device, layer.weight.dtype)
        layer.weight.copy_(weight)
        layer.weight_mask.copy_((weight != 0).to(layer.weight_mask.dtype))
    supernet.commit_task(weights)
