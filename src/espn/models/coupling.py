"""How the converter couples channels: Torch-Pruning's ``DependencyGraph`` groups turned into
espn's unit groups (:class:`Group`); see docs/architectures.md, "How units are formed"."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import Tensor, nn

from espn.layers import ConvertError
from espn.layers.parameters import channel_axis
from espn.models.convert_tokens import TokenConvertError, check_stream_sources
from espn.models.probe import (
    adapter,
    all_groups,
    channel_rooted,
    check_flatten_order,
    downstream,
    regroups,
    token_sides,
)

if TYPE_CHECKING:
    import torch_pruning as tp


@dataclass
class Group:
    """One set of coupled channels found by the dependency graph (a *part*: channels of one
    width), or the unit group of parts joined by grouped convs."""

    #: channels of a part; units of a unit group
    size: int
    producers: list[str] = field(default_factory=list)
    consumers: list[str] = field(default_factory=list)
    norms: list[str] = field(default_factory=list)
    #: self-attention modules reading and writing the group (their heads are units of their own)
    attentions: list[str] = field(default_factory=list)
    #: bare parameters added to the group's features (a class token, position embeddings)
    params: list[str] = field(default_factory=list)
    #: bare parameters multiplying the group's features (a layer scale)
    scale_params: list[str] = field(default_factory=list)
    #: linear layers applied across the token axis of the channels (an MLP-Mixer's token
    #: mixing): not units of the group, their FLOPs scale with its alive channels
    tokens: list[str] = field(default_factory=list)
    #: grouped convs (not depthwise) reading a part: their outputs' part joins it
    grouped_inputs: list[str] = field(default_factory=list)
    #: layers and norms reading the channels as a slice of a concatenation (``torch.cat``),
    #: by name: where the slice starts in their input and the features one unit spans
    slices: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: channels one unit spans on each side of a layer (inputs of a linear layer reading a
    #: flattened map: channels x H*W), by layer name
    out_unit: dict[str, int] = field(default_factory=dict)
    in_unit: dict[str, int] = field(default_factory=dict)
    norm_unit: dict[str, int] = field(default_factory=dict)
    name: str = ""
    #: channels kept whole (see :func:`_fixed` and :func:`_fixed_group`)
    fixed: bool = False


def _grouped(m: nn.Module) -> bool:
    """A layer whose channels come in groups (a grouped conv, depthwise too)."""
    layer = adapter(m)
    return layer.role == "layer" and layer.groups(m) != 1


def _fixed(
    graph: tp.DependencyGraph,
    groups: list[list[tuple[tp.Dependency, list[int]]]],
    names: dict[nn.Module, str],
    tokens: list[set[tuple[str, bool]]],
) -> list[bool]:
    """Which of Torch-Pruning's ``groups`` are kept whole: those with a node that
    :func:`_keeps_whole`; those cut into parts within a module (:func:`_cut_in_module`, its
    sides across the token axis in ``tokens`` aside) with the other sides of their layers
    (the stream, whose width such a module may read from its input's shape); those sharing a
    layer's side with a kept one (a reader of a concatenation, whose members are read as one)."""
    sides = [
        {(dep.target.module, graph.is_out_channel_pruning_fn(dep.handler)) for dep, _ in items}
        for items in groups
    ]
    kept: set[tuple[object, bool]] = set()
    for items, held, across in zip(groups, sides, tokens, strict=True):
        if _cut_in_module(graph, items, names, across):
            kept |= held | {(m, not out) for m, out in held if m in names}
        elif any(_keeps_whole(dep.target) for dep, _ in items):
            kept |= held
    fixed = [bool(held & kept) for held in sides]
    while True:
        kept = set().union(*(held for held, f in zip(sides, fixed, strict=True) if f))
        grown = [f or bool(held & kept) for held, f in zip(sides, fixed, strict=True)]
        if grown == fixed:
            return fixed
        fixed = grown


def _cut_in_module(
    graph: tp.DependencyGraph,
    items: list[tuple[tp.Dependency, list[int]]],
    names: dict[nn.Module, str],
    tokens: set[tuple[str, bool]],
) -> bool:
    """Whether a linear layer inside a module of the user's own (not the model itself) reads
    a projection's outputs cut into parts: a reshape moves them to another axis of its input,
    or it reads a part of them (heads, or q, k and v, cut from ``qkv``); a side in ``tokens``
    (applied across the token axis: an MLP-Mixer's token mixing) reads them whole."""
    size = len(items[0][1])
    for dep, idxs in items:
        m = dep.target.module
        out, name = graph.is_out_channel_pruning_fn(dep.handler), names.get(m, "")
        if "." in name and adapter(m).token_outputs and (name, out) not in tokens:
            width = adapter(m).width(m, out)
            if len(idxs) > width or (not out and len(idxs) == width < size):
                return True
    return False


def _keeps_whole(node: tp.Node) -> bool:
    """Whether the channels through ``node`` are kept whole: it splits or shuffles them
    (:func:`~espn.models.probe.regroups`; MobileViTv2's q, k and v split from one conv), or
    it is a GroupNorm of one group (cutting a channel would change the others' statistics)."""
    m = node.module
    one_group = isinstance(m, nn.GroupNorm) and m.num_groups == 1 < m.num_channels
    return one_group or regroups(node)


def _multiplies(graph: tp.DependencyGraph, m: nn.Module | nn.Parameter) -> bool:
    """Whether ``m``'s output reaches a product through element-wise ops alone: it scales
    features (the excitation of a squeeze-excitation block; a bare parameter: a layer scale)
    rather than being features. A product of a layer's output with a bare parameter scales
    the layer's own features instead."""
    import torch_pruning as tp

    for node in downstream(graph, m, tp.ops._ElementWiseOp):
        mul = node.grad_fn is not None and node.grad_fn.name().startswith("Mul")
        if mul and isinstance(node.module, tp.ops._ElementWiseOp):
            by_parameter = any(isinstance(i.module, nn.Parameter) for i in node.inputs)
            return isinstance(m, nn.Parameter) or not by_parameter
    return False


def _flattened(m: nn.Module, out_side: bool, taken: int, size: int) -> int:
    """Inputs per channel when linear layer ``m`` reads a flattened map of ``size`` channels
    (``taken`` of its inputs follow them, all of them), else 0."""
    if out_side or not adapter(m).reads_flattened or taken != adapter(m).width(m, False):
        return 0
    return taken // size if taken > size and taken % size == 0 else 0


def _concatenated(m: nn.Module, out_side: bool, idxs: list[int], size: int) -> bool:
    """Whether ``m`` reads the part's ``size`` channels as the consecutive slice ``idxs`` of
    its wider input: a concatenation read by a plain layer (not grouped) or a per-channel norm
    (which becomes one norm per member)."""
    kind = adapter(m)
    reader = kind.per_channel if kind.role == "norm" else kind.role == "layer" and not out_side
    return (
        reader
        and not _grouped(m)
        and len(idxs) == size < kind.width(m, out_side)
        and idxs == list(range(idxs[0], idxs[0] + size))
    )


@dataclass
class Coupling:
    """The unit groups :func:`couple` finds, and what the converter needs besides."""

    groups: list[Group]
    #: inputs per channel of linear layers reading a flattened feature map
    repeats: dict[str, int]
    #: layers whose output scales features (see :func:`_multiplies`)
    scales: set[str]


def couple(
    model: nn.Module,
    example: Tensor,
    modules: dict[str, nn.Module],
    bare: dict[str, nn.Parameter],
    graph: tp.DependencyGraph,
) -> Coupling:
    """The unit groups of ``modules`` (and of the bare parameters in ``bare`` that join
    them) from Torch-Pruning's ``graph``."""
    names = {m: n for n, m in modules.items()}
    param_names = {id(p): n for n, p in bare.items()}
    parts = []
    repeats: dict[str, int] = {}
    scales: set[str] = set()
    found = all_groups(model, graph)
    across = [token_sides(model, example, graph, items, names, modules) for items in found]
    kept = _fixed(graph, found, names, across)
    for items, fixed, tokens in zip(found, kept, across, strict=True):
        tokens = set() if fixed else tokens
        if (names.get(items[0][0].target.module), True) in tokens:
            items = channel_rooted(graph, items, names, tokens)
        g = _part(graph, items, names, param_names, repeats, scales, fixed, tokens)
        g.tokens = sorted({name for name, _ in tokens}, key=list(modules).index)
        parts.append(g)
        if fixed:
            continue
        features = [n for n in g.producers if n not in scales] or g.producers
        for name in [n for n in g.consumers if n in repeats]:
            check_flatten_order(model, example, modules[features[0]], name, g.size, modules)
    for name, layer in modules.items():
        if _grouped(layer):
            _check_grouped_input(model, example, name, adapter(layer).depthwise(layer), parts)
    groups = [_join(members, modules, repeats) for members in _joined_parts(parts)]
    return Coupling(groups, repeats, scales)


def _refuse_coupling(
    name: str, side: str, width: int, taken: int, root: str, size: int
) -> ConvertError:
    """The refusal of layer ``name``, ``taken`` of whose ``width`` features on ``side`` are
    coupled to the ``size`` channels of layer ``root``, naming the construct."""
    if taken > width:
        construct = (
            f"its {width} {side} features are coupled to {taken} channels of {root!r}: a reshape "
            "or transpose moves channels to another axis (attention heads cut from one "
            "projection), which is not supported"
        )
    elif taken < width:
        construct = (
            f"{taken} of its {width} {side} channels are the channels of {root!r} and the others "
            "come from other layers: this concatenation of feature maps is not supported "
            "(supported: torch.cat of whole outputs of layers, read by ungrouped conv or linear "
            "layers and BatchNorms)"
        )
    else:
        construct = (
            f"its {width} {side} channels are {width} of the {size} channels of {root!r}: "
            "splitting a feature map (chunk, split or slicing, such as q, k and v cut from one "
            "projection) is not supported"
        )
    return ConvertError(f"layer {name!r}: {construct}")


def _part(
    graph: tp.DependencyGraph,
    items: list[tuple[tp.Dependency, list[int]]],
    names: dict[nn.Module, str],
    param_names: dict[int, str],
    repeats: dict[str, int],
    scales: set[str],
    fixed: bool,
    tokens: set[tuple[str, bool]],
) -> Group:
    """One group of Torch-Pruning's graph as a part (channels of one width), noting the
    linear layers reading it flattened in ``repeats`` and its feature scales in ``scales``;
    a ``fixed`` part (see :func:`_fixed`) takes its layers as they come, whole; the sides in
    ``tokens`` (applied across its token axis) are not its channels."""
    root_name = names[items[0][0].target.module]
    g = Group(size=len(items[0][1]), fixed=fixed)
    for dep, idxs in items:
        m = dep.target.module
        if isinstance(m, nn.Parameter) and id(m) in param_names:
            name = param_names[id(m)]
            if fixed or len(idxs) == g.size == m.shape[channel_axis(m)]:
                held = g.scale_params if _multiplies(graph, m) else g.params
                if name not in held:
                    held.append(name)
            continue
        if m not in names:
            continue
        name = names[m]
        out_side = graph.is_out_channel_pruning_fn(dep.handler)
        if (name, out_side) in tokens:
            continue
        kind = adapter(m)
        width = kind.width(m, out_side)
        repeat = 0 if fixed else _flattened(m, out_side, len(idxs), g.size)
        if repeat:
            repeats[name] = repeat
        elif fixed:
            pass  # taken whole, as :func:`_join` places it
        elif _concatenated(m, out_side, idxs, g.size):
            g.slices[name] = (idxs[0], 1)
        elif len(idxs) != g.size or width != g.size:
            raise _refuse_coupling(
                name, "output" if out_side else "input", width, len(idxs), root_name, g.size
            )
        if name in g.slices and kind.role != "norm":
            continue  # read as a member of a concatenation (see espn.models.convert)
        if kind.role == "norm":
            g.norms.append(name)
        elif kind.role == "attention":
            g.attentions.append(name)
        elif out_side or kind.depthwise(m):  # a depthwise conv's inputs are its outputs
            if name not in g.producers:
                g.producers.append(name)
            if kind.may_scale and _multiplies(graph, m):
                scales.add(name)
        elif _grouped(m):
            g.grouped_inputs.append(name)
        else:
            g.consumers.append(name)
    return g


def _check_grouped_input(
    model: nn.Module, example: Tensor, name: str, depthwise: bool, parts: list[Group]
) -> None:
    """Refuse grouped conv ``name`` unless its input channels come from layers alone: with
    the outputs of the other layers and norms writing them set to zero, its input must be
    zero (a pruned group's inputs are removed from those layers; the model input or a bare
    parameter cannot lose channels)."""
    part = next(
        (p for p in parts if name in (p.producers if depthwise else p.grouped_inputs)), None
    )
    if part is not None and part.fixed:
        return  # never pruned: no group of it is removed
    writers = [] if part is None else [n for n in part.producers + part.norms if n != name]
    try:  # with no writers, its input (the model input, a parameter) is not zero: refused
        check_stream_sources(model, example, name, writers, [name])
    except TokenConvertError:
        raise ConvertError(
            f"grouped conv {name!r} reads channels that come partly from the model input or a "
            "bare parameter, so its groups could not be removed; supported: grouped and "
            "depthwise convs whose inputs come from conv layers"
        ) from None


def _joined_parts(parts: list[Group]) -> list[list[Group]]:
    """The parts joined into one unit group by grouped convs (each reads one part and writes
    another) and all fixed parts joined into one, in the order of their first part."""
    writer = {name: i for i, part in enumerate(parts) for name in part.producers}
    root = list(range(len(parts)))

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    fixed = [i for i, part in enumerate(parts) if part.fixed]
    pairs = [(i, writer[name]) for i, part in enumerate(parts) for name in part.grouped_inputs]
    for i, j in pairs + [(fixed[0], i) for i in fixed[1:]]:
        a, b = sorted((find(i), find(j)))
        root[b] = a
    joined: dict[int, list[Group]] = {}
    for i, part in enumerate(parts):
        joined.setdefault(find(i), []).append(part)
    return list(joined.values())


def _join(members: list[Group], modules: dict[str, nn.Module], repeats: dict[str, int]) -> Group:
    """One unit group of ``members`` (parts): its units are the greatest common divisor of the
    parts' widths, the group counts of the grouped convs writing them and of the GroupNorms
    normalising them, so that a unit is whole conv groups and whole GroupNorm groups on every
    side; a group forced down to a single unit is refused (it could never be pruned). Members
    with a fixed part make one fixed unit group (see :func:`_fixed_group`)."""
    if any(part.fixed for part in members):
        return _fixed_group(members, modules)
    counts: list[tuple[str, int]] = []
    for part in members:
        for name in part.producers + part.norms:
            m = modules[name]
            count = adapter(m).group_count(name, m)
            if count is not None:
                counts.append(count)
    units = math.gcd(*(part.size for part in members), *(n for _, n in counts))
    if units == 1 and counts and max(part.size for part in members) > 1:
        order = list(modules)
        first = min((n for p in members for n in p.producers + p.norms), key=order.index)
        raise ConvertError(
            f"the channels of {first!r} cannot be pruned in whole groups: "
            f"{' and '.join(text for text, _ in counts)} leave no common group count above 1; "
            "supported: grouped convs and GroupNorms whose group counts share a divisor above 1"
        )
    group = Group(size=units)
    for part in members:
        width = part.size // units
        if width > 1:
            token = [n for n in part.norms + part.attentions if adapter(modules[n]).tokens]
            token += part.params + part.scale_params + part.tokens
            if token:
                raise ConvertError(
                    f"module {token[0]!r} works on channels pruned in "
                    f"units of {width} (a grouped conv or GroupNorm); supported: LayerNorm and "
                    "attention on features pruned one by one"
                )
        for name in part.producers:
            if name not in group.producers:
                group.producers.append(name)
            group.out_unit[name] = width
        for name in part.consumers:
            group.consumers.append(name)
            group.in_unit[name] = width * repeats.get(name, 1)
        for name in part.norms:
            group.norms.append(name)
            group.norm_unit[name] = width
        for name, (start, _) in part.slices.items():
            if name in group.slices:
                raise ConvertError(
                    f"layer {name!r} reads two parts of one unit group in a concatenation; "
                    "supported: concatenations of feature maps pruned on their own"
                )
            group.slices[name] = (start, width)
        group.attentions += part.attentions
        group.tokens += part.tokens
        group.params += part.params
        group.scale_params += part.scale_params
    return group


def _fixed_group(members: list[Group], modules: dict[str, nn.Module]) -> Group:
    """The unit group of the channels kept whole (:func:`_fixed`): one unit holding all
    channels of its producers and norms, so that the pruner, which keeps one unit of every
    group, never removes them; readers take all their inputs (no input group), so where a
    split or shuffle moved a channel does not matter, and bare parameters are never cut."""
    group = Group(size=1, fixed=True)
    for part in members:
        if part.attentions:
            raise ConvertError(
                f"module {part.attentions[0]!r} works on channels kept whole (never pruned: "
                "a channel split or shuffle passes them on, a GroupNorm of one group normalises "
                "them, or a module cuts them into parts), which is not supported; supported "
                "there: conv and linear layers, their norms and bare parameters"
            )
        group.params += part.params + part.scale_params
        for name in part.producers + part.norms:
            units = group.out_unit if name in part.producers else group.norm_unit
            units.setdefault(name, adapter(modules[name]).width(modules[name], True))
    group.producers, group.norms = list(group.out_unit), list(group.norm_unit)
    return group
