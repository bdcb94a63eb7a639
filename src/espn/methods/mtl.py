"""Multitask learning: all tasks trained jointly on one shared network, batches mixing tasks."""

from __future__ import annotations

from dataclasses import replace

from torch import Tensor

from espn.data.joint import JointTask
from espn.data.tasks import Task, TaskSequence
from espn.methods.base import METHODS, Phase, Strategy
from espn.settings.training import TrainingSettings
from espn.supernet.layers import TaskHead
from espn.supernet.masks import TaskMask
from espn.supernet.supernet import Supernet


def task_views(task: JointTask, joint: TaskMask, heads: list[str]) -> list[TaskMask]:
    """One :class:`TaskMask` per task of ``task`` from the joint one: same sub-network and state,
    with each task's block of the joint ``heads`` (TaskHead modules) as its own head."""
    out = []
    for t, single in enumerate(task.tasks):
        lo, hi = task.offsets[t], task.offsets[t] + single.n_classes
        state = {}
        for key, value in joint.state.items():
            module = key.rsplit(".", 1)[0]
            state[key] = value[lo:hi].clone() if module in heads else value
        out.append(
            replace(
                joint,
                state=state,
                n_classes=single.n_classes,
                new_weights=joint.new_weights if t == 0 else 0,
            )
        )
    return out


@METHODS.register("mtl")
class MTL(Strategy):
    """Multitask learning: all tasks trained jointly on one dense network, a head per task,
    with the epochs every other method spends on each task, no pruning; the joint network
    is committed as every task's sub-network (docs/methods.md)."""

    uses_gamma = False
    uses_alpha = False
    accepts_pretrained = False

    def __init__(self, cfg: TrainingSettings) -> None:
        super().__init__(cfg)
        self.joint: JointTask | None = None

    def phases(self) -> list[Phase]:
        return self.joint_phases("train")

    def training_tasks(self, seq: TaskSequence) -> list[Task]:
        self.joint = JointTask(seq)
        return [self.joint]

    def loss(self, logits: Tensor, y: Tensor) -> Tensor:
        if self.joint is None:
            raise RuntimeError("MTL trains the JointTask that training_tasks(seq) returns")
        return self.joint.loss(logits, y)

    def commit(self, supernet: Supernet, task: Task) -> None:
        """Commit the joint network, then file it as one sub-network per task."""
        if not isinstance(task, JointTask):
            raise TypeError(f"MTL trains a JointTask, got {type(task).__name__}")
        supernet.commit_task(self.weights)
        joint = supernet.masks.pop()
        heads = [n for n, m in supernet.task_modules.items() if isinstance(m, TaskHead)]
        supernet.masks.extend(task_views(task, joint, heads))
        supernet.active_task = None
