"""Unit (channel/neuron) pruning (importance + regulariser + schedule) and weight pruning."""

from espn.pruning.pruner import PRUNERS, Pruner, gate_magnitude, select_units
from espn.pruning.regularisers import (
    FlopAwareL1,
    Polarization,
    Regulariser,
    UniformL1,
    flop_aware_lambdas,
)
from espn.pruning.weights import new_weight_target, prune_weights, select_weights

__all__ = [
    "PRUNERS",
    "FlopAwareL1",
    "Polarization",
    "Pruner",
    "Regulariser",
    "UniformL1",
    "flop_aware_lambdas",
    "gate_magnitude",
    "new_weight_target",
    "prune_weights",
    "select_units",
    "select_weights",
]
