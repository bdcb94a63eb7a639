"""One adapter per layer type: what a layer type means to espn (conversion, units, FLOPs,
export) in one file each, registered by type (see :mod:`espn.layers.base`).

Importing this package registers every adapter below; a new layer type is one more file
here and one more import line.
"""

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
