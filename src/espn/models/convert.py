"""Bring your own conv net: turn an ordinary ``nn.Module`` into a supernet-ready one.

:func:`to_supernet` takes a network made of ``nn.Conv2d`` (grouped and depthwise too),
``nn.BatchNorm2d``, ``nn.GroupNorm`` and ``nn.Linear`` layers (plus parameter-free modules
and functions: activations, pooling, additions, products, flatten) and returns a copy in which

* every conv / linear layer is a masked layer (:class:`MaskedConv2d` / :class:`MaskedLinear`)
  holding the original weights, with the unit groups of its input and output channels set;
* every BatchNorm / GroupNorm is a task-specific :class:`TaskBatchNorm2d` /
  :class:`TaskGroupNorm` of its group;
* the output layer is a per-task :class:`TaskHead` (or a shared masked head plus a per-task
  :class:`TaskBias` when ``multi_head`` is False);
* ``nn.Conv1d``, ``nn.BatchNorm1d`` and ``nn.Embedding`` likewise (every layer type has one
  adapter in :mod:`espn.layers`, which says what it becomes, costs and exports to);
* bare per-feature parameters of a module of the user's own (a hand-written ViT's class token
  and position embeddings added to a token stream, a layer scale multiplying a conv's
  channels) become per-task state (:class:`~espn.layers.parameters.TaskParameters`);
* transformer layers (``nn.LayerNorm``, ``nn.MultiheadAttention``,
  ``nn.TransformerEncoder(Layer)``, linear layers on token tensors) and timm's
  ``VisionTransformer`` are converted as :mod:`espn.models.convert_tokens` and
  :mod:`espn.models.timm_vit` describe (attention heads become units).

The unit groups are found by Torch-Pruning's ``DependencyGraph``: channels that must be pruned
together (the two sides of every residual add, a conv and its BatchNorm, the consumers of a
tensor, a depthwise conv and the channels it convolves, a squeeze-excitation scale and the
features it multiplies) form one group. A grouped convolution joins the group of its input
channels and the group of its output channels into one, whose unit is a whole conv group
(group ``k``'s inputs and outputs live or die together), and a GroupNorm makes its group's
unit a whole number of its groups: each layer's side then spans ``channels / units``
consecutive channels per unit (``*_unit_size``), the units of a group being the greatest
common divisor of its widths, conv groups and GroupNorm groups. A linear layer reading a
flattened feature map reads ``H*W`` inputs per channel of its group (``in_unit_size``). A
layer whose output only scales features (the excitation of a squeeze-excitation block) keeps
its bias per task (:class:`TaskChannelBias`) and needs no gate: a dead channel multiplies a
zero feature. A layer whose output channels cannot be silenced exactly by a BatchNorm of its
group (a bias without a BatchNorm right after it, or a group without any norm) gets a
:class:`UnitGate` right after it, so that a pruned channel is exactly zero.

The model's ``forward`` is kept, so it must call its submodules (not shared functional weights)
and be traceable by Torch-Pruning and torch.fx (no data-dependent control flow), which is
checked here, before any training (see ``docs/architectures.md`` for what is refused); so are
its FLOPs and a task's slim copy (:mod:`espn.models.convert_checks`). To use such a model from
``espn run --model NAME``, register a factory in :data:`espn.models.MODELS` (see
:func:`register_converted`) or expose one through the ``espn.models`` entry-point group.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from espn.layers import (
    ConvertError,
    LayerAdapter,
    Placement,
    adapter_for,
    layer_types,
    source_names,
)
from espn.layers.layernorm import channel_layer_norm
from espn.layers.parameters import TaskParameters, channel_axis
from espn.models.convert_checks import check_flops_counted, check_task_cut, module_flops
from espn.models.convert_tokens import (
    TokenConvertError,
    check_stream_sources,
    replace_encoders,
    token_outputs,
)
from espn.models.registry import MODELS, ModelSpec

if TYPE_CHECKING:
    import torch_pruning as tp

__all__ = ["ConvertError", "load_entry_point_models", "register_converted", "to_supernet"]

#: a module the converter turns into its supernet counterpart (one with a layer adapter)
Convertible = nn.Module


def _adapter(m: nn.Module) -> LayerAdapter:
    """The adapter of a module :func:`_check_modules` accepted."""
    adapter = adapter_for(m)
    assert adapter is not None
    return adapter


def _is_norm(m: nn.Module) -> bool:
    return _adapter(m).role == "norm"


@dataclass
class _Group:
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
    #: grouped convs (not depthwise) reading a part: their outputs' part joins it
    grouped_inputs: list[str] = field(default_factory=list)
    #: channels one unit spans on each side of a layer (inputs of a linear layer reading a
    #: flattened map: channels x H*W), by layer name
    out_unit: dict[str, int] = field(default_factory=dict)
    in_unit: dict[str, int] = field(default_factory=dict)
    norm_unit: dict[str, int] = field(default_factory=dict)
    name: str = ""


def _check_modules(model: nn.Module) -> tuple[dict[str, Convertible], dict[str, nn.Parameter]]:
    """Named modules of a layer type espn has an adapter for, and the parameters held by
    any other module (by qualified name; refused unless they join a token stream, see
    :func:`_stream_parameters`)."""
    found: dict[str, Convertible] = {}
    bare: dict[str, nn.Parameter] = {}
    seen: dict[int, str] = {}
    attention: list[str] = []
    for name, m in model.named_modules(remove_duplicate=False):
        if any(name.startswith(f"{a}.") for a in attention):
            continue  # the projections of a MultiheadAttention: converted with it
        adapter = adapter_for(m)
        if adapter is not None and adapter.role == "attention":
            attention.append(name)
        if adapter is not None:
            adapter.check(name, m)
            if id(m) in seen:
                raise ConvertError(
                    f"module {seen[id(m)]!r} is used again as {name!r}; shared layers are "
                    "not supported (each task mask needs one module per layer)"
                )
            seen[id(m)] = name
            found[name] = m
        elif type(m).__module__.startswith("torch.") and any(True for _ in m.parameters(False)):
            raise _refuse_parameter(model, name)  # a torch layer type without an adapter
        else:  # a module of the user's own: its parameters may join a token stream
            for leaf, p in m.named_parameters(recurse=False):
                bare[f"{name}.{leaf}" if name else leaf] = p
    owner: dict[int, str] = {}
    for name, m in found.items():
        for p in m.parameters():
            if id(p) in owner:
                raise ConvertError(
                    f"module {name!r} shares a parameter with {owner[id(p)]!r} (tied weights); "
                    "espn masks, freezes and prunes each layer's weights on their own, so tied "
                    "layers would be untied; give each layer its own parameters"
                )
            owner[id(p)] = name
    return found, bare


def _refuse_parameter(model: nn.Module, owner: str) -> ConvertError:
    """The refusal of module ``owner``, whose parameters espn cannot express."""
    kind = type(model.get_submodule(owner)).__name__
    return ConvertError(
        f"module {owner!r} is a {kind} with parameters; the converter supports "
        f"{source_names()} and nn.TransformerEncoder(Layer) (plus parameter-free modules, and "
        "bare per-feature parameters: a class token, position embeddings, a layer scale), and "
        "timm's VisionTransformer"
    )


def _check_calls(model: nn.Module, example_input: Tensor, modules: dict[str, nn.Module]) -> None:
    """Refuse a layer that ``forward`` calls more than once on the example input: its masks,
    unit groups and FLOPs are per layer, and a second call would need its own."""
    calls = dict.fromkeys(modules, 0)

    def count(name: str) -> Callable[..., None]:
        def hook(*_: object) -> None:
            calls[name] += 1

        return hook

    hooks = [m.register_forward_pre_hook(count(n)) for n, m in modules.items()]
    try:
        with torch.no_grad():
            model(example_input)
    finally:
        for h in hooks:
            h.remove()
    again = [f"{n!r} ({k} times)" for n, k in calls.items() if k > 1]
    if again:
        raise ConvertError(
            f"module {again[0]} is called more than once by forward(); a layer called again "
            "is a shared layer, not supported (each call would need its own task masks and "
            "FLOPs): use one module per call"
        )


def _torch_class(m: nn.Module) -> type[nn.Module]:
    """The torch layer class ``m`` is or subclasses (the one its adapter stands for)."""
    return next(t for t in type(m).__mro__ if t.__module__.startswith("torch.nn"))


def _same(a: object, b: object) -> bool:
    """Whether two module outputs (tensors, or tuples of them) are equal bit for bit."""
    pairs = zip(*(x if isinstance(x, tuple) else (x,) for x in (a, b)), strict=False)
    return all(x is y or (isinstance(x, Tensor) and torch.equal(x, y)) for x, y in pairs)


def _plain_layers(model: nn.Module, example: Tensor) -> None:
    """Make every layer whose class replaces its torch class's ``forward`` compute as its
    torch class, or refuse it: espn converts a layer as its torch class. A layer computing
    the same on the example input is kept; one that is its torch class followed by its own
    children (timm's ``BatchNormAct2d``: a BatchNorm, then its ``drop`` and ``act``) becomes
    an ``nn.Sequential`` of the torch layer and those children, in place, and so does a
    LayerNorm over the channels of an NCHW map (``LayerNorm2d``, see
    :func:`~espn.layers.layernorm.channel_layer_norm`); any other (timm's ``Conv2dSame``
    padding by the input's size) is refused."""
    subclassed = {
        n: m
        for n, m in model.named_modules()
        if adapter_for(m) is not None and type(m).forward is not _torch_class(m).forward
    }
    split: dict[str, nn.Sequential] = {}
    differs: list[str] = []

    def plain(m: nn.Module) -> nn.Module:
        layer = copy.copy(m)
        layer.__class__ = _torch_class(m)
        layer._modules = {}
        return layer

    def runs_as(layer: Callable[..., object], inp: tuple[object, ...], out: object) -> bool:
        try:
            return _same(layer(*inp), out)
        except Exception:  # it cannot even run on this input
            return False

    def compare(name: str) -> Callable[..., None]:
        def hook(m: nn.Module, inp: tuple[object, ...], out: object) -> None:
            if runs_as(partial(_torch_class(m).forward, m), inp, out):
                return
            seq = nn.Sequential(plain(m), *m.children())
            if isinstance(m, nn.LayerNorm) and len(seq) == 1:
                seq = channel_layer_norm(plain(m))
            if len(seq) > 1 and runs_as(seq, inp, out):
                split[name] = seq
            else:
                differs.append(name)

        return hook

    hooks = [m.register_forward_hook(compare(n)) for n, m in subclassed.items()]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for h in hooks:
            h.remove()
    if differs:
        m = subclassed[differs[0]]
        torch_name = f"nn.{_torch_class(m).__name__}"
        raise ConvertError(
            f"module {differs[0]!r} is a {type(m).__name__}, a {torch_name} whose forward() "
            f"computes something else than {torch_name}'s (such as a padding of its own); espn "
            f"converts it as {torch_name}, so it is not supported"
        )
    for name, seq in split.items():
        _set(model, name, seq)


def _depthwise(m: nn.Module) -> bool:
    """A conv that convolves each channel on its own: its input and output channels are one."""
    return _adapter(m).depthwise(m)


def _grouped(m: nn.Module) -> bool:
    """A layer whose channels come in groups (a grouped conv, depthwise too)."""
    adapter = _adapter(m)
    return adapter.role == "layer" and adapter.groups(m) != 1


def _elementwise_op() -> type:
    """torch_pruning's element-wise op node type, imported when a model is converted."""
    import torch_pruning as tp

    return tp.ops._ElementWiseOp


def _multiplies(graph: tp.DependencyGraph, m: nn.Module | nn.Parameter) -> bool:
    """Whether ``m``'s output reaches a product through element-wise ops alone: it scales
    features (the excitation of a squeeze-excitation block; a bare parameter: a layer scale)
    rather than being features. A product of a layer's output with a bare parameter scales
    the layer's own features instead."""
    frontier = list(graph.module2node[m].outputs)
    seen: set[int] = set()
    while frontier:
        node = frontier.pop()
        if id(node) in seen or not isinstance(node.module, _elementwise_op()):
            continue
        seen.add(id(node))
        if node.grad_fn is not None and node.grad_fn.name().startswith("Mul"):
            by_parameter = any(isinstance(i.module, nn.Parameter) for i in node.inputs)
            return isinstance(m, nn.Parameter) or not by_parameter
        frontier.extend(node.outputs)
    return False


def _flattened(m: Convertible, out_side: bool, taken: int, size: int) -> int:
    """Inputs per channel when linear layer ``m`` reads a flattened map of ``size`` channels
    (``taken`` of its inputs follow them, all of them), else 0."""
    if out_side or not _adapter(m).reads_flattened or taken != _adapter(m).width(m, False):
        return 0
    return taken // size if taken > size and taken % size == 0 else 0


def _groups(
    model: nn.Module,
    example_input: Tensor,
    modules: dict[str, Convertible],
    bare: dict[str, nn.Parameter] | None = None,
) -> tuple[list[_Group], dict[str, nn.Module | None], str, dict[str, int], set[str]]:
    """Coupled channel groups, each layer's sole direct consumer, the output layer, the
    inputs per channel of linear layers reading a flattened feature map, and the layers whose
    output scales features (see :func:`_multiplies`)."""
    names = {m: n for n, m in modules.items()}
    param_names = {id(p): n for n, p in (bare or {}).items()}
    graph = _dependency_graph(model, example_input)
    successor: dict[str, nn.Module | None] = {}
    outputs = []
    for name, m in modules.items():
        node = graph.module2node.get(m)
        if node is None:
            raise ConvertError(f"module {name!r} is not used by forward() on the example input")
        successor[name] = node.outputs[0].module if len(node.outputs) == 1 else None
        if not node.outputs and not _is_norm(m):
            outputs.append(name)
    if len(outputs) != 1 or not _adapter(modules[outputs[0]]).can_be_head:
        raise ConvertError(
            "the model must end in exactly one nn.Linear layer (the classifier) whose output is "
            f"the model's output; found output layers: {outputs or 'none'}"
        )
    parts = []
    repeats: dict[str, int] = {}
    scales: set[str] = set()
    flattened: list[tuple[nn.Module, str, nn.Module, int]] = []
    for group in graph.get_all_groups(root_module_types=layer_types()):
        items = list(group)
        root_name = names[items[0][0].target.module]
        g = _Group(size=len(items[0][1]))
        for dep, idxs in items:
            m = dep.target.module
            if isinstance(m, nn.Parameter) and id(m) in param_names:
                name = param_names[id(m)]
                if len(idxs) == g.size == m.shape[channel_axis(m)]:
                    held = g.scale_params if _multiplies(graph, m) else g.params
                    if name not in held:
                        held.append(name)
                continue
            if m not in names:
                continue
            name = names[m]
            out_side = graph.is_out_channel_pruning_fn(dep.handler)
            adapter = _adapter(m)
            width = adapter.width(m, out_side)
            repeat = _flattened(m, out_side, len(idxs), g.size)
            if repeat:
                repeats[name] = repeat
            elif len(idxs) != g.size or width != g.size:
                raise ConvertError(
                    f"layer {name!r} uses {len(idxs)} of its {width} "
                    f"{'output' if out_side else 'input'} channels from the channels of "
                    f"{root_name!r} ({g.size}): concatenation and splitting of feature maps "
                    "are not supported"
                )
            if adapter.role == "norm":
                g.norms.append(name)
            elif adapter.role == "attention":
                g.attentions.append(name)
            elif out_side or adapter.depthwise(m):  # a depthwise conv's inputs are its outputs
                if name not in g.producers:
                    g.producers.append(name)
                if adapter.may_scale and _multiplies(graph, m):
                    scales.add(name)
            elif _grouped(m):
                g.grouped_inputs.append(name)
            else:
                g.consumers.append(name)
        features = [n for n in g.producers if n not in scales] or g.producers
        producer = modules[features[0]]
        for name in g.consumers:
            if name in repeats:
                flattened.append((producer, name, modules[name], g.size))
        parts.append(g)
    for name, layer in modules.items():
        if _grouped(layer):
            _check_grouped_input(model, example_input, name, _depthwise(layer), parts)
    groups = [_join(members, modules, repeats) for members in _joined_parts(parts)]
    unit = {n: size // repeats[n] for g in groups for n, size in g.in_unit.items() if n in repeats}
    for source, reader, layer, size in flattened:
        _check_flatten_order(model, example_input, source, reader, layer, size, unit[reader])
    return groups, successor, outputs[0], repeats, scales


def _dependency_graph(model: nn.Module, example: Tensor) -> tp.DependencyGraph:
    """Torch-Pruning's dependency graph of ``model``; a failure to build it is refused in
    one line naming the layer whose output it could not follow."""
    import torch_pruning as tp  # heavy (it imports timm and wandb): only when converting

    try:
        return tp.DependencyGraph().build_dependency(model, example_inputs=example, verbose=False)
    except Exception as exc:  # Torch-Pruning fails on reshapes it cannot map
        raise ConvertError(
            f"the channels {_failed_after(model, exc)} cannot be followed through forward() "
            f"({type(exc).__name__} in Torch-Pruning's dependency graph): a reshape that "
            "regroups channels, such as ShuffleNet's channel shuffle, is not supported"
        ) from None


def _failed_after(model: nn.Module, exc: Exception) -> str:
    """``of 'NAME'``: the layer nearest before the graph node Torch-Pruning failed on (read
    from its traceback), or ``of <model class>``."""
    node, tb = None, exc.__traceback__
    while tb is not None:
        node = tb.tb_frame.f_locals.get("node", node)
        tb = tb.tb_next
    names = {id(m): n for n, m in model.named_modules() if n}
    seen: set[int] = set()
    frontier = [node] if node is not None else []
    while frontier:
        n = frontier.pop(0)
        if id(n) in seen:
            continue
        seen.add(id(n))
        if id(getattr(n, "module", None)) in names:
            return f"after {names[id(n.module)]!r}"
        frontier.extend(getattr(n, "inputs", []))
    return f"of {type(model).__name__}"


def _check_grouped_input(
    model: nn.Module, example: Tensor, name: str, depthwise: bool, parts: list[_Group]
) -> None:
    """Refuse grouped conv ``name`` unless its input channels come from layers alone: with
    the outputs of the other layers and norms writing them set to zero, its input must be
    zero (a pruned group's inputs are removed from those layers; the model input or a bare
    parameter cannot lose channels)."""
    part = next(
        (p for p in parts if name in (p.producers if depthwise else p.grouped_inputs)), None
    )
    writers = [] if part is None else [n for n in part.producers + part.norms if n != name]
    try:
        if not writers:
            raise TokenConvertError(name)
        check_stream_sources(model, example, name, writers, [name])
    except TokenConvertError:
        raise ConvertError(
            f"grouped conv {name!r} reads channels that come partly from the model input or a "
            "bare parameter, so its groups could not be removed; supported: grouped and "
            "depthwise convs whose inputs come from conv layers"
        ) from None


def _joined_parts(parts: list[_Group]) -> list[list[_Group]]:
    """The parts joined into one unit group by grouped convs (each reads one part and writes
    another), in the order of their first part."""
    writer = {name: i for i, part in enumerate(parts) for name in part.producers}
    root = list(range(len(parts)))

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    for i, part in enumerate(parts):
        for name in part.grouped_inputs:
            a, b = sorted((find(i), find(writer[name])))
            root[b] = a
    joined: dict[int, list[_Group]] = {}
    for i, part in enumerate(parts):
        joined.setdefault(find(i), []).append(part)
    return list(joined.values())


def _join(
    members: list[_Group], modules: dict[str, Convertible], repeats: dict[str, int]
) -> _Group:
    """One unit group of ``members`` (parts): its units are the greatest common divisor of the
    parts' widths, the group counts of the grouped convs writing them and of the GroupNorms
    normalising them, so that a unit is whole conv groups and whole GroupNorm groups on every
    side; a group forced down to a single unit is refused (it could never be pruned)."""
    counts: list[tuple[str, int]] = []
    for part in members:
        for name in part.producers + part.norms:
            m = modules[name]
            count = _adapter(m).group_count(name, m)
            if count is not None:
                counts.append(count)
    units = math.gcd(*(part.size for part in members), *(n for _, n in counts))
    if units == 1 and counts and max(part.size for part in members) > 1:
        order = list(modules)
        first = min((n for p in members for n in p.producers + p.norms), key=order.index)
        raise ConvertError(
            f"the channels of {first!r} cannot be pruned in whole groups: "
            f"{' and '.join(text for text, _ in counts)} leave no common group count above 1; "
            "supported: grouped convs and GroupNorms whose group counts share a divisor above "
            "1 (GroupNorm(1, C) normalises all channels together)"
        )
    group = _Group(size=units)
    for part in members:
        width = part.size // units
        if width > 1:
            token = [n for n in part.norms + part.attentions if _adapter(modules[n]).tokens]
            token += part.params + part.scale_params
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
        group.attentions += part.attentions
        group.params += part.params
        group.scale_params += part.scale_params
    return group


@torch.no_grad()
def _check_flatten_order(
    model: nn.Module,
    example: Tensor,
    producer: nn.Module,
    name: str,
    linear: nn.Module,
    size: int,
    width: int = 1,
) -> None:
    """Check that linear layer ``name`` reads its flattened map channel-major (channel ``c``
    owns inputs ``c*H*W ... (c+1)*H*W - 1``, as ``x.flatten(1)`` of ``(N, C, H, W)``): raise
    a channel of ``producer`` in one sample each and see which inputs move, all within the
    inputs of its unit of ``width`` channels (a GroupNorm in between moves the channels of
    the raised one's group). (The dependency graph maps any flatten so; a channels-last one
    would mask the wrong inputs.)"""
    weight = linear.weight
    assert isinstance(weight, Tensor)
    repeat = int(weight.shape[1]) // size
    probe = sorted({0, 1, size - 1})
    x = example[:1].expand(len(probe) + 1, *example.shape[1:]).clone()
    seen: dict[str, Tensor] = {}

    def raise_channels(m: nn.Module, inp: tuple[Tensor, ...], out: Tensor) -> Tensor:
        out = out.clone()
        for i, c in enumerate(probe):
            out[i + 1, c] += 1e3
        return out

    def capture(m: nn.Module, inp: tuple[Tensor, ...]) -> None:
        seen["x"] = inp[0]

    hooks = [
        producer.register_forward_hook(raise_channels),
        linear.register_forward_pre_hook(capture),
    ]
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
    for i, c in enumerate(probe):
        moved = (seen["x"][i + 1] != seen["x"][0]).nonzero().flatten()
        first = c // width * width * repeat
        if bool(((moved < first) | (moved >= first + width * repeat)).any()):
            raise ConvertError(
                f"linear layer {name!r} reads a flattened feature map whose inputs are not "
                "grouped by channel; supported: x.flatten(1) of an (N, C, H, W) map "
                "(channel-major), not a channels-last flatten"
            )


def _set(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, module)


def to_supernet(
    model: nn.Module,
    example_input: Tensor,
    multi_head: bool = True,
    task_affine: bool = False,
) -> nn.Module:
    """A supernet-ready copy of ``model`` (see the module docstring); ``model`` is untouched.

    ``example_input`` is a small batch of inputs used to trace the network. The output layer
    becomes the task head: a :class:`TaskHead` per task with ``multi_head``, else a shared
    masked linear layer (followed by a per-task :class:`TaskBias` with ``task_affine``, which
    also gives gates a per-task scale and shift). Weights, BatchNorm
    parameters and statistics and the classifier are copied, so that the result computes what
    ``model`` computes (in eval mode) until the first task begins, which resets BatchNorms and
    heads.
    """
    from espn.models.timm_vit import from_timm_vit, is_timm_vit  # it imports the registry

    if is_timm_vit(model):
        measured = module_flops(model, example_input)
        vit = from_timm_vit(model, example_input, multi_head, task_affine)
        check_flops_counted(measured, vit, example_input)
        return vit
    model = copy.deepcopy(model).eval()
    measured = module_flops(model, example_input)
    _plain_layers(model, example_input)
    modules, bare = _check_modules(model)
    _check_calls(model, example_input, modules)
    groups, successor, head, repeats, scales = _groups(model, example_input, modules, bare)
    model = replace_encoders(model)
    order = {name: i for i, name in enumerate(modules)}
    in_group: dict[str, str] = {}
    out_group: dict[str, str] = {}
    norm_group: dict[str, str] = {}
    #: features per unit on each side of every layer (inputs: a flattened map's H*W included)
    in_unit = dict(repeats)
    out_unit: dict[str, int] = {}
    norm_unit: dict[str, int] = {}
    gated: set[str] = set()
    #: bare parameters of a token stream, with their unit group
    adopted: dict[str, str] = {}
    for g in groups:
        if head in g.producers:
            continue  # the classes: never pruned
        if not g.producers:
            raise ConvertError(
                f"the channels of {(g.attentions + g.norms + g.consumers)[0]!r} come from no "
                "layer (the model input?); start the network with a conv or linear layer"
            )
        g.name = min(g.producers, key=order.__getitem__)
        in_unit |= g.in_unit
        out_unit |= g.out_unit
        norm_unit |= g.norm_unit
        for name in g.consumers:
            in_group[name] = g.name
        for name in g.norms:
            norm_group[name] = g.name
        for name in g.attentions:
            in_group[name] = g.name
        stream = any(_adapter(modules[n]).tokens for n in g.norms + g.attentions)
        for name in (g.params if stream else []) + g.scale_params:
            adopted[name] = g.name
        if stream:
            writers = g.producers + g.norms + g.attentions
            readers = g.consumers + g.norms + g.attentions
            params = [bare[n] for n in g.params]
            check_stream_sources(model, example_input, g.name, writers, readers, params)
        for name in g.producers:
            out_group[name] = g.name
            bias = getattr(modules[name], "bias", None) is not None
            if g.norms and name in scales:
                continue  # a feature scale: its dead channels multiply zero features
            # a bias right before a BatchNorm is absorbed by it; any other bias (before a
            # GroupNorm too: it shifts channels of a group differently) becomes the shift of a
            # gate, and a group without norms gets its saliency from gates
            after = successor[name]
            absorbed = after is not None and getattr(adapter_for(after), "absorbs_bias", False)
            if not g.norms or (bias and not absorbed):
                gated.add(name)
    refused = [n for n in bare if n not in adopted]
    if refused:
        raise _refuse_parameter(model, refused[0].rpartition(".")[0])
    linears = sorted(n for n in gated if _adapter(modules[n]).token_outputs)
    tokens = token_outputs(model, example_input, linears)
    for name, m in modules.items():
        place = Placement(
            name,
            in_group=in_group.get(name),
            out_group=out_group.get(name),
            in_unit=in_unit.get(name, 1),
            out_unit=out_unit.get(name, 1),
            norm_group=norm_group.get(name),
            norm_unit=norm_unit.get(name, 1),
            head=name == head,  # _groups checked it is a layer that can be one
            multi_head=multi_head,
            task_affine=task_affine,
            gated=name in gated,
            scales=name in scales,
            tokens=name in tokens,
        )
        _set(model, name, _adapter(m).convert(m, place))
    if adopted:
        adopted = {n: adopted[n] for n in bare if n in adopted}  # the model's order
        _hold_parameters(model, bare, adopted)
    check_flops_counted(measured, model, example_input)
    check_task_cut(model, example_input)
    return model


def _hold_parameters(
    model: nn.Module, bare: dict[str, nn.Parameter], adopted: dict[str, str]
) -> None:
    """Make the adopted bare parameters per-task state: one :class:`TaskParameters` on the
    model registers them (the model keeps reading them where they are)."""
    if isinstance(model, nn.Sequential | nn.ModuleList | nn.ModuleDict):
        raise ConvertError(
            f"parameter {next(iter(adopted))!r} is held in a {type(model).__name__}, whose "
            "forward would call a module added to it; hold it on a module of your own"
        )
    name = "espn_task_parameters"
    while hasattr(model, name):
        name = f"_{name}"
    params = {n: bare[n] for n in adopted}
    model.add_module(name, TaskParameters(params, list(adopted.values())))


def register_converted(
    name: str, build: Callable[[ModelSpec], nn.Module], example_batch: int = 2
) -> None:
    """Register ``build(spec) -> plain nn.Module`` as model ``name``, converted on the fly.

    Example: ``register_converted("vgg11-bn", lambda s: torchvision.models.vgg11_bn(
    num_classes=s.n_classes))`` makes ``make_config(model="vgg11-bn", ...)`` work.
    """

    def factory(spec: ModelSpec) -> nn.Module:
        plain = build(spec)
        example = torch.zeros(example_batch, *spec.input_shape)
        return to_supernet(plain, example, spec.multi_head, spec.task_affine)

    factory.__doc__ = f"{name}: converted from a plain torch model by espn.models.convert"
    MODELS.register(name)(factory)


def load_entry_point_models() -> list[str]:
    """Register the models other packages expose in the ``espn.models`` entry-point group.

    Each entry point ``NAME = "pkg.module:factory"`` names a factory ``factory(spec)`` that
    returns a supernet-ready module (for instance through :func:`to_supernet`); it is imported
    only when the model is built. Returns the names registered.
    """
    from importlib.metadata import entry_points

    added = []
    for ep in entry_points(group="espn.models"):
        if ep.name in MODELS:
            continue

        def factory(spec: ModelSpec, ep: object = ep) -> nn.Module:
            return ep.load()(spec)  # type: ignore[attr-defined]

        factory.__doc__ = f"{ep.name}: from the entry point {ep.value}"
        MODELS.register(ep.name)(factory)
        added.append(ep.name)
    return added
