"""A spy on the one learner: which tasks each :class:`ContinualLearner` learned, and which
tasks the training engine trained and for whom (its ``owner``: the learner driving it; None
for an engine driven by anything else)."""

from __future__ import annotations

from typing import Any

import pytest

from espn.learner import ContinualLearner
from espn.training.engine import Engine


class LearnerSpy:
    """Installed on ``monkeypatch``; records, in order, every sequence and every task given
    to a learner, and every task the engine trained (name, driven by a learner?)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sequences: list[list[str]] = []
        self.learned: list[str] = []
        self.trained: list[tuple[str, bool]] = []
        spy = self
        learn_sequence, learn, train_task = (
            ContinualLearner.learn_sequence,
            ContinualLearner.learn,
            Engine.train_task,
        )

        def sequence_seen(learner: ContinualLearner, seq: Any, **kw: Any) -> Any:
            spy.sequences.append(seq.names())
            return learn_sequence(learner, seq, **kw)

        def task_seen(learner: ContinualLearner, *args: Any, **kw: Any) -> Any:
            spy.learned.append(str(kw.get("name")))
            return learn(learner, *args, **kw)

        def trained(engine: Engine, task: Any, *args: Any, **kw: Any) -> Any:
            spy.trained.append((task.name, isinstance(engine.owner, ContinualLearner)))
            return train_task(engine, task, *args, **kw)

        monkeypatch.setattr(ContinualLearner, "learn_sequence", sequence_seen)
        monkeypatch.setattr(ContinualLearner, "learn", task_seen)
        monkeypatch.setattr(Engine, "train_task", trained)

    @property
    def trained_by_learner(self) -> bool:
        """Whether every task the engine trained was trained for a learner."""
        return bool(self.trained) and all(by for _, by in self.trained)
