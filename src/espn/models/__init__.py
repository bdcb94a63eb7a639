"""Supernet-ready models, found by name in :data:`MODELS`."""

from espn.models import fc, resnet
from espn.models.convert import load_entry_point_models
from espn.models.reference import resolve
from espn.models.registry import MODELS, ModelSpec

load_entry_point_models()  # models other packages expose in the "espn.models" entry points

__all__ = ["MODELS", "ModelSpec", "fc", "resnet", "resolve"]
