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
- ``--joint``: a reference that is not exemplar-free, one network naming the task.

    python benchmarks/routing_study.py --data-dir /usr/share/datasets/fashion-mnist --epochs 5
    python benchmarks/routing_study.py --arch cnn --train 4000 --epochs 5
    python benchmarks/routing_study.py --skip-networks --joint --epochs 5

(FC: 2-3 minutes a task at one thread on the shared machine; CNN on 3,600 images: 5.)
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
from espn.inference.subspace import fit_subspaces, subspace_nll

MEAN, STD = 0.2860, 0.3530  # espn's Fashion-MNIST normalisation
HELD_OUT_EVERY = 10
ROTATIONS = 4


def load(root: Path, train: bool) -> tuple[Tensor, Tensor]:
    x, y = fashion_mnist(root, train=train)
    return (x - MEAN) / STD, y


def network(arch: str, outputs: int) -> nn.Sequential:
    if arch == "fc":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
            nn.Linear(1024, outputs),
        )  # fmt: skip
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 256), nn.ReLU(), nn.Linear(256, outputs),
    )  # fmt: skip


def rotations(x: Tensor) -> list[Tensor]:
    return [torch.rot90(x, r, dims=(2, 3)) for r in range(ROTATIONS)]


def train(arch: str, x: Tensor, y: Tensor, classes: int, rotate: bool, epochs: int) -> nn.Module:
    """The task's network on its own data: C outputs, or a class per (class, rotation)."""
    net = network(arch, classes * (ROTATIONS if rotate else 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(epochs):
        for rows in torch.randperm(len(x)).split(128):
            xb, yb = x[rows], y[rows]
            if rotate:  # label (class, r) = r * C + class
                xb = torch.cat(rotations(xb))
                yb = torch.cat([r * classes + yb for r in range(ROTATIONS)])
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


def task_scores(args, x: Tensor, y: Tensor, probe: Tensor) -> dict[str, Tensor]:
    """Every recipe's score of each row of ``probe`` for the task of ``(x, y)``."""
    out = {"input-subspace": -subspace_nll(probe, fit_subspaces(x, y)).double()}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    parser.add_argument("--arch", choices=("fc", "cnn"), default="fc")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--train", type=int, default=0, help="training images a task (0: all)")
    parser.add_argument("--test", type=int, default=0, help="test images a task (0: all)")
    parser.add_argument("--skip-networks", action="store_true", help="input-subspace only")
    parser.add_argument(
        "--joint", action="store_true",
        help="also a reference that is not exemplar-free: one network trained on every task's "
        "images to name the task",
    )  # fmt: skip
    parser.add_argument("--save", type=Path, help="write every score here (torch.save)")
    parser.add_argument("--load", type=Path, help="analyse the scores --save wrote, no training")
    args = parser.parse_args()
    if args.load:
        analyse(torch.load(args.load, weights_only=True))
        return
    torch.set_num_threads(1)
    torch.manual_seed(0)
    order = torch.randperm(10, generator=torch.Generator().manual_seed(0)).tolist()
    train_x, train_y = load(args.data_dir, True)
    test_x, test_y = load(args.data_dir, False)
    tests, truth = [], []
    for t in range(5):
        keep = torch.nonzero((test_y == order[2 * t]) | (test_y == order[2 * t + 1])).flatten()
        keep = keep[: args.test] if args.test else keep
        tests.append(test_x[keep])
        truth.append(torch.full((len(keep),), t))
    probe, truth_t = torch.cat(tests), torch.cat(truth)
    scores, held_scores, fitted = [], [], []
    for t in range(5):
        start = time.time()
        pair = order[2 * t : 2 * t + 2]
        keep = torch.nonzero((train_y == pair[0]) | (train_y == pair[1])).flatten()
        if args.train:
            keep = keep[: args.train]
        x, y = train_x[keep], (train_y[keep] == pair[1]).long()
        held = torch.arange(len(x)) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
        s = task_scores(args, x[~held], y[~held], torch.cat([probe, x[held]]))
        fitted.append(x[~held])
        scores.append({k: v[: len(probe)] for k, v in s.items()})
        held_scores.append({k: v[len(probe) :] for k, v in s.items()})
        print(
            f"task {t} {pair}: {int((~held).sum())} fitted, {time.time() - start:.0f}s", flush=True
        )
    saved = {"scores": scores, "held": held_scores, "truth": truth_t}
    if args.save:
        torch.save(saved, args.save)
    print(f"\n{args.arch}, {args.epochs} epochs, {int((~held).sum())} images fitted a task")
    analyse(saved)
    if args.joint:
        tasks = torch.cat([torch.full((len(f),), t) for t, f in enumerate(fitted)])
        joint = train(args.arch, torch.cat(fitted), tasks, len(fitted), False, args.epochs)
        picked = logits(joint, probe).argmax(1)
        print(
            f"| joint network (reference, sees every task) | "
            f"{100 * float((picked == truth_t).double().mean()):.2f} |"
        )


def analyse(saved: dict, top: int = 15) -> None:
    """Print the share picked right per recipe: each score raw, standardised (``z``: minus
    the task's held-out mean, over its deviation) and scaled (``s``: over the tasks' mean
    held-out deviation, no shift: what keeps a log-likelihood's scale across tasks); sums of
    two or three scores, each standardised or scaled (the best ``top``)."""
    scores, held, truth = saved["scores"], saved["held"], saved["truth"]
    tasks, names = range(len(scores)), list(scores[0])
    spread = {n: torch.stack([held[t][n].std() for t in tasks]).mean() for n in names}

    def variant(name: str, kind: str, t: int) -> Tensor:
        if kind == "z":
            return (scores[t][name] - held[t][name].mean()) / held[t][name].std()
        return scores[t][name] / spread[name]

    def share(score) -> float:
        picked = torch.stack([score(t) for t in tasks], 1).argmax(1)
        return 100 * float((picked == truth).double().mean())

    print("| recipe | task picked right (%) |\n|---|---|")
    for n in names:
        print(
            f"| {n}: raw / standardised | {share(lambda t, n=n: scores[t][n]):.2f} / "
            f"{share(lambda t, n=n: variant(n, 'z', t)):.2f} |"
        )
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
        print(f"| {label} | {value:.2f} |")
    if "input-subspace" not in names:
        return
    for n in names[1:]:  # the weight picked on the test images: an upper bound, not a recipe
        best = max(
            (
                share(
                    lambda t, w=w, n=n: variant("input-subspace", "s", t) + w * variant(n, "z", t)
                ),
                w,
            )
            for w in (0.05, 0.1, 0.2, 0.3, 0.5, 0.7)
        )
        print(
            f"| s(input-subspace) + w z({n}), best w = {best[1]} (on the test images) | {best[0]:.2f} |"
        )


if __name__ == "__main__":
    main()
