"""Classifier heads and inputs the converter reads (issue 47, item 2): a convolutional
classifier, several heads combined, token-id inputs into an ``nn.Embedding``; the end-to-end
runs (2 tasks, zero forgetting, export FLOPs) are the slow ``test_constructs.py``."""

from __future__ import annotations

import json

import pytest
import torch
from torch import Tensor, nn

import espn
from espn.errors import EspnError
from espn.export.export import measured_flops
from espn.layers import ConvertError
from espn.layers.conv2d import MaskedConv2d, TaskConvHead
from espn.models.convert import to_supernet
from espn.supernet.layers import TaskChannelBias, TaskHead
from helpers.constructs import ConvHead, Embedding, TwoHeads

IMAGES = torch.randn(2, 3, 32, 32)


def test_a_conv_classifier_becomes_a_per_task_conv_head() -> None:
    model = ConvHead().eval()
    sn = espn.wrap(model, IMAGES)
    head = sn.model.get_submodule("classifier.0")
    assert isinstance(head, TaskConvHead) and head.in_units is not None
    assert sn.dense_flops == measured_flops(model, IMAGES[:1])  # FlopCounterMode's count
    sn.begin_task(3)  # the head takes the task's class count, any batch size runs
    for batch in (1, 5):
        assert sn.forward_working(torch.randn(batch, 3, 32, 32)).shape == (batch, 3)


def test_a_shared_conv_classifier_is_masked_with_a_per_task_bias() -> None:
    sn = espn.wrap(ConvHead(), IMAGES, multi_head=False, task_affine=True)
    shared, bias = sn.model.get_submodule("classifier.0")
    assert type(shared) is MaskedConv2d and shared.out_units is None
    assert isinstance(bias, TaskChannelBias)


def test_heads_averaged_each_become_a_task_head_and_a_dead_token_feature_is_zero() -> None:
    sn = espn.wrap(TwoHeads(), IMAGES)
    assert all(isinstance(sn.model.get_submodule(n), TaskHead) for n in ("head", "head_dist"))
    sn.begin_task(4)
    sn.model.tokens.data.fill_(1.0)  # as a task learns them
    (group,) = {sn.model.get_submodule("head").in_units}
    assert group is not None
    alive = torch.arange(sn.group_sizes[group]) % 2 == 0
    units = {g: torch.ones(n, dtype=torch.bool) for g, n in sn.group_sizes.items()}
    sn.set_unit_masks(units | {group: alive})
    tokens = sn.model.tokens.detach()
    assert bool((tokens[..., ~alive] == 0).all()) and bool((tokens[..., alive] != 0).any())


class Concatenated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(12, 4), nn.Linear(12, 4)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.a(x), self.b(x)], dim=1)


@pytest.mark.parametrize(
    ("model", "example", "message"),
    [
        (Concatenated(), torch.randn(2, 12), "classifier 'a' has 4 outputs but the model outputs"),
        (
            nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 4, 1, groups=2), nn.Flatten()),
            torch.randn(2, 3, 3, 3),
            "found '1', a Conv2d",
        ),
        (nn.Linear(12, 4), torch.zeros(2, 12, dtype=torch.long), "no nn.Embedding"),
    ],
)
def test_what_cannot_be_a_classifier_or_an_input_is_refused(model, example, message) -> None:
    with pytest.raises(ConvertError) as err:
        to_supernet(model, example)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_token_ids_are_the_inputs_of_an_embedding_model_saved_and_loaded(tmp_path) -> None:
    gen = torch.Generator().manual_seed(0)
    ids, y = torch.randint(64, (24, 12), generator=gen), torch.arange(24) % 4
    sn = espn.wrap(Embedding(), ids[:2])
    assert sn.input_dtype == torch.int64
    learner = espn.ContinualLearner(sn, "espn", epochs=(1, 1, 1), batch_size=8, seed=0)
    learner.learn((ids, y), test=(ids[:8], y[:8]))
    with pytest.raises(EspnError, match="x: inputs must be int64 token ids"):
        learner.predict(ids.float(), task=0)
    learner.save(tmp_path / "run")
    manifest = json.loads((tmp_path / "run" / "checkpoint" / "manifest.json").read_text())
    assert manifest["spec"]["input_dtype"] == "int64"
    loaded = espn.load(tmp_path / "run", Embedding())
    assert loaded.supernet.input_dtype == torch.int64
    assert torch.equal(loaded.predict(ids, task=0), learner.predict(ids, task=0))


def test_a_float_model_refuses_token_ids() -> None:
    learner = espn.ContinualLearner(espn.wrap(ConvHead(), IMAGES), "espn", seed=0)
    with pytest.raises(EspnError, match="data: inputs must be float32"):
        learner.learn((torch.zeros(8, 3, 32, 32, dtype=torch.long), torch.zeros(8).long()))
