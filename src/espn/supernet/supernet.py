"""The supernet: one network whose weights are shared by every task's sparse sub-network."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from espn.errors import EspnError
from espn.supernet.flops import Cost, count_flops, trace_costs, unit_flops
from espn.supernet.layers import (
    MaskedLayer,
    TaskSpecific,
    UnitGate,
    UnitModule,
    with_unions,
)
from espn.supernet.masks import LayerLayout, Ownership, TaskMask, prefixed, zero_dead_units


class NothingToMask(EspnError, ValueError):
    """A model without masked layers: espn has nothing to mask in it."""


class TaskRequired(EspnError, ValueError):
    """``supernet(x)`` without ``task=``: which task answers is never guessed."""


#: how a committed task holds its weights (see :meth:`Supernet.commit_task`)
WEIGHT_KINDS = ("shared", "own", "fixed")


class Supernet(nn.Module):
    """A network packed with task sub-networks: the wrapped ``model``'s masked layers (shared
    weights) and task-specific modules, one :class:`TaskMask` per learned task (their union
    frozen), and the *working* sub-network of the task in training."""

    def __init__(self, model: nn.Module, example_input: Tensor) -> None:
        super().__init__()
        self.model = model
        self.layers: dict[str, MaskedLayer] = {
            n: m for n, m in model.named_modules() if isinstance(m, MaskedLayer)
        }
        if not self.layers:
            raise NothingToMask(
                f"{type(model).__name__} has no masked layer, so espn has nothing to mask: a "
                "supernet masks the weights of nn.Linear and nn.Conv2d layers (with "
                "nn.BatchNorm2d as task BatchNorm); wrap a plain model with "
                "espn.wrap(model, example_input), which converts those layers"
            )
        #: the shape of one input sample (the example batch without its batch dimension)
        self.input_shape = tuple(example_input.shape[1:])
        #: the dtype of the inputs: float32, or int64 token ids for a model whose first layer
        #: is an embedding (recorded in checkpoints, checked on every input given)
        self.input_dtype = example_input.dtype
        #: how a checkpoint names the model (a registered name or an import reference, see
        #: ``espn.wrap``) and the class count it was built for; None when not known
        self.model_name: str | None = None
        self.model_classes: int | None = None
        self._read_units(model)
        self._check_topology()
        self.costs: list[Cost] = trace_costs(model, example_input)
        self.dense_flops = count_flops(self.costs, self.widths)
        self.masks: list[TaskMask] = []
        layout = {
            n: LayerLayout(
                tuple(m.weight.shape),
                m.out_units,
                m.in_units,
                m.out_unit_size,
                m.in_unit_size,
                self.unions.get(m.in_units, ()) if m.in_units else (),
                self.concats.get(m.in_units, ()) if m.in_units else (),
            )
            for n, m in self.layers.items()
        }
        #: which task owns each shared weight (the first that took it as a new weight)
        self.owners = Ownership.empty(layout, next(iter(self.layers.values())).weight.device)
        self.active_task: int | None = None
        self.in_training = False

    # ----------------------------------------------------------------- topology
    def _read_units(self, model: nn.Module) -> None:
        """The unit groups of ``model``'s gates and norms, the unions and concatenations of
        groups that its layers read, and the width of each."""
        self.task_modules: dict[str, TaskSpecific] = {
            n: m for n, m in model.named_modules() if isinstance(m, TaskSpecific)
        }
        self.groups: dict[str, list[UnitModule]] = {}
        for m in self.task_modules.values():
            if isinstance(m, UnitModule):
                self.groups.setdefault(m.group, []).append(m)
        self.group_sizes = {g: mods[0].num_units for g, mods in self.groups.items()}
        #: unions of unit groups read as one (a residual stream whose producers are pruned
        #: each on its own, see ``espn.models.resnet``): union name -> its member groups
        self.unions: dict[str, tuple[str, ...]] = {
            u: tuple(members) for u, members in getattr(model, "unit_unions", {}).items()
        }
        #: concatenations of unit groups read as one (a layer reading ``torch.cat`` of their
        #: features, see ``espn.models.convert``): concatenation name -> its member groups
        self.concats: dict[str, tuple[str, ...]] = {
            c: tuple(members) for c, members in getattr(model, "unit_concats", {}).items()
        }
        self._check_unions()
        #: the width of every unit group, union and concatenation
        self.widths = (
            self.group_sizes
            | {u: self.group_sizes[members[0]] for u, members in self.unions.items()}
            | {c: sum(self.group_sizes[g] for g in members) for c, members in self.concats.items()}
        )

    def _check_unions(self) -> None:
        for union, members in self.unions.items() | self.concats.items():
            if union in self.groups:
                raise ValueError(f"unit union {union!r} has the name of a unit group")
            unknown = [g for g in members if g not in self.groups]
            if not members or unknown:
                raise ValueError(f"unit union {union!r}: no gate/BatchNorm for {unknown or 'it'}")
            if union in self.unions and len({self.group_sizes[g] for g in members}) != 1:
                raise ValueError(f"unit union {union!r} joins groups of different widths")

    def _check_topology(self) -> None:
        for name, sizes in self.group_sizes.items():
            if any(m.num_units != sizes for m in self.groups[name]):
                raise ValueError(f"unit group {name!r} has modules of different widths")
        for name, layer in self.layers.items():
            for attr, dim in (("out_units", 0), ("in_units", 1)):
                group = getattr(layer, attr)
                if group is None:
                    continue
                known = self.group_sizes if dim == 0 else self.widths  # a union is only read
                if group not in known:
                    raise ValueError(f"layer {name!r}: {attr}={group!r} names no gate/BatchNorm")
                size = layer.out_unit_size if dim == 0 else layer.in_unit_size
                if layer.weight.shape[dim] != self.widths[group] * size:
                    raise ValueError(
                        f"layer {name!r}: {attr}={group!r} has {self.widths[group]} units "
                        f"of {size} features but the weight has {layer.weight.shape[dim]}"
                    )

    @property
    def stream_pruning(self) -> str | None:
        """How the residual streams are pruned: ``"per-conv"`` (unions of groups),
        ``"coupled"`` (a group scaled by several gates/BatchNorms), None (no stream)."""
        if self.unions:
            return "per-conv"
        return "coupled" if any(len(mods) > 1 for mods in self.groups.values()) else None

    # -------------------------------------------------------------- unit masks
    def unit_masks(self) -> dict[str, Tensor]:
        """Boolean alive vector of every unit group in the active sub-network."""
        return {g: mods[0].unit_mask.bool().clone() for g, mods in self.groups.items()}

    @torch.no_grad()
    def set_unit_masks(self, units: dict[str, Tensor]) -> None:
        """Set alive units; a dead unit's gate/BatchNorm scale and shift (and what other task
        modules hold for it, see :meth:`TaskSpecific.zero_dead`) are zeroed exactly."""
        self._load_units(units)
        for g in units:
            for m in self.groups[g]:
                dead = m.entry_mask() == 0
                m.weight.data.masked_fill_(dead, 0.0)
                m.bias.data.masked_fill_(dead, 0.0)
        for task_module in self.task_modules.values():
            task_module.zero_dead(units)
        self.set_weight_masks({})  # the weight masks restricted to the alive units

    def _load_units(self, units: dict[str, Tensor]) -> None:
        """Write the alive vectors ``units`` into their groups' unit masks."""
        for g, alive in units.items():
            every = bool(alive.all())
            for m in self.groups[g]:
                m.set_units(alive, every)

    def structural_mask(self, name: str) -> Tensor:
        """Weights of layer ``name`` whose input and output units are both alive."""
        return self.owners.structure(name, self.unit_masks(), self.layers[name].weight.device)

    def note_masks(self) -> None:
        """Let every layer record whether its weight mask is all ones (see
        ``MaskedLayer.note_mask``): called where masks change, so a step multiplies no
        weight by a mask of ones."""
        for layer in self.layers.values():
            layer.note_mask()

    # ------------------------------------------------------------ weight masks
    def weight_masks(self) -> dict[str, Tensor]:
        """Boolean weight mask of every masked layer in the active sub-network."""
        return {n: layer.weight_mask.bool() for n, layer in self.layers.items()}

    @torch.no_grad()
    def set_weight_masks(self, masks: dict[str, Tensor]) -> None:
        """Set weight masks, each layer's zeroed on the rows and columns of dead units (see
        :func:`~espn.supernet.masks.zero_dead_units`). A mask copied in from a boolean one, or
        noted binary before, stays binary and is noted so without a read of its values."""
        unknown = masks.keys() - self.layers.keys()
        if unknown:
            raise KeyError(f"no masked layer named {sorted(unknown)}")
        units = with_unions(self.unit_masks(), self.unions, self.concats)
        dead = {g: alive for g, alive in units.items() if not bool(alive.all())}
        for name, layer in self.layers.items():
            mask = masks.get(name)
            if mask is not None:
                layer.weight_mask.copy_(mask.to(layer.weight_mask.device))
            binary = (mask is not None and mask.dtype == torch.bool) or layer.mask_is_binary()
            zero_dead_units(layer, dead)
            layer.note_mask(binary)

    @torch.no_grad()
    def zero_pruned(self, state: Mapping[Tensor, Mapping[str, Any]] | None = None) -> list[str]:
        """Zero the free weights outside every layer's mask and their optimizer state
        (``state``: per weight) after a prune event, so that a step skips the mask product
        (see ``MaskCaches.zero_pruned``); returns the layers that skip it."""
        skipping = []
        for name, layer in self.layers.items():
            values = (state or {}).get(layer.weight, {}).values()
            states = [v for v in values if isinstance(v, Tensor) and v.shape == layer.weight.shape]
            if layer.zero_pruned(states):
                skipping.append(name)
        return skipping

    # -------------------------------------------------------------- counting
    def alive_counts(self, units: dict[str, Tensor] | None = None) -> dict[str, int]:
        """Alive units per group, of the active task or of ``units``."""
        units = self.unit_masks() if units is None else units
        return {g: int(a.sum()) for g, a in units.items()}

    def alive_widths(self, units: dict[str, Tensor] | None = None) -> dict[str, int]:
        """Alive units per group, union and concatenation of groups (a union's unit is alive
        where any member keeps it), of the active task or of ``units``."""
        units = self.unit_masks() if units is None else units
        full = with_unions(units, self.unions, self.concats)
        return {g: int(a.sum()) for g, a in full.items()}

    def flops(self, units: dict[str, Tensor] | None = None) -> float:
        """FLOPs of the active sub-network, or of the given unit masks (see ``espn.supernet.flops``)."""
        return count_flops(self.costs, self.alive_widths(units))

    def floor_ratio(self) -> float:
        """The smallest FLOPs ratio unit pruning reaches: the pruner never empties a layer, and
        a union of groups (a residual stream) keeps one unit when its members keep the same one."""
        one = {g: torch.arange(n) == 0 for g, n in self.group_sizes.items()}
        return self.flops(one) / max(self.dense_flops, 1)

    def unit_flops(self, load: str = "output") -> dict[str, float]:
        """FLOP_l(m): the FLOPs one unit of each group carries in the active sub-network
        (``load``: see :func:`espn.supernet.flops.unit_flops`). What the readers of a union
        spend on one of its units (``load="total"``) is shared equally by its member groups;
        a unit of a concatenation is a unit of one member group, which carries all of it."""
        loads = unit_flops(self.costs, self.alive_widths(), load)
        for union, members in self.unions.items() | self.concats.items():
            share = loads.pop(union) / (len(members) if union in self.unions else 1)
            for g in members:
                loads[g] += share
        return loads

    def alive_unit_entries(self) -> int:
        """Alive units counted once per gate/BatchNorm that scales them (once per entry of a
        norm's ``weight`` where a unit spans several channels): the number of saliencies the
        sparsity penalties are averaged over."""
        return sum(
            int(mods[0].unit_mask.sum()) * sum(m.entries_per_unit for m in mods)
            for mods in self.groups.values()
        )

    @property
    def total_weights(self) -> int:
        """p: the number of shared (masked) weights."""
        return sum(layer.weight.numel() for layer in self.layers.values())

    @property
    def frozen_weights(self) -> int:
        """p_{t-1}: weights owned by earlier tasks."""
        return sum(int(layer.frozen.sum()) for layer in self.layers.values())

    @property
    def free_weights(self) -> int:
        """Weights no earlier task owns: p - p_{t-1}."""
        return self.total_weights - self.frozen_weights

    def weight_budget(self, alpha: float) -> int:
        """NNZ-bar_t = ceil(alpha * (p - p_{t-1})): the new weights the next task may take."""
        return math.ceil(alpha * self.free_weights)

    def new_weights(self) -> int:
        """Weights of the active sub-network that no earlier task owns."""
        return sum(
            int((layer.weight_mask.bool() & ~layer.frozen).sum()) for layer in self.layers.values()
        )

    def used_weights(self) -> int:
        """Weights in the active task's mask (frozen and new)."""
        return sum(int(layer.weight_mask.bool().sum()) for layer in self.layers.values())

    # ---------------------------------------------------------------- parameters
    def shared_parameters(self) -> list[Tensor]:
        """The shared weight tensors, one per masked layer."""
        return [layer.weight for layer in self.layers.values()]

    # ---------------------------------------------------------------- task life
    @torch.no_grad()
    def begin_task(self, n_classes: int) -> None:
        """Start a new task: the working sub-network is the whole network (m_t = [p])."""
        for m in self.task_modules.values():
            m.reset_task(n_classes)
        self._load_units({g: torch.ones(n, dtype=torch.bool) for g, n in self.group_sizes.items()})
        for layer in self.layers.values():
            layer.weight_mask.fill_(1.0)
            layer.note_mask(binary=True)
        self.active_task = None
        self.in_training = True
        self._n_classes = n_classes

    def task_state(self, committed: bool = False) -> dict[str, Tensor]:
        """The active task's own tensors (gates/BatchNorm, head, statistics) by name; with
        ``committed``, only what a finished task stores (modules with ``per_task`` set)."""
        return {
            f"{name}.{key}": value
            for name, m in self.task_modules.items()
            if m.per_task or not committed
            for key, value in m.task_state().items()
        }

    def task_state_keys(self, committed: bool = False) -> set[str]:
        """The names :meth:`task_state` returns, without copying any tensor."""
        return {
            f"{name}.{key}"
            for name, m in self.task_modules.items()
            if m.per_task or not committed
            for key in m.state_dict()
            if key != "unit_mask"
        }

    @torch.no_grad()
    def release_gates(self) -> None:
        """End of pruning: non-affine gates become 1 on alive units and stop training."""
        for m in self.task_modules.values():
            if isinstance(m, UnitGate):
                m.release()

    def unit_state_groups(self) -> dict[str, str]:
        """Task-state keys holding one value per unit, or the same number of values per unit
        (gates, BatchNorm, GroupNorm), with their group."""
        return {
            f"{name}.{key}": m.group
            for name, m in self.task_modules.items()
            if isinstance(m, UnitModule)
            for key, value in m.state_dict().items()
            if key != "unit_mask" and value.dim() == 1 and value.numel() == m.weight.numel()
        }

    @torch.no_grad()
    def commit_task(self, weights: str = "shared") -> TaskMask:
        """Store the working sub-network as the next task's mask, in its smallest exact form
        (:mod:`espn.supernet.masks`). ``weights``: ``"shared"`` (ESPN, PackNet) freezes them for
        every later task (the task owns those no earlier task owned); ``"own"`` (Individual)
        stores the task's own copy in the mask and freezes nothing; ``"fixed"`` (SupSup): never
        trained, frozen like shared ones, no new weights."""
        if not self.in_training:
            raise RuntimeError("commit_task() called with no task in training")
        if weights not in WEIGHT_KINDS:
            raise ValueError(f"unknown weights {weights!r}; choose one of: {WEIGHT_KINDS}")
        self.set_unit_masks(self.unit_masks())  # optimizer momentum may have moved dead gates
        own = None
        if weights == "own":
            own = {n: m.weight.detach()[m.weight_mask.bool()] for n, m in self.layers.items()}
        index = len(self.masks)
        new_weights = 0 if weights == "fixed" else self.new_weights()
        masks = self.weight_masks()
        if weights != "own":
            self.owners.take(masks, index)
            for name, layer in self.layers.items():
                layer.frozen |= masks[name]
        mask = TaskMask.from_dense(
            masks,
            self.unit_masks(),
            self.task_state(committed=True),
            self._n_classes,
            new_weights,
            own,
            owners=self.owners,
            horizon=index if weights == "shared" else -1,  # trained weights only: owned form
        )
        self.masks.append(mask)
        self.in_training = False
        self.active_task = len(self.masks) - 1
        return mask

    @torch.no_grad()
    def load_task_state(self, units: dict[str, Tensor], state: dict[str, Tensor]) -> None:
        """Swap in a task's unit masks (first: a released gate is its unit mask) and its task
        state (``"<module>.<tensor>"``, as :meth:`task_state` names it)."""
        self._load_units(units)
        for name, m in self.task_modules.items():
            m.load_task_state(prefixed(state, f"{name}."))

    @torch.no_grad()
    def use_task(self, task: int) -> None:
        """Load task ``task``'s sub-network (weight and unit masks, gates/BatchNorm, head, and
        the task's own weights if it has them)."""
        if self.in_training:
            raise RuntimeError("a task is in training; commit it before switching tasks")
        if not 0 <= task < len(self.masks):
            learned = f"tasks 0..{len(self.masks) - 1}" if self.masks else "no task is learned yet"
            raise IndexError(f"task {task} is not learned ({learned})")
        mask = self.masks[task]
        self.load_task_state(mask.units, mask.state)
        for name, layer in self.layers.items():
            weight_mask = mask.weight_mask(name, layer.weight.device)
            layer.weight_mask.copy_(weight_mask)
            if name in mask.own:  # a task with its own weights (Individual)
                values = mask.own[name].to(layer.weight.device, layer.weight.dtype)
                layer.weight.masked_scatter_(weight_mask, values)
        self.active_task = task

    # ------------------------------------------------------------------ state
    def get_extra_state(self) -> dict[str, Any]:
        """What ``state_dict()`` carries besides the modules' tensors: every learned task, the
        owner ids, and which task is loaded or in training, in types that
        ``torch.load(weights_only=True)`` reads."""
        return {
            "format": 1,
            "active_task": -1 if self.active_task is None else self.active_task,
            "in_training": self.in_training,
            "n_classes": int(getattr(self, "_n_classes", 0)),
            "owners": {n: ids.clone() for n, ids in self.owners.ids.items()},
            "tasks": [m.as_state() for m in self.masks],
        }

    @torch.no_grad()
    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`get_extra_state` returned (called by ``load_state_dict``
        before the modules' own tensors are loaded: heads are resized to the saved task's
        width here so that they fit)."""
        if not isinstance(state, dict) or state.get("format") != 1:
            raise ValueError("not a supernet state (no task list in its '_extra_state')")
        layers = {n: tuple(layer.weight.shape) for n, layer in self.layers.items()}
        owners = state["owners"]
        if set(owners) != set(layers) or any(
            tuple(owners[n].shape) != shape for n, shape in layers.items()
        ):
            raise ValueError(
                "the state's masked layers differ from this supernet's "
                f"({sorted(owners)} vs {sorted(layers)}); it was saved from another model"
            )
        device = next(iter(self.layers.values())).weight.device
        self.owners = Ownership(self.owners.layout, {n: v.to(device) for n, v in owners.items()})
        self.masks = [TaskMask.from_state(t, layers, self.owners) for t in state["tasks"]]
        self.in_training, self.active_task = False, None
        if state["in_training"]:
            self.begin_task(int(state["n_classes"]))
        elif state["active_task"] >= 0:
            self.use_task(int(state["active_task"]))

    def forward(self, x: Tensor, task: int | None = None) -> Tensor:
        """Logits of task ``task``'s sub-network; ``task`` is never guessed (the task in
        training runs through :meth:`forward_working`)."""
        if task is None:
            learned = f"0..{len(self.masks) - 1}" if self.masks else "none learned yet"
            raise TaskRequired(
                f"supernet(x) needs task=: the index of the task whose sub-network should "
                f"answer (learned tasks: {learned}); espn never guesses it. The task in "
                "training runs through supernet.forward_working(x)"
            )
        if isinstance(task, bool) or not isinstance(task, int):
            raise TaskRequired(f"task must be a task index (int), got {task!r}")
        if task != self.active_task:
            self.use_task(task)
        return self.model(x)

    def forward_working(self, x: Tensor) -> Tensor:
        """Logits of the sub-network loaded now: the task in training, or the whole network
        before any task began."""
        return self.model(x)
