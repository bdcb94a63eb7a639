"""Torch-Pruning's dependency graph of a model the converter reads (a split's or shuffle's
views identity-mapped, its group search bounded, walked), and checks that run the model with
one channel raised to find what the graph maps as if channels stayed on their axis (a Linear
across tokens, a transpose; a flatten that is not channel-major; :func:`_probe`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from unittest.mock import patch

import torch
from torch import Tensor, nn

from espn.layers import ConvertError, LayerAdapter, adapter_for, layer_types
from espn.layers.base import call_hooked

if TYPE_CHECKING:
    import torch_pruning as tp


def adapter(m: nn.Module) -> LayerAdapter:
    """The adapter of a module the converter accepted."""
    adapter = adapter_for(m)
    assert adapter is not None
    return adapter


def _feature_axis(m: nn.Module) -> int:
    """The axis of ``m``'s features: last for a layer on token tensors, else channels."""
    return -1 if adapter(m).token_outputs else 1


@torch.no_grad()
def _probe(
    model: nn.Module,
    example: Tensor,
    source: nn.Module,
    readers: dict[str, nn.Module],
    modules: dict[str, nn.Module],
    features: list[int],
) -> dict[str, Tensor]:
    """Where each reader's input changes when feature ``features[i]`` of ``source``'s output
    is raised in sample ``i + 1`` (sample 0 unchanged): one boolean map per raised sample.
    Only functions carry the change: every norm passes its input through (it mixes the
    features it normalises) and every other layer computes what it computes on sample 0."""
    x = example[:1].expand(len(features) + 1, *example.shape[1:]).clone()
    seen: dict[str, Tensor] = {}

    def raise_features(m: nn.Module, inp: tuple[Tensor, ...], out: Tensor) -> Tensor:
        out = out.clone()
        for i, f in enumerate(features):
            out.select(_feature_axis(source), f)[i + 1] += 1e3
        return out

    def hold(m: nn.Module, inp: tuple[Tensor, ...], out: Tensor) -> Tensor:
        return (out[:1].expand_as(out) if adapter(m).role == "layer" else inp[0]).clone()

    def capture(name: str) -> Callable[..., None]:
        def hook(m: nn.Module, inp: tuple[Tensor, ...]) -> None:
            seen[name] = inp[0].clone()  # before in-place ops change it

        return hook

    others = [m for m in modules.values() if m is not source and adapter(m).role != "attention"]
    hooks = [m.register_forward_hook(hold) for m in others]
    hooks.append(source.register_forward_hook(raise_features))
    hooks += [m.register_forward_pre_hook(capture(n)) for n, m in readers.items()]
    call_hooked(model, hooks, x)
    return {name: inp[1:] != inp[:1] for name, inp in seen.items()}


def across_tokens(
    model: nn.Module,
    example: Tensor,
    first: str,
    readers: list[str],
    modules: dict[str, nn.Module],
) -> list[str]:
    """The ``readers`` of a part of coupled channels that read the channels of ``first`` (the
    part's first producer) on another axis than their features: raised (see :func:`_probe`),
    its feature 1 changes their input at index 1 of another axis, not at feature 1 alone
    (Torch-Pruning maps a transpose as if it kept the channel axis). Linear layers applied
    across the token axis (an MLP-Mixer's token mixing); any other such reader is refused."""
    if not any(adapter(modules[n]).token_outputs for n in readers):
        return []
    reading = {n: modules[n] for n in readers}
    found = []
    for name, changes in _probe(model, example, modules[first], reading, modules, [1]).items():
        changed = changes[0]
        feature = _feature_axis(reading[name]) % changes.dim() - 1  # in a sample
        at = []  # per axis of a sample: the indices where the input changed
        for d in range(changed.dim()):
            rows = changed.movedim(d, 0).reshape(changed.shape[d], -1).any(1)
            at.append(set(rows.nonzero().flatten().tolist()))
        if at[feature] == {1} or all(at[d] != {1} for d in range(changed.dim()) if d != feature):
            continue
        if not adapter(reading[name]).token_outputs:
            raise ConvertError(
                f"layer {name!r} reads the channels of {first!r} on another axis than its "
                "features; supported across the token axis: nn.Linear (an MLP-Mixer's token "
                "mixing)"
            )
        found.append(name)
    return found


def check_flatten_order(
    model: nn.Module,
    example: Tensor,
    producer: nn.Module,
    name: str,
    size: int,
    modules: dict[str, nn.Module],
) -> None:
    """Check that linear layer ``name`` reads its flattened map of ``size`` channels
    channel-major (channel ``c`` owns inputs ``c*H*W ... (c+1)*H*W - 1``, as ``x.flatten(1)``
    of ``(N, C, H, W)``): a raised channel of ``producer`` (see :func:`_probe`) must change
    those inputs alone. (The dependency graph maps any flatten so; a channels-last one would
    mask the wrong inputs.)"""
    linear = modules[name]
    repeat = adapter(linear).width(linear, False) // size
    channels = sorted({0, 1, size - 1})
    changes = _probe(model, example, producer, {name: linear}, modules, channels)[name]
    for c, changed in zip(channels, changes, strict=True):
        moved = changed.flatten().nonzero().flatten()
        if bool(((moved < c * repeat) | (moved >= (c + 1) * repeat)).any()):
            raise ConvertError(
                f"linear layer {name!r} reads a flattened feature map whose inputs are not "
                "grouped by channel; supported: x.flatten(1) of an (N, C, H, W) map "
                "(channel-major), not a channels-last flatten"
            )


def token_sides(
    model: nn.Module,
    example: Tensor,
    graph: tp.DependencyGraph,
    items: list[tuple[tp.Dependency, list[int]]],
    names: dict[nn.Module, str],
    modules: dict[str, nn.Module],
) -> set[tuple[str, bool]]:
    """The sides (layer name, whether its output side) of a group of Torch-Pruning's graph
    that a linear layer applies across the token axis (:func:`across_tokens`);
    none in a group with attention, which mixes channels (convert_tokens checks its streams)."""
    sides = [
        (names[dep.target.module], graph.is_out_channel_pruning_fn(dep.handler))
        for dep, _ in items
        if dep.target.module in names
    ]
    roles = {adapter(modules[n]).role for n, _ in sides}
    layers = [(n, out) for n, out in sides if adapter(modules[n]).role == "layer"]
    producers = [n for n, out in layers if out]
    if len(items[0][1]) < 2 or not producers or "attention" in roles:
        return set()
    readers = [n for n, out in layers if not out]
    first = min(producers, key=list(modules).index)
    inputs = across_tokens(model, example, first, readers, modules)
    # a token MLP's last layer writes tokens: it is one that reads tokens, or reads the
    # hidden features of one (not this part's channels)
    read = {n for t in inputs for n in _readers(graph, modules[t], names)} - set(readers)
    outputs = [n for n in producers if n in read or n in inputs]
    return {(n, False) for n in inputs} | {(n, True) for n in outputs}


def _readers(graph: tp.DependencyGraph, m: nn.Module, names: dict[nn.Module, str]) -> set[str]:
    """The layers reading ``m``'s outputs (in Torch-Pruning's group of its first output)."""
    group = graph.get_pruning_group(m, graph.get_pruner_of_module(m).prune_out_channels, [0])
    sides = [(d.target.module, graph.is_out_channel_pruning_fn(d.handler)) for d, _ in group]
    return {names[r] for r, out in sides if r in names and not out}


def channel_rooted(
    graph: tp.DependencyGraph,
    items: list[tuple[tp.Dependency, list[int]]],
    names: dict[nn.Module, str],
    tokens: set[tuple[str, bool]],
) -> list[tuple[tp.Dependency, list[int]]]:
    """A group of Torch-Pruning's graph rooted at a linear layer's tokens (its indices count
    tokens, not channels) found again from its first producer of channels."""
    for dep, _ in items:
        m = dep.target.module
        name = names.get(m)
        if name and graph.is_out_channel_pruning_fn(dep.handler) and (name, True) not in tokens:
            width = graph.get_out_channels(m)
            return list(graph.get_pruning_group(m, dep.handler, list(range(width))))
    return items


def regroups(node: tp.Node) -> bool:
    """Whether Torch-Pruning's op node ``node`` splits the channels of an NCHW map (chunk,
    split or slicing on dimension 1) or views them as groups or back (a channel shuffle's
    ``view(B, g, C // g, H, W)``), which its index mappings do not follow."""
    import torch_pruning as tp

    fn, op = node.grad_fn, node.module
    sizes = tuple(getattr(fn, "_saved_self_sym_sizes", ()))
    if isinstance(op, tp.ops._SplitOp | tp.ops._SliceOp):
        return len(sizes) == 4 and fn._saved_dim % 4 == 1
    if not isinstance(op, tp.ops._ReshapeOp) or not sizes:
        return False
    flat, grouped = sorted((sizes, tuple(fn._input_metadata[0].shape)), key=len)
    return (
        (len(flat), len(grouped)) == (4, 5)
        and flat[1] == grouped[1] * grouped[2]
        and flat[2:] == grouped[3:]
    )


def dependency_graph(model: nn.Module, example: Tensor) -> tp.DependencyGraph:
    """Torch-Pruning's dependency graph of ``model``; a failure to build it is refused in
    one line naming the layer whose output it could not follow."""
    import torch_pruning as tp  # heavy (it imports timm and wandb): only when converting
    from torch_pruning.dependency import index_mapping

    graph = tp.DependencyGraph()
    try:
        try:
            return graph.build_dependency(model, example_inputs=example, verbose=False)
        except ZeroDivisionError:  # the widths of a channel shuffle's views, traced by now
            for node in graph.module2node.values():
                if regroups(node):  # kept whole (see espn.models.coupling): identity-mapped
                    node.type = tp.ops.OPTYPE.ELEMENTWISE
            index_mapping.update_index_mapping(graph)
            return graph
    except Exception as exc:  # Torch-Pruning fails on reshapes it cannot map
        raise ConvertError(
            f"the channels {failed_after(model, exc)} cannot be followed through forward() "
            f"({type(exc).__name__} in Torch-Pruning's dependency graph): a reshape that "
            "regroups channels otherwise than a split or shuffle is not supported"
        ) from None


#: indices Torch-Pruning may map through reshapes while it groups one model's channels (a VGG's
#: classifier: 25,600); on MaxViT's attention its search never ends (its ``list(set(...))``
#: gives a node's indices met again in another order, which it takes for new ones)
MAPPED_LIMIT = 2_000_000


def all_groups(model: nn.Module, graph: tp.DependencyGraph) -> list[list[Any]]:
    """Torch-Pruning's groups of the channels of the layers of ``graph``, its flatten mapping
    counting the indices it returns, refused past :data:`MAPPED_LIMIT`."""
    from torch_pruning.dependency.index_mapping import _FlattenIndexMapping

    call, mapped = _FlattenIndexMapping.__call__, [0]

    def counted(self: Any, idxs: list[Any]) -> list[Any]:
        out = call(self, idxs)
        mapped[0] += len(out)
        if mapped[0] > MAPPED_LIMIT:
            raise ConvertError(f"Torch-Pruning mapped over {MAPPED_LIMIT:,} indices in reshapes")
        return out

    try:
        with patch.object(_FlattenIndexMapping, "__call__", counted):
            return [list(g) for g in graph.get_all_groups(root_module_types=layer_types())]
    except ConvertError as exc:  # see MAPPED_LIMIT
        raise ConvertError(
            f"the channels {failed_after(model, exc)} cannot be followed through forward(): "
            f"{exc} (features reshaped into heads outside an attention espn converts, as MaxViT's)"
        ) from None


def successors(
    graph: tp.DependencyGraph, modules: dict[str, nn.Module]
) -> dict[str, nn.Module | None]:
    """Each layer's sole direct consumer in ``graph`` (None: several or none); a layer that
    ``forward`` never calls is refused."""
    successor: dict[str, nn.Module | None] = {}
    for name, m in modules.items():
        node = graph.module2node.get(m)
        if node is None:
            raise ConvertError(f"module {name!r} is not used by forward() on the example input")
        successor[name] = node.outputs[0].module if len(node.outputs) == 1 else None
    return successor


def downstream(
    graph: tp.DependencyGraph, m: nn.Module | nn.Parameter, through: type = object
) -> Iterator[tp.Node]:
    """The nodes of ``graph`` that ``m``'s output flows into, each once, going on past those
    whose module is a ``through``."""
    frontier = list(graph.module2node[m].outputs)
    seen: set[int] = set()
    while frontier:
        node = frontier.pop()
        if id(node) not in seen:
            seen.add(id(node))
            yield node
            if isinstance(node.module, through):
                frontier.extend(node.outputs)


def failed_after(model: nn.Module, exc: Exception) -> str:
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
