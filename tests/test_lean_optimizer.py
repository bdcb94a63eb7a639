"""espn's RMSprop steps exactly as torch's, with no slow square root of zeros."""

from __future__ import annotations

import pytest
import torch

from espn.training.optim import LeanRMSprop, OptimConfig, build_optimizer


def odd_gradients(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Gradients with exact zeros (40%: frozen or masked weights), subnormal and tiny values,
    a few NaN and inf, and ordinary ones, so that ``square_avg`` holds zeros, subnormals,
    normals, inf and NaN."""
    grad = torch.randn(shape, generator=gen)
    pick = torch.rand(shape, generator=gen)
    grad[pick < 0.4] = 0.0
    grad[(pick >= 0.4) & (pick < 0.45)] = 1e-20  # squared: below the smallest normal
    grad[(pick >= 0.45) & (pick < 0.5)] = 3e-17  # squared near eps's last bit
    grad[(pick >= 0.5) & (pick < 0.502)] = float("nan")
    grad[(pick >= 0.502) & (pick < 0.504)] = float("inf")
    return grad


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"momentum": 0.9},
        {"weight_decay": 1e-2},
        {"momentum": 0.5, "weight_decay": 1e-3, "alpha": 0.9},
        {"eps": 1e-30},  # too small to absorb sqrt(tiny): torch's own step runs
    ],
    ids=str,
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lean_rmsprop_is_torch_rmsprop_bit_for_bit(options: dict, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(50, 40, dtype=dtype), torch.randn(40, dtype=dtype)]
    ours = [p.clone().requires_grad_(True) for p in start]
    theirs = [p.clone().requires_grad_(True) for p in start]
    lean = LeanRMSprop(ours, lr=1e-2, **options)
    torch_opt = torch.optim.RMSprop(theirs, lr=1e-2, **options)
    for _ in range(6):
        for a, b in zip(ours, theirs, strict=True):
            a.grad = odd_gradients(a.shape, gen).to(dtype)
            b.grad = a.grad.clone()
        lean.step()
        torch_opt.step()
    if not options.get("weight_decay"):  # (decay makes every gradient non-zero)
        assert any(bool((s["square_avg"] == 0).any()) for s in lean.state.values())
    assert any(bool(s["square_avg"].isnan().any()) for s in lean.state.values())
    for a, b in zip(ours, theirs, strict=True):
        assert same_bits(a.detach(), b.detach())
        for key, value in torch_opt.state[b].items():
            assert same_bits(lean.state[a][key], value), key
    assert not torch.equal(ours[0].detach(), start[0])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two float tensors hold the same bits (NaN payloads included)."""
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))


def test_the_engine_builds_the_lean_rmsprop() -> None:
    params = [torch.zeros(3, 2, requires_grad=True)]
    optimizer = build_optimizer(OptimConfig("rmsprop", lr=1e-3), params)
    assert isinstance(optimizer, LeanRMSprop)
    assert optimizer._lean(optimizer.param_groups[0])
    assert not optimizer._lean(optimizer.param_groups[0] | {"eps": 0.0})
    assert not optimizer._lean(optimizer.param_groups[0] | {"centered": True})
