"""Cost per optimizer step of keeping frozen weights exact: espn's FrozenGuard against masks.

Every training step of every method with frozen weights zeroes their gradients and puts them
back after the optimizer's step. espn's :class:`~espn.training.optim.FrozenGuard` does both
on the weights' bits (an integer AND, then an OR with the snapshot); the obvious formulation
is a boolean ``masked_fill_`` and ``where``. This script freezes a share of each layer's
weights of a supernet, checks that both give bit-identical weights and gradients, and prints
the milliseconds per step of each and their ratio.

    python benchmarks/frozen_guard.py                          # fc1024 and resnet18-reduced, CPU
    python benchmarks/frozen_guard.py --device cuda --frozen 0.9
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch.utils import benchmark

from espn.models.registry import ModelSpec, build_supernet
from espn.supernet import Supernet
from espn.training.optim import FrozenGuard

SHAPES = {"fc1024": (1, 28, 28), "resnet18-reduced": (3, 32, 32)}


def frozen_supernet(model: str, share: float, device: torch.device) -> Supernet:
    """``model`` with ``share`` of each layer's weights frozen at random and random gradients."""
    shape = SHAPES[model]
    sn = build_supernet(
        model, ModelSpec(shape, 10, multi_head=False), torch.zeros(2, *shape), 0, device
    )
    gen = torch.Generator().manual_seed(0)
    for layer in sn.layers.values():
        layer.frozen.copy_(torch.rand(layer.frozen.shape, generator=gen) < share)
        layer.weight.grad = torch.randn(layer.weight.shape, generator=gen).to(device)
    return sn


def boolean_guard(sn: Supernet) -> Callable[[], None]:
    """The same guarantee with boolean masks: ``masked_fill_`` and ``where``."""
    layers = [layer for layer in sn.layers.values() if bool(layer.frozen.any())]
    saved = [layer.weight.detach().clone() for layer in layers]

    @torch.no_grad()
    def step() -> None:
        for layer, weights in zip(layers, saved, strict=True):
            layer.weight.grad.masked_fill_(layer.frozen, 0.0)
            layer.weight.copy_(torch.where(layer.frozen, weights, layer.weight))

    return step


def espn_guard(sn: Supernet) -> Callable[[], None]:
    """espn's :class:`FrozenGuard` over ``sn``: both of its calls of a step."""
    guard = FrozenGuard(sn)

    def step() -> None:
        guard.mask_gradients()
        guard.restore()

    return step


def median_ms(step: Callable[[], None], seconds: float) -> float:
    """Median milliseconds of ``step`` over about ``seconds`` (torch's benchmark Timer, which
    synchronises CUDA)."""
    timer = benchmark.Timer("step()", globals={"step": step}, num_threads=torch.get_num_threads())
    return 1e3 * timer.blocked_autorange(min_run_time=seconds).median


def parse_timing_args(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, torch.device]:
    """``parser``'s arguments with the options the timing scripts here share (models, seconds
    per timing, device, CPU threads, which it sets), and the device."""
    parser.add_argument("--models", default="fc1024,resnet18-reduced")
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per timing")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args, torch.device(args.device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frozen", type=float, default=0.5, help="share of weights frozen")
    args, device = parse_timing_args(parser)
    print(f"{args.frozen:.0%} of the weights frozen, {device}, {torch.get_num_threads()} threads")
    print(f"{'model':>18} {'weights':>10} {'boolean ms':>11} {'espn ms':>8} {'speed-up':>9}")
    for model in args.models.split(","):
        bool_side, espn_side = (frozen_supernet(model, args.frozen, device) for _ in range(2))
        before = [layer.weight.detach().clone() for layer in espn_side.layers.values()]
        reference, guarded = boolean_guard(bool_side), espn_guard(espn_side)
        for side in (bool_side, espn_side):  # an optimizer step moved every weight
            for layer in side.layers.values():
                layer.weight.data.add_(1.0)
        reference()
        guarded()
        layers = zip(bool_side.layers.values(), espn_side.layers.values(), before, strict=True)
        for a, b, start in layers:
            if not (
                torch.equal(a.weight, b.weight)
                and torch.equal(a.weight.grad, b.weight.grad)
                and torch.equal(b.weight[b.frozen], start[b.frozen])
            ):
                raise SystemExit(f"{model}: FrozenGuard differs from the boolean guard")

        bool_ms = median_ms(reference, args.seconds)
        espn_ms = median_ms(guarded, args.seconds)
        weights = espn_side.total_weights
        print(
            f"{model:>18} {weights:>10} {bool_ms:>11.2f} {espn_ms:>8.2f} {bool_ms / espn_ms:>8.1f}x"
        )


if __name__ == "__main__":
    main()
