"""Training time per epoch of one SplitCIFAR100-shaped task on a residual supernet.

The task is synthetic but shaped like a SplitCIFAR100 task: 2500 training images of 3x32x32
(uint8, on the device), 5 classes, 500 test images, the CIFAR augmentation (random crop with
padding 4, flip) and normalisation on the device. One task is trained by the real engine with
ESPN (gamma 0.2) or PackNet for PRE,PRUNE,FINE epochs; every epoch is timed, and the test
evaluation too. Nothing is learned from the data (random images); only speed is measured.

    python benchmarks/cifar_epoch_time.py                       # reduced ResNet18, CPU
    python benchmarks/cifar_epoch_time.py --device cuda --amp   # on a GPU, mixed precision
    python benchmarks/cifar_epoch_time.py --model resnet18 --threads 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
from step_cost import AtEpochEnd

from espn.data.augment import ImageTransform
from espn.data.cifar import STATS
from espn.data.tasks import Split, Task
from espn.evaluation.metrics import task_accuracy
from espn.methods import METHODS, MethodConfig
from espn.models import MODELS, ModelSpec
from espn.supernet import Supernet
from espn.training import Engine, OptimConfig


def synthetic_task(n_train: int, n_test: int, device: torch.device, seed: int = 0) -> Task:
    gen = torch.Generator().manual_seed(seed)

    def split(n: int) -> Split:
        x = torch.randint(0, 256, (n, 3, 32, 32), generator=gen, dtype=torch.uint8).to(device)
        y = (torch.arange(n) % 5).to(device)
        return Split(x, torch.arange(n, device=device), y)

    transform = ImageTransform(*STATS["cifar100"], crop_padding=4, flip=True)
    return Task("synthetic", split(n_train), split(n_test), transform, 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18-reduced")
    parser.add_argument("--method", default="espn", choices=["espn", "packnet"])
    parser.add_argument("--epochs", default="1,1,1", help="PRE,PRUNE,FINE")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--train", type=int, default=2500)
    parser.add_argument("--test", type=int, default=500)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    task = synthetic_task(args.train, args.test, device)
    model = MODELS.get(args.model)(ModelSpec((3, 32, 32), 5, multi_head=True)).to(device)
    sn = Supernet(model, task.transform(task.train.x[:2], False))
    epochs = tuple(int(e) for e in args.epochs.split(","))
    cfg = MethodConfig(gamma=0.2 if args.method == "espn" else 1.0, alpha=0.1, epochs=epochs)
    optim = OptimConfig("adam", lr=0.01, betas=(0.0, 0.999))
    engine = Engine(sn, METHODS.get(args.method)(cfg), optim, args.batch_size, amp=args.amp)
    marks: list[tuple[str, float]] = []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def on_epoch_end(phase: str, epoch: int) -> None:
        sync()
        marks.append((phase, time.perf_counter()))

    start = time.perf_counter()
    engine.callbacks.append(AtEpochEnd(on_epoch_end))
    engine.train_task(task, 0)
    per_epoch = []
    last = start
    for phase, t in marks:
        per_epoch.append({"phase": phase, "seconds": t - last})
        last = t
    t0 = time.perf_counter()
    task_accuracy(sn, task, 0)
    sync()
    eval_s = time.perf_counter() - t0
    doc = {
        "model": args.model,
        "method": args.method,
        "device": str(device),
        "amp": args.amp,
        "threads": torch.get_num_threads(),
        "batch_size": args.batch_size,
        "train_images": args.train,
        "dense_mflops_per_image": sn.dense_flops / 1e6,
        "epochs": per_epoch,
        "mean_epoch_s": sum(e["seconds"] for e in per_epoch) / len(per_epoch),
        "eval_s": eval_s,
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
    }
    for e in per_epoch:
        print(f"{e['phase']:>9}: {e['seconds']:.2f} s")
    print(
        f"{args.model} {args.method} on {device}{' amp' if args.amp else ''}, "
        f"{torch.get_num_threads()} threads, batch {args.batch_size}: "
        f"{doc['mean_epoch_s']:.2f} s per epoch of {args.train} images, "
        f"test evaluation of {args.test} images {eval_s:.2f} s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
