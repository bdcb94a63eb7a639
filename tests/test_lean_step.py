"""The lean training step computes what the plain formulation computes."""

from __future__ import annotations

from copy import deepcopy

import pytest
import torch
from torch import nn

import espn
from espn.layers.batchnorm2d import TaskBatchNorm2d
from espn.layers.groupnorm import TaskGroupNorm
from espn.models.registry import ModelSpec
from espn.models.registry import build_supernet as registry_supernet
from espn.pruning.regularisers import UniformL1, masked_weight_l2
from espn.supernet import Supernet
from espn.supernet.layers import UnitGate, UnitModule
from espn.training.optim import FrozenGuard, OptimConfig, TaskOptimizer


def small_supernet(widths: tuple[int, int] = (8, 5)) -> Supernet:
    torch.manual_seed(0)
    a, b = widths
    model = nn.Sequential(nn.Linear(6, a), nn.ReLU(), nn.Linear(a, b), nn.ReLU(), nn.Linear(b, 3))
    return espn.wrap(model, torch.zeros(2, 6))


#: widths whose weights span several of the CPU's vector registers plus a ragged tail
#: (6 x 67 and 67 x 45 floats), so that the vectorised and the scalar code paths of the
#: backward's elementwise kernels are both compared
WIDE = (67, 45)


@pytest.mark.parametrize(
    "cfg",
    [
        OptimConfig("sgd", lr=0.1, momentum=0.9),
        OptimConfig("nesterov", lr=0.1, momentum=0.9),
        OptimConfig("adam", lr=0.1, betas=(0.0, 0.999)),
        OptimConfig("rmsprop", lr=0.1),
        OptimConfig("rmsprop", lr=0.1, momentum=0.5),
    ],
    ids=lambda c: f"{c.optimizer}-{c.momentum}",
)
def test_frozen_weights_keep_their_bits_without_a_restore(cfg: OptimConfig) -> None:
    """Without weight decay the guard skips its restore: zeroed gradients from a fresh
    optimizer move no frozen weight, whatever the gradients of the others were."""
    sn = small_supernet()
    gen = torch.Generator().manual_seed(1)
    for layer in sn.layers.values():
        layer.frozen.copy_(torch.rand(layer.frozen.shape, generator=gen) < 0.5)
    before = {n: layer.weight.detach().clone() for n, layer in sn.layers.items()}
    optimizer = TaskOptimizer(cfg, list(sn.shared_parameters()))
    guard = FrozenGuard(sn, restore=optimizer.decays)
    assert not guard.restores
    odd = torch.tensor([float("nan"), float("inf"), -1e30, 1e-40, 3.0, -0.0])
    for _ in range(5):
        for layer in sn.layers.values():
            layer.weight.grad = odd[torch.randint(len(odd), layer.weight.shape, generator=gen)]
            free = ~layer.frozen
            layer.weight.grad[free] = torch.randn(int(free.sum()), generator=gen)
        guard.mask_gradients()
        for opt in optimizer.optimizers:
            opt.step()
        guard.restore()
    for n, layer in sn.layers.items():
        frozen = layer.frozen
        assert torch.equal(
            layer.weight.detach()[frozen].view(torch.int32), before[n][frozen].view(torch.int32)
        )
        assert not torch.equal(layer.weight.detach()[~frozen], before[n][~frozen])


def test_weight_decay_keeps_the_restore() -> None:
    sn = small_supernet()
    decaying = TaskOptimizer(OptimConfig("adam", weight_decay=1e-2), list(sn.shared_parameters()))
    assert decaying.decays and FrozenGuard(sn, restore=decaying.decays).restores


def reference_l2(sn: Supernet) -> torch.Tensor:
    """The authors' term as first written: a Python loop of masked products."""
    layers = [layer for layer in sn.layers.values() if layer.out_units is not None]
    norms = torch.stack(
        [torch.linalg.vector_norm(layer.weight * layer.weight_mask) for layer in layers]
    )
    nnz = torch.stack([layer.weight_mask.sum() for layer in layers]).sum()
    return torch.linalg.vector_norm(norms) / nnz.clamp_min(1.0).sqrt()


def test_masked_l2_matches_the_loop_in_value_and_gradient() -> None:
    sn = small_supernet()
    first, second, *_ = sn.layers.values()
    gen = torch.Generator().manual_seed(2)
    second.weight_mask.copy_((torch.rand(second.weight.shape, generator=gen) < 0.6).float())
    sn.note_masks()
    assert first.mask_is_ones() and not second.mask_is_ones()
    grads = []
    for term in (masked_weight_l2, reference_l2):
        sn.zero_grad(set_to_none=True)
        value = term(sn)
        value.backward()
        grads.append((value.detach(), [layer.weight.grad.clone() for layer in sn.layers.values()]))
    (v1, g1), (v2, g2) = grads
    torch.testing.assert_close(v1, v2)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b)


def test_a_mask_written_in_place_is_no_longer_taken_as_ones() -> None:
    """The all-ones shortcut follows the mask's version: any write since brings the product
    back, so no stale shortcut hides a mask."""
    sn = small_supernet()
    layer = next(iter(sn.layers.values()))
    sn.note_masks()
    assert layer.mask_is_ones()
    with torch.no_grad():
        assert layer.masked_weight() is layer.weight
    # a training step's masked weight is the weight's own memory: no product computed
    assert layer.masked_weight().data_ptr() == layer.weight.data_ptr()
    layer.weight_mask[0, 0] = 0.0
    assert not layer.mask_is_ones()
    assert float(layer.masked_weight().detach()[0, 0]) == 0.0
    assert float(layer.mask_count()) == layer.weight.numel() - 1


def test_weighted_l1_is_the_sum_of_lambda_times_l1() -> None:
    sn = small_supernet()
    assert len(sn.groups) == 2  # one gate per hidden layer
    penalty = UniformL1(0.5)
    penalty.refresh(sn)
    with torch.no_grad():
        for mods in sn.groups.values():
            for m in mods:
                m.weight.copy_(torch.randn(m.weight.shape))
    expected = sum(
        penalty.lambdas[g] * m.weight.abs().sum() for g, mods in sn.groups.items() for m in mods
    )
    torch.testing.assert_close(penalty(sn), expected)


def masked_and_frozen(sn: Supernet, seed: int) -> None:
    """Random weight masks (not all ones) and frozen weights in every layer."""
    gen = torch.Generator().manual_seed(seed)
    for layer in sn.layers.values():
        layer.weight_mask.copy_((torch.rand(layer.weight.shape, generator=gen) < 0.7).float())
        layer.frozen.copy_(torch.rand(layer.weight.shape, generator=gen) < 0.4)
    sn.note_masks()


def test_the_masked_product_keeps_only_trainable_gradients_bit_for_bit() -> None:
    """The product's backward writes the gradient of ``w * m`` with every weight outside the
    mask or frozen zeroed bitwise (NaN and inf included), and the guard then leaves it."""
    sn = small_supernet()
    masked_and_frozen(sn, 3)
    x = torch.randn(4, 6)
    x[0, 0] = float("inf")  # non-finite gradients must be zeroed as exactly as finite ones
    guard = FrozenGuard(sn, restore=False)
    assert guard.layers == list(sn.layers.values())
    guard.begin_step()
    sn.forward_working(x).sum().backward()
    assert all(layer.grad_is_kept() for layer in sn.layers.values())
    got = {n: layer.weight.grad.clone() for n, layer in sn.layers.items()}
    guard.mask_gradients()  # nothing left to zero: the gradients stay as written
    for name, layer in sn.layers.items():
        assert torch.equal(layer.weight.grad.view(torch.int32), got[name].view(torch.int32))
    # the plain formulation: autograd through w * m (a mask that requires grad takes the
    # plain product), then the frozen and masked-out entries zeroed
    sn.zero_grad(set_to_none=True)
    guard.begin_step()
    masks = {
        f"{n}.weight_mask": layer.weight_mask.clone().requires_grad_(True)
        for n, layer in sn.layers.items()
    }
    torch.func.functional_call(sn.model, masks, (x,)).sum().backward()
    assert not any(layer.grad_is_kept() for layer in sn.layers.values())
    for name, layer in sn.layers.items():
        trainable = layer.weight_mask.bool() & ~layer.frozen
        expected = layer.weight.grad.masked_fill(~trainable, 0.0)
        assert torch.equal(got[name].view(torch.int32), expected.view(torch.int32)), name
    assert not bool(sn.layers[next(iter(sn.layers))].weight.grad.isfinite().all())


def test_a_gradient_the_product_did_not_write_is_masked_by_the_guard() -> None:
    """Only the gradient the product's backward wrote in this step counts as kept: a
    gradient replaced or written in place since, or one from an earlier backward pass, is
    masked by the guard as before."""
    sn = small_supernet()
    masked_and_frozen(sn, 4)
    guard = FrozenGuard(sn, restore=False)
    first, second = sn.layers.values()
    for change in ("replace", "in place"):
        sn.zero_grad(set_to_none=True)
        guard.begin_step()
        sn.forward_working(torch.randn(4, 6)).sum().backward()
        if change == "replace":
            first.weight.grad = torch.ones_like(first.weight)
        else:
            first.weight.grad.add_(1.0)
        assert not first.grad_is_kept() and second.grad_is_kept()
        guard.mask_gradients()
        assert bool((first.weight.grad[first.frozen] == 0).all())
        assert bool((first.weight.grad[~first.frozen] != 0).all())
    guard.begin_step()  # a new step: nothing of the last backward pass counts
    assert not any(layer.grad_is_kept() for layer in sn.layers.values())


def test_the_l2_term_reads_the_forward_pass_product() -> None:
    """After a training forward pass, the masked L2 term takes each layer's product from it
    (no second product) and gives the same value and weight gradients as the loop."""
    sn = small_supernet()
    masked_and_frozen(sn, 5)
    for layer in sn.layers.values():
        layer.frozen.zero_()  # compare the term's own gradient, with nothing kept out
    x = torch.randn(4, 6)
    got = []
    for term in (masked_weight_l2, reference_l2):
        sn.zero_grad(set_to_none=True)
        out = sn.forward_working(x).sum()
        if term is masked_weight_l2:
            assert all(layer.step_parts() is not None for layer in sn.layers.values())
        (out + term(sn)).backward()
        got.append([layer.weight.grad.clone() for layer in sn.layers.values()])
    for a, b in zip(*got, strict=True):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        next(iter(sn.layers.values())).weight.add_(1.0)  # an optimizer step: stale now
    assert next(iter(sn.layers.values())).step_parts() is None


def test_a_method_that_prunes_no_units_fixes_its_gates_at_one() -> None:
    """PackNet trains no gate: its gates are released when the task begins and pass their
    input through unchanged (the same tensor), until a unit dies."""
    sn = small_supernet()
    strategy = espn.create_method("packnet")
    strategy.attach(sn)
    sn.begin_task(3)
    strategy.begin_task(sn)
    gates = [m for m in sn.task_modules.values() if isinstance(m, UnitGate)]
    assert gates and all(g.is_identity() and not g.weight.requires_grad for g in gates)
    x = torch.randn(4, gates[0].num_units)
    assert gates[0](x) is x
    units = {g: torch.ones(mods[0].num_units, dtype=torch.bool) for g, mods in sn.groups.items()}
    units[gates[0].group][0] = False
    sn.set_unit_masks(units)
    assert not gates[0].is_identity()
    assert bool((gates[0](x)[:, 0] == 0).all())


def test_a_supernet_copied_mid_step_copies_no_step_state() -> None:
    """What a layer remembers of a step (its product, a graph node) is left out of copies."""
    sn = small_supernet()
    masked_and_frozen(sn, 6)
    sn.forward_working(torch.randn(4, 6)).sum().backward()
    copy = deepcopy(sn)
    for layer, copied in zip(sn.layers.values(), copy.layers.values(), strict=True):
        assert layer.step_parts() is not None and copied.step_parts() is None
        assert not copied.grad_is_kept() and torch.equal(copied.weight, layer.weight)


def test_a_mask_not_noted_as_binary_takes_the_plain_product() -> None:
    """The gradient of ``w * m`` is ``grad * m``: the keeping backward is used only for a
    mask noted as 0/1 since its last change; a fractional mask, or one written since, is
    differentiated as a product."""
    sn = small_supernet()
    masked_and_frozen(sn, 7)
    layer = next(iter(sn.layers.values()))
    layer.weight_mask.mul_(0.5)  # written since it was noted: fractional now
    for noted in (False, True):
        if noted:
            sn.note_masks()
        sn.zero_grad(set_to_none=True)
        x = torch.randn(4, 6)
        sn.forward_working(x).sum().backward()
        assert layer.step_parts() is None and not layer.grad_is_kept()
        got = layer.weight.grad.clone()
        sn.zero_grad(set_to_none=True)
        soft = {
            f"{n}.weight_mask": m.weight_mask.clone().requires_grad_(True)
            for n, m in sn.layers.items()
        }
        torch.func.functional_call(sn.model, soft, (x,)).sum().backward()
        torch.testing.assert_close(got, layer.weight.grad, rtol=0, atol=0)


def frozen_and_masked(sn: Supernet, seed: int, ones: bool, frozen: bool) -> None:
    """Masks of ones or random 0/1 masks, with or without frozen weights, noted."""
    gen = torch.Generator().manual_seed(seed)
    for layer in sn.layers.values():
        if not ones:
            layer.weight_mask.copy_((torch.rand(layer.weight.shape, generator=gen) < 0.7).float())
        if frozen:
            layer.frozen.copy_(torch.rand(layer.weight.shape, generator=gen) < 0.4)
    sn.note_masks()


@pytest.mark.parametrize("widths", [(8, 5), WIDE], ids=["small", "wide"])
@pytest.mark.parametrize("l2", [False, True], ids=["no-l2", "l2"])
@pytest.mark.parametrize("frozen", [False, True], ids=["none-frozen", "frozen"])
@pytest.mark.parametrize("ones", [True, False], ids=["ones", "binary"])
def test_the_fused_gradient_is_the_autograd_gradient_kept(
    ones: bool, frozen: bool, l2: bool, widths: tuple[int, int]
) -> None:
    """The training step's weight gradient (the product's backward, the masked-L2 term's
    coefficient added in it, the untrainable entries zeroed bit for bit) is, bit for bit,
    what plain autograd gives for ``loss(w * m) + 0.3 * l2(w * m)`` (the product and the
    term's own gradient summed by autograd), with every weight outside the mask or frozen
    zeroed; and it is the per-layer loop's gradient up to float rounding. The term enters the
    fused gradient in one ``addcdiv_`` pass: a fused multiply-add there would differ from
    autograd's product-then-sum in about one entry in seven."""
    sn = small_supernet(widths)
    frozen_and_masked(sn, 8, ones, frozen)
    x, y = torch.randn(5, 6), torch.tensor([0, 1, 2, 1, 0])
    guard = FrozenGuard(sn, restore=False)
    guard.begin_step()
    logits = sn.forward_working(x)
    assert all(layer.step_parts() is not None for layer in sn.layers.values())
    total = torch.nn.functional.cross_entropy(logits, y)
    if l2:
        total = total + 0.3 * masked_weight_l2(sn)
    total.backward()
    guard.mask_gradients()
    got = {n: layer.weight.grad.clone() for n, layer in sn.layers.items()}
    # the unfused formulation: autograd through the products (masks requiring grad take the
    # plain product) and the per-layer loop of the L2 term, then the untrainable zeroed
    masks = {
        f"{n}.weight_mask": layer.weight_mask.clone().requires_grad_(True)
        for n, layer in sn.layers.items()
    }
    for term in (masked_weight_l2, reference_l2):
        sn.zero_grad(set_to_none=True)
        logits = torch.func.functional_call(sn.model, masks, (x,))
        assert all(layer.step_parts() is None for layer in sn.layers.values())
        total = torch.nn.functional.cross_entropy(logits, y)
        if l2:
            total = total + 0.3 * term(sn)
        total.backward()
        for name, layer in sn.layers.items():
            trainable = layer.weight_mask.bool() & ~layer.frozen
            expected = layer.weight.grad.masked_fill(~trainable, 0.0)
            if term is masked_weight_l2 or not l2:
                assert torch.equal(got[name].view(torch.int32), expected.view(torch.int32))
            else:
                torch.testing.assert_close(got[name], expected, rtol=1e-6, atol=1e-7)
            assert bool((got[name][trainable] != 0).any())


def test_training_steps_through_the_fused_path_move_no_frozen_weight() -> None:
    """ESPN's steps (gates, L1 penalty, masked-L2 term, RMSprop with momentum) through the
    fused backward leave every frozen weight's bits as they were, masked or not."""
    sn = small_supernet()
    strategy = espn.create_method("espn", masked_l2=0.5)
    engine = espn.training.Engine(sn, strategy, OptimConfig("rmsprop", lr=0.1, momentum=0.5), 5)
    sn.begin_task(3)
    strategy.begin_task(sn)
    frozen_and_masked(sn, 9, ones=False, frozen=True)
    before = {n: layer.weight.detach().clone() for n, layer in sn.layers.items()}
    optimizer = engine.build_optimizer()
    guard = FrozenGuard(sn, restore=optimizer.decays)
    phase = strategy.phases()[0]
    gen = torch.Generator().manual_seed(10)
    for _ in range(4):
        x, y = torch.randn(5, 6, generator=gen), torch.randint(3, (5,), generator=gen)
        engine._step(optimizer, guard, phase, x, y)  # at the optimizer's lr, 0.1
    for name, layer in sn.layers.items():
        frozen = layer.frozen
        assert layer.grad_is_kept()
        assert torch.equal(
            layer.weight.detach()[frozen].view(torch.int32), before[name][frozen].view(torch.int32)
        )
        moved = layer.weight_mask.bool() & ~frozen
        assert not torch.equal(layer.weight.detach()[moved], before[name][moved])


@pytest.mark.parametrize("kind", ["batchnorm", "groupnorm"])
def test_a_task_norm_with_every_unit_alive_skips_its_mask_bit_for_bit(kind: str) -> None:
    """A task BatchNorm/GroupNorm whose units are all alive (noted when a task begins or units
    are set) uses its scale and shift as they are: the same output and gradients, bit for bit,
    as the product with its mask of ones; a unit mask written since, or a copy's, is
    multiplied again (a dead unit outputs zero and gets no gradient)."""
    torch.manual_seed(0)
    if kind == "batchnorm":
        norm: UnitModule = TaskBatchNorm2d(6, "g")
    else:
        norm = TaskGroupNorm(3, 6, "g", unit_size=2)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(4, 6, 5, 5)
    grads = []
    for noted in (False, True):
        norm.note_units(noted)
        assert norm.all_alive() is noted
        norm.zero_grad()
        out = norm(x)
        (out * torch.linspace(-1.0, 2.0, out.numel()).view_as(out)).sum().backward()
        grads.append((out.detach(), norm.weight.grad.clone(), norm.bias.grad.clone()))
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    assert not deepcopy(norm).all_alive()
    norm.unit_mask[0] = 0.0  # written since it was noted: the mask applies again
    assert not norm.all_alive()
    norm.zero_grad()
    out = norm(x)
    out.sum().backward()
    size = 1 if kind == "batchnorm" else 2
    assert bool((out[:, :size] == 0).all()) and bool((norm.weight.grad[:size] == 0).all())


def test_a_task_begins_and_sets_units_noting_whether_all_are_alive() -> None:
    """Every task norm of a task that begins is known all alive (no host read), and
    ``set_unit_masks`` notes each group as it sets it."""
    spec = ModelSpec((3, 8, 8), 4, True, stream_pruning="per-conv")
    sn = registry_supernet("resnet18-reduced", spec, torch.zeros(2, 3, 8, 8), 0, "cpu")
    sn.begin_task(4)
    norms = [m for m in sn.task_modules.values() if isinstance(m, TaskBatchNorm2d)]
    assert norms and all(m.all_alive() for m in norms)
    units = sn.unit_masks()
    group = norms[0].group
    units[group][0] = False
    sn.set_unit_masks(units)
    assert not norms[0].all_alive()
    assert all(m.all_alive() for m in norms if m.group != group)
