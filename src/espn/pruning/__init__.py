"""Unit (channel/neuron) pruning (importance + regulariser + schedule) and weight pruning."""

from espn.pruning.polarization import Polarization
from espn.pruning.pruner import PRUNERS, Pruner, gate_magnitude
from espn.pruning.regularisers import FlopAwareL1, Regulariser, UniformL1, flop_aware_lambdas
from espn.pruning.schedule import GradualSchedule
from espn.pruning.selection import select_units
from espn.pruning.weights import new_weight_target, prune_weights, select_weights

__all__ = [
    "PRUNERS",
    "FlopAwareL1",
    "GradualSchedule",
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
