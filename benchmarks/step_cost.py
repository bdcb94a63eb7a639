"""Cost of espn's training step per phase against a plain PyTorch loop over the same network.

For each model and method, espn trains a task through its real engine (the method's phases:
pre-training, pruning, fine-tuning) while a plain PyTorch loop trains the same dense network
(``nn.Linear`` / ``nn.Conv2d`` / ``nn.BatchNorm2d`` / ``nn.LayerNorm`` in place of espn's
masked layers, gates and task norms; no masks, no penalty, no guard) on the same task's
batches (same data, batch size, augmentation) with the same optimizer. The two are
interleaved in one process: after every epoch of espn's (``--steps`` optimizer steps) the
plain loop runs ``--steps`` steps, so a machine shared with other work slows both alike. The
first epoch of every phase is a warm-up and is not counted; the table prints the median
milliseconds per step over the ``--repeats`` epochs after it and the median of the
per-epoch ratios espn / plain (read the ratios on a shared machine).

Where the method's recipe has the authors' L2 term on the masked weights (``masked_l2``:
ESPN and PackNet), a second plain loop, ``plain+L2``, trains another copy of the dense network
with that term added to its loss as a user writes it in PyTorch (``strength * ||w||_2 /
sqrt(n)`` over the weights of the layers espn's term covers, all of them as one vector), so
that espn's step is also compared with a plain step of the same objective: the ``plain``
row's loop computes less than espn's recipe asks for. Each method prints one row per
baseline; espn's milliseconds are the same in both, the baseline and the ratios differ.

The timed task is task 1, after a one-batch task 0, so that frozen weights exist (the frozen
guard and weight reuse work as in every task after the first). Before timing, the script
checks that the plain network computes what the supernet computes at initialisation (the
same network, the same weights).

The pre-train, prune and fine-tune columns train the masked supernet (``slim_training``
off); the ``slim prune`` and ``slim finetune`` columns time a second run's pruning and
fine-tuning with ``slim_training`` on (the default of ``espn run``): between prune events a
physically slimmed copy of the task's sub-network trains once its dead units make it pay
(see ``espn.training.slim_step.slim_prune_pays``: at ``--steps`` per epoch and the run's
prune events per epoch), and the fine-tuning trains one throughout (a method that does not
train slim shows the masked step there); both are timed against the plain loop alike, the
copies' building and writing back counted in the steps' time.

    python benchmarks/step_cost.py --threads 1                       # all models, espn and packnet
    python benchmarks/step_cost.py --models fc1024 --methods espn,packnet,individual --steps 20
    python benchmarks/step_cost.py --device cuda
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from espn import create_method
from espn.data.augment import ImageTransform
from espn.data.tasks import Split, Task
from espn.layers.batchnorm2d import TaskBatchNorm2d
from espn.layers.conv2d import MaskedConv2d, conv_padding, conv_pair
from espn.layers.groupnorm import TaskGroupNorm
from espn.layers.layernorm import TaskLayerNorm
from espn.layers.linear import MaskedLinear
from espn.models.registry import ModelSpec, build_supernet
from espn.supernet import Supernet
from espn.supernet.layers import TaskHead, UnitGate
from espn.training.callbacks import Callback, EpochEnd
from espn.training.engine import Engine
from espn.training.optim import OptimConfig, TaskOptimizer, build_optimizer


class AtEpochEnd(Callback):
    """Calls ``after(phase, epoch)`` after every epoch of the engine it is added to."""

    def __init__(self, after: Callable[[str, int], None]) -> None:
        self.after = after

    def on_epoch_end(self, learner: object, event: EpochEnd) -> None:
        self.after(event.phase, event.epoch)


@dataclass(frozen=True)
class Setting:
    """A benchmark model: the registered model, its input shape, whether each task has its
    own head, the optimizer and batch of its regime, and whether training batches are
    augmented (random crop and flip, as the CIFAR benchmarks)."""

    model: str
    shape: tuple[int, ...]
    multi_head: bool
    optim: OptimConfig
    batch: int
    augment: bool


_ADAM = OptimConfig("adam", lr=1e-3, betas=(0.0, 0.999))  # the paper's CIFAR recipe
_RMSPROP = OptimConfig("rmsprop", lr=1e-4)  # the paper's MNIST recipe
SETTINGS = {
    "fc1024": Setting("fc1024", (1, 28, 28), False, _RMSPROP, 256, False),
    "fc1024-32": Setting("fc1024", (3, 32, 32), False, _RMSPROP, 256, False),
    "resnet18-reduced": Setting("resnet18-reduced", (3, 32, 32), True, _ADAM, 128, True),
    "mobilenetv2-small": Setting("mobilenetv2-small", (3, 32, 32), True, _ADAM, 128, True),
    "vit-p4": Setting("vit-p4", (3, 32, 32), True, _ADAM, 128, True),
}
#: method names as the table prints them (a method with a FLOPs budget runs at gamma 0.2)
LABELS = {"espn": "ESPN-0.2"}
#: the largest difference allowed between the plain network's and the supernet's logits
TOLERANCE = 1e-4
#: what the timings read (``--clock``): wall time, or the CPU time of this process (on a
#: machine shared with other work, CPU time is what a step costs, whatever else runs)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
CLOCK = [time.perf_counter]


@torch.no_grad()
def _plain_module(m: nn.Module) -> nn.Module | None:
    """The plain torch module computing what espn module ``m`` computes with every unit alive
    and no mask (None: ``m`` is plain already, or a container)."""
    if isinstance(m, MaskedLinear):
        out: nn.Module = nn.Linear(m.in_features, m.out_features, bias=False)
    elif isinstance(m, MaskedConv2d):
        out = nn.Conv2d(
            m.in_channels,
            m.out_channels,
            conv_pair(m.kernel_size),
            stride=conv_pair(m.stride),
            padding=conv_padding(m.padding),
            dilation=conv_pair(m.dilation),
            groups=m.groups,
            bias=False,
            padding_mode=m.padding_mode,
        )
    elif isinstance(m, TaskHead):
        out = nn.Linear(m.in_features, m.out_features)
    elif isinstance(m, TaskBatchNorm2d):
        out = nn.BatchNorm2d(m.num_features, m.eps, m.momentum)
    elif isinstance(m, TaskGroupNorm):
        out = nn.GroupNorm(m.num_groups, m.num_channels, m.eps)
    elif isinstance(m, TaskLayerNorm):
        out = nn.LayerNorm(m.normalized_shape, m.eps)
    elif isinstance(m, UnitGate) and not m.affine:
        return nn.Identity()  # a fresh gate scales by one
    else:
        return None
    for name, value in list(m.named_parameters(recurse=False)) + list(
        m.named_buffers(recurse=False)
    ):
        if hasattr(out, name) and getattr(out, name) is not None:
            getattr(out, name).copy_(value)
    return out.to(next(iter(m.parameters())).device)


def plain_network(supernet: Supernet) -> nn.Module:
    """A copy of ``supernet``'s model made of plain torch layers with its current weights."""
    model = copy.deepcopy(supernet.model)
    for name, module in list(model.named_modules()):
        plain = _plain_module(module)
        if plain is not None and name:
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, plain)
    return model


def synthetic_task(name: str, setting: Setting, images: int, seed: int, device: str) -> Task:
    """``images`` random uint8 images of ``setting``'s shape in 10 classes, on ``device``,
    cropped and flipped when training where the setting augments."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(256, (images, *setting.shape), generator=gen, dtype=torch.uint8)
    y = torch.randint(10, (images,), generator=gen)
    channels = setting.shape[0]
    transform = ImageTransform(
        (0.5,) * channels, (0.25,) * channels, 4 if setting.augment else 0, setting.augment
    )
    split = Split(x.to(device), torch.arange(images, device=device), y.to(device))
    empty = Split(x[:0].to(device), torch.arange(0, device=device), y[:0].to(device))
    return Task(name, split, empty, transform, 10)


@dataclass
class Timings:
    """Per phase of espn's task: milliseconds per step of each counted epoch, espn's and each
    baseline loop's (``plain``, ``plain+L2``) right after it."""

    espn: dict[str, list[float]] = field(default_factory=dict)
    #: baseline name -> phase -> milliseconds per step
    base: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    epochs_seen: dict[str, int] = field(default_factory=dict)
    #: milliseconds of each prune event (not counted in the steps' times)
    events: list[float] = field(default_factory=list)

    def add(self, phase: str, espn_ms: float, base_ms: dict[str, float]) -> None:
        seen = self.epochs_seen.get(phase, 0)
        self.epochs_seen[phase] = seen + 1
        if seen == 0:  # the first epoch of a phase warms up (optimizer state, caches)
            return
        self.espn.setdefault(phase, []).append(espn_ms)
        for name, ms in base_ms.items():
            self.base.setdefault(name, {}).setdefault(phase, []).append(ms)

    def row(self, phase: str, baseline: str = "plain") -> tuple[float, float, float] | None:
        """Median espn ms, median ``baseline`` ms, median ratio of ``phase`` (None: not
        timed)."""
        if phase not in self.espn:
            return None
        base = self.base[baseline][phase]
        ratios = [e / p for e, p in zip(self.espn[phase], base, strict=True)]
        return (
            statistics.median(self.espn[phase]),
            statistics.median(base),
            statistics.median(ratios),
        )

    def baseline_ms(self, baseline: str) -> float:
        """Median milliseconds per step of ``baseline`` over every timed phase."""
        runs = [ms for per_phase in self.base.get(baseline, {}).values() for ms in per_phase]
        return statistics.median(runs) if runs else float("nan")


def recipe_l2(supernet: Supernet, plain: nn.Module, strength: float) -> Callable[[], Tensor] | None:
    """The authors' L2 term of espn's recipe on the plain network, as a user writes it:
    ``strength * ||w||_2 / sqrt(n)`` with ``w`` the weights of the layers espn's term covers
    (those producing units; not the head) as one vector of ``n`` entries (None at strength 0).
    espn's term divides by its masks' counts; the dense network's mask is every weight."""
    if strength <= 0:
        return None
    weights = [
        plain.get_submodule(name).weight
        for name, layer in supernet.layers.items()
        if layer.out_units is not None
    ]
    return l2_term(weights, strength)


def l2_term(weights: list[Tensor], strength: float) -> Callable[[], Tensor]:
    """``strength * ||w||_2 / sqrt(n)`` of ``weights`` as one vector of ``n`` entries, as a
    user writes it in PyTorch: a norm per tensor, stacked, and the norm of that."""
    scale = strength / math.sqrt(sum(w.numel() for w in weights))

    def term() -> Tensor:
        norms = torch.stack([torch.linalg.vector_norm(w) for w in weights])
        return scale * torch.linalg.vector_norm(norms)

    return term


#: a baseline loop: its dense network, optimizer and penalty (None: the task loss alone)
Loop = tuple[nn.Module, torch.optim.Optimizer, Callable[[], Tensor] | None]


def baseline_loops(
    supernet: Supernet, plain: nn.Module, setting: Setting, masked_l2: float
) -> dict[str, Loop]:
    """The baselines espn's step is timed against: ``plain`` (``plain`` itself, the task loss
    alone) and, where the recipe has the L2 term (``masked_l2`` > 0), ``plain+L2`` (a copy of
    it whose loss adds that term, see :func:`recipe_l2`); each with its own optimizer."""
    loops: dict[str, Loop] = {
        "plain": (plain, plain_optimizer(setting.optim, list(plain.parameters())), None)
    }
    with_l2 = copy.deepcopy(plain)
    l2 = recipe_l2(supernet, with_l2, masked_l2)
    if l2 is not None:
        loops["plain+L2"] = (
            with_l2,
            plain_optimizer(setting.optim, list(with_l2.parameters())),
            l2,
        )
    return loops


def plain_step(loop: Loop, x: Tensor, y: Tensor) -> Tensor:
    """One plain PyTorch training step of ``loop`` on a batch; its loss."""
    model, optimizer, penalty = loop
    loss = F.cross_entropy(model(x), y)
    if penalty is not None:
        loss = loss + penalty()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def plain_epoch(
    loop: Loop, task: Task, batch: int, steps: int, generator: torch.Generator
) -> float:
    """Milliseconds per step of ``steps`` plain PyTorch training steps of ``loop`` over
    ``task``."""
    loop[0].train()
    start = CLOCK[0]()
    loss = torch.zeros(())
    for i, (x, y) in enumerate(task.batches("train", batch, True, generator)):
        if i == steps:
            break
        loss = plain_step(loop, x, y)
    float(loss.detach())  # wait for the device, as espn's epoch does
    return 1e3 * (CLOCK[0]() - start) / steps


def plain_optimizer(cfg: OptimConfig, params: list[Tensor]) -> torch.optim.Optimizer:
    """The plain loop's optimizer: torch's own class with espn's settings (espn's RMSprop is
    its :class:`~espn.training.optim.LeanRMSprop`; SGD and Adam are torch's fused ones on
    both sides)."""
    if cfg.optimizer == "rmsprop":
        return torch.optim.RMSprop(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    return build_optimizer(cfg, params)


def check_same_network(supernet: Supernet, plain: nn.Module, x: Tensor, what: str) -> None:
    """Stop unless the plain network computes the supernet's logits on ``x``."""
    with torch.no_grad():
        supernet.eval()
        plain.eval()
        diff = float((supernet.forward_working(x) - plain(x)).abs().max())
        supernet.train()
        plain.train()
    if not diff <= TOLERANCE:
        raise SystemExit(f"{what}: the plain network differs from the supernet by {diff:.2e}")


def measure(
    name: str, method: str, args: argparse.Namespace, device: str, slim: bool = False
) -> tuple[list[str], Timings]:
    """Train task 1 of ``method`` on model ``name`` with the plain loop interleaved, through
    the masked supernet; with ``slim``, time its pruning and fine-tuning alone, on slim
    copies where they pay (one untimed epoch of pre-training before them)."""
    setting = SETTINGS[name]
    batch = args.batch or setting.batch
    spec = ModelSpec(setting.shape, 10, setting.multi_head, stream_pruning="per-conv")
    example = torch.zeros(2, *setting.shape)
    supernet = build_supernet(setting.model, spec, example, 0, device)
    plain = plain_network(supernet)
    probe = synthetic_task("probe", setting, 4, 99, device)
    check_same_network(supernet, plain, next(probe.batches("train", 4, augment=False))[0], name)
    epochs = args.repeats + 1
    # no warm-up: it would take pre-training's first epoch (espn's MNIST recipe has one)
    plan = (1, epochs, epochs) if slim else (epochs, epochs, epochs)
    strategy = create_method(method, epochs=plan, warmup=0)
    loops = baseline_loops(supernet, plain, setting, float(strategy.settings.get("masked_l2", 0)))
    gens = {name: torch.Generator().manual_seed(3) for name in loops}
    engine = Engine(supernet, strategy, setting.optim, batch, seed=0, slim_training=slim)
    engine.train_task(synthetic_task("task 0", setting, batch, 1, device), 0)
    task = synthetic_task("task 1", setting, batch * args.steps, 2, device)
    timings, phases = Timings(), [p.name for p in strategy.phases()]
    mark = [CLOCK[0]()]
    prune_event = engine._prune_event

    def timed_prune_event(progress: float, optimizer: TaskOptimizer) -> None:
        """A prune event (the strategy's prune step and the zeroing of what it pruned),
        timed apart from the steps (its count per step is the run's)."""
        start = CLOCK[0]()
        prune_event(progress, optimizer)
        took = CLOCK[0]() - start
        timings.events.append(1e3 * took)
        mark[0] += took

    engine._prune_event = timed_prune_event  # type: ignore[method-assign]

    def after_epoch(phase: str, epoch: int) -> None:
        if slim and phase not in ("prune", "finetune"):  # not timed: the phases before
            mark[0] = CLOCK[0]()
            return
        espn_ms = 1e3 * (CLOCK[0]() - mark[0]) / args.steps
        base_ms = {
            name: plain_epoch(loop, task, batch, args.steps, gens[name])
            for name, loop in loops.items()
        }
        timings.add(phase, espn_ms, base_ms)
        mark[0] = CLOCK[0]()

    engine.callbacks.append(AtEpochEnd(after_epoch))
    engine.train_task(task, 1)
    return phases, timings


def cell(row: tuple[float, float, float] | None) -> str:
    return f"{'-':>17}" if row is None else f"{row[0]:>9.1f} ({row[2]:.2f}x)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="fc1024,resnet18-reduced,mobilenetv2-small,vit-p4")
    parser.add_argument("--methods", default="espn,packnet")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per epoch")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per phase")
    parser.add_argument("--batch", type=int, default=None, help="batch (default: the model's)")
    parser.add_argument(
        "--no-slim",
        dest="slim",
        action="store_false",
        help="leave out the 'slim prune' and 'slim finetune' columns (slim copies)",
    )
    parser.add_argument(
        "--clock",
        default="wall",
        choices=tuple(CLOCKS),
        help="wall time, or this process's CPU time (steadier on a shared machine; on the "
        "CPU with one thread, the two agree on an idle machine)",
    )
    args = parser.parse_args(argv)
    CLOCK[0] = CLOCKS[args.clock]
    unknown = [m for m in args.models.split(",") if m not in SETTINGS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(SETTINGS)}")
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    print(
        f"{device}, {torch.get_num_threads()} threads, {args.clock} clock, {args.steps} steps "
        f"per epoch, median of "
        f"{args.repeats} epochs per phase; ms per step "
        "(espn / baseline)"
    )
    header = f"{'model':>17} {'method':>10} {'batch':>5} {'baseline':>9} {'base ms':>8}"
    print(
        header
        + "".join(f" {p:>17}" for p in ("pretrain", "prune", "finetune"))
        + f" {'slim prune':>17} {'slim finetune':>17} {'event ms':>9}  other phases"
    )
    for name in args.models.split(","):
        for method in args.methods.split(","):
            phases, timings = measure(name, method, args, device)
            slim = measure(name, method, args, device, slim=True)[1] if args.slim else None
            batch = args.batch or SETTINGS[name].batch
            label = LABELS.get(method, method)
            event = statistics.median(timings.events) if timings.events else float("nan")
            others = [
                p for p in phases if p not in ("pretrain", "prune", "finetune") and timings.row(p)
            ]
            for base in timings.base:
                cells = "".join(
                    f" {cell(timings.row(p, base))}" for p in ("pretrain", "prune", "finetune")
                )
                for p in ("prune", "finetune"):
                    cells += f" {cell(None if slim is None else slim.row(p, base))}"
                extra = "".join(f"  {p}: {cell(timings.row(p, base)).strip()}" for p in others)
                print(
                    f"{name:>17} {label:>10} {batch:>5} {base:>9} {timings.baseline_ms(base):>8.1f}"
                    f"{cells} {event:>9.1f}{extra}"
                )


if __name__ == "__main__":
    main()
