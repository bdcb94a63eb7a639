"""Accuracy, continual-learning metrics and plots."""

from espn.evaluation.metrics import (
    average_accuracy,
    backward_transfer,
    final_accuracy,
    forgetting,
    task_accuracy,
    task_logits,
)

__all__ = [
    "average_accuracy",
    "backward_transfer",
    "final_accuracy",
    "forgetting",
    "task_accuracy",
    "task_logits",
]
