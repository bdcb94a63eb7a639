"""espn's RMSprop steps exactly as torch's, with no slow square root of zeros."""

from __future__ import annotations

import pytest
import torch

from espn.training.optim import LeanRMSprop, OptimConfig, build_optimizer


def odd_gradients(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Gradients with exact zeros (40%: frozen or masked weights), subnormal and tiny values,
    and ordinary ones, so that ``square_avg`` holds zeros, subnormals and normals."""
    grad = torch.randn(shape, generator=gen)
    pick = torch.rand(shape, generator=gen)
    grad[pick < 0.4] = 0.0
    grad[(pick >= 0.4) & (pick < 0.45)] = 1e-20  # squared: below the smallest normal
    grad[(pick >= 0.45) & (pick < 0.5)] = 3e-17  # squared near eps's last bit
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
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a.detach().view(bits), b.detach().view(bits))
        for key, value in torch_opt.state[b].items():
            assert torch.equal(lean.state[a][key], value), key
    assert not torch.equal(ours[0].detach(), start[0])


def test_the_engine_builds_the_lean_rmsprop() -> None:
    params = [torch.zeros(3, 2, requires_grad=True)]
    optimizer = build_optimizer(OptimConfig("rmsprop", lr=1e-3), params)
    assert isinstance(optimizer, LeanRMSprop)
    assert optimizer._lean(optimizer.param_groups[0])
    assert not optimizer._lean(optimizer.param_groups[0] | {"eps": 0.0})
    assert not optimizer._lean(optimizer.param_groups[0] | {"centered": True})
