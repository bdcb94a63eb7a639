"""Inference latency of exported slim sub-networks next to the masked supernet.

For each model (FC1024 and the reduced ResNet18 by default; also ``mobilenetv2-small``, depthwise
convolutions),
each FLOPs budget gamma and each batch size, one task is pruned to a *random* sub-network of
the target FLOPs: unit saliencies are drawn at random and the library's own global-threshold
selection (``select_units``) removes the least salient units until FLOPs <= gamma x dense; the
weight mask keeps every weight between alive units (a weight mask inside alive units does not
change the speed of a dense slim model). No training is involved: latency does not depend on
the weight values. Then, in one process, on the CPU (and the GPU when present):

* ``supernet``: ``supernet(x, task=t)``, the masked dense supernet a user runs without export;
* ``plain``: the same task as a plain full-width network (masks multiplied in, gates and
  BatchNorm folded): the dense network without the masking overhead;
* ``narrow``: a plain dense network of the task's per-layer widths built from new modules
  (same graph as the slim model, fresh ``nn.Conv2d``/``nn.Linear``, no Torch-Pruning);
* ``slim``: the exported model (``espn export``: pruned units removed by Torch-Pruning,
  BatchNorm folded, saved with ``torch.export`` and loaded back).

Each latency is the median of ``--repeats`` timed blocks of about ``--block`` seconds, the
models taking turns (``torch.utils.benchmark.Timer``). Printed: medians, the speed-ups
``supernet/slim`` and ``plain/slim``, and ``0.7/gamma``, our target at batch 256 on the CPU.

    python benchmarks/inference_speed.py                 # everything, CPU (+ GPU if present)
    python benchmarks/inference_speed.py --models fc1024 --gammas 0.2 --batches 256
    python benchmarks/inference_speed.py --models mobilenetv2-small --batches 1,64 --device cuda

Transformers (``--token-models``, default the registry ViT ``vit-p4`` on 28x28 inputs, batches
``--token-batches``): the exported slim model (pruned heads, MLP neurons and stream features
removed, ``torch.export`` round trip) next to the *dense* exported model of the same network
(a task with every unit alive) and the masked supernet; printed: medians and the speed-ups
``dense/slim`` and ``supernet/slim``, side by side.

    python benchmarks/inference_speed.py --models "" --token-models vit-p4 --device cuda
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import benchmark

from espn.export.export import export_task, load_exported
from espn.export.slim import fold_batchnorm, plain_copy, slim_copy
from espn.models.registry import MODELS, ModelSpec
from espn.pruning import select_units
from espn.supernet.supernet import Supernet

SPECS = {
    "fc1024": ModelSpec((1, 28, 28), 10, multi_head=False),
    "resnet18-reduced": ModelSpec((3, 32, 32), 5, multi_head=True),
    "vit-p4": ModelSpec((1, 28, 28), 2, multi_head=True),
    "mobilenetv2-small": ModelSpec((3, 32, 32), 5, multi_head=True),
}


def fresh_like(model: nn.Module) -> nn.Module:
    """A plain network of the same graph and per-layer widths as ``model``, built from new
    modules (default initialisation, no Torch-Pruning, no export): the native narrow network."""
    fresh = copy.deepcopy(model)
    for name, m in list(fresh.named_modules()):
        if isinstance(m, nn.Conv2d):
            new: nn.Module = nn.Conv2d(
                m.in_channels,
                m.out_channels,
                m.kernel_size,
                m.stride,
                m.padding,
                m.dilation,
                m.groups,
                m.bias is not None,
            )
        elif isinstance(m, nn.Linear):
            new = nn.Linear(m.in_features, m.out_features, m.bias is not None)
        elif isinstance(m, nn.BatchNorm2d):
            new = nn.BatchNorm2d(m.num_features)
        else:
            continue
        parent, _, leaf = name.rpartition(".")
        setattr(fresh.get_submodule(parent) if parent else fresh, leaf, new.to(m.weight.device))
    return fresh.eval()


def random_task(supernet: Supernet, n_classes: int, gamma: float, seed: int) -> None:
    """Commit a task whose units are a random selection of FLOPs <= gamma x dense."""
    gen = torch.Generator().manual_seed(seed)
    supernet.begin_task(n_classes)
    saliency = {g: torch.rand(n, generator=gen) for g, n in supernet.group_sizes.items()}
    units = select_units(
        saliency, supernet.unit_masks(), supernet.flops, gamma * supernet.dense_flops
    )
    with torch.no_grad():
        for mods in supernet.groups.values():
            for m in mods:
                # drawn on the CPU: the same sub-network on every device
                m.weight.copy_(torch.empty(m.weight.shape).uniform_(0.5, 1.5, generator=gen))
                m.bias.copy_(torch.empty(m.bias.shape).uniform_(-0.1, 0.1, generator=gen))
    supernet.set_unit_masks(units)
    supernet.eval()
    supernet.commit_task()


def build(name: str, device: str) -> Supernet:
    spec = SPECS[name]
    torch.manual_seed(0)
    model = MODELS.get(name)(spec).to(device)
    supernet = Supernet(model, torch.zeros(2, *spec.input_shape, device=device))
    return supernet.eval()


def interleaved_medians(
    fns: dict[str, Any], x: torch.Tensor, repeats: int, block: float
) -> dict[str, float]:
    """Median seconds per call of each ``fn(x)``: ``repeats`` rounds, each timing one block of
    about ``block`` seconds per model, the models taking turns so that drifts of the machine
    (other load, clock) hit them alike."""
    timers = {
        k: benchmark.Timer(
            "with torch.no_grad(): fn(x)",
            globals={"fn": fn, "x": x, "torch": torch},
            num_threads=torch.get_num_threads(),  # the Timer's default is one thread
        )
        for k, fn in fns.items()
    }
    numbers = {}
    for k, timer in timers.items():
        timer.timeit(3)  # warm-up
        numbers[k] = max(1, round(block / max(timer.timeit(3).median, 1e-7)))
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, timer in timers.items():
            samples[k].append(timer.timeit(numbers[k]).median)
    return {k: statistics.median(v) for k, v in samples.items()}


def measure(
    name: str, gammas: list[float], batches: list[int], device: str, args: argparse.Namespace
) -> list[dict[str, Any]]:
    rows = []
    supernet = build(name, device)
    spec = SPECS[name]
    with tempfile.TemporaryDirectory() as tmp:
        for t, gamma in enumerate(gammas):
            random_task(supernet, spec.n_classes, gamma, seed=t)
            gen = torch.Generator().manual_seed(100 + t)
            check = [torch.randn(64, *spec.input_shape, generator=gen).to(device)]
            report = export_task(supernet, t, check, Path(tmp) / f"{name}-{t}.pt2", also_onnx=False)
            slim = load_exported(report.files[0])
            plain = fold_batchnorm(plain_copy(supernet, t), check[0][:2])
            models: dict[str, nn.Module] = {
                "supernet": lambda x, t=t: supernet(x, task=t),
                "plain": plain,
                "narrow": fresh_like(
                    fold_batchnorm(slim_copy(supernet, t, check[0][:2]), check[0][:2])
                ),
                "slim": slim,
            }
            base = {"model": name, "device": device, "gamma": gamma, "target": 0.7 / gamma}
            rows += time_task(supernet, t, models, base, report, batches, gen, args, format_row)
    return rows


def time_task(
    supernet: Supernet,
    task: int,
    models: dict[str, Any],
    base: dict[str, Any],
    report: Any,
    batches: list[int],
    gen: torch.Generator,
    args: argparse.Namespace,
    fmt: Callable[[dict[str, Any]], str],
) -> list[dict[str, Any]]:
    """Time ``models`` (which include ``slim``) on random batches of each size, printing one
    row per batch: ``base``, the task's FLOPs ratio and widths, medians in ms, and every other
    model's time over the slim model's (``speedup_vs_<name>``)."""
    rows = []
    device = next(supernet.parameters()).device
    for batch in batches:
        x = torch.randn(batch, *supernet.input_shape, generator=gen).to(device)
        supernet(x, task=task)  # load the task's masks outside the timed region
        times = interleaved_medians(models, x, args.repeats, args.block)
        row = base | {
            "flops_ratio": report.flops / report.dense_flops,
            "widths": report.widths,
            "batch": batch,
            "ms": {k: 1e3 * v for k, v in times.items()},
        }
        row |= {f"speedup_vs_{k}": times[k] / times["slim"] for k in models if k != "slim"}
        rows.append(row)
        print(fmt(row), flush=True)
    return rows


def measure_tokens(
    name: str, gammas: list[float], batches: list[int], device: str, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """A transformer: task 0 dense (every unit alive), then one random task per gamma; each
    exported and loaded back; the slim models timed against the dense one and the supernet."""
    rows = []
    supernet = build(name, device)
    spec = SPECS[name]
    gen = torch.Generator().manual_seed(100)
    check = [torch.randn(16, *spec.input_shape, generator=gen).to(device)]
    with tempfile.TemporaryDirectory() as tmp:
        exported = []
        for t, gamma in enumerate([1.0, *gammas]):
            random_task(supernet, spec.n_classes, gamma, seed=t)
            report = export_task(supernet, t, check, Path(tmp) / f"{name}-{t}.pt2", also_onnx=False)
            exported.append((gamma, report, load_exported(report.files[0])))
        dense = exported[0][2]
        for t, (gamma, report, slim) in enumerate(exported[1:], start=1):
            models: dict[str, Any] = {
                "supernet": lambda x, t=t: supernet(x, task=t),
                "dense": dense,
                "slim": slim,
            }
            base = {"model": name, "device": device, "gamma": gamma}
            rows += time_task(
                supernet, t, models, base, report, batches, gen, args, format_token_row
            )
    return rows


TOKEN_HEADER = (
    f"{'model':<17} {'dev':<4} {'gamma':>5} {'FLOPs':>6} {'batch':>5} "
    f"{'supernet ms':>11} {'dense ms':>9} {'slim ms':>8} {'x dense':>7} {'x super':>7}"
)


def format_token_row(r: dict[str, Any]) -> str:
    ms = r["ms"]
    return (
        f"{r['model']:<17} {r['device']:<4} {r['gamma']:>5.2f} {r['flops_ratio']:>6.3f} "
        f"{r['batch']:>5} {ms['supernet']:>11.3f} {ms['dense']:>9.3f} {ms['slim']:>8.3f} "
        f"{r['speedup_vs_dense']:>7.2f} {r['speedup_vs_supernet']:>7.2f}"
    )


HEADER = (
    f"{'model':<17} {'dev':<4} {'gamma':>5} {'FLOPs':>6} {'batch':>5} "
    f"{'supernet ms':>11} {'plain ms':>9} {'narrow ms':>9} {'slim ms':>8} "
    f"{'x super':>7} {'x plain':>7} {'0.7/g':>5}"
)


def format_row(r: dict[str, Any]) -> str:
    ms = r["ms"]
    return (
        f"{r['model']:<17} {r['device']:<4} {r['gamma']:>5.2f} {r['flops_ratio']:>6.3f} "
        f"{r['batch']:>5} {ms['supernet']:>11.3f} {ms['plain']:>9.3f} {ms['narrow']:>9.3f} "
        f"{ms['slim']:>8.3f} {r['speedup_vs_supernet']:>7.2f} {r['speedup_vs_plain']:>7.2f} "
        f"{r['target']:>5.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="fc1024,resnet18-reduced")
    parser.add_argument("--gammas", default="0.2,0.5")
    parser.add_argument("--batches", default="1,256")
    parser.add_argument("--token-models", default="vit-p4", help="transformers ('' for none)")
    parser.add_argument("--token-batches", default="1,64")
    parser.add_argument(
        "--devices",
        "--device",
        default=None,
        help="e.g. cpu,cuda; default: cpu, and cuda when present",
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds per model")
    parser.add_argument("--block", type=float, default=0.2, help="seconds per timed block")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    devices = (
        args.devices.split(",")
        if args.devices
        else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    )
    gammas = [float(g) for g in args.gammas.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{args.threads} CPU threads"
        + (f", GPU {torch.cuda.get_device_name()}" if "cuda" in devices else "")
    )
    print("sub-networks: random units at the FLOPs target (no training); latency = median")
    rows = []
    conv_models = [m for m in args.models.split(",") if m]
    if conv_models:
        print(HEADER)
    for name in conv_models:
        MODELS.get(name)  # an unknown name fails here, naming the known ones
        for device in devices:
            rows += measure(name, gammas, batches, device, args)
    token_models = [m for m in args.token_models.split(",") if m]
    if token_models:
        print("transformers: exported slim vs the exported dense network")
        print(TOKEN_HEADER)
    token_batches = [int(b) for b in args.token_batches.split(",")]
    for name in token_models:
        MODELS.get(name)
        for device in devices:
            rows += measure_tokens(name, gammas, token_batches, device, args)
    cpu_256 = [r for r in rows if r["device"] == "cpu" and r["batch"] == 256 and "target" in r]
    for r in cpu_256:
        verdict = "meets" if r["speedup_vs_supernet"] >= r["target"] else "MISSES"
        print(
            f"{r['model']} gamma {r['gamma']}: CPU batch 256 speed-up "
            f"{r['speedup_vs_supernet']:.2f}x {verdict} the 0.7/gamma = {r['target']:.2f}x target"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
