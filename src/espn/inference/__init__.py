"""Task-agnostic prediction: infer which task a sample belongs to from the tasks'
sub-networks, then classify it with that task's sub-network.

Rules (:data:`RULES`, by name): ``entropy`` (lowest softmax entropy), ``energy``,
``mahalanobis`` (nearest class mean of the penultimate features, from statistics each task
stores when it is committed), ``entropy-mahalanobis`` (both, standardised),
``input-gaussian`` (the likelihood of the input under each task's stored class Gaussians;
the default), ``input-subspace`` (a mixture of principal-subspace Gaussians of the inputs
and their edges, stored with the ``task_agnostic`` option) and ``supsup-oneshot`` (SupSup's entropy gradient over superposed masks). See
docs/task-agnostic.md for what each costs, stores and achieves.
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
