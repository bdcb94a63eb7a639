"""Supernet-ready models, found by name in :data:`MODELS`."""

from espn.models import fc
from espn.models.registry import MODELS, ModelSpec

__all__ = ["MODELS", "ModelSpec", "fc"]
