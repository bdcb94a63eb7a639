"""espn's compiled training step (``--compile``) against plain PyTorch, eager and compiled.

Four steps over the same network, data, batch and optimizer, per phase of espn's task:

* ``plain``: a plain PyTorch loop (``step_cost.py``'s dense copy of the network, no masks,
  no penalty, no guard), eager;
* ``plain-c``: the same loop with its loss (forward and cross-entropy) through
  ``torch.compile`` as ``--compile`` compiles espn's: ``reduce-overhead`` (CUDA graphs) and
  ``channels_last`` conv inputs on CUDA, the fused optimizer eager;
* ``espn`` and ``espn-c``: espn's engine training the task eagerly and with ``--compile``,
  the masked supernet in every phase (``slim_training`` off: the same network as the plain
  loops'; the whole task below fine-tunes slim, as a run does by default).

As in ``step_cost.py``, the timed task is task 1 after a one-batch task 0, the plain loops
run ``--steps`` steps after every epoch of espn's (interleaved, so a shared machine slows all
alike), the first epoch of every phase is a warm-up (compiles happen there) and not counted,
prune events are timed apart. Columns: median ms per step over the ``--repeats`` epochs after
it; ``espn`` is also given as a ratio to ``plain``, ``espn-c`` to ``plain-c``
(the issue's goal: within 1.2x on CUDA). ``--amp`` runs every loop under autocast (bfloat16
where the device has it). The compiled graphs of espn's step and the CUDA-graph skips that
torch reports are printed after the table.

``--task``: also the wall time of one task of the paper's CIFAR recipe (ESPN-0.2, the
reduced ResNet18, Adam, batch 128, 2500 images: 20 steps an epoch, 10 warm-up + 50
pre-training + 90 pruning + 100 fine-tuning epochs = 5000 steps), eager and compiled. It runs
each phase's epochs divided by ``--task-scale`` (at least 2) and extrapolates to the recipe:
per phase, its first epoch (compiles included) plus the median of its other epochs for each
remaining recipe epoch. Both the measured and the extrapolated seconds are printed.

    python benchmarks/compile_step.py --device cuda                 # reduced ResNet18, batch 128
    python benchmarks/compile_step.py --device cuda --amp --task    # bfloat16; + a whole task
    python benchmarks/compile_step.py --models fc1024 --steps 3 --repeats 1 --backend aot_eager
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import step_cost
import torch
import torch.nn.functional as F
from step_cost import SETTINGS, check_same_network, plain_network, synthetic_task
from torch import Tensor, nn
from torch._dynamo.utils import counters

from espn import create_method
from espn.data.tasks import Task
from espn.models.registry import ModelSpec, build_supernet
from espn.supernet import Supernet
from espn.training.compile import STATIC_MODE, StepCompiler, is_convolutional
from espn.training.engine import Engine, autocast_dtype
from espn.training.optim import OptimConfig, build_optimizer

#: the four steps, in the table's order
LOOPS = ("plain", "plain-c", "espn", "espn-c")
PHASES = ("warmup", "pretrain", "prune", "finetune")
#: the paper's CIFAR recipe: epochs per phase (warm-up taken from pre-training's 60), the
#: images per task its epochs are stated for, and its optimizer
RECIPE_EPOCHS = {"warmup": 10, "pretrain": 50, "prune": 90, "finetune": 100}
RECIPE_IMAGES = 2500
RECIPE_OPTIM = OptimConfig("adam", lr=0.01, betas=(0.0, 0.999))


class PlainStep:
    """A plain PyTorch training step over ``model``: cross-entropy of its logits under
    autocast when ``amp``, compiled as espn's step is when ``backend`` is given."""

    def __init__(
        self,
        model: nn.Module,
        optim: OptimConfig,
        device: torch.device,
        amp: bool,
        backend: str | None,
    ) -> None:
        self.model = model
        self.optimizer = build_optimizer(optim, list(model.parameters()))
        dtype = autocast_dtype(device.type)
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp and dtype == torch.float16)
        cuda = device.type == "cuda"
        self.mode = STATIC_MODE if cuda and backend == "inductor" else None
        channels_last = cuda and backend is not None and is_convolutional(model)

        def loss(x: Tensor, y: Tensor) -> Tensor:
            if channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=dtype, enabled=amp):
                return F.cross_entropy(model(x), y)

        self.loss: Callable[[Tensor, Tensor], Tensor] = (
            loss
            if backend is None
            else torch.compile(loss, backend=backend, mode=self.mode, dynamic=False)
        )

    def epoch(self, task: Task, batch: int, steps: int, generator: torch.Generator) -> float:
        """Milliseconds per step of ``steps`` steps over ``task``."""
        self.model.train()
        start = time.perf_counter()
        last = torch.zeros(())
        for i, (x, y) in enumerate(task.batches("train", batch, True, generator)):
            if i == steps:
                break
            if self.mode == STATIC_MODE:
                torch.compiler.cudagraph_mark_step_begin()
            loss = self.loss(x, y)
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            last = loss.detach()
        float(last)  # wait for the device, as espn's epoch does
        return 1e3 * (time.perf_counter() - start) / steps


@dataclass
class Table:
    """Milliseconds per step of each loop, per phase, epoch by epoch (the first epoch of a
    phase not counted), and the milliseconds of each prune event."""

    ms: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    seen: dict[tuple[str, str], int] = field(default_factory=dict)
    events: list[float] = field(default_factory=list)

    def add(self, loop: str, phase: str, value: float) -> None:
        key = (loop, phase)
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.seen[key] > 1:
            self.ms.setdefault(loop, {}).setdefault(phase, []).append(value)

    def median(self, loop: str, phase: str) -> float | None:
        values = self.ms.get(loop, {}).get(phase)
        return statistics.median(values) if values else None

    def ratio(self, loop: str, base: str, phase: str) -> float | None:
        """Median over epochs of ``loop``'s ms over ``base``'s ms of the same epoch."""
        mine, theirs = self.ms.get(loop, {}).get(phase), self.ms.get(base, {}).get(phase)
        if not mine or not theirs:
            return None
        return statistics.median(a / b for a, b in zip(mine, theirs, strict=False))


def model_and_task(
    name: str, device: str, images: int, batch: int
) -> tuple[Supernet, nn.Module, Task, Task]:
    """The supernet of benchmark model ``name``, its plain dense copy (checked to compute the
    same logits), a one-batch task 0 and a task 1 of ``images`` images."""
    setting = SETTINGS[name]
    spec = ModelSpec(setting.shape, 10, setting.multi_head, stream_pruning="per-conv")
    supernet = build_supernet(setting.model, spec, torch.zeros(2, *setting.shape), 0, device)
    plain = plain_network(supernet)
    probe = synthetic_task("probe", setting, 4, 99, device)
    check_same_network(supernet, plain, next(probe.batches("train", 4, augment=False))[0], name)
    first = synthetic_task("task 0", setting, batch, 1, device)
    return supernet, plain, first, synthetic_task("task 1", setting, images, 2, device)


def measure(name: str, method: str, args: argparse.Namespace, table: Table) -> dict[str, int]:
    """Train task 1 of ``method`` on ``name`` eagerly, then compiled, each with the two
    plain loops interleaved; what the compiled step compiled and captured."""
    measure_loop(name, method, args, table, compiled=False)
    return measure_loop(name, method, args, table, compiled=True)


def measure_loop(
    name: str, method: str, args: argparse.Namespace, table: Table, compiled: bool
) -> dict[str, int]:
    """One of :func:`measure`'s two runs (``compiled``: espn's step compiled)."""
    setting = SETTINGS[name]
    batch = args.batch or setting.batch
    device = torch.device(args.device)
    torch.manual_seed(0)
    supernet, plain, first, task = model_and_task(name, args.device, batch * args.steps, batch)
    plains = {
        "plain": PlainStep(plain, setting.optim, device, args.amp, None),
        "plain-c": PlainStep(plain, setting.optim, device, args.amp, args.backend),
    }
    epochs = args.repeats + 1
    strategy = create_method(method, epochs=(epochs, epochs, epochs), warmup=0)
    # the masked step in every phase, as step_cost.py's columns: the same network as the plain
    # loop's (slim fine-tuning trains a narrower one; the whole task below runs it)
    engine = Engine(
        supernet, strategy, setting.optim, batch, seed=0, amp=args.amp, slim_training=False
    )
    if compiled:
        engine.compiler = StepCompiler(args.backend)
    engine.train_task(first, 0)
    loop = "espn-c" if compiled else "espn"
    generator = torch.Generator().manual_seed(3)
    mark = [time.perf_counter()]
    prune_step = strategy.prune_step

    def timed_prune_step(sn: Supernet, progress: float) -> None:
        """A prune event, timed apart from the steps."""
        start = time.perf_counter()
        prune_step(sn, progress)
        took = time.perf_counter() - start
        table.events.append(1e3 * took)
        mark[0] += took

    strategy.prune_step = timed_prune_step  # type: ignore[method-assign]

    def after_epoch(phase: str, epoch: int) -> None:
        table.add(loop, phase, 1e3 * (time.perf_counter() - mark[0]) / args.steps)
        for label, step in plains.items():
            table.add(label, phase, step.epoch(task, batch, args.steps, generator))
        mark[0] = time.perf_counter()

    skips = counters["inductor"]["cudagraph_skips"]
    engine.callbacks.append(step_cost.AtEpochEnd(after_epoch))
    engine.train_task(task, 1)
    if engine.compiler is None:
        return {}
    return {
        "graphs": engine.compiler.graphs,
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"] - skips,
    }


@dataclass
class TaskTime:
    """One whole task's wall time: measured, extrapolated to the recipe, and where it went."""

    measured: float
    extrapolated: float
    steps: int
    graphs: int | None
    #: per phase: median ms per step of its epochs after the first (prune events left out)
    step_ms: dict[str, float]
    #: seconds of the first epoch of every phase together (compiles happen there)
    first_epochs: float
    #: prune events: how many, and their median ms
    events: list[float]


def whole_task(args: argparse.Namespace, compiled: bool) -> TaskTime:
    """One ESPN-0.2 task of the paper's CIFAR recipe at ``1/--task-scale`` of its epochs,
    timed epoch by epoch and extrapolated to the recipe's epochs (see the module docstring)."""
    setting = SETTINGS["resnet18-reduced"]
    torch.manual_seed(0)
    batch = args.batch or setting.batch
    supernet, _, _, task = model_and_task("resnet18-reduced", args.device, args.task_images, batch)
    run = {p: max(2, round(e / args.task_scale)) for p, e in RECIPE_EPOCHS.items()}
    epochs = (run["warmup"] + run["pretrain"], run["prune"], run["finetune"])
    strategy = create_method(
        "espn", gamma=0.2, alpha=0.1, epochs=epochs, warmup=run["warmup"], recipe="cifar"
    )
    engine = Engine(supernet, strategy, RECIPE_OPTIM, batch, seed=0, amp=args.amp)
    if compiled:
        engine.compiler = StepCompiler(args.backend)
    seconds: dict[str, list[float]] = {}
    in_events, events = [0.0], []
    mark = [time.perf_counter()]
    prune_step = strategy.prune_step

    def timed_prune_step(sn: Supernet, progress: float) -> None:
        start = time.perf_counter()
        prune_step(sn, progress)
        events.append(time.perf_counter() - start)
        in_events[0] += events[-1]

    strategy.prune_step = timed_prune_step  # type: ignore[method-assign]

    def after_epoch(phase: str, epoch: int) -> None:
        now = time.perf_counter()
        seconds.setdefault(phase, []).append(now - mark[0])
        steps_ms.setdefault(phase, []).append(1e3 * (now - mark[0] - in_events[0]))
        mark[0], in_events[0] = now, 0.0

    steps_ms: dict[str, list[float]] = {}
    start = time.perf_counter()
    engine.callbacks.append(step_cost.AtEpochEnd(after_epoch))
    log = engine.train_task(task, 0)
    measured = time.perf_counter() - start
    extrapolated = sum(
        times[0] + (RECIPE_EPOCHS[phase] - 1) * statistics.median(times[1:])
        for phase, times in seconds.items()
    )
    per_epoch = task.num_batches("train", batch)
    return TaskTime(
        measured,
        extrapolated,
        sum(p["steps"] for p in log.phases),
        log.compiled_graphs,
        {phase: statistics.median(ms[1:]) / per_epoch for phase, ms in steps_ms.items()},
        sum(times[0] for times in seconds.values()),
        events,
    )


def fmt(value: float | None, ratio: float | None = None) -> str:
    if value is None:
        return f"{'-':>16}"
    return f"{value:>8.2f}" + (f" ({ratio:.2f}x)" if ratio is not None else " " * 8)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18-reduced")
    parser.add_argument("--methods", default="espn")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per epoch")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per phase")
    parser.add_argument("--batch", type=int, default=None, help="batch (default: the model's)")
    parser.add_argument("--amp", action="store_true", help="autocast every loop (bfloat16)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--task", action="store_true", help="also one paper-recipe task")
    parser.add_argument("--task-scale", type=float, default=10.0, help="recipe epochs / this")
    parser.add_argument(
        "--task-images", type=int, default=RECIPE_IMAGES, help="the task's images (a smoke run)"
    )
    args = parser.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in SETTINGS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(SETTINGS)}")
    if args.steps < 1 or args.repeats < 1 or args.task_images < 1 or args.task_scale <= 0:
        parser.error("--steps, --repeats and --task-images must be at least 1, --task-scale > 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(
        f"{name}, torch {torch.__version__}, backend {args.backend}, amp {args.amp}, "
        f"{args.steps} steps per epoch, median of {args.repeats} epochs per phase; ms per step "
        "(espn / plain, espn-c / plain-c)"
    )
    print(f"{'model':>17} {'method':>10} {'phase':>9}" + "".join(f" {x:>16}" for x in LOOPS))
    for model in args.models.split(","):
        for method in args.methods.split(","):
            table = Table()
            info = measure(model, method, args, table)
            label = step_cost.LABELS.get(method, method)
            for phase in PHASES:
                if table.median("espn", phase) is None:
                    continue
                cells = [
                    fmt(table.median("plain", phase)),
                    fmt(table.median("plain-c", phase)),
                    fmt(table.median("espn", phase), table.ratio("espn", "plain", phase)),
                    fmt(table.median("espn-c", phase), table.ratio("espn-c", "plain-c", phase)),
                ]
                print(f"{model:>17} {label:>10} {phase:>9} " + " ".join(cells))
            events = statistics.median(table.events) if table.events else float("nan")
            print(
                f"{'':>17} {label:>10} compiled step: {info.get('graphs')} graphs for tasks 0 and "
                f"1, {info.get('cudagraph_skips')} CUDA-graph skips; prune event {events:.1f} ms"
            )
    if args.task:
        for compiled in (False, True):
            took = whole_task(args, compiled)
            what = f"compiled ({took.graphs} graphs)" if compiled else "eager"
            recipe = sum(RECIPE_EPOCHS.values()) * -(-args.task_images // (args.batch or 128))
            print(
                f"paper-recipe task (ESPN-0.2, resnet18-reduced, {args.task_images} images, batch "
                f"{args.batch or 128}), {what}: {took.steps} steps in {took.measured:.1f} s; "
                f"extrapolated to the recipe's {recipe} steps: {took.extrapolated:.1f} s"
            )
            phases = ", ".join(f"{p} {ms:.2f}" for p, ms in took.step_ms.items())
            event = 1e3 * statistics.median(took.events) if took.events else float("nan")
            print(
                f"    ms per step after each phase's first epoch: {phases}; first epochs "
                f"{took.first_epochs:.1f} s; {len(took.events)} prune events of {event:.1f} ms"
            )


if __name__ == "__main__":
    main()
