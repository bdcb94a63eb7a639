"""Torch-Pruning's dependency graph of a model the converter reads: built (a channel split's
or shuffle's views identity-mapped), its channel groups searched within a bound, walked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from unittest.mock import patch

from torch import Tensor, nn

from espn.layers import ConvertError, layer_types

if TYPE_CHECKING:
    import torch_pruning as tp


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
        raise _unfollowed(
            model,
            exc,
            f" ({type(exc).__name__} in Torch-Pruning's dependency graph): a reshape that "
            "regroups channels otherwise than a split or shuffle is not supported",
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
        why = f": {exc} (features reshaped into heads outside an attention espn converts, as MaxViT's)"
        raise _unfollowed(model, exc, why) from None


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


def _unfollowed(model: nn.Module, exc: Exception, why: str) -> ConvertError:
    """The refusal of channels Torch-Pruning could not follow (``exc``, ``why``), naming the
    layer nearest before the graph node it failed on (read from its traceback), else the model."""
    node, tb = None, exc.__traceback__
    while tb is not None:
        node = tb.tb_frame.f_locals.get("node", node)
        tb = tb.tb_next
    names = {id(m): n for n, m in model.named_modules() if n}
    seen: set[int] = set()
    frontier, where = [node] if node is not None else [], f"of {type(model).__name__}"
    while frontier:
        n = frontier.pop(0)
        if id(n) in seen:
            continue
        seen.add(id(n))
        if id(getattr(n, "module", None)) in names:
            where = f"after {names[id(n.module)]!r}"
            break
        frontier.extend(getattr(n, "inputs", []))
    return ConvertError(f"the channels {where} cannot be followed through forward(){why}")
