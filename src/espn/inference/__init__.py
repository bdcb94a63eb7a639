"""Task-agnostic prediction: infer which task a sample belongs to from the tasks'
sub-networks, then classify it with that task's sub-network. The rules (:data:`RULES`, by
name), what each costs, stores and achieves: docs/task-agnostic.md.
"""

from espn.inference import oneshot, subspace  # noqa: F401  (each registers its rule)
from espn.inference.evaluate import evaluate_named, evaluate_rules, evaluate_task_agnostic
from espn.inference.outputs import InferenceError
from espn.inference.predict import DEFAULT_RULE, Inferred, get_rule, infer, predict_given
from espn.inference.rule import RULES, OutputRule, Rule
from espn.inference.statistics import task_statistics

__all__ = [
    "DEFAULT_RULE",
    "RULES",
    "InferenceError",
    "Inferred",
    "OutputRule",
    "Rule",
    "evaluate_named",
    "evaluate_rules",
    "evaluate_task_agnostic",
    "get_rule",
    "infer",
    "predict_given",
    "task_statistics",
]
