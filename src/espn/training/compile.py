"""The compiled training step (``espn run --compile``, ``compile=True``): the loss part of the
step runs through ``torch.compile`` (on CUDA as CUDA graphs, convolutional inputs
``channels_last``), the guard and the optimizers stay eager. Why, and what recompiles:
docs/performance.md ("The compiled step"); :attr:`StepCompiler.graphs` counts the graphs
(``compiled_graphs`` in a task's record).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

#: the backend ``--compile`` uses (tests may use a cheap one, e.g. ``"aot_eager"``)
DEFAULT_BACKEND = "inductor"
#: the mode of the step on CUDA: forward and backward replayed as CUDA graphs
STATIC_MODE = "reduce-overhead"

log = logging.getLogger(__name__)


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (every backend)."""
    from torch._dynamo.utils import counters  # here: importing dynamo takes seconds

    return int(counters["stats"]["unique_graphs"])


def is_convolutional(model: nn.Module) -> bool:
    """Whether ``model`` has a 2-D convolution (its inputs then go ``channels_last`` on CUDA)."""
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


class StepCompiler:
    """Runs the loss part of the engine's step through ``torch.compile``, one compiled
    function per mode, and counts the graphs compiled for it (:attr:`graphs`)."""

    def __init__(self, backend: str = DEFAULT_BACKEND) -> None:
        self.backend = backend
        #: graphs compiled by this step so far (a first compile counts one per graph)
        self.graphs = 0
        self._compiled: dict[str | None, Callable[..., Any]] = {}
        #: the torch.compile mode of the current task's steps (None: the default)
        self.mode: str | None = None
        self._channels_last = False

    def start_task(self, model: nn.Module, device: torch.device) -> None:
        """Choose the mode and input layout of a task's steps (see the module docstring)."""
        cuda = device.type == "cuda"
        self.mode = STATIC_MODE if cuda and self.backend == "inductor" else None
        self._channels_last = cuda and is_convolutional(model)

    def run(
        self, fn: Callable[..., tuple[Tensor, Tensor]], x: Tensor, *args: Any
    ) -> tuple[Tensor, Tensor]:
        """``fn(x, *args)`` (the step's ``(loss, total)``), compiled; the loss comes back
        as a tensor of its own (a CUDA graph's outputs are overwritten by its next replay)."""
        compiled = self._compiled.get(self.mode)
        if compiled is None:
            compiled = torch.compile(
                _with_layout, backend=self.backend, mode=self.mode, dynamic=False
            )
            self._compiled[self.mode] = compiled
        if self.mode == STATIC_MODE:
            torch.compiler.cudagraph_mark_step_begin()
        before = compiled_graphs()
        loss, total = compiled(fn, self._channels_last, x, *args)
        new = compiled_graphs() - before
        if new:  # a compile, never a step's cost (TORCH_LOGS=recompiles says why)
            self.graphs += new
            log.debug("the step compiled graph %d (input %s)", self.graphs, tuple(x.shape))
        return (loss.detach().clone() if self.mode == STATIC_MODE else loss), total


def _with_layout(
    fn: Callable[..., tuple[Tensor, Tensor]], channels_last: bool, x: Tensor, *args: Any
) -> tuple[Tensor, Tensor]:
    """What is compiled: ``fn`` with a 4-D input in ``channels_last`` format if asked."""
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return fn(x, *args)
