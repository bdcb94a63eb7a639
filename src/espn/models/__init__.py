"""Supernet-ready models, found by name in :data:`MODELS`."""

from espn.models import fc, mobilenet, resnet, vit
from espn.models.convert import load_entry_point_models
from espn.models.reference import resolve
from espn.models.registry import MODELS, ModelSpec

load_entry_point_models()  # models other packages expose in the "espn.models" entry points

__all__ = ["MODELS", "ModelSpec", "fc", "mobilenet", "resnet", "resolve", "vit"]
