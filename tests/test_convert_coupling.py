"""How the converter couples channels (``espn.models.coupling``): what it cannot follow is
refused at wrap in one line naming the layer and the construct, never later and never as a
raw torch error; a token stream whose linear layers read the channels stays accepted, and a
Linear across its tokens (an MLP-Mixer's token mixing) is transparent to its channels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import espn
from espn.export.slim import slim_copy
from espn.layers.parameters import TaskParameters
from espn.models.convert import ConvertError
from helpers.constructs import CONSTRUCTS, TokenMixer

IMAGE = torch.zeros(2, 3, 32, 32)


class SplitProjection(nn.Module):
    """Attention whose q, k and v are cut from one projection's output."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.qkv = nn.Linear(48, 32), nn.Linear(32, 96)
        self.proj, self.fc = nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(F.pixel_unshuffle(x, 4).flatten(2).transpose(1, 2))
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v))
        return self.fc(x.mean(1))


class InputConcat(nn.Module):
    """A conv reading the model input concatenated with a conv's output: the input's channels
    come from no layer, so they cannot be pruned."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.mix = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(11, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.mix(torch.cat([x, self.stem(x)], 1)).mean((2, 3)))


class ScaledShuffle(nn.Module):
    """ShuffleNet's split and shuffle with a layer scale on the shuffled channels: a bare
    parameter on channels kept whole (held per task, never cut)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.branch = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
        self.gamma = nn.Parameter(torch.ones(8, 1, 1))
        self.fc = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        keep, change = self.stem(x).chunk(2, dim=1)
        x = self.gamma * torch.cat([keep, self.branch(change)], dim=1)
        x = x.view(len(x), 2, 4, 32, 32).transpose(1, 2).flatten(1, 2)
        return self.fc(x.mean((2, 3)))


class NarrowMixer(nn.Module):
    """A Linear across 16 tokens of 8 channels (the widths differ: Torch-Pruning couples the
    token axis to the channels with the wrong width)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 8, 8)
        self.tokens = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.fc = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = x + self.tokens(x.transpose(1, 2)).transpose(1, 2)
        return self.fc(x.mean(1))


class WideMixer(TokenMixer):
    """Token and channel MLPs on 16 tokens of 24 channels, as timm's Mixer (more channels
    than tokens: Torch-Pruning couples the token layers to more channels than they have)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.norm, self.fc = nn.Conv2d(3, 24, 8, 8), nn.LayerNorm(24), nn.Linear(24, 4)
        self.channels = nn.Sequential(nn.Linear(24, 32), nn.GELU(), nn.Linear(32, 24))


class TokenConv(nn.Module):
    """A 1x1 Conv1d across 16 tokens of 8 channels (the tokens as its channels)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.tokens = nn.Conv2d(3, 8, 8, 8), nn.Conv1d(16, 16, 1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        return self.fc((x + self.tokens(x)).mean(1))


class TokenLinear(nn.Module):
    """One Linear across 16 tokens of 8 channels (no hidden layer), then a channel MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.norm = nn.Conv2d(3, 8, 8, 8), nn.LayerNorm(8)
        self.tokens, self.mlp, self.fc = nn.Linear(16, 16), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = x + self.tokens(self.norm(x).transpose(1, 2)).transpose(1, 2)
        return self.fc((x + self.mlp(x)).mean(1))


class ChannelMLP(nn.Module):
    """Patches transposed into tokens, a residual MLP on their channels (16 tokens of 16
    channels, so only the axes tell a channel from a token)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.norm = nn.Conv2d(3, 16, 8, 8), nn.LayerNorm(16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.fc = nn.Linear(16, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = x + self.mlp(self.norm(x))
        return self.fc(x.mean(1))


@pytest.mark.parametrize(
    ("model", "layer", "construct"),
    [
        (InputConcat, "layer 'mix'", "3 of its 11 channels come from no layer"),
        (SplitProjection, "layer 'proj'", "splitting a feature map"),
        (TokenConv, "layer 'tokens'", "supported across the token axis: nn.Linear"),
    ],
)
def test_a_construct_the_converter_cannot_follow_is_refused_at_wrap_naming_it(
    model: type[nn.Module], layer: str, construct: str
) -> None:
    with pytest.raises(ConvertError) as err:
        espn.wrap(model(), IMAGE)
    message = str(err.value)
    assert message.startswith(layer) and construct in message and "\n" not in message


def test_linear_layers_on_the_channels_of_a_token_stream_are_accepted() -> None:
    """The transpose probe refuses a Linear across tokens only: the same stream's MLP on its
    channels converts, its layers in the stem's unit group."""
    model = espn.wrap(ChannelMLP(), IMAGE)
    stream = model.model.stem[0].out_units
    assert model.model.mlp[0][0].in_units == model.model.mlp[2][0].out_units == stream


@pytest.mark.parametrize("make", [NarrowMixer, WideMixer, CONSTRUCTS["token-mixing"][0]])
def test_a_linear_across_tokens_is_transparent_to_the_channels_it_is_applied_over(
    make: type[nn.Module],
) -> None:
    """The token MLP's tokens are never pruned, its hidden features are a unit group of their
    own, and its rows are the stem's channels: the slim copy's token layers run on the alive
    channels alone, and the FLOPs espn counts (wrap itself checks them against
    FlopCounterMode on a random task's slim copy) scale with them."""
    model = espn.wrap(make(), IMAGE)
    net = model.model
    first, second = net.tokens[0][0], net.tokens[2]
    stream = net.stem[0].out_units
    assert (first.in_units, first.out_units) == (None, "tokens.0")
    assert (second.in_units, second.out_units) == ("tokens.0", None)
    assert first.row_units == second.row_units == stream
    model.begin_task(4)
    units = model.unit_masks()
    units[stream][: model.widths[stream] // 2] = False
    rows = 2.0 * 16 * 32 * 2  # both token layers, per channel of the stream
    assert model.dense_flops - model.flops(units) >= rows * (model.widths[stream] // 2)


def test_a_single_linear_across_tokens_prunes_nothing_of_its_own() -> None:
    """Its tokens are both its inputs and outputs, so it has no unit group; the channel MLP
    after it stays in the stem's (wrap checks the slim copy and its FLOPs)."""
    net = espn.wrap(TokenLinear(), IMAGE).model
    stream = net.stem[0].out_units
    assert (net.tokens.in_units, net.tokens.out_units, net.tokens.row_units) == (None, None, stream)
    assert net.mlp[0].in_units == net.mlp[0].out_units == stream


def test_token_mixing_with_per_task_shifts_is_refused_at_wrap() -> None:
    """A gate's per-task shift in the token MLP would write the channels a task prunes."""
    with pytest.raises(ConvertError, match=r"^layer 'tokens\.0' is applied across the token axis"):
        espn.wrap(CONSTRUCTS["token-mixing"][0](), IMAGE, task_affine=True)


def test_a_tiny_mixer_keeps_earlier_tasks_and_exports_the_flops_it_reports(tmp_path) -> None:
    """Two tasks of ESPN on a tiny MLP-Mixer: task 0's logits bit-identical after task 1, and
    each exported task costs what espn reports (FlopCounterMode on the loaded program), at
    any batch size."""
    from espn.export.export import load_exported, measured_flops

    torch.manual_seed(0)
    sn = espn.wrap(CONSTRUCTS["token-mixing"][0](), IMAGE)
    learner = espn.ContinualLearner(sn, "espn", gamma=0.5, epochs=(1, 1, 1), batch_size=16, seed=0)
    data = [(torch.randn(40, 3, 32, 32), torch.arange(40) % 2) for _ in range(2)]
    probe = torch.randn(5, 3, 32, 32)
    learner.learn(data[0])
    sn.eval()
    with torch.no_grad():
        before = sn(probe, task=0)
    learner.learn(data[1])
    sn.eval()
    with torch.no_grad():
        assert torch.equal(sn(probe, task=0), before)
    for t in range(2):
        report = learner.export(t, tmp_path / f"task{t}.pt2", onnx=False)
        program = load_exported(report.files[0])
        assert measured_flops(program, probe) == sn.flops(sn.masks[t].units) < sn.dense_flops
        with torch.no_grad():
            assert torch.allclose(program(probe[:3]), sn(probe[:3], task=t), atol=1e-5)


def test_a_concatenation_is_read_as_its_members_unit_groups_in_order() -> None:
    """A layer reading ``torch.cat`` of feature maps names the concatenation of their unit
    groups, whose alive units are theirs in order; a BatchNorm over one becomes one task
    BatchNorm per member, in that member's group (wrap itself checks that a random task's
    slim copy computes the masked supernet's outputs and costs what espn counts)."""
    model = espn.wrap(CONSTRUCTS["concatenation"][0](), IMAGE)
    model.begin_task(4)
    net, members = model.model, ("stem.0", "a.0", "b.0")
    concat = f"cat({','.join(members)})"
    assert model.concats[concat] == members and model.widths[concat] == 24
    assert net.mix[0].in_units == net.dense[2][0].in_units == concat
    assert [part.group for part in net.dense[0].parts] == list(members)
    units = model.unit_masks()
    units["a.0"][:5] = False
    model.set_unit_masks(units)
    read = model.structural_mask("mix.0")[0, :, 0, 0]
    assert torch.equal(read, torch.cat([units[g] for g in members]))
    assert not net.dense[0].parts[1].weight[:5].any()
    assert model.alive_widths()[concat] == 19
    model.eval()
    model.commit_task()
    slim = slim_copy(model, 0, IMAGE)  # the norm's parts joined into one, at the alive channels
    assert type(slim.dense[0]) is nn.BatchNorm2d and slim.dense[0].num_features == 19
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(slim(x), model(x, task=0), rtol=1e-5, atol=1e-5)


def test_a_layer_scale_on_channels_kept_whole_is_held_per_task_and_never_cut() -> None:
    sn = espn.wrap(ScaledShuffle(), IMAGE)  # wrap's checks: FLOPs and a random task's slim copy
    held = next(m for m in sn.model.modules() if isinstance(m, TaskParameters))
    assert held.targets == ["gamma"] and held.groups == [None]


def tiny_maxvit() -> nn.Module:
    """torchvision's MaxViT at its smallest: two blocks, 2x2 windows, a 32x32 input."""
    from torchvision.models.maxvit import MaxVit

    torch.manual_seed(0)
    return MaxVit(
        input_size=(32, 32),
        stem_channels=16,
        partition_size=2,
        block_channels=[16, 32],
        block_layers=[1, 1],
        head_dim=8,
        stochastic_depth_prob=0.0,
        num_classes=4,
    )


def test_a_channel_search_that_does_not_settle_is_refused_at_wrap_naming_the_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MaxViT's attention reshapes its features into heads on windows of tokens, which
    Torch-Pruning maps as flattened channels: its search grows with the model (torchvision's
    maxvit_t: past the limit in about 20 s, where it ran for good). Here the limit is lowered
    to what the tiny model passes."""
    from torch_pruning.dependency.index_mapping import _FlattenIndexMapping

    own = _FlattenIndexMapping.__call__
    monkeypatch.setattr("espn.models.probe.MAPPED_LIMIT", 10_000)
    with pytest.raises(ConvertError, match=r"channels after '.*to_qkv' cannot be followed"):
        espn.wrap(tiny_maxvit(), IMAGE)
    assert _FlattenIndexMapping.__call__ is own  # Torch-Pruning's own mapping again
