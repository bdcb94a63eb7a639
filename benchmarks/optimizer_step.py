"""Cost of one optimizer step: torch's default implementation against espn's fused kernels.

espn's :func:`~espn.training.optim.build_optimizer` asks torch for its fused SGD and Adam on
the CPU and CUDA (torch has no fused RMSprop: espn's is torch's step with no slow square
root of zeros, :class:`~espn.training.optim.LeanRMSprop`).
On a CPU, torch's default for SGD and Adam loops over the tensors with several passes each;
at CPG's batch of 32 such a step costs about as much as the forward and backward pass it
follows. This script steps both implementations from the same weights and gradients, checks
that they agree to float32 rounding (often to the bit), and prints the
milliseconds per step of each, their ratio, and a forward and backward pass of the network
for scale.

    python benchmarks/optimizer_step.py                      # fc1024 and resnet18-reduced, CPU
    python benchmarks/optimizer_step.py --device cuda
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from frozen_guard import SHAPES, median_ms, parse_timing_args  # beside this script
from torch import Tensor

from espn.models.registry import ModelSpec, build_supernet
from espn.training.optim import OptimConfig, build_optimizer

#: each optimizer with the settings a method of espn gives it
CONFIGS = {
    "sgd": OptimConfig("sgd", lr=1e-2, momentum=0.9),
    "nesterov": OptimConfig("nesterov", lr=1e-2, weight_decay=4e-5, momentum=0.9),  # CPG
    "adam": OptimConfig("adam", lr=1e-3, weight_decay=1e-4),  # SupSup's scores, CPG's masks
    "rmsprop": OptimConfig("rmsprop", lr=1e-3),  # ESPN, PackNet, Individual, RMN
}
#: the largest relative difference allowed after the steps of the check (float32 rounding)
TOLERANCE = 1e-5


def torch_default(cfg: OptimConfig, params: list[Tensor]) -> torch.optim.Optimizer:
    """The same optimizer as :func:`build_optimizer`, with torch's default implementation."""
    optimizer = build_optimizer(cfg, params)
    # torch's own class (espn's LeanRMSprop subclasses torch's RMSprop)
    kind = next(c for c in type(optimizer).__mro__ if c.__module__.startswith("torch.optim"))
    defaults = {k: v for k, v in optimizer.defaults.items() if k not in ("fused", "foreach")}
    return kind(params, **defaults)


def parameters(model: str, device: torch.device, batch: int) -> tuple[list[Tensor], Callable]:
    """``model``'s parameters with gradients from one batch, and a forward and backward pass."""
    shape = SHAPES[model]
    sn = build_supernet(
        model, ModelSpec(shape, 10, multi_head=False), torch.zeros(2, *shape), 0, device
    )
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *shape, generator=gen).to(device)
    y = torch.randint(10, (batch,), generator=gen).to(device)

    def forward_backward() -> None:
        sn.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(sn.forward_working(x), y).backward()

    forward_backward()
    return [p for p in sn.parameters() if p.grad is not None], forward_backward


def agree(cfg: OptimConfig, params: list[Tensor], steps: int = 5) -> tuple[bool, float]:
    """Step both implementations from ``params`` and their gradients: whether they ended
    bit-identical, and the largest difference relative to the weights' largest magnitude."""
    sides = []
    for make in (torch_default, build_optimizer):
        copies = [p.detach().clone().requires_grad_(True) for p in params]
        for copy, p in zip(copies, params, strict=True):
            copy.grad = p.grad.clone()
        optimizer = make(cfg, copies)
        for _ in range(steps):
            optimizer.step()
        sides.append(copies)
    identical = all(torch.equal(a, b) for a, b in zip(*sides, strict=True))
    scale = max(float(p.detach().abs().max()) for p in sides[0])
    worst = max(float((a - b).detach().abs().max()) for a, b in zip(*sides, strict=True))
    return identical, worst / scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizers", default=",".join(CONFIGS))
    parser.add_argument("--batch", type=int, default=32, help="batch of the forward/backward")
    args, device = parse_timing_args(parser)
    print(f"{device}, {torch.get_num_threads()} threads, forward+backward at batch {args.batch}")
    header = f"{'model':>18} {'optimizer':>9} {'torch ms':>9} {'espn ms':>8} {'speed-up':>9}"
    print(f"{header} {'fwd+bwd ms':>11} {'bit-identical':>14} {'max rel diff':>13}")
    for model in args.models.split(","):
        params, forward_backward = parameters(model, device, args.batch)
        pass_ms = median_ms(forward_backward, args.seconds)
        for name in args.optimizers.split(","):
            cfg = CONFIGS[name]
            identical, diff = agree(cfg, params)
            if not diff <= TOLERANCE:
                raise SystemExit(f"{model} {name}: espn's optimizer is {diff:.2e} off torch's")
            makers = (torch_default, build_optimizer)
            ms = [median_ms(make(cfg, params).step, args.seconds) for make in makers]
            print(
                f"{model:>18} {name:>9} {ms[0]:>9.2f} {ms[1]:>8.2f} {ms[0] / ms[1]:>8.1f}x"
                f" {pass_ms:>11.2f} {identical!s:>14} {diff:>13.1e}"
            )


if __name__ == "__main__":
    main()
