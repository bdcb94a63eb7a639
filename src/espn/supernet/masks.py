"""Per-task sub-networks, stored compactly: bit-packed weight masks, unit masks, task state."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

_BIT_VALUES = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


def pack_bits(mask: Tensor) -> Tensor:
    """Pack a boolean tensor of any shape into a flat uint8 tensor, 8 entries per byte."""
    flat = mask.detach().flatten().to(torch.uint8)
    flat = F.pad(flat, (0, (-flat.numel()) % 8))
    return (flat.view(-1, 8) * _BIT_VALUES.to(flat.device)).sum(1, dtype=torch.uint8)


def unpack_bits(packed: Tensor, shape: tuple[int, ...] | torch.Size) -> Tensor:
    """Inverse of :func:`pack_bits`: the boolean tensor of ``shape``."""
    numel = 1
    for s in shape:
        numel *= int(s)
    shifts = torch.arange(7, -1, -1, device=packed.device, dtype=torch.uint8)
    bits = (packed.unsqueeze(1) >> shifts) & 1
    return bits.flatten()[:numel].view(tuple(shape)).bool()


@dataclass
class TaskMask:
    """Task t's sub-network m_t and its own small state.

    ``weights`` holds one bit-packed mask per masked layer (``shapes`` gives their shapes),
    ``units`` one boolean vector per unit group (True = neuron/channel alive), and ``state``
    the task-specific parameters and buffers (gates or BatchNorm, heads), keyed
    ``"<module>.<tensor>"``. ``new_weights`` counts the weights the task took from the free
    ones when it was committed. ``own`` holds, for a task that keeps its own copy of its
    weights (Individual), the values of its masked weights per layer (in mask order).
    """

    weights: dict[str, Tensor]
    shapes: dict[str, tuple[int, ...]]
    units: dict[str, Tensor]
    state: dict[str, Tensor] = field(default_factory=dict)
    n_classes: int = 0
    new_weights: int = 0
    own: dict[str, Tensor] = field(default_factory=dict)

    @classmethod
    def from_dense(
        cls,
        weights: dict[str, Tensor],
        units: dict[str, Tensor],
        state: dict[str, Tensor],
        n_classes: int,
        new_weights: int,
        own: dict[str, Tensor] | None = None,
    ) -> TaskMask:
        """Pack boolean weight masks (moved to the CPU) into a :class:`TaskMask`."""
        return cls(
            weights={k: pack_bits(v.cpu()) for k, v in weights.items()},
            shapes={k: tuple(v.shape) for k, v in weights.items()},
            units={k: v.detach().cpu().bool().clone() for k, v in units.items()},
            state={k: v.detach().cpu().clone() for k, v in state.items()},
            n_classes=n_classes,
            new_weights=new_weights,
            own={k: v.detach().cpu().clone() for k, v in (own or {}).items()},
        )

    def weight_mask(self, layer: str, device: torch.device | str = "cpu") -> Tensor:
        """The boolean weight mask of ``layer``."""
        return unpack_bits(self.weights[layer].to(device), self.shapes[layer])

    def nnz(self) -> int:
        """Number of weights in the sub-network (an independent count from the packed bits)."""
        return sum(int(self.weight_mask(k).sum()) for k in self.weights)

    def nbytes(self) -> dict[str, int]:
        """Bytes held by the packed masks, the unit masks, the task state and own weights."""
        return {
            "weight_masks": sum(v.numel() for v in self.weights.values()),
            "unit_masks": sum((v.numel() + 7) // 8 for v in self.units.values()),
            "state": sum(v.numel() * v.element_size() for v in self.state.values()),
            "own_weights": sum(v.numel() * v.element_size() for v in self.own.values()),
        }
