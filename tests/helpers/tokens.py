"""Tiny transformer models for the tests: a ViT, an MLP with LayerNorm, a model built on
``nn.TransformerEncoderLayer``, all on the 1x8x8 tasks of ``helpers.deploy.tiny_sequence``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from espn.data.registry import BENCHMARKS, Benchmark
from espn.models.convert import to_supernet
from espn.models.registry import MODELS, ModelSpec
from espn.models.vit import ViT
from helpers.deploy import tiny_sequence


def tiny_vit(spec: ModelSpec) -> nn.Module:
    """A ViT of width 32, 2 heads of 16, depth 2, MLP 64, on 4x4 patches of 8x8 images."""
    return ViT(spec.input_shape, spec.n_classes, spec.multi_head, dim=32, depth=2, heads=2)


def ln_mlp(affine: bool = False) -> nn.Module:
    """A plain MLP with LayerNorm after each hidden layer (without affine parameters by
    default: the case that used to train and then fail to export)."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, 32),
        nn.LayerNorm(32, elementwise_affine=affine),
        nn.ReLU(),
        nn.Linear(32, 24),
        nn.LayerNorm(24, elementwise_affine=affine),
        nn.ReLU(),
        nn.Linear(24, 3),
    )


class RowTransformer(nn.Module):
    """Rows of the image as 8 tokens: an input projection, two post-norm
    ``nn.TransformerEncoderLayer``s (``nn.TransformerEncoder``), mean pooling, a classifier."""

    def __init__(self, n_classes: int = 3, norm_first: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        layer = nn.TransformerEncoderLayer(
            16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = nn.Linear(16, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.encoder(self.inp(x.flatten(1, 2))).mean(1))


def converted(build: nn.Module) -> nn.Module:
    return to_supernet(build, torch.zeros(2, 1, 8, 8))


#: registered model name -> factory
MODELS_UNDER_TEST = {
    "tiny-vit": tiny_vit,
    "ln-mlp": lambda spec: converted(ln_mlp()),
    "row-transformer": lambda spec: converted(RowTransformer(spec.n_classes)),
}


@contextmanager
def token_models() -> Iterator[None]:
    """The models above and benchmark ``tiny-tokens`` (three 3-class 1x8x8 tasks)."""
    bench = Benchmark(
        build=lambda args: tiny_sequence(args.n_tasks or 3, seed=args.seed),
        default_tasks=3,
        max_tasks=None,
        description="tiny tasks for transformer tests",
        defaults={"batch_size": 16, "optimizer": "sgd", "lr": 0.05},
    )
    with (
        MODELS.temporarily("tiny-vit", tiny_vit),
        MODELS.temporarily("ln-mlp", MODELS_UNDER_TEST["ln-mlp"]),
        MODELS.temporarily("row-transformer", MODELS_UNDER_TEST["row-transformer"]),
        BENCHMARKS.temporarily("tiny-tokens", bench),
    ):
        yield
