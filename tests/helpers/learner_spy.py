"""A spy on the one learner: which tasks each :class:`ContinualLearner` learned, and which
tasks the training engine trained and for whom (the ``learner`` its events name: the learner
driving it; None for an engine driven by anything else)."""

from __future__ import annotations

from typing import Any

import pytest

from espn.api.learner import ContinualLearner
from espn.training.callbacks import Callback, TrainStart
from helpers.deploy import watch_engines


class LearnerSpy(Callback):
    """Installed on ``monkeypatch``; records, in order, every sequence and every task given
    to a learner, and every task the engine trained (name, driven by a learner?)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sequences: list[list[str]] = []
        self.learned: list[str] = []
        self.trained: list[tuple[str, bool]] = []
        spy = self
        learn_sequence, learn = ContinualLearner.learn_sequence, ContinualLearner.learn

        def sequence_seen(learner: ContinualLearner, seq: Any, **kw: Any) -> Any:
            spy.sequences.append(seq.names())
            return learn_sequence(learner, seq, **kw)

        def task_seen(learner: ContinualLearner, *args: Any, **kw: Any) -> Any:
            spy.learned.append(str(kw.get("name")))
            return learn(learner, *args, **kw)

        monkeypatch.setattr(ContinualLearner, "learn_sequence", sequence_seen)
        monkeypatch.setattr(ContinualLearner, "learn", task_seen)
        watch_engines(monkeypatch, self)

    def on_train_start(self, learner: Any, event: TrainStart) -> None:
        self.trained.append((event.name, isinstance(learner, ContinualLearner)))

    @property
    def trained_by_learner(self) -> bool:
        """Whether every task the engine trained was trained for a learner."""
        return bool(self.trained) and all(by for _, by in self.trained)
