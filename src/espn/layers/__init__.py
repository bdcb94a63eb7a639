"""One adapter per layer type, one file each; importing this package registers them all
(docs/architectures.md, "One adapter per layer type")."""

from espn.layers import (
    attention,
    batchnorm1d,
    batchnorm2d,
    conv1d,
    conv2d,
    embedding,
    groupnorm,
    layernorm,
    linear,
)
from espn.layers.base import (
    ConvertError,
    ExportError,
    LayerAdapter,
    Placement,
    WeightAdapter,
    adapter_for,
    exported_adapter,
    layer_types,
    register,
    source_names,
)

__all__ = [
    "ConvertError",
    "ExportError",
    "LayerAdapter",
    "Placement",
    "WeightAdapter",
    "adapter_for",
    "attention",
    "batchnorm1d",
    "batchnorm2d",
    "conv1d",
    "conv2d",
    "embedding",
    "exported_adapter",
    "groupnorm",
    "layer_types",
    "layernorm",
    "linear",
    "register",
    "source_names",
]
