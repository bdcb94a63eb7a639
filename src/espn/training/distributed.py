"""One run trained data-parallel over the processes ``torchrun`` starts: the same steps at any
world size (:func:`sharded_step`, :func:`recalibrate`, :meth:`Ranks.check_same`); only rank 0
writes the run directory. How and why: docs/distributed.md.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import os
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from espn.data.tasks import Task
from espn.errors import EspnError
from espn.layers.batchnorm2d import SHARD_BATCH_NORM
from espn.supernet.supernet import Supernet

#: how long a rank waits for the others at a collective before the run fails
TIMEOUT = timedelta(minutes=30)


class DistributedError(EspnError, RuntimeError):
    """The ranks of a data-parallel run disagree (a decision or weights differ), or the
    process group cannot be joined; the message names the ranks and the event."""


def join(enabled: bool, device: torch.device | str) -> Ranks | None:
    """The data-parallel ranks of this run: the process group ``torchrun``'s environment
    describes, joined here unless already (gloo on the CPU, NCCL on CUDA); None when not
    ``enabled`` or not under ``torchrun``."""
    if not enabled or "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
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
        # torch._dynamo (a process's first optimizer imports it) imports modules whose defaults
        # hold the default group: imported after the join, they would keep its gloo threads
        # alive into the interpreter's teardown, where they abort the process at random
        importlib.import_module("torch._dynamo")
        try:
            dist.init_process_group("nccl" if cuda else "gloo", timeout=TIMEOUT)
        except (RuntimeError, ValueError) as exc:
            raise DistributedError(
                f"cannot join the process group torchrun describes (RANK={os.environ['RANK']}, "
                f"WORLD_SIZE={os.environ['WORLD_SIZE']}): {exc}; pass --no-distributed "
                "(distributed=False) to train in this process alone"
            ) from None
        atexit.register(_leave)
    return Ranks(dist.get_rank(), dist.get_world_size(), local_device() if cuda else "cpu")


def _leave() -> None:
    """Destroy the process group at exit, while the interpreter is whole (unless the script
    destroyed it)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def local_device() -> torch.device:
    """The GPU of this rank: ``cuda:LOCAL_RANK``."""
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def writes_files() -> bool:
    """Whether this process writes a run's files: rank 0 of a process group, or a process
    that has none."""
    return not dist.is_initialized() or dist.get_rank() == 0


class Ranks:
    """Rank ``rank`` of ``world`` data-parallel processes training one run."""

    def __init__(self, rank: int, world: int, device: torch.device | str) -> None:
        self.rank, self.world, self.device = rank, world, torch.device(device)

    @property
    def writer(self) -> bool:
        """Rank 0 writes the run directory; the others write none of its files."""
        return self.rank == 0

    def mine(self, k: int) -> bool:
        """Whether batch ``k`` of a pass shared out whole (evaluation, recalibration) is this
        rank's."""
        return k % self.world == self.rank

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
        mine = torch.tensor([list(data)], dtype=torch.uint8, device=self.device)
        return [bytes(t[0].tolist()) for t in _gathered_rows(self, mine, [1] * self.world)]

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


def shard_count(shards: int | None, ranks: Ranks | None) -> int:
    """The slices a training step computes its batch in: ``shards``, unset the world size (1
    in a process alone); refuses fewer slices than ranks (a rank would have none)."""
    world = 1 if ranks is None else ranks.world
    if shards is None:
        return world
    if shards < world:
        raise DistributedError(
            f"shards {shards} is fewer than the {world} processes of this run: give --shards "
            f"(shards=) of at least {world}, or leave it unset (the number of processes)"
        )
    return shards


#: what a sharded pass records of each task BatchNorm call, in call order: the norm, the
#: mean and biased variance of its input per channel, and its values per channel
Record = list[tuple[Any, Tensor, Tensor, int]]


def sharded_step(
    ranks: Ranks | None,
    count: int,
    x: Tensor,
    y: Tensor,
    backward: Callable[[Tensor, Tensor], Tensor],
    params: Sequence[Tensor],
) -> Tensor:
    """The gradients of ``params`` for the batch ``(x, y)`` computed in ``count`` slices of
    contiguous rows, each rank its contiguous run of them: ``backward`` differentiates each
    slice's loss alone (and returns it); gradients are summed in slice order, so no sum
    depends on the world size (docs/distributed.md). A process alone in one slice, and a
    batch of fewer than ``count`` samples, are trained whole. Returns the batch's loss."""
    n = len(y)
    if n < count or (count == 1 and ranks is None):
        return backward(x, y)
    rank, world = (0, 1) if ranks is None else (ranks.rank, ranks.world)
    bounds = [n * s // count for s in range(count + 1)]
    rows: list[Tensor] = []
    record: Record = []
    held: list[Tensor] = []
    for s in range(count * rank // world, count * (rank + 1) // world):
        for p in params:
            p.grad = None
        record = []
        SHARD_BATCH_NORM.append(partial(_shard_batch_norm, record))
        try:
            loss = backward(x[bounds[s] : bounds[s + 1]], y[bounds[s] : bounds[s + 1]])
        finally:
            SHARD_BATCH_NORM.pop()
        held = [p for p in params if p.grad is not None]
        rows.append(_row([*(p.grad for p in held if p.grad is not None), loss.detach()], record))
    runs = [count * (r + 1) // world - count * r // world for r in range(world)]
    table = torch.cat(_gathered_rows(ranks, torch.stack(rows), runs))
    size = sum(p.numel() for p in held) + 1
    share = torch.tensor(bounds, device=table.device).diff().to(table.dtype).div_(n).unsqueeze(1)
    summed = (table[:, :size] * share).sum(0)
    offset = 0
    for p in held:
        p.grad = summed[offset : offset + p.numel()].view(p.shape).to(p.dtype).clone()
        offset += p.numel()
    with torch.no_grad():
        for norm, means, variances, counts in _calls(record, table[:, size:]):
            total = counts.sum()
            weights = counts / total
            mean = (means * weights).sum(0)
            var = ((variances + (means - mean) ** 2) * weights).sum(0)
            norm.num_batches_tracked.add_(1)
            factor = norm.momentum
            if factor is None:  # cumulative moving average, as torch's BatchNorm
                factor = 1.0 / float(norm.num_batches_tracked)
            norm.running_mean.lerp_(mean.to(norm.running_mean.dtype), factor)
            unbiased = var * (total / (total - 1).clamp(min=1))
            norm.running_var.lerp_(unbiased.to(norm.running_var.dtype), factor)
    return summed[-1].to(loss.dtype)


#: training batches (in order, no augmentation) the statistics are averaged over; the whole
#: training split of a task when it has fewer
RECALIBRATION_BATCHES = 100


@torch.no_grad()
def recalibrate_batchnorm(
    supernet: Supernet,
    task: Task,
    batch_size: int,
    max_batches: int = RECALIBRATION_BATCHES,
    take: Callable[[int], bool] | None = None,
) -> int:
    """Reset the working sub-network's BatchNorm statistics and recompute them over (at most
    ``max_batches`` batches of) ``task``'s training data; returns the batches used (0 when
    the supernet has no BatchNorm). ``take``: which of those batches (by number) this
    process uses (a data-parallel rank its share).

    Batch ``k`` enters with momentum ``1/k``: the running statistics end as the plain mean of
    the batches' means and (unbiased) variances, as ``nn.BatchNorm2d(momentum=None)`` computes.
    """
    norms = [
        m for m in supernet.task_modules.values() if isinstance(m, nn.modules.batchnorm._BatchNorm)
    ]
    if not norms:
        return 0
    saved = [(m.momentum, m.training) for m in norms]
    was_training = supernet.training
    supernet.eval()
    for m in norms:
        m.reset_running_stats()
        m.train()
    used = 0
    try:
        for k, (x, _) in enumerate(task.batches("train", batch_size, augment=False)):
            if k == max_batches:
                break
            if take is not None and not take(k):
                continue
            used += 1
            for m in norms:
                m.momentum = 1.0 / used
            supernet.forward_working(x)
    finally:
        for m, (momentum, training) in zip(norms, saved, strict=True):
            m.momentum = momentum
            m.train(training)
        supernet.train(was_training)
    return used


@torch.no_grad()
def recalibrate(
    ranks: Ranks | None, count: int, supernet: Supernet, task: Task, batch_size: int
) -> int:
    """:func:`recalibrate_batchnorm` as a training step of ``count`` slices computes it (one
    process alone in one slice: that function itself), the same at any world size
    (docs/distributed.md, "BatchNorm per slice"). Returns the batches used."""
    if count == 1 and ranks is None:
        return recalibrate_batchnorm(supernet, task, batch_size)
    world = 1 if ranks is None else ranks.world
    record: Record = []
    SHARD_BATCH_NORM.append(partial(_shard_batch_norm, record))
    try:
        used = recalibrate_batchnorm(
            supernet, task, batch_size, take=None if ranks is None else ranks.mine
        )
        batches = used if ranks is None else ranks.total(used)[0]
        if used == 0 and batches > 0:  # this rank's share is empty: the calls' layout alone
            recalibrate_batchnorm(supernet, task, batch_size, max_batches=1)
    finally:
        SHARD_BATCH_NORM.pop()
    calls = len(record) // max(used, 1)  # the task BatchNorm calls of a batch
    if calls == 0:
        return batches
    rows = torch.stack([_row([], record[k : k + calls]) for k in range(0, len(record), calls)])
    parts = _gathered_rows(
        ranks, rows[:used], [len(range(r, batches, world)) for r in range(world)]
    )
    table = torch.stack([parts[b % world][b // world] for b in range(batches)])
    for norm, means, variances, counts in _calls(record[:calls], table):
        norm.running_mean.copy_(means.mean(0))
        norm.running_var.copy_((variances * counts / (counts - 1).clamp(min=1)).mean(0))
        norm.num_batches_tracked.fill_(batches)
    return batches


def _shard_batch_norm(record: Record, norm: Any, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """A training task BatchNorm over this slice alone; its statistics go to ``record`` (the
    running ones are the caller's)."""
    dims = [0, *range(2, x.dim())]
    var, mean = torch.var_mean(
        x.detach().to(torch.promote_types(x.dtype, torch.float32)), dims, correction=0
    )
    record.append((norm, mean, var, x.numel() // x.shape[1]))
    out: Tensor = F.batch_norm(x, None, None, weight, bias, True, 0.0, norm.eps)
    return out


def _row(tensors: Sequence[Tensor], record: Record) -> Tensor:
    """``tensors`` and the statistics in ``record`` flattened into one row (float32 at least)."""
    parts = [*tensors, *(torch.cat([m, v, m.new_tensor([c])]) for _, m, v, c in record)]
    dtype = torch.float32
    for t in parts:
        dtype = torch.promote_types(dtype, t.dtype)
    return torch.cat([t.reshape(-1).to(dtype) for t in parts])


def _calls(record: Record, table: Tensor) -> Iterator[tuple[Any, Tensor, Tensor, Tensor]]:
    """Per BatchNorm call of ``record``, its columns of ``table`` (one row per slice or
    batch): the means, the biased variances, the values per channel (a column)."""
    offset = 0
    for norm, mean, _, _ in record:
        c = mean.numel()
        part = table[:, offset : offset + 2 * c + 1]
        offset += 2 * c + 1
        yield norm, part[:, :c], part[:, c : 2 * c], part[:, 2 * c :]


def _gathered_rows(ranks: Ranks | None, mine: Tensor, counts: Sequence[int]) -> list[Tensor]:
    """Every rank's rows (``mine`` here: ``counts[rank]`` rows of one length on every rank),
    in rank order."""
    if ranks is None:
        return [mine]
    padded = mine
    if len(mine) < max(counts):
        padded = torch.cat([mine, mine.new_zeros(max(counts) - len(mine), mine.shape[1])])
    gathered = [torch.empty_like(padded) for _ in range(ranks.world)]
    dist.all_gather(gathered, padded)
    return [g[:c] for g, c in zip(gathered, counts, strict=True)]
