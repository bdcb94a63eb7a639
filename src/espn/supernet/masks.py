"""Per-task sub-networks, stored compactly: owner ids, and each task's weight mask per layer in
the smallest of four forms (:data:`MASK_FORMS`: ``structure``, ``owned``, ``bits``,
``indices``) that decodes to exactly that mask (docs/algorithm.md, "Storage as owner ids").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from espn.supernet.layers import MaskedLayer, expand_units, with_unions

_BIT_VALUES = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)

#: the forms a weight mask is stored in (docs/algorithm.md, "Storage as owner ids")
MASK_FORMS = ("structure", "owned", "bits", "indices")
#: the forms that store a payload per task
EXPLICIT_FORMS = ("bits", "indices")
#: owner-id dtypes, smallest first: torch compares no unsigned type wider than uint8 on CPU
OWNER_DTYPES = (torch.uint8, torch.int16, torch.int32, torch.int64)


def pack_bits(mask: Tensor) -> Tensor:
    """Pack a boolean tensor of any shape into a flat uint8 tensor, 8 entries per byte."""
    flat = mask.detach().flatten().to(torch.uint8)
    flat = F.pad(flat, (0, (-flat.numel()) % 8))
    return (flat.view(-1, 8) * _BIT_VALUES.to(flat.device)).sum(1, dtype=torch.uint8)


def unpack_bits(packed: Tensor, shape: tuple[int, ...] | torch.Size) -> Tensor:
    """Inverse of :func:`pack_bits`: the boolean tensor of ``shape``."""
    numel = torch.Size(shape).numel()
    shifts = torch.arange(7, -1, -1, device=packed.device, dtype=torch.uint8)
    bits = (packed.unsqueeze(1) >> shifts) & 1
    return bits.flatten()[:numel].view(tuple(shape)).bool()


def prefixed(tensors: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The tensors whose names start with ``prefix``, by the rest of their names."""
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def owner_dtype(n_tasks: int) -> torch.dtype:
    """The smallest owner-id dtype holding ids ``0 .. n_tasks - 1`` and the free sentinel
    (the dtype's largest value): uint8 up to 255 tasks, then int16, int32, int64."""
    for dtype in OWNER_DTYPES:
        if n_tasks <= torch.iinfo(dtype).max:
            return dtype
    raise ValueError(f"{n_tasks} tasks do not fit any owner-id dtype")


class LayerLayout(NamedTuple):
    """A masked layer's weight shape and the unit groups indexing its outputs and inputs."""

    shape: tuple[int, ...]
    out_units: str | None
    in_units: str | None
    #: features per unit on each side (see ``MaskedLayer.out_unit_size``)
    out_unit_size: int = 1
    in_unit_size: int = 1
    #: the unit groups whose union ``in_units`` is (a residual stream read after producers
    #: pruned each on its own); empty: ``in_units`` is a group of its own
    in_members: tuple[str, ...] = ()
    #: the unit groups whose concatenation ``in_units`` is (empty: none)
    in_concat: tuple[str, ...] = ()


@dataclass(eq=False)
class Ownership:
    """Which task owns each shared weight (the first that took it as a new weight): one id
    tensor per masked layer (``ids``) in the smallest dtype that fits (:func:`owner_dtype`),
    the dtype's largest value for a free weight. Ids are written once, so ``ids <= t`` never
    changes: a task's mask can be stored as its ``horizon`` alone."""

    layout: dict[str, LayerLayout]
    ids: dict[str, Tensor]

    @classmethod
    def empty(cls, layout: dict[str, LayerLayout], device: torch.device | str) -> Ownership:
        """Every weight free, in uint8."""
        free = torch.iinfo(torch.uint8).max
        ids = {
            n: torch.full(lay.shape, free, dtype=torch.uint8, device=device)
            for n, lay in layout.items()
        }
        return cls(layout, ids)

    @property
    def dtype(self) -> torch.dtype:
        """The current owner-id dtype."""
        return next(iter(self.ids.values())).dtype if self.ids else torch.uint8

    @property
    def free_id(self) -> int:
        """The sentinel of a weight no task owns."""
        return torch.iinfo(self.dtype).max

    @property
    def bits(self) -> int:
        """Bits per weight that hold every id given so far and the free sentinel (all ones):
        ``ceil(log2(tasks + 1))``, at least 1."""
        # free weights read as id 0: the same bit count as no id at all (at least 1)
        free = self.free_id
        top = max(
            (int(v.masked_fill(v == free, 0).max()) for v in self.ids.values() if v.numel()),
            default=0,
        )
        return max(1, (top + 1).bit_length())

    def nbytes(self) -> int:
        """Bytes of the owner ids as stored: :attr:`bits` bit-planes per layer."""
        return self.bits * sum((v.numel() + 7) // 8 for v in self.ids.values())

    def packed(self) -> dict[str, Tensor]:
        """Each layer's ids as :attr:`bits` bit-planes, packed (uint8, one plane after the
        other, each padded to whole bytes), the free sentinel as all ones."""
        bits, free = self.bits, self.free_id
        out = {}
        for name, ids in self.ids.items():
            # in the ids' own dtype: every id and the all-ones sentinel fit it (the free id is
            # the dtype's largest value, so ids need fewer bits than the dtype has)
            values = ids.masked_fill(ids == free, (1 << bits) - 1).flatten()
            out[name] = torch.cat([pack_bits((values >> k) & 1) for k in range(bits)])
        return out

    @classmethod
    def unpacked(
        cls, layout: dict[str, LayerLayout], planes: dict[str, Tensor], bits: int, n_tasks: int
    ) -> Ownership:
        """Inverse of :meth:`packed` (``n_tasks``: the dtype to hold them in)."""
        dtype = owner_dtype(max(n_tasks, 1))
        ids = {}
        for name, lay in layout.items():
            numel = torch.Size(lay.shape).numel()
            per_plane = (numel + 7) // 8
            values = torch.zeros(numel, dtype=torch.int64, device=planes[name].device)
            for k in range(bits):
                plane = planes[name][k * per_plane : (k + 1) * per_plane]
                values |= unpack_bits(plane, (numel,)).to(torch.int64) << k
            free = values == (1 << bits) - 1
            ids[name] = values.masked_fill(free, torch.iinfo(dtype).max).to(dtype).view(lay.shape)
        return cls(layout, ids)

    @torch.no_grad()
    def reserve(self, n_tasks: int) -> None:
        """Widen the dtype (keeping every id, remapping the free sentinel) so that ids up to
        ``n_tasks - 1`` fit."""
        dtype = owner_dtype(n_tasks)
        if OWNER_DTYPES.index(dtype) <= OWNER_DTYPES.index(self.dtype):
            return
        old_free, new_free = self.free_id, torch.iinfo(dtype).max
        for name, ids in self.ids.items():
            self.ids[name] = ids.to(dtype).masked_fill_(ids == old_free, new_free)

    @torch.no_grad()
    def take(self, masks: dict[str, Tensor], task: int) -> None:
        """Task ``task`` owns the weights of ``masks`` that no task owned yet."""
        self.reserve(task + 1)
        free = self.free_id
        for name, mask in masks.items():
            ids = self.ids[name]
            ids.masked_fill_(mask.to(ids.device) & (ids == free), task)

    def frozen(self, name: str) -> Tensor:
        """Weights of layer ``name`` that some task owns."""
        return self.ids[name] != self.free_id

    def owned(self, name: str, horizon: int, device: torch.device | str | None = None) -> Tensor:
        """Weights of layer ``name`` owned by task ``horizon`` or an earlier one."""
        ids = self.ids[name] if device is None else self.ids[name].to(device)
        return ids <= horizon  # the free sentinel exceeds every task id

    def to(self, device: torch.device | str) -> Ownership:
        """The ids moved to ``device`` (in place)."""
        self.ids = {n: v.to(device) for n, v in self.ids.items()}
        return self

    def structure(
        self, name: str, units: dict[str, Tensor], device: torch.device | str = "cpu"
    ) -> Tensor:
        """Weights of layer ``name`` whose output and input units are both alive in ``units``."""
        lay = self.layout[name]
        mask = torch.ones(lay.shape[:2], dtype=torch.bool, device=device)
        if lay.out_units:
            out = units[lay.out_units].to(device)
            mask &= expand_units(out, lay.out_unit_size).view(-1, 1)
        if lay.in_units:
            unions = {lay.in_units: lay.in_members} if lay.in_members else {}
            concats = {lay.in_units: lay.in_concat} if lay.in_concat else {}
            alive = with_unions(units, unions, concats)[lay.in_units]
            mask &= expand_units(alive.to(device), lay.in_unit_size).view(1, -1)
        return mask.view(*lay.shape[:2], *([1] * (len(lay.shape) - 2))).expand(lay.shape)


def zero_dead_units(layer: MaskedLayer, dead: dict[str, Tensor]) -> None:
    """Zero ``layer``'s weight mask on the rows and columns of dead units (``dead``: the
    alive vector of every unit group and union with a dead unit), without building a
    boolean tensor of the weight's size."""
    mask = layer.weight_mask
    sides = ((layer.out_units, layer.out_unit_size), (layer.in_units, layer.in_unit_size))
    for dim, (group, size) in enumerate(sides):
        if group in dead:
            gone = expand_units(dead[group], size).logical_not().nonzero().view(-1)
            mask.index_fill_(dim, gone.to(mask.device), 0.0)


def encode_mask(
    mask: Tensor,
    name: str,
    units: dict[str, Tensor],
    owners: Ownership | None,
    horizon: int,
) -> tuple[str, Tensor]:
    """The smallest form (and its payload, empty for derived forms) that decodes to exactly
    ``mask``; derived forms are checked against ``mask``, never assumed."""
    mask = mask.detach().bool()
    if owners is not None:
        structure = owners.structure(name, units, mask.device)
        if torch.equal(mask, structure):
            return "structure", torch.empty(0, dtype=torch.uint8)
        if horizon >= 0 and torch.equal(mask, structure & owners.owned(name, horizon, mask.device)):
            return "owned", torch.empty(0, dtype=torch.uint8)
    mask = mask.cpu()
    nnz = int(mask.sum())
    if nnz * 4 < (mask.numel() + 7) // 8:
        return "indices", torch.nonzero(mask.flatten()).flatten().to(torch.int32)
    return "bits", pack_bits(mask)


@dataclass
class TaskMask:
    """Task t's sub-network m_t and its own small state: per masked layer a payload
    (``weights``) in the form ``forms`` names (default ``"bits"``; derived forms read the
    shared ``owners`` and ``horizon``); per unit group a boolean alive vector (``units``);
    the task modules' tensors by ``"<module>.<tensor>"`` (``state``); the weights it took
    (``new_weights``); its own weight values in mask order (``own``, Individual); and what
    it stores for task-agnostic prediction (``stats``, :mod:`espn.inference.statistics`)."""

    weights: dict[str, Tensor]
    shapes: dict[str, tuple[int, ...]]
    units: dict[str, Tensor]
    state: dict[str, Tensor] = field(default_factory=dict)
    n_classes: int = 0
    new_weights: int = 0
    own: dict[str, Tensor] = field(default_factory=dict)
    forms: dict[str, str] = field(default_factory=dict)
    horizon: int = -1
    owners: Ownership | None = field(default=None, repr=False, compare=False)
    stats: dict[str, Tensor] = field(default_factory=dict)

    def as_state(self) -> dict[str, Any]:
        """This mask as a supernet's state dict carries it (its shapes and owners are the
        supernet's): see :meth:`from_state`."""
        fields = ("weights", "forms", "units", "state", "own", "stats")
        plain = {k: dict(getattr(self, k)) for k in fields}
        return plain | {
            "n_classes": self.n_classes,
            "new_weights": self.new_weights,
            "horizon": self.horizon,
        }

    @classmethod
    def from_state(
        cls, t: dict[str, Any], shapes: dict[str, tuple[int, ...]], owners: Ownership
    ) -> TaskMask:
        """The mask :meth:`as_state` returned ``t`` for (``stats`` may be missing)."""
        return cls(
            weights=dict(t["weights"]),
            shapes=dict(shapes),
            units={g: u.bool() for g, u in t["units"].items()},
            state=dict(t["state"]),
            n_classes=int(t["n_classes"]),
            new_weights=int(t["new_weights"]),
            own=dict(t["own"]),
            forms=dict(t["forms"]),
            horizon=int(t["horizon"]),
            owners=owners,
            stats=dict(t.get("stats", {})),
        )

    @classmethod
    def from_dense(
        cls,
        weights: dict[str, Tensor],
        units: dict[str, Tensor],
        state: dict[str, Tensor],
        n_classes: int,
        new_weights: int,
        own: dict[str, Tensor] | None = None,
        owners: Ownership | None = None,
        horizon: int = -1,
    ) -> TaskMask:
        """Store boolean weight masks (on the CPU) in their smallest exact form (without
        ``owners``: bits or indices; see :func:`encode_mask`)."""
        units = {k: v.detach().cpu().bool().clone() for k, v in units.items()}
        encoded = {k: encode_mask(v, k, units, owners, horizon) for k, v in weights.items()}
        return cls(
            weights={k: payload for k, (_, payload) in encoded.items()},
            shapes={k: tuple(v.shape) for k, v in weights.items()},
            units=units,
            state={k: v.detach().cpu().clone() for k, v in state.items()},
            n_classes=n_classes,
            new_weights=new_weights,
            own={k: v.detach().cpu().clone() for k, v in (own or {}).items()},
            forms={k: form for k, (form, _) in encoded.items()},
            horizon=horizon,
            owners=owners,
        )

    def form(self, layer: str) -> str:
        """The form ``layer``'s mask is stored in."""
        return self.forms.get(layer, "bits")

    def weight_mask(self, layer: str, device: torch.device | str = "cpu") -> Tensor:
        """The boolean weight mask of ``layer``."""
        form, shape = self.form(layer), self.shapes[layer]
        if form == "bits":
            return unpack_bits(self.weights[layer].to(device), shape)
        if form == "indices":
            flat = torch.zeros(torch.Size(shape).numel(), dtype=torch.bool, device=device)
            flat[self.weights[layer].to(device, torch.long)] = True
            return flat.view(shape)
        if self.owners is None:
            raise RuntimeError(f"layer {layer!r}: a {form!r} mask needs the supernet's owner ids")
        mask = self.owners.structure(layer, self.units, device)
        if form == "owned":
            mask = mask & self.owners.owned(layer, self.horizon, device)
        return mask.clone() if form == "structure" else mask

    def alive_state(self, groups: dict[str, str]) -> tuple[dict[str, Tensor], dict[str, str]]:
        """The task state with each per-unit tensor (``groups``: key -> unit group) cut to its
        alive units where every dead unit's value is exactly +0.0, and the keys so cut with
        their groups: what a checkpoint stores (:meth:`expand_state` puts the zeros back)."""
        out, cut = dict(self.state), {}
        for key, group in groups.items():
            value, alive = self.state.get(key), self.units.get(group)
            if value is None or alive is None or value.dim() != 1 or bool(alive.all()):
                continue
            if not bool(alive.any()) or value.numel() % alive.numel():
                continue
            per_unit = value.view(alive.numel(), -1)
            dead = per_unit[~alive]
            if bool((dead == 0).all()) and not bool(torch.signbit(dead).any()):
                out[key], cut[key] = per_unit[alive].flatten().clone(), group
        return out, cut

    @staticmethod
    def expand_state(
        state: dict[str, Tensor], cut: dict[str, str], units: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Inverse of :meth:`alive_state`: zeros at the dead units of each cut tensor."""
        out = dict(state)
        for key, group in cut.items():
            alive = units[group]
            kept = state[key].view(int(alive.sum()), -1)
            full = torch.zeros(alive.numel(), kept.shape[1], dtype=kept.dtype)
            full[alive] = kept
            out[key] = full.flatten()
        return out

    def nnz(self) -> int:
        """Number of weights in the sub-network (an independent count from the stored form)."""
        return sum(int(self.weight_mask(k).sum()) for k in self.weights)

    def nbytes(self, groups: dict[str, str] | None = None) -> dict[str, int]:
        """Bytes held by the stored masks, the unit masks, the task state (per-unit tensors of
        ``groups`` cut to the alive units, see :meth:`alive_state`) and own weights (the owner
        ids that derived masks read are shared by all tasks, not counted here)."""
        state = self.alive_state(groups)[0] if groups else self.state
        return {
            "weight_masks": sum(v.numel() * v.element_size() for v in self.weights.values()),
            "unit_masks": sum((v.numel() + 7) // 8 for v in self.units.values()),
            "state": sum(v.numel() * v.element_size() for v in state.values()),
            "own_weights": sum(v.numel() * v.element_size() for v in self.own.values()),
        }
