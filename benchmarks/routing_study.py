"""How often each exemplar-free recipe picks the right task on split Fashion-MNIST 5x2.

A study beside espn (plain PyTorch networks, one thread; espn gives the data and the
``input-subspace`` rule) of the routing recipes that docs/task-agnostic.md compares. The
tasks are espn's ``split-fashion-mnist`` at seed 0 (the classes dealt in the seeded order, two
a task); each task's network is trained on that task's training images alone (every tenth
held out), and every score is calibrated from the task's held-out tenth only (standardised:
minus its mean, over its deviation), so nothing of another task is seen or kept. Recipes
(higher = more likely the task's; argmax over tasks):

- ``input-subspace``: espn's rule as it stands (the mixture of principal-subspace Gaussians of
  the input's edges, ``espn.inference.subspace``), raw and standardised;
- ``max-logit`` / ``mahalanobis``: a network trained on the task's classes only (C outputs):
  its largest logit, and the nearest class mean of its penultimate features (tied covariance);
- ``rotation``: the network trained with a class per (class, rotation by 0/90/180/270
  degrees), 4C outputs (Kim et al., NeurIPS 2022; CLOM); the score is, over the four
  rotations r of the input, the mean logit (``rotation-logit``) or softmax
  (``rotation-softmax``) of (class, r), its largest over the classes;
- ``rotation-mahalanobis``: the nearest class mean of that network's penultimate features;
- sums of two or three scores (:func:`analyse`), and ``input-subspace`` plus one other score
  weighted, the weight picked on the test images (an upper bound, not a recipe);
- ``--lifts``: ``input-subspace`` fitted on the task's images and their horizontal flips and
  1-pixel shifts (``+flips/shifts``), scored on the input and its flip averaged
  (``flip-averaged``), and both;
- ``--joint``: references that are not exemplar-free, one network trained on every task's
  images to name the task (``fc``, ``cnn``; ``cnn3``: three convolution blocks with batch
  norm, trained on random flips and shifts of up to 2 pixels), or to name the class, read as
  its task (``cnn3-classes``): what a router that sees every task reaches.

``--sequence rotated`` / ``permuted`` take espn's rotated / permuted Fashion-MNIST (10 tasks,
seed 0) instead of the split one. Every share is printed for the test images and for the
tasks' held-out tenths (routed among all tasks, as a run picks its default rule).

    python benchmarks/routing_study.py --data-dir /usr/share/datasets/fashion-mnist --epochs 5
    python benchmarks/routing_study.py --arch cnn --train 4000 --epochs 5
    python benchmarks/routing_study.py --skip-networks --lifts --joint cnn cnn3 cnn3-classes
    python benchmarks/routing_study.py --skip-networks --lifts --sequence rotated --train 1000

(At one thread on the shared machine: FC, 2-3 minutes a task; CNN on 3,600 images, 5;
``input-subspace`` with ``--lifts``, under a minute a task on 900 images, 10-13 on 10,800; a
reference, 3-5 minutes on 900 images a task (12 epochs), 7-11 on 10,800 (3 epochs).)
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from espn.data.offline import fashion_mnist
from espn.data.registry import BENCHMARKS, BenchmarkArgs
from espn.data.tensors import split_tensors
from espn.inference.subspace import fit_subspaces, subspace_nll

MEAN, STD = 0.2860, 0.3530  # espn's Fashion-MNIST normalisation
BACKGROUND = -MEAN / STD  # a black pixel, normalised
HELD_OUT_EVERY = 10
ROTATIONS = 4
SEQUENCE_TASKS = 10  # tasks of --sequence rotated / permuted
#: the density lift's extra copies of each image: its flip and its 1-pixel shifts
LIFT_SHIFTS = ((0, 1), (0, -1), (1, 0), (-1, 0))


def load(root: Path, train: bool) -> tuple[Tensor, Tensor]:
    x, y = fashion_mnist(root, train=train)
    return (x - MEAN) / STD, y


def deal(args) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Per task its training images, their labels and its test images. Split: the classes
    dealt in espn's seeded order, two a task (the first ``--train`` / ``--test`` of each);
    rotated / permuted: espn's benchmark itself (seeded subsets)."""
    if args.sequence != "split":
        seq = BENCHMARKS.get(f"{args.sequence}-fashion-mnist").build(
            BenchmarkArgs(
                n_tasks=SEQUENCE_TASKS,
                train_per_task=args.train or None,
                test_per_task=args.test or None,
                data_dir=args.data_dir,
                download=False,
            )
        )
        return [
            (*split_tensors(task, "train"), split_tensors(task, "test")[0]) for task in seq.tasks
        ]
    order = torch.randperm(10, generator=torch.Generator().manual_seed(0)).tolist()
    train_x, train_y = load(args.data_dir, True)
    test_x, test_y = load(args.data_dir, False)
    tasks = []
    for t in range(5):
        pair = order[2 * t : 2 * t + 2]
        keep = torch.nonzero((train_y == pair[0]) | (train_y == pair[1])).flatten()
        keep = keep[: args.train] if args.train else keep
        probe = torch.nonzero((test_y == pair[0]) | (test_y == pair[1])).flatten()
        probe = probe[: args.test] if args.test else probe
        tasks.append((train_x[keep], (train_y[keep] == pair[1]).long(), test_x[probe]))
    return tasks


def network(arch: str, outputs: int) -> nn.Sequential:
    if arch == "fc":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
            nn.Linear(1024, outputs),
        )  # fmt: skip
    if arch == "cnn3":  # three blocks of convolution, batch norm, ReLU and pooling: 28 -> 3

        def block(i: int, o: int) -> list[nn.Module]:
            return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2)]

        return nn.Sequential(
            *block(1, 32), *block(32, 64), *block(64, 128),
            nn.Flatten(), nn.Linear(128 * 3 * 3, 256), nn.ReLU(), nn.Linear(256, outputs),
        )  # fmt: skip
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 256), nn.ReLU(), nn.Linear(256, outputs),
    )  # fmt: skip


def rotations(x: Tensor) -> list[Tensor]:
    return [torch.rot90(x, r, dims=(2, 3)) for r in range(ROTATIONS)]


def shift(x: Tensor, dy: Tensor | int, dx: Tensor | int, pad: int = 2) -> Tensor:
    """``x`` (N, 1, H, W) moved ``dy`` pixels down and ``dx`` right (each an int or one per
    image, at most ``pad``), black coming in."""
    n, _, h, w = x.shape
    padded = F.pad(x[:, 0], (pad, pad, pad, pad), value=BACKGROUND)
    rows = (pad - torch.as_tensor(dy)).reshape(-1, 1) + torch.arange(h)
    cols = (pad - torch.as_tensor(dx)).reshape(-1, 1) + torch.arange(w)
    batch = torch.arange(n)[:, None, None]
    return padded[batch, rows.expand(n, h)[:, :, None], cols.expand(n, w)[:, None, :]][:, None]


def jitter(x: Tensor) -> Tensor:
    """Each image flipped horizontally with probability 1/2 and shifted by up to 2 pixels."""
    flip = torch.rand(len(x)) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(3), x)
    return shift(x, torch.randint(-2, 3, (len(x),)), torch.randint(-2, 3, (len(x),)))


def train(
    arch: str, x: Tensor, y: Tensor, outputs: int, rotate: bool, epochs: int, augment: bool = False
) -> nn.Module:
    """A network on ``(x, y)``: ``outputs`` classes, or a class per (class, rotation)."""
    net = network(arch, outputs * (ROTATIONS if rotate else 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(epochs):
        for rows in torch.randperm(len(x)).split(128):
            xb, yb = x[rows], y[rows]
            if augment:
                xb = jitter(xb)
            if rotate:  # label (class, r) = r * C + class
                xb = torch.cat(rotations(xb))
                yb = torch.cat([r * outputs + yb for r in range(ROTATIONS)])
            opt.zero_grad()
            F.cross_entropy(net(xb), yb).backward()
            opt.step()
    return net.eval()


@torch.no_grad()
def features(net: nn.Module, x: Tensor) -> Tensor:
    return torch.cat([net[:-1](c) for c in x.split(2048)])


@torch.no_grad()
def logits(net: nn.Module, x: Tensor) -> Tensor:
    return torch.cat([net(c) for c in x.split(2048)])


def gaussian(feats: Tensor, y: Tensor, classes: int) -> tuple[Tensor, Tensor]:
    """Class means and the inverse of the tied covariance (shrunk towards its mean variance)."""
    f = feats.double()
    means = torch.stack([f[y == c].mean(0) for c in range(classes)])
    centred = f - means[y]
    cov = centred.T @ centred / len(f)
    shrunk = 0.9 * cov + 0.1 * cov.diagonal().mean() * torch.eye(len(cov), dtype=f.dtype)
    return means, torch.linalg.inv(shrunk)


def mahalanobis(feats: Tensor, means: Tensor, precision: Tensor) -> Tensor:
    d = feats.double()[:, None, :] - means[None]
    return -torch.einsum("ncd,de,nce->nc", d, precision, d).min(1).values


@torch.no_grad()
def rotation_scores(net: nn.Module, x: Tensor, classes: int) -> dict[str, Tensor]:
    per_logit, per_soft = 0, 0
    for r, xr in enumerate(rotations(x)):
        out = logits(net, xr).double()
        cols = slice(r * classes, (r + 1) * classes)
        per_logit = per_logit + out[:, cols] / ROTATIONS
        per_soft = per_soft + out.softmax(1)[:, cols] / ROTATIONS
    return {
        "rotation-logit": per_logit.max(1).values,
        "rotation-softmax": per_soft.max(1).values,
    }


def density_scores(x: Tensor, y: Tensor, probe: Tensor, lifts: bool) -> dict[str, Tensor]:
    """``input-subspace``'s log-likelihood of each row of ``probe``, and with ``lifts`` the
    same fitted on ``x`` and its flips and shifts, averaged over the input and its flip, or
    both."""
    out = {}
    fits = {"": (x, y)}
    if lifts:
        copies = [x.flip(3), *(shift(x, dy, dx) for dy, dx in LIFT_SHIFTS)]
        fits["+flips/shifts"] = (torch.cat([x, *copies]), y.repeat(len(copies) + 1))
    for suffix, (fx, fy) in fits.items():
        stats = fit_subspaces(fx, fy)
        out[f"input-subspace{suffix}"] = -subspace_nll(probe, stats).double()
        if lifts:
            flipped = -subspace_nll(probe.flip(3), stats).double()
            out[f"input-subspace{suffix}, flip-averaged"] = (
                out[f"input-subspace{suffix}"] + flipped
            ) / 2
    return out


def task_scores(args, x: Tensor, y: Tensor, probe: Tensor) -> dict[str, Tensor]:
    """Every recipe's score of each row of ``probe`` for the task of ``(x, y)``."""
    out = density_scores(x, y, probe, args.lifts)
    if args.skip_networks:
        return out
    classes = int(y.max()) + 1
    plain = train(args.arch, x, y, classes, False, args.epochs)
    out["max-logit"] = logits(plain, probe).double().max(1).values
    out["mahalanobis"] = mahalanobis(
        features(plain, probe), *gaussian(features(plain, x), y, classes)
    )
    rot = train(args.arch, x, y, classes, True, args.epochs)
    out |= rotation_scores(rot, probe, classes)
    stats = gaussian(features(rot, x), y, classes)
    out["rotation-mahalanobis"] = mahalanobis(features(rot, probe), *stats)
    return out


def joint(args, fitted: list[tuple[Tensor, Tensor]], probe: Tensor) -> dict[str, Tensor]:
    """Each reference of ``--joint``: the task it picks for each row of ``probe``, from one
    network trained on every task's fitted images to name the task, or the class (task =
    class // classes a task)."""
    x = torch.cat([fx for fx, _ in fitted])
    task = torch.cat([torch.full((len(fx),), t) for t, (fx, _) in enumerate(fitted)])
    per_task = int(fitted[0][1].max()) + 1
    picked = {}
    for name in args.joint:
        start = time.time()
        arch, _, by_class = name.partition("-")
        labels = task * per_task + torch.cat([fy for _, fy in fitted]) if by_class else task
        outputs = len(fitted) * per_task if by_class else len(fitted)
        torch.manual_seed(0)
        net = train(arch, x, labels, outputs, False, args.joint_epochs, augment=arch == "cnn3")
        picked[name] = logits(net, probe).argmax(1) // (per_task if by_class else 1)
        print(f"reference {name}: {time.time() - start:.0f}s", flush=True)
    return picked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    parser.add_argument("--sequence", choices=("split", "rotated", "permuted"), default="split")
    parser.add_argument("--arch", choices=("fc", "cnn"), default="fc")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--train", type=int, default=0, help="training images a task (0: all)")
    parser.add_argument("--test", type=int, default=0, help="test images a task (0: all)")
    parser.add_argument("--skip-networks", action="store_true", help="input-subspace only")
    parser.add_argument("--lifts", action="store_true", help="also input-subspace's two lifts")
    parser.add_argument(
        "--joint", nargs="+", default=[], choices=("fc", "cnn", "cnn3", "cnn3-classes"),
        help="also references that are not exemplar-free: networks trained on every task's "
        "images to name the task (or the class)",
    )  # fmt: skip
    parser.add_argument("--joint-epochs", type=int, default=12)
    parser.add_argument("--save", type=Path, help="write every score here (torch.save)")
    parser.add_argument("--load", type=Path, help="analyse the scores --save wrote, no training")
    args = parser.parse_args()
    if args.load:
        analyse(torch.load(args.load, weights_only=True))
        return
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tasks = deal(args)
    fitted, helds = [], []
    for x, y, _ in tasks:
        held = torch.arange(len(x)) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
        fitted.append((x[~held], y[~held]))
        helds.append(x[held])
    # every score is taken on the test images and on every task's held-out tenth
    probe = torch.cat([test for _, _, test in tasks] + helds)
    sizes = [len(test) for _, _, test in tasks] + [len(h) for h in helds]
    truth = torch.cat([torch.full((n,), t % len(tasks)) for t, n in enumerate(sizes)])
    n_test = sum(sizes[: len(tasks)])
    scores = []
    for t, (x, y) in enumerate(fitted):
        start = time.time()
        scores.append(task_scores(args, x, y, probe))
        print(f"task {t}: {len(x)} fitted, {time.time() - start:.0f}s", flush=True)
    saved = {"scores": scores, "truth": truth, "n_test": torch.tensor(n_test)}
    if args.joint:
        saved["joint"] = joint(args, fitted, probe)
    if args.save:
        torch.save(saved, args.save)
    print(
        f"\n{args.sequence}, {args.arch}, {args.epochs} epochs, {len(fitted[0][0])} fitted a task"
    )
    analyse(saved)


def analyse(saved: dict, top: int = 15) -> None:
    """Print the share picked right per recipe, of the test images and of the held-out
    tenths: each score raw and standardised (``z``: minus the task's held-out mean, over its
    deviation; a task's own held-out tenth calibrates it) and scaled (``s``: over the tasks'
    mean held-out deviation, no shift: what keeps a log-likelihood's scale across tasks);
    sums of two or three scores, each standardised or scaled (the best ``top``, test images);
    then a summary: ``input-subspace`` (and its lifts) raw beside the references of
    ``--joint``."""
    scores, truth, n_test = saved["scores"], saved["truth"], int(saved["n_test"])
    tasks, names = range(len(scores)), list(scores[0])
    own = [(truth == t) & (torch.arange(len(truth)) >= n_test) for t in tasks]
    held = [{n: scores[t][n][own[t]] for n in names} for t in tasks]
    spread = {n: torch.stack([held[t][n].std() for t in tasks]).mean() for n in names}

    def variant(name: str, kind: str, t: int) -> Tensor:
        if kind == "z":
            return (scores[t][name] - held[t][name].mean()) / held[t][name].std()
        return scores[t][name] / spread[name]

    def shares(picked: Tensor) -> tuple[float, float]:
        right = 100 * (picked == truth).double()
        return float(right[:n_test].mean()), float(right[n_test:].mean())

    def share(score) -> tuple[float, float]:
        return shares(torch.stack([score(t) for t in tasks], 1).argmax(1))

    def row(label: str, value: tuple[float, float]) -> None:
        print(f"| {label} | {value[0]:.2f} | {value[1]:.2f} |")

    print("| recipe | task picked right: test (%) | held-out (%) |\n|---|---|---|")
    summary = {}
    for n in names:
        row(f"{n}, raw", share(lambda t, n=n: scores[t][n]))
        if n.startswith("input-subspace"):
            summary[n] = share(lambda t, n=n: scores[t][n])
        row(f"{n}, standardised", share(lambda t, n=n: variant(n, "z", t)))
    combos = []
    for k in (2, 3):
        for group in itertools.combinations(names, k):
            for kinds in itertools.product("zs", repeat=k):
                label = " + ".join(f"{kd}({n})" for n, kd in zip(group, kinds, strict=True))
                value = share(
                    lambda t, g=group, ks=kinds: sum(
                        variant(n, kd, t) for n, kd in zip(g, ks, strict=True)
                    )
                )
                combos.append((value, label))
    for value, label in sorted(combos, reverse=True)[:top]:
        row(label, value)
    # input-subspace plus a network's score, the weight picked on the test images: an upper
    # bound, not a recipe
    for n in (n for n in names if not n.startswith("input-subspace")):
        value, w = max(
            (
                share(
                    lambda t, w=w, n=n: variant("input-subspace", "s", t) + w * variant(n, "z", t)
                ),
                w,
            )
            for w in (0.05, 0.1, 0.2, 0.3, 0.5, 0.7)
        )
        row(f"s(input-subspace) + w z({n}), best w = {w} (on the test images)", value)
    for name, picked in saved.get("joint", {}).items():
        summary[f"reference {name} (sees every task)"] = shares(picked)
    print("\n| summary: the task picked by | test (%) | held-out (%) |\n|---|---|---|")
    for label, value in summary.items():
        row(label, value)


if __name__ == "__main__":
    main()
