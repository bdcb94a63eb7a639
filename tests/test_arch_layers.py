"""The layer types added as one adapter file each (``espn.layers``): ``nn.BatchNorm1d``,
``nn.Conv1d``, ``nn.Embedding``, and a hand-written ViT (class token and position embedding
as bare parameters, ``espn.layers.parameters``). For each: two ESPN tasks with task 0 bit-identical and its
frozen weights untouched, and the exported slim model's FLOPs (FlopCounterMode) equal to the
supernet's count, its outputs the supernet's. Tiny models, seconds each."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import espn
from espn.data.tasks import Split, Task, TaskSequence
from espn.export.export import measured_flops
from espn.export.slim import slim_copy
from espn.layers import adapter_for, exported_adapter
from espn.layers.batchnorm1d import TaskBatchNorm1d
from espn.layers.conv1d import MaskedConv1d
from espn.layers.embedding import MaskedEmbedding
from espn.layers.parameters import TaskParameters
from espn.models.convert import ConvertError, to_supernet
from espn.supernet import Supernet
from helpers.arch import OPTIMIZERS, assert_random_task_exports_exactly, check_two_tasks
from helpers.deploy import tiny_sequence
from helpers.images import random_task


def bn_mlp() -> nn.Module:
    """An MLP with BatchNorm1d after each hidden layer (biases absorbed by the norms)."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Linear(32, 24),
        nn.BatchNorm1d(24),
        nn.ReLU(),
        nn.Linear(24, 3),
    )


class SequenceNet(nn.Module):
    """The 8x8 image as a 64-step sequence: a Conv1d with BatchNorm1d, a depthwise Conv1d, a
    strided Conv1d with a bias and no norm (gated), mean over time, a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(1, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm1d(8)
        self.dw = nn.Conv1d(8, 8, 5, padding=2, groups=8, bias=False)
        self.bn2 = nn.BatchNorm1d(8)
        self.conv3 = nn.Conv1d(8, 12, 3, stride=2)
        self.fc = nn.Linear(12, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.bn1(self.conv1(x.flatten(2))))
        h = torch.relu(self.bn2(self.dw(h)))
        return self.fc(torch.relu(self.conv3(h)).mean(-1))


class TokenNet(nn.Module):
    """Token ids in, an embedding, a linear layer per token, mean over tokens, a classifier."""

    def __init__(self, vocabulary: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, 16)
        self.mix = nn.Linear(16, 24)
        self.fc = nn.Linear(24, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(torch.relu(self.mix(self.embed(x))).mean(1))


class HandViT(nn.Module):
    """A ViT as research code writes it: a patch conv, a class token and position embeddings
    as ``nn.Parameter`` s on the model itself, a pre-norm ``nn.TransformerEncoder``, a final
    LayerNorm on the class token, a classifier."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.patch = nn.Conv2d(1, dim, 4, stride=4)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, 5, dim))
        layer = nn.TransformerEncoderLayer(
            dim, 2, 32, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.encoder(x)[:, 0]))


class FunctionalNet(nn.Module):
    """An MLP whose hidden layer and classifier ``forward`` never calls: it passes their
    weights to ``F.linear`` (as Swin does)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.hidden, self.fc = nn.Linear(64, 32), nn.Linear(32, 24), nn.Linear(24, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.inp(x.flatten(1)))
        h = torch.relu(F.linear(h, self.hidden.weight, self.hidden.bias))
        return F.linear(h, self.fc.weight, self.fc.bias)


class FunctionalConv(nn.Module):
    """A conv (its stride and padding read from it) and a LayerNorm whose weights ``forward``
    passes to ``F.conv2d`` and ``F.layer_norm``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.LayerNorm(8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        c, n = self.conv, self.norm
        h = torch.relu(F.conv2d(x, c.weight, c.bias, c.stride, c.padding)).mean((2, 3))
        return self.fc(F.layer_norm(h, n.normalized_shape, n.weight, n.bias, n.eps))


class MatmulParameter(nn.Module):
    """A token model multiplying by a bare parameter: FLOPs espn would not count."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.w = nn.Parameter(0.1 * torch.randn(16, 16))
        self.fc = nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(self.inp(x.flatten(1, 2)))
        return self.fc((h + h @ self.w).mean(1))


def token_sequence(n_tasks: int = 2, n: int = 48, length: int = 8, vocabulary: int = 16):
    """Learnable token tasks: each class a prototype sequence, a quarter of its tokens
    replaced at random."""
    gen = torch.Generator().manual_seed(0)
    tasks = []
    for t in range(n_tasks):
        protos = torch.randint(vocabulary, (3, length), generator=gen)
        splits = []
        for _ in range(2):
            y = torch.arange(n) % 3
            noise = torch.randint(vocabulary, (n, length), generator=gen)
            keep = torch.rand(n, length, generator=gen) < 0.75
            splits.append(Split(torch.where(keep, protos[y], noise), torch.arange(n), y))
        tasks.append(Task(f"tokens {t}", splits[0], splits[1], lambda x, train: x, 3))
    return TaskSequence("tokens", tasks, (length,), multi_head=True)


NETS = {
    "bn-mlp": bn_mlp,
    "conv1d": SequenceNet,
    "embedding": TokenNet,
    "vit": HandViT,
    "functional": FunctionalNet,
    "functional-conv": FunctionalConv,
}


def sequence(kind: str) -> TaskSequence | None:
    return token_sequence() if kind == "embedding" else None


@pytest.mark.parametrize("optim", OPTIMIZERS, ids=lambda o: o.optimizer)
@pytest.mark.parametrize("kind", list(NETS))
def test_two_tasks_bit_identical_and_export_counted_exactly(kind, optim, tmp_path):
    check_two_tasks(
        NETS[kind], optim, tmp_path, export=optim.optimizer == "sgd", seq=sequence(kind)
    )


@pytest.mark.parametrize("kind", list(NETS))
def test_random_task_slim_copy_matches_flop_counter(kind):
    seq = sequence(kind)
    x = seq.tasks[0].test.x[:8] if seq else torch.randn(8, 1, 8, 8)
    torch.manual_seed(0)
    sn = Supernet(to_supernet(NETS[kind](), x[:2]), x[:2])
    assert measured_flops(sn.model, x) == sn.dense_flops
    assert_random_task_exports_exactly(sn, x, 3)


def test_each_layer_becomes_its_espn_module_and_is_found_by_type():
    x = torch.randn(2, 1, 8, 8)
    kinds = {
        TaskBatchNorm1d: to_supernet(bn_mlp(), x),
        MaskedConv1d: to_supernet(SequenceNet(), x),
        MaskedEmbedding: to_supernet(TokenNet(), token_sequence().tasks[0].train.x[:2]),
    }
    for kind, model in kinds.items():
        found = [m for m in model.modules() if isinstance(m, kind)]
        assert found and all(exported_adapter(m) is not None for m in found)
    assert adapter_for(nn.BatchNorm1d(4)) is not adapter_for(nn.BatchNorm2d(4))


def test_embedding_with_max_norm_is_refused():
    net = TokenNet()
    net.embed = nn.Embedding(16, 16, max_norm=1.0)
    with pytest.raises(ConvertError, match="Embedding 'embed' has max_norm"):
        to_supernet(net, torch.zeros(2, 8, dtype=torch.long))


def test_slim_embedding_keeps_alive_features_only():
    x = token_sequence().tasks[0].test.x[:4]
    sn = Supernet(to_supernet(TokenNet(), x[:2]), x[:2])
    random_task(sn, 3, x, torch.Generator().manual_seed(0), 0.5)
    alive = int(sn.masks[0].units["embed"].sum())
    table = slim_copy(sn, 0, x).get_submodule("embed.0")
    assert isinstance(table, nn.Embedding) and table.weight.shape == (16, alive)
    assert 0 < alive < 16


class Tied(nn.Module):
    """Two linear layers sharing one weight (``fc2.weight = fc1.weight``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc0 = nn.Linear(64, 16)
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc2.weight = self.fc1.weight
        self.fc = nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.fc1(torch.relu(self.fc0(x.flatten(1)))))
        return self.fc(torch.relu(self.fc2(h)))


class CalledTwice(nn.Module):
    """One linear layer applied twice in forward (the FLOPs of two calls, one module)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 64)
        self.mid = nn.Linear(64, 64)
        self.fc = nn.Linear(64, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.fc1(x.flatten(1)))
        return self.fc(torch.relu(self.mid(torch.relu(self.mid(h)))))


def test_tied_weights_are_refused_not_untied():
    with pytest.raises(ConvertError, match="module 'fc2' shares a parameter with 'fc1'"):
        espn.wrap(Tied(), torch.zeros(2, 1, 8, 8))


def test_a_module_called_twice_is_refused_not_counted_once():
    with pytest.raises(ConvertError, match=r"module 'mid' \(2 times\) is called more than once"):
        espn.wrap(CalledTwice(), torch.zeros(2, 1, 8, 8))


class FunctionalMisuse(FunctionalNet):
    """Reads the classifier's weights other than as its call: without its bias, or as a
    matrix product."""

    def __init__(self, use: str) -> None:
        super().__init__()
        self.use = use

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.inp(x.flatten(1)))
        h = torch.relu(F.linear(h, self.hidden.weight, self.hidden.bias))
        if self.use == "no bias":
            return F.linear(h, self.fc.weight)
        return h @ self.fc.weight.T + self.fc.bias


@pytest.mark.parametrize(
    ("use", "function"), [("no bias", "nn.functional.linear"), ("matmul", "Tensor.T")]
)
def test_weights_read_other_than_as_the_layers_call_are_refused(use, function):
    with pytest.raises(ConvertError, match=rf"computes torch.{function} on the weights of 'fc'"):
        espn.wrap(FunctionalMisuse(use), torch.zeros(2, 1, 8, 8))


def test_hand_written_vit_keeps_its_tokens_per_task_and_cuts_them_on_export():
    x = torch.randn(4, 1, 8, 8)
    sn = Supernet(to_supernet(HandViT(), x[:2]), x[:2])
    held = [m for m in sn.task_modules.values() if isinstance(m, TaskParameters)]
    assert len(held) == 1 and held[0].targets == ["cls_token", "pos_embed"]
    assert sn.model.cls_token is held[0].p0  # the model reads the per-task parameter
    random_task(sn, 3, x, torch.Generator().manual_seed(0), 0.5)
    alive = int(sn.masks[0].units["patch"].sum())
    slim = slim_copy(sn, 0, x)
    assert slim.get_parameter("pos_embed").shape == (1, 5, alive) and alive < 16


def test_a_bare_parameter_used_as_a_weight_is_refused():
    with pytest.raises(ConvertError, match=r"forward\(\) costs 6240 FLOPs .* espn counts 2144"):
        to_supernet(MatmulParameter(), torch.zeros(2, 1, 8, 8))


def test_hand_written_vit_saves_and_loads_bit_identical(tmp_path):
    """Its per-task class token and position embeddings go into the checkpoint with the task
    and come back: the loaded run's task 0 answers as before."""
    seq = tiny_sequence(2)
    torch.manual_seed(0)
    learner = espn.ContinualLearner(
        espn.wrap(HandViT(), seq.tasks[0].train.x[:2]), "espn", epochs=(1, 1, 1), gamma=0.5
    )
    for task in seq.tasks:
        learner.learn((task.train.x, task.train.y), (task.test.x, task.test.y))
    learner.save(tmp_path / "run")
    x = seq.tasks[0].test.x
    sn = learner.supernet.eval()
    loaded = espn.load(tmp_path / "run", model=HandViT()).supernet.eval()
    with torch.no_grad():
        assert torch.equal(loaded(x, task=0), sn(x, task=0))
        assert torch.equal(loaded(x, task=1), sn(x, task=1))
