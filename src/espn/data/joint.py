"""All tasks of a sequence as one task (multitask learning's joint data): batches mix tasks,
each sample transformed by its own task."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from espn.data.tasks import Split, Task, TaskSequence


def _joint_split(tasks: list[Task], split: str, offsets: list[int]) -> Split:
    """Every sample of ``split`` of every task: ``x`` holds its task, ``index`` its row in
    that task's split, ``y`` its label shifted by its task's label offset."""
    parts = [t.split(split) for t in tasks]
    device = parts[0].y.device
    owner = torch.cat(
        [torch.full((len(p),), t, dtype=torch.long, device=device) for t, p in enumerate(parts)]
    )
    rows = torch.cat([torch.arange(len(p), device=device) for p in parts])
    labels = torch.cat([p.y + off for p, off in zip(parts, offsets, strict=True)])
    return Split(owner, rows, labels)


class JointTask(Task):
    """All tasks of a sequence as one task whose shuffled batches mix every task's samples.
    With one head per task the joint head holds every task's classes side by side (labels
    offset into their task's block, :meth:`loss` a softmax over that block only); with a
    shared head the labels are the tasks' own."""

    def __init__(self, seq: TaskSequence) -> None:
        self.tasks = list(seq.tasks)
        self.multi_head = seq.multi_head
        sizes = [t.n_classes for t in self.tasks]
        if self.multi_head:
            self.offsets = [sum(sizes[:t]) for t in range(len(sizes))]
            n_classes = sum(sizes)
        else:
            self.offsets = [0] * len(sizes)
            n_classes = seq.n_classes
        super().__init__(
            name=f"joint ({len(self.tasks)} tasks)",
            train=_joint_split(self.tasks, "train", self.offsets),
            test=_joint_split(self.tasks, "test", self.offsets),
            transform=self._no_transform,
            n_classes=n_classes,
        )
        device = self.train.y.device
        column_task = [t for t, n in enumerate(sizes) for _ in range(n)]
        #: the task each column of the joint head (= each joint label) belongs to
        self.column_task = torch.tensor(column_task, dtype=torch.long, device=device)

    @staticmethod
    def _no_transform(x: Tensor, train: bool) -> Tensor:
        raise TypeError("a JointTask's samples are transformed by their own tasks in batches()")

    def inputs(self, split: str, rows: list[Tensor], train: bool) -> Iterator[Tensor]:
        """The inputs of each batch: each task's samples transformed together by that task's
        transform."""
        data = self.split(split)
        for batch in rows:
            owner, local = data.x[batch], data.index[batch]
            out: Tensor | None = None
            for t in torch.unique(owner).tolist():
                where = torch.nonzero(owner == t).squeeze(1)
                part = self.tasks[t].split(split)
                inputs = self.tasks[t].transform(part.x[part.index[local[where]]], train)
                if out is None:
                    out = inputs.new_empty((len(batch), *inputs.shape[1:]))
                out[where] = inputs
            assert out is not None
            yield out

    def loss(self, logits: Tensor, y: Tensor) -> Tensor:
        """Cross-entropy of every sample over its own task's classes."""
        if not self.multi_head:
            return F.cross_entropy(logits, y)
        sample_task = self.column_task[y]
        other = self.column_task.unsqueeze(0) != sample_task.unsqueeze(1)
        return F.cross_entropy(logits.masked_fill(other, float("-inf")), y)
