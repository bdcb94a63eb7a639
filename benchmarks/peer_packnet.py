"""espn's PackNet next to a reference PackNet (Avalanche's), on the very same tasks.

The task sequence is built once by espn's benchmark code (offline Fashion-MNIST by default,
rotated); espn trains on it through ``run_experiment`` and Avalanche's ``PackNet`` strategy
gets the same images (espn's preprocessing applied once) with task labels 0..T-1. espn runs
``--method packnet`` with its defaults only (its recipe, the benchmark's optimizer, batch
and alpha, the size rule): nothing here tailors it. Avalanche runs FC 784-1024-1024-10 with
the optimizer, learning rate, batch size and kept share (alpha) of espn's resolved run, and,
unless ``--epochs``/``--post-prune-epochs`` are given, as many optimizer steps per task as
espn's run (its phases, size rule included) and espn's fine-tuning steps after its one-shot
prune (``prune_proportion = 1 - alpha``). Printed: the final test accuracy and the training
time of every task for both, and their averages.

    pip install 'espn[avalanche]'  # avalanche-lib (optional; see .ci/run for a torch-safe install)
    python benchmarks/peer_packnet.py                      # 3 tasks x 4000 images, CPU
    python benchmarks/peer_packnet.py --tasks 5 --train-per-task 6000 --seed 1 --device cuda
    python benchmarks/peer_packnet.py --side espn --json peer.json  # without Avalanche
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from espn.api.experiment import build_benchmark, run_experiment
from espn.data.tasks import Task, TaskSequence
from espn.methods.base import METHODS
from espn.runs.config import ConfigError, RunConfig, make_config
from espn.training.optim import OptimConfig, build_optimizer
from espn.training.plan import plan_phase, reference_batches
from espn.utils.io import write_json_atomic

SIDES = ("both", "espn", "avalanche")
BENCHMARK_CHOICES = (
    "rotated-fashion-mnist",
    "permuted-fashion-mnist",
    "rotated-mnist",
    "permuted-mnist",
)


@dataclass
class SideResult:
    """One library's run: final test accuracy (%) and training seconds of every task."""

    name: str
    accuracy: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        """The figures as a JSON-able dict, with the averages."""
        return {
            "accuracy": self.accuracy,
            "seconds": self.seconds,
            "average_accuracy": sum(self.accuracy) / len(self.accuracy),
            "average_seconds": sum(self.seconds) / len(self.seconds),
        }


def espn_config(args: argparse.Namespace, out: Path) -> RunConfig:
    """espn's PackNet with its defaults: only the task sequence, seed and device are given
    (and ``--reference-size``, the size rule's reference, and ``--masked-l2``, the one term
    Avalanche's PackNet lacks, when asked for)."""
    extra = {} if args.masked_l2 is None else {"masked_l2": args.masked_l2}
    return make_config(
        benchmark=args.benchmark,
        method="packnet",
        tasks=args.tasks,
        train_per_task=args.train_per_task,
        test_per_task=args.test_per_task,
        reference_size=args.reference_size,
        seed=args.seed,
        device=args.device,
        out=out,
        **extra,
    )


@dataclass(frozen=True)
class Recipe:
    """What Avalanche's side runs: espn's optimizer settings, batch and kept share, and the
    length of a task in epochs (``epochs`` in all, ``post_prune`` after the prune)."""

    optim: OptimConfig
    batch_size: int
    keep: float
    epochs: int
    post_prune: int


def avalanche_recipe(args: argparse.Namespace, cfg: RunConfig, task_size: int) -> Recipe:
    """Avalanche's side from espn's resolved run: per task as many optimizer steps as espn
    takes (in whole epochs, rounded up) and espn's fine-tuning steps after the prune,
    unless ``--epochs``/``--post-prune-epochs`` say otherwise."""
    batch = cfg.batch_size
    per_epoch = math.ceil(task_size / batch)
    per_reference = reference_batches(cfg.floor_reference(), batch)
    strategy = METHODS.get(cfg.method)(cfg.method_config())
    phases = strategy.phases()
    plans = [plan_phase(p, per_epoch, per_reference) for p in phases]
    last_prune = max(i for i, p in enumerate(phases) if p.prune_updates > 0)
    after = sum(p.steps for p in plans[last_prune + 1 :])
    epochs = args.epochs or math.ceil(sum(p.steps for p in plans) / per_epoch)
    post = args.post_prune_epochs
    post = math.ceil(after / per_epoch) if post is None else post
    _check_post_prune(post, epochs)
    return Recipe(cfg.training_settings(), batch, cfg.alpha, epochs, post)


def split_tensors(task: Task, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The model inputs and labels of a task's split, exactly as espn's evaluation sees them."""
    data = task.split(split)
    return task.transform(data.x[data.index], False), data.y


def run_espn(cfg: RunConfig, seq: TaskSequence, progress: bool = False) -> SideResult:
    """Train ``seq`` with espn's PackNet; accuracies after the last task, seconds per task."""
    doc = run_experiment(cfg, progress=progress, overwrite=True, seq=seq)
    return SideResult("espn", list(doc["final_accuracy"]), [float(s) for s in doc["seconds"]])


def run_avalanche(seq: TaskSequence, args: argparse.Namespace, recipe: Recipe) -> SideResult:
    """Train ``seq`` with Avalanche's PackNet strategy on Avalanche's own FC model.

    The model is ``SimpleMLP`` (two hidden layers of 1024 with biases, no dropout) wrapped by
    ``PackNetModel``, initialised by PyTorch's defaults under ``torch.manual_seed(seed)``;
    accuracy is measured after the last task, on the same test tensors as espn's.
    """
    with warnings.catch_warnings():  # Avalanche's import-time and no-logger notices
        warnings.filterwarnings("ignore", message="no QP solver|No loggers specified")
        return _run_avalanche(seq, args, recipe)


def _run_avalanche(seq: TaskSequence, args: argparse.Namespace, recipe: Recipe) -> SideResult:
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets
    from avalanche.benchmarks.scenarios.supervised import with_classes_timeline
    from avalanche.benchmarks.scenarios.task_aware import with_task_labels
    from avalanche.benchmarks.utils import (
        DataAttribute,
        TaskAwareSupervisedClassificationDataset,
        TaskLabels,
    )
    from avalanche.models import SimpleMLP
    from avalanche.models.packnet import PackNetModel
    from avalanche.training.plugins import EvaluationPlugin
    from avalanche.training.supervised import PackNet

    def dataset(t: int, split: str) -> TaskAwareSupervisedClassificationDataset:
        x, y = (v.cpu() for v in split_tensors(seq.tasks[t], split))
        labels = torch.full_like(y, t)
        return TaskAwareSupervisedClassificationDataset(
            [torch.utils.data.TensorDataset(x, y)],
            data_attributes=[
                DataAttribute(y.tolist(), "targets"),
                TaskLabels(labels.tolist()),
            ],
        )

    n = range(len(seq))
    streams = benchmark_from_datasets(
        train=[dataset(t, "train") for t in n], test=[dataset(t, "test") for t in n]
    )
    scenario = with_classes_timeline(with_task_labels(streams))
    torch.manual_seed(args.seed)
    mlp = SimpleMLP(seq.n_classes, math.prod(seq.input_shape), 1024, 2, drop_rate=0.0)
    model = PackNetModel(mlp)
    strategy = PackNet(
        model=model,
        optimizer=build_optimizer(recipe.optim, list(model.parameters())),
        post_prune_epochs=recipe.post_prune,
        prune_proportion=1.0 - recipe.keep,
        train_mb_size=recipe.batch_size,
        train_epochs=recipe.epochs,
        eval_mb_size=1024,
        device=args.device,
        evaluator=EvaluationPlugin(loggers=[]),
    )
    result = SideResult("avalanche")
    for experience in scenario.train_stream:
        start = time.perf_counter()
        strategy.train(experience)
        if torch.device(args.device).type == "cuda":
            torch.cuda.synchronize()
        result.seconds.append(time.perf_counter() - start)
    model.eval()
    with torch.no_grad():
        for t in n:
            x, y = split_tensors(seq.tasks[t], "test")
            correct = 0
            for rows in torch.arange(len(y), device=y.device).split(1024):
                xb = x[rows].to(args.device)
                logits = model(xb, torch.full((len(rows),), t, device=args.device))
                correct += int((logits.argmax(1) == y[rows].to(args.device)).sum())
            result.accuracy.append(100.0 * correct / len(y))
    return result


def table(seq: TaskSequence, sides: list[SideResult]) -> str:
    """Accuracy and seconds per task, side by side, and the averages."""
    head = f"{'task':<16}" + "".join(f"{s.name + ' acc %':>17}{s.name + ' s':>13}" for s in sides)
    lines = [head]
    for t, task in enumerate(seq.tasks):
        cells = "".join(f"{s.accuracy[t]:>17.2f}{s.seconds[t]:>13.1f}" for s in sides)
        lines.append(f"{task.name:<16}{cells}")
    cells = "".join(
        f"{sum(s.accuracy) / len(s.accuracy):>17.2f}{sum(s.seconds) / len(s.seconds):>13.1f}"
        for s in sides
    )
    lines.append(f"{'average':<16}{cells}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; the defaults are the comparison of issue 11."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", default="rotated-fashion-mnist", choices=BENCHMARK_CHOICES)
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--train-per-task", type=int, default=4000)
    parser.add_argument("--test-per-task", type=int, default=None, help="default: all 10000")
    parser.add_argument(
        "--reference-size",
        type=int,
        default=None,
        help="espn's size-rule reference (images per task the epochs are stated for); "
        "default: the benchmark's (60000)",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="Avalanche's epochs per task in all; default: espn's optimizer steps per task",
    )
    parser.add_argument(
        "--post-prune-epochs",
        type=int,
        default=None,
        help="Avalanche's epochs after the prune; default: espn's fine-tuning steps",
    )
    parser.add_argument(
        "--masked-l2",
        type=float,
        default=None,
        help="espn's L2 term on the masked weights; default: packnet's (CtRL's 1); Avalanche's "
        "PackNet has none, so 0 compares the two without it",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--side", default="both", choices=SIDES, help="which library to run")
    parser.add_argument("--out", type=Path, default=None, help="espn's run directory")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--progress", action="store_true", help="espn's progress bar")
    return parser.parse_args(argv)


def _check_post_prune(post: int, epochs: int) -> None:
    if not 0 <= post < epochs:
        raise ValueError(
            f"--post-prune-epochs must be in [0, --epochs), got {post} with --epochs {epochs}"
        )


def check_args(args: argparse.Namespace) -> None:
    """Refuse what neither library could run, naming the value (espn's own checks follow)."""
    for name in ("epochs", "post_prune_epochs"):
        value = getattr(args, name)
        if value is not None and value < (1 if name == "epochs" else 0):
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be >= {1 if name == 'epochs' else 0}, got {value}")
    if args.epochs is not None and args.post_prune_epochs is not None:
        _check_post_prune(args.post_prune_epochs, args.epochs)
    if args.side != "espn" and importlib.util.find_spec("avalanche") is None:
        raise ValueError(
            "avalanche-lib is not installed: pip install 'espn[avalanche]', or use --side espn"
        )


def main(argv: list[str] | None = None) -> int:
    """Run both sides on one task sequence and print the comparison; 2 on bad input."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            check_args(args)
            cfg = espn_config(args, args.out or Path(tmp) / "espn")
            seq = build_benchmark(cfg)
            recipe = avalanche_recipe(args, cfg, len(seq.tasks[0].train))
        except (ValueError, ConfigError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        sides = []
        if args.side in ("both", "espn"):
            sides.append(run_espn(cfg, seq, args.progress))
        if args.side in ("both", "avalanche"):
            sides.append(run_avalanche(seq, args, recipe))
    print(
        f"{cfg.benchmark}, {len(seq)} tasks x {len(seq.tasks[0].train)} training images, "
        f"espn: packnet defaults ({cfg.optimizer} lr {cfg.lr:g}, batch {recipe.batch_size}, "
        f"alpha {recipe.keep:g}, masked L2 {cfg.method_options['masked_l2']:g}, "
        f"epochs {','.join(map(str, cfg.epochs or ()))}, size rule "
        f"{'on, reference ' + str(cfg.floor_reference()) if cfg.floor_reference() else 'off'}); "
        f"avalanche: {recipe.epochs} epochs ({recipe.post_prune} after the prune), keep "
        f"{recipe.keep:g}; seed {args.seed}, {args.device}, {torch.get_num_threads()} threads"
    )
    print(table(seq, sides))
    if args.json:
        write_json_atomic(
            args.json,
            {
                "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "avalanche_recipe": {
                    "epochs": recipe.epochs,
                    "post_prune_epochs": recipe.post_prune,
                    "keep": recipe.keep,
                    "batch_size": recipe.batch_size,
                    "optimizer": recipe.optim.optimizer,
                    "lr": recipe.optim.lr,
                },
                "tasks": [t.name for t in seq.tasks],
                "torch": torch.__version__,
                **{s.name: s.summary() for s in sides},
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
