"""espn: Efficient Sparse PackNet, zero-forgetting and inference-efficient continual learning."""

__version__ = "0.1.0"
