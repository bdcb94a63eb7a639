"""Widths written into ``forward``, refitted to a slim copy.

Research code often reshapes with a width it keeps beside its layers: torchvision's
``VisionTransformer`` does ``x.reshape(n, self.hidden_dim, n_h * n_w)`` after its patch
convolution. Traced, that width is a number in the graph, right for the full-width model and
wrong once a task's dead channels are removed. :func:`reshape_inputs` records the input shape
of every ``view``/``reshape`` of the full-width graph; :func:`fit_reshapes` runs the slim graph
once and, where a reshape's input lost features, replaces each number in its target shape that
equals a shrunk dimension's full width by that dimension's slim width. A number that could mean
two dimensions of different slim widths is left as it is (the slim copy is then refused by the
checks that run it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, fx

_RESHAPES = {"view", "reshape"}


def _is_reshape(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in _RESHAPES
    return node.op == "call_function" and node.target in (torch.reshape, Tensor.view)


class _Run(fx.Interpreter):
    """Runs a graph, calling ``visit(node, input)`` before each reshape."""

    def __init__(self, gm: fx.GraphModule, visit: Any) -> None:
        super().__init__(gm)
        self.visit = visit

    def run_node(self, n: fx.Node) -> Any:
        if _is_reshape(n):
            x = self.env.get(n.args[0]) if isinstance(n.args[0], fx.Node) else None
            if isinstance(x, Tensor):
                self.visit(n, x)
        return super().run_node(n)


@torch.no_grad()
def reshape_inputs(gm: fx.GraphModule, example: Tensor) -> dict[str, tuple[int, ...]]:
    """The input shape of every reshape of ``gm`` on ``example``, by node name."""
    shapes: dict[str, tuple[int, ...]] = {}

    def visit(n: fx.Node, x: Tensor) -> None:
        shapes[n.name] = tuple(x.shape)

    _Run(gm, visit).run(example)
    return shapes


def _fitted(value: Any, widths: dict[int, int]) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return widths.get(value, value)
    if isinstance(value, tuple | list):
        return type(value)(_fitted(v, widths) for v in value)
    return value


@torch.no_grad()
def fit_reshapes(gm: fx.GraphModule, example: Tensor, full: dict[str, tuple[int, ...]]) -> None:
    """Refit the widths written into ``gm``'s reshapes to its slim inputs (see the module
    docstring); ``full``: :func:`reshape_inputs` of the full-width graph."""
    changed = False

    def visit(n: fx.Node, x: Tensor) -> None:
        nonlocal changed
        before = full.get(n.name)
        if before is None or len(before) != x.dim() or before == tuple(x.shape):
            return
        widths: dict[int, int] = {}
        for old, new in zip(before, x.shape, strict=True):
            if widths.setdefault(old, int(new)) != new:
                widths[old] = -2  # two dimensions of that width, now different: ambiguous
        widths = {old: new for old, new in widths.items() if new not in (old, -2)}
        if widths:
            n.args = (n.args[0], *_fitted(n.args[1:], widths))
            changed = True

    _Run(gm, visit).run(example)
    if changed:
        gm.recompile()
