"""One run trained data-parallel over the processes ``torchrun`` starts.

Every rank holds the whole run: the same supernet, the same task data and the same batch
generator, so every rank draws the same global batch of ``batch_size`` samples (the order is
the single-process order whatever the world size) and takes its contiguous slice of it
(:meth:`Ranks.shard`). Task BatchNorms normalise by the global batch's statistics while
training (:meth:`Ranks.step`). After the backward pass the gradients are summed over the
ranks, each weighted by its share of the global batch, before the frozen guard masks them
(:meth:`Ranks.average_gradients`): every rank then takes the same optimizer step, and frozen
and pruned weights stay bit-identical. Pruning decisions read only the weights, so they are
the same on every rank; :meth:`Ranks.check_same` compares a digest of the supernet at every
prune event and commit and stops the run where the ranks differ. Task BatchNorm statistics
are recalibrated over the ranks' batches and all-reduced (:func:`recalibrate`); accuracies
are counted over the ranks' test batches and summed (exact integers, so equal to one
process's).

The process group is ``torchrun``'s (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT`` in the environment): gloo on the CPU, NCCL on CUDA. Only rank 0 writes the
run directory (see :attr:`espn.api.run_directory.RunDirectory.writes`).
"""

from __future__ import annotations

import atexit
import hashlib
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from espn.data.tasks import Task
from espn.errors import EspnError
from espn.supernet.layers import SYNCED_BATCH_NORM
from espn.supernet.supernet import Supernet
from espn.training.batchnorm import recalibrate_batchnorm

#: how long a rank waits for the others at a collective before the run fails
TIMEOUT = timedelta(minutes=30)


class DistributedError(EspnError, RuntimeError):
    """The ranks of a data-parallel run disagree (a decision or weights differ), or the
    process group cannot be joined; the message names the ranks and the event."""


def under_torchrun() -> bool:
    """Whether this process was started by ``torchrun`` (or with its environment)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def join(enabled: bool, device: torch.device | str) -> Ranks | None:
    """The data-parallel ranks of this run: the process group ``torchrun``'s environment
    describes, joined here unless already (gloo on the CPU, NCCL on CUDA); None when not
    ``enabled`` or not under ``torchrun``."""
    if not enabled or not under_torchrun():
        return None
    cuda = torch.device(device).type == "cuda"
    if cuda and torch.device(device).index is not None and int(os.environ["WORLD_SIZE"]) > 1:
        raise DistributedError(
            f"device {str(device)!r} names one GPU for every rank; under torchrun give "
            "--device cuda (device='cuda'): each rank takes the GPU of its LOCAL_RANK"
        )
    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(local_device())
        try:
            dist.init_process_group("nccl" if cuda else "gloo", timeout=TIMEOUT)
        except (RuntimeError, ValueError) as exc:
            raise DistributedError(
                f"cannot join the process group torchrun describes (RANK={os.environ['RANK']}, "
                f"WORLD_SIZE={os.environ['WORLD_SIZE']}): {exc}; pass --no-distributed "
                "(distributed=False) to train in this process alone"
            ) from None
        atexit.register(dist.destroy_process_group)
    return Ranks(dist.get_rank(), dist.get_world_size(), local_device() if cuda else "cpu")


def local_device() -> torch.device:
    """The GPU of this rank: ``cuda:LOCAL_RANK``."""
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def writes_files() -> bool:
    """Whether this process writes a run's files: rank 0 of a process group, or a process
    that has none."""
    return not dist.is_initialized() or dist.get_rank() == 0


@dataclass(frozen=True)
class Share:
    """A rank's slice of a global batch: its inputs, labels, and their fraction of it."""

    ranks: Ranks
    x: Tensor
    y: Tensor
    weight: float


class Ranks:
    """Rank ``rank`` of ``world`` data-parallel processes training one run."""

    def __init__(self, rank: int, world: int, device: torch.device | str) -> None:
        self.rank, self.world, self.device = rank, world, torch.device(device)

    @property
    def writer(self) -> bool:
        """Rank 0 writes the run directory; the others write none of its files."""
        return self.rank == 0

    def shard(self, x: Tensor, y: Tensor) -> Share:
        """This rank's slice of the global batch ``(x, y)``: contiguous rows, the ranks'
        sizes differing by one at most; a batch smaller than the world (an epoch's short last
        one) whole on every rank, each counting for its ``1/world``."""
        n = len(y)
        if n < self.world:
            return Share(self, x, y, 1 / self.world)
        lo, hi = n * self.rank // self.world, n * (self.rank + 1) // self.world
        return Share(self, x[lo:hi], y[lo:hi], (hi - lo) / n)

    @contextmanager
    def step(self, x: Tensor, y: Tensor) -> Iterator[Share]:
        """A training step's slice of the global batch ``(x, y)`` (see :meth:`shard`); within
        it, training task BatchNorms normalise by the statistics of the global batch, as one
        process over the whole batch."""
        share = self.shard(x, y)
        SYNCED_BATCH_NORM.append(partial(_sync_batch_norm, self, share.weight))
        try:
            yield share
        finally:
            SYNCED_BATCH_NORM.pop()

    def mine(self, k: int) -> bool:
        """Whether batch ``k`` of a pass shared out whole (evaluation, recalibration) is this
        rank's."""
        return k % self.world == self.rank

    def average_gradients(self, params: Sequence[Tensor], loss: Tensor, weight: float) -> Tensor:
        """Replace each gradient by the global batch's: the ranks' gradients weighted by
        their share of the batch and summed (one all-reduce); the global batch's loss. The
        same parameters have a gradient on every rank (the same graph); the others keep
        ``None``."""
        grads = [p.grad for p in params if p.grad is not None]
        dtype = torch.float32
        for g in grads:
            dtype = torch.promote_types(dtype, g.dtype)
        parts = [g.reshape(-1).to(dtype) for g in grads]
        flat = torch.cat([*parts, loss.detach().reshape(1).to(dtype)]).mul_(weight)
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view(g.shape))
            offset += g.numel()
        return flat[-1].to(loss.dtype)

    def total(self, *counts: int) -> list[int]:
        """``counts`` summed over the ranks."""
        summed = self.sum_(torch.tensor(counts, dtype=torch.long, device=self.device))
        return [int(v) for v in summed.tolist()]

    def sum_(self, t: Tensor) -> Tensor:
        """Sum ``t`` over the ranks, in place."""
        dist.all_reduce(t)
        return t

    def check_same(self, supernet: Supernet, event: str) -> None:
        """Stop the run unless every rank holds the same supernet (masks, owner ids, weights,
        BatchNorm statistics): its :func:`digest` compared over the ranks; where they differ,
        the message names the first entry of the state dict that does."""
        entries = entry_digests(supernet)
        whole = self._gathered(hashlib.sha256(b"".join(entries.values())).digest())
        others = [r for r, d in enumerate(whole) if d != whole[0]]
        if not others:
            return
        each = self._gathered(b"".join(entries.values()))
        keys = list(entries)
        differ = [k for i, k in enumerate(keys) if len({d[32 * i : 32 * i + 32] for d in each}) > 1]
        raise DistributedError(
            f"{event}: rank(s) {others} hold another supernet than rank 0 (first in "
            f"{differ[0] if differ else 'its layout'}); the ranks diverged, so the run stops "
            "(its last checkpoint is kept)"
        )

    def _gathered(self, data: bytes) -> list[bytes]:
        """``data`` (of the same length on every rank) of every rank, in rank order."""
        mine = torch.tensor(list(data), dtype=torch.uint8, device=self.device)
        gathered = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(gathered, mine)
        return [bytes(t.tolist()) for t in gathered]

    def barrier(self) -> None:
        """Wait for every rank."""
        dist.barrier()


def entry_digests(supernet: Supernet) -> dict[str, bytes]:
    """SHA-256 of each entry of the supernet's state dict: its tensors' bits, learned tasks,
    owner ids, which task is in training."""
    out = {}
    for key, value in supernet.state_dict().items():
        h = hashlib.sha256()
        _feed(h, value)
        out[key] = h.digest()
    return out


def digest(supernet: Supernet) -> str:
    """SHA-256 of the supernet's state (of its :func:`entry_digests`)."""
    return hashlib.sha256(b"".join(entry_digests(supernet).values())).hexdigest()


def _feed(h: Any, value: Any) -> None:
    """Feed ``value`` (tensors, numbers, strings, and lists and dicts of them) to ``h``."""
    if isinstance(value, Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            h.update(str(k).encode())
            _feed(h, value[k])
    elif isinstance(value, list | tuple):
        for v in value:
            _feed(h, v)
    else:
        h.update(repr(value).encode())


@torch.no_grad()
def recalibrate(ranks: Ranks | None, supernet: Supernet, task: Task, batch_size: int) -> int:
    """:func:`~espn.training.batchnorm.recalibrate_batchnorm` over the ranks (None: this
    process alone): each averages the statistics of its share of the batches, and the shares
    are weighted by their batch counts and summed; the batches used in all."""
    used = recalibrate_batchnorm(supernet, task, batch_size, take=ranks.mine if ranks else None)
    if ranks is None:
        return used
    norms = [m for m in supernet.task_modules.values() if isinstance(m, _BatchNorm)]
    if not norms:
        return 0
    total = ranks.sum_(torch.tensor([float(used)], device=next(supernet.parameters()).device))
    for m in norms:
        for stat in (m.running_mean, m.running_var):
            if stat is not None:
                ranks.sum_(stat.mul_(used / float(total)))
        if m.num_batches_tracked is not None:
            ranks.sum_(m.num_batches_tracked)
    return int(total)


def _sync_batch_norm(
    ranks: Ranks, share: float, norm: Any, x: Tensor, weight: Tensor, bias: Tensor, factor: float
) -> Tensor:
    """A training task BatchNorm over the global batch: its mean and variance summed over the
    ranks (two passes, as one process computes them), the running statistics updated with
    them by ``factor``."""
    y, mean, var, count = _GlobalBatchNorm.apply(x, weight, bias, norm.eps, share, ranks)
    with torch.no_grad():
        unbiased = var * (count / max(count - 1.0, 1.0))
        norm.running_mean.lerp_(mean, factor)
        norm.running_var.lerp_(unbiased, factor)
    out: Tensor = y
    return out


class _GlobalBatchNorm(torch.autograd.Function):
    """Batch normalisation by statistics over every rank's slice of the global batch; the
    backward pass sums its two per-channel terms over the ranks likewise. Gradients are in
    this rank's loss's units (its slice's mean), as the weights' before they are averaged."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor, bias: Tensor, eps: float, share: float, ranks: Ranks
    ) -> tuple[Tensor, Tensor, Tensor, float]:
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        sums = torch.cat([x.sum(dims), x.new_tensor([x.numel() // x.shape[1]])])
        ranks.sum_(sums)
        count = float(sums[-1])
        mean = sums[:-1] / count
        centred = x - mean.view(shape)
        var = ranks.sum_((centred * centred).sum(dims)) / count
        invstd = torch.rsqrt(var + eps)
        xhat = centred * invstd.view(shape)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.count, ctx.share, ctx.ranks = count, share, ranks
        ctx.mark_non_differentiable(mean, var)
        return xhat * weight.view(shape) + bias.view(shape), mean, var, count

    @staticmethod
    def backward(ctx: Any, dy: Tensor, *_: Any) -> tuple[Tensor, Tensor, Tensor, None, None, None]:
        xhat, weight, invstd = ctx.saved_tensors
        dims = [0, *range(2, dy.dim())]
        shape = [1, -1] + [1] * (dy.dim() - 2)
        local = torch.cat([dy.sum(dims), (dy * xhat).sum(dims)])
        channels = weight.numel()
        d_bias, d_weight = local[:channels].clone(), local[channels:].clone()
        total = ctx.ranks.sum_(local.mul_(ctx.share)).div_(ctx.share * ctx.count)
        mean_dy, mean_dy_xhat = total[:channels].view(shape), total[channels:].view(shape)
        dx = (weight * invstd).view(shape) * (dy - mean_dy - xhat * mean_dy_xhat)
        return dx, d_weight, d_bias, None, None, None
