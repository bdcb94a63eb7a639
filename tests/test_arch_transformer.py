"""Transformers as supernets: zero forgetting, exact per-task FLOPs (attention matmuls
included) against FlopCounterMode on the exported slim model, heads pruned whole, resume, and
one-line refusals. Tiny models (see ``helpers.tokens``), seconds each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import espn
from espn.api.experiment import build_benchmark, build_supernet
from espn.errors import EspnError
from espn.evaluation import task_logits
from espn.export.export import export_task, exported, measured_flops
from espn.export.slim import ExportError, plain_copy, slim_copy
from espn.layers.attention import MaskedAttention
from espn.layers.base import TokenGate
from espn.layers.layernorm import TaskLayerNorm
from espn.methods import METHODS
from espn.runs.config import make_config
from espn.supernet import Supernet
from espn.training import Engine, OptimConfig
from helpers.arch import assert_resumes_exactly
from helpers.constructs import QkvAttention, QkvSplit
from helpers.tokens import RowTransformer, ln_mlp, token_models

OPTIMIZERS = [
    OptimConfig("sgd", lr=0.05, momentum=0.9, weight_decay=1e-2),
    OptimConfig("adam", lr=1e-3, weight_decay=1e-2),
]
MODELS = ["tiny-vit", "ln-mlp", "row-transformer"]


@pytest.fixture(scope="module", autouse=True)
def registered() -> Iterator[None]:
    with token_models():
        yield


def train(model: str, optim: OptimConfig, tmp: Path, method: str = "espn") -> tuple:
    """Learn the three tiny tasks with ``method`` (gamma 0.5, alpha 0.5), checking after each
    task that every earlier task's logits and weights are bit-identical."""
    cfg = make_config(
        benchmark="tiny-tokens",
        model=model,
        method=method,
        gamma=0.5 if method == "espn" else None,
        alpha=0.5,
        epochs=(1, 2, 1),
        out=tmp / "run",
    )
    seq = build_benchmark(cfg)
    sn = build_supernet(cfg, seq)
    engine = Engine(sn, METHODS.get(method)(cfg.method_config()), optim, 16, 0)
    logits, weights = [], []
    for t, task in enumerate(seq.tasks):
        engine.train_task(task, t)
        for j in range(t):
            assert torch.equal(task_logits(sn, seq.tasks[j], j), logits[j]), f"task {j} changed"
            for n, layer in sn.layers.items():
                mask = sn.masks[j].weight_mask(n)
                assert torch.equal(layer.weight[mask], weights[j][n][mask])
        logits.append(task_logits(sn, task, t))
        weights.append({n: m.weight.detach().clone() for n, m in sn.layers.items()})
    return sn, seq


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, tuple]:
    """Each model trained once with ESPN and SGD, shared by the FLOPs and head tests."""
    tmp = tmp_path_factory.mktemp("trained")
    return {m: train(m, OPTIMIZERS[0], tmp / m) for m in MODELS}


@pytest.mark.parametrize("optim", OPTIMIZERS, ids=lambda o: o.optimizer)
@pytest.mark.parametrize("model", MODELS)
def test_earlier_tasks_bit_identical(model, optim, tmp_path):
    train(model, optim, tmp_path)


def test_packnet_on_the_vit_keeps_earlier_tasks(tmp_path):
    train("tiny-vit", OPTIMIZERS[1], tmp_path, method="packnet")


@pytest.mark.parametrize("model", MODELS)
def test_flops_equal_flop_counter_on_the_exported_model(model, trained, tmp_path):
    sn, seq = trained[model]
    x = seq.tasks[0].test.x[:4]
    for t in range(len(sn.masks)):
        slim = slim_copy(sn, t, x)
        assert measured_flops(slim, x) == sn.flops(sn.masks[t].units)
        assert sn.flops(sn.masks[t].units) <= 0.5 * sn.dense_flops
        program = exported(slim, x).module()
        assert not any(type(m).__module__.startswith("espn") for m in program.modules())
        with torch.no_grad():
            assert torch.allclose(slim(x), sn(x, task=t), atol=1e-5)
    report = export_task(sn, t, [x], tmp_path / "last.pt2", also_onnx=False)  # torch.export
    assert report.flops == sn.flops(sn.masks[t].units)


def test_attention_flops_count_qk_and_av():
    """The analytic count of a ViT equals FlopCounterMode on it, whose bmm/matmul counts
    include QK^T and AV (2 N^2 d per head each): removing a head removes them."""
    sn = espn.wrap("tiny-vit", torch.zeros(2, 1, 8, 8), n_classes=3)
    x = torch.randn(1, 1, 8, 8)
    assert measured_flops(sn.model, x) == sn.dense_flops
    per_head = sn.unit_flops()["blocks.0.heads"]
    tokens, head_dim, dim = 5, 16, 32
    assert per_head == 4 * tokens**2 * head_dim + 3 * 2 * tokens * dim * head_dim
    units = sn.unit_masks()
    units["blocks.0.heads"][1] = False
    assert sn.dense_flops - sn.flops(units) == per_head + 2 * tokens * head_dim * dim


@pytest.mark.parametrize("model", ["tiny-vit", "row-transformer"])
def test_heads_are_pruned_whole(model, trained):
    sn = trained[model][0]
    attentions = [m for m in sn.model.modules() if isinstance(m, MaskedAttention)]
    assert attentions
    for t in range(len(sn.masks)):
        sn.use_task(t)
        for attn in attentions:
            alive = sn.unit_masks()[attn.heads_group]
            hd = attn.head_dim
            for layer in (attn.q, attn.k, attn.v):  # rows of a head: all dead or head alive
                used = layer.weight_mask.bool().view(-1, hd, layer.in_features).flatten(1).any(1)
                assert not (used & ~alive).any()
            cols = attn.proj.weight_mask.bool().view(attn.proj.out_features, -1, hd).any(2).any(0)
            assert not (cols & ~alive).any()


def test_a_dead_head_leaves_the_slim_model():
    sn = espn.wrap("tiny-vit", torch.zeros(2, 1, 8, 8), n_classes=3)
    sn.begin_task(3)
    units = sn.unit_masks()
    units["blocks.1.heads"][0] = False
    units["blocks.0.mlp"][:10] = False
    units["stream"][5:9] = False
    sn.set_unit_masks(units)
    sn.commit_task()
    x = torch.randn(3, 1, 8, 8)
    slim = slim_copy(sn, 0, x)
    block0, block1 = slim.get_submodule("blocks.0"), slim.get_submodule("blocks.1")
    assert block1.attn.q.weight.shape == (16, 28) and block1.attn.proj.weight.shape == (28, 16)
    assert block0.attn.q.weight.shape == (32, 28) and block0.fc1.weight.shape == (54, 28)
    assert slim.get_submodule("blocks.0.norm1").normalized_shape == (28,)
    assert slim.get_parameter("tokens.pos_embed").shape == (1, 5, 28)
    sn.eval()
    with torch.no_grad():
        assert torch.allclose(slim(x), sn(x, task=0), atol=1e-5)
    assert measured_flops(slim, x) == sn.flops()
    with pytest.raises(ExportError, match="use slim_copy"):
        plain_copy(sn, 0)


def test_layernorm_mlp_exports_equal_to_the_supernet():
    """LayerNorm(elementwise_affine=False) after pruned neurons: normalised over the alive
    neurons only, so the slim model (pruned neurons removed) computes the same."""
    x = torch.randn(6, 1, 8, 8)
    sn = espn.wrap(ln_mlp(), x)
    norms = [m for m in sn.model.modules() if isinstance(m, TaskLayerNorm)]
    assert len(norms) == 2
    sn.begin_task(3)
    with torch.no_grad():
        for m in norms:
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-1, 1)
    units = {g: torch.arange(n) % 3 != 0 for g, n in sn.group_sizes.items()}
    sn.set_unit_masks(units)
    sn.commit_task()
    sn.eval()
    slim = slim_copy(sn, 0, x)
    with torch.no_grad():
        assert torch.allclose(slim(x), sn(x, task=0), atol=1e-5)
        hidden = sn.model[:3](x)  # first linear and its LayerNorm: dead neurons exactly 0
    assert bool((hidden[:, ~units[next(iter(units))]] == 0).all())


def test_task_layernorm_is_torchs_layernorm_over_the_alive_features():
    """Forward and gradients of a task LayerNorm equal torch's LayerNorm over its alive
    features bit for bit (all alive: the whole width), a dead feature outputs exactly zero
    and its scale and shift get no gradient; a mask written in place (a prune event) is
    followed; the compiled form (the mask as a tensor) computes the same within rounding."""
    torch.manual_seed(0)
    norm = TaskLayerNorm(12, "stream", eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-1, 1)
    x = torch.randn(3, 5, 12)
    for alive in (torch.ones(12, dtype=torch.bool), torch.arange(12) % 3 != 1):
        with torch.no_grad():
            norm.unit_mask.copy_(alive.float())
        xs, ws, bs = (t.detach()[..., alive].requires_grad_() for t in (x, norm.weight, norm.bias))
        xm = x.clone().requires_grad_()
        out = norm(xm)
        ref = nn.functional.layer_norm(xs, (int(alive.sum()),), ws, bs, 1e-6)
        assert torch.equal(out[..., alive], ref)
        assert torch.equal(out[..., ~alive], torch.zeros_like(out[..., ~alive]))
        assert not out[..., ~alive].signbit().any()
        g = torch.randn_like(out)
        norm.zero_grad()
        out.backward(g)
        ref.backward(g[..., alive])
        assert xm.grad is not None and xs.grad is not None
        assert torch.equal(xm.grad[..., alive], xs.grad)
        assert not xm.grad[..., ~alive].any()
        for got, want in ((norm.weight.grad, ws.grad), (norm.bias.grad, bs.grad)):
            assert got is not None and want is not None
            assert torch.equal(got[alive], want) and not got[~alive].any()
        with torch.no_grad():
            assert torch.allclose(norm.masked_norm(x), norm(x), atol=1e-5)


def test_a_training_step_folds_the_token_gates_into_their_layers(monkeypatch):
    """In a training step a ViT's token gates (the MLP's neurons, the attention heads on v)
    scale their layer's weight rows instead of its output: the logits and every gradient
    are the same within rounding for trained gates, and bit for bit for released ones
    (scales 0 and 1, dead units) on the whole width (within rounding where the step carries
    the alive units alone); in eval mode and under a hook the gate is called."""
    from espn.models.registry import ModelSpec
    from espn.models.vit import ViT
    from helpers.tokens import tiny_vit

    torch.manual_seed(0)
    x = torch.randn(3, 1, 8, 8)
    sn = Supernet(tiny_vit(ModelSpec((1, 8, 8), 4, True)), x[:2])
    sn.begin_task(4)
    gates = [m for m in sn.model.modules() if isinstance(m, TokenGate)]
    assert len(gates) == 4
    with torch.no_grad():
        for g in gates:
            g.weight.uniform_(0.5, 1.5)
    calls: list[TokenGate] = []
    forward = TokenGate.forward

    def counted(gate: TokenGate, x: Tensor) -> Tensor:
        calls.append(gate)
        return forward(gate, x)

    monkeypatch.setattr(TokenGate, "forward", counted)

    def run(hooked: bool) -> tuple[Tensor, list[Tensor]]:
        hooks = [g.register_forward_hook(lambda *_: None) for g in gates] if hooked else []
        sn.train()
        sn.model.zero_grad()
        out = sn.forward_working(x)
        out.square().sum().backward()
        for h in hooks:
            h.remove()
        grads = [p.grad.clone() for p in sn.model.parameters() if p.grad is not None]
        return out.detach(), grads

    folded, folded_grads = run(hooked=False)
    assert not calls  # folded: no gate was called
    gated_out, gated_grads = run(hooked=True)
    assert len(calls) == len(gates)
    assert torch.allclose(folded, gated_out, atol=1e-5)
    assert all(
        torch.allclose(a, b, atol=1e-5) for a, b in zip(folded_grads, gated_grads, strict=True)
    )
    sn.set_unit_masks({g: torch.arange(n) % 4 != 1 for g, n in sn.group_sizes.items()})
    sn.release_gates()
    # with dead units the unhooked step carries the alive units alone (narrower sums: equal
    # within rounding, see the next test); on the whole width the fold is exact
    alive_out, alive_grads = run(hooked=False)
    monkeypatch.setattr(ViT, "carries_alive_units", lambda self: False)
    folded, folded_grads = run(hooked=False)
    gated_out, gated_grads = run(hooked=True)
    assert torch.equal(folded, gated_out)
    assert len(folded_grads) == len(gated_grads) == len(alive_grads)
    assert all(torch.equal(a, b) for a, b in zip(folded_grads, gated_grads, strict=True))
    assert torch.allclose(alive_out, gated_out, atol=1e-5)
    assert all(
        torch.allclose(a, b, atol=1e-5) for a, b in zip(alive_grads, gated_grads, strict=True)
    )
    calls.clear()
    sn.eval()
    with torch.no_grad():
        sn.forward_working(x)
    assert len(calls) == len(gates)


def _pruned_tiny_vit(
    x: Tensor, stream: Tensor, neurons: Tensor, scaled: type, shift: bool = False
) -> Supernet:
    """A tiny ViT's supernet on task 0 with random scales on its ``scaled`` modules
    (and random LayerNorm shifts with ``shift``), the stream's features ``stream`` alive, the
    first head of block 0 dead and the MLP neurons ``neurons`` of block 1 alive."""
    from espn.models.registry import ModelSpec
    from helpers.tokens import tiny_vit

    sn = Supernet(tiny_vit(ModelSpec((1, 8, 8), 4, True)), x[:2])
    sn.begin_task(4)
    with torch.no_grad():
        for m in sn.model.modules():
            if isinstance(m, scaled):
                m.weight.uniform_(0.5, 1.5)
            if shift and isinstance(m, TaskLayerNorm):
                m.bias.uniform_(-1, 1)
    units = {g: torch.ones(n, dtype=torch.bool) for g, n in sn.group_sizes.items()}
    units |= {"stream": stream, "blocks.0.heads": torch.tensor([False, True])}
    units |= {"blocks.1.mlp": neurons}
    sn.set_unit_masks(units)
    return sn


@pytest.mark.parametrize("dead_stream", [True, False])
def test_a_training_step_carries_the_alive_units_alone(monkeypatch, dead_stream):
    """Once a ViT has dead units, a training step carries its alive units alone (the
    stream's alive features: no task LayerNorm runs on the whole width; each block's alive
    MLP neurons and heads): the logits and every gradient equal the whole-width forward's
    within float rounding, and every gradient of a dead unit (a dead stream feature's norm
    scales, tokens and the weights writing or reading it; a dead neuron's or head's rows
    and columns) is exactly zero in both. Eval mode, or a hook on any module, runs the
    whole width."""
    from espn.models.vit import ViT

    torch.manual_seed(0)
    x = torch.randn(5, 1, 8, 8)
    neurons = torch.arange(64) % 4 != 1
    stream = torch.arange(32) % 3 != 0 if dead_stream else torch.ones(32, dtype=torch.bool)
    sn = _pruned_tiny_vit(x, stream, neurons, TaskLayerNorm | TokenGate)
    wide: list[int] = []
    forward = TaskLayerNorm.forward

    def counted(norm: TaskLayerNorm, x: Tensor) -> Tensor:
        wide.append(1)
        return forward(norm, x)

    monkeypatch.setattr(TaskLayerNorm, "forward", counted)

    def run(hooked: bool) -> tuple[Tensor, dict[str, Tensor]]:
        model = sn.model
        assert isinstance(model, ViT)
        hook = model.head.register_forward_hook(lambda *_: None) if hooked else None
        sn.train()
        model.zero_grad(set_to_none=True)
        out = sn.forward_working(x)
        out.square().sum().backward()
        if hook is not None:
            hook.remove()
        return out.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    carried, carried_grads = run(hooked=False)
    assert not wide  # no norm ran on the whole width
    whole, whole_grads = run(hooked=True)
    norms = sum(isinstance(m, TaskLayerNorm) for m in sn.model.modules())
    assert len(wide) == norms == 5
    assert torch.allclose(carried, whole, atol=1e-5)
    assert carried_grads.keys() == whole_grads.keys()
    for name, grad in carried_grads.items():
        assert torch.allclose(grad, whole_grads[name], atol=1e-5), name
    dead = {
        "tokens.pos_embed": (Ellipsis, ~stream),
        "norm.weight": ~stream,
        "blocks.0.fc2.weight": ~stream,
        "blocks.1.attn.q.weight": (slice(None), ~stream),
        "patch_embed.weight": ~stream,
        "blocks.0.attn.k.weight": slice(0, 16),  # the dead head's rows
        "blocks.0.attn.proj.weight": (slice(None), slice(0, 16)),
        "blocks.1.fc1.weight": ~neurons,
        "blocks.1.fc2.weight": (slice(None), ~neurons),
    }
    for name, where in dead.items():
        for grads in (carried_grads, whole_grads):
            assert torch.equal(grads[name][where], torch.zeros_like(grads[name][where])), name
    wide.clear()
    sn.eval()
    with torch.no_grad():
        assert torch.allclose(sn.forward_working(x), carried, atol=1e-5)
    assert len(wide) == norms


def test_the_alive_step_reads_every_layer_at_the_slim_exports_cut(monkeypatch):
    """The ViT's training step on its alive units and the slim export cut each layer through
    its adapter's one cut: every weight (and norm scale and shift) the step computes with
    equals the exported slim layer's, bit for bit, in the order the step reads them."""
    from espn.layers.conv2d import MaskedConv2d

    torch.manual_seed(0)
    x = torch.randn(3, 1, 8, 8)
    sn = _pruned_tiny_vit(
        x, torch.arange(32) % 3 != 0, torch.arange(64) % 4 != 1, TaskLayerNorm, shift=True
    )
    sn.release_gates()  # scale 1 on the alive units: folded into the export's rows exactly
    sn.commit_task()
    slim = slim_copy(sn, 0, x)
    read: list[Tensor] = []
    linear, layer_norm, conv = F.linear, F.layer_norm, MaskedConv2d._conv_forward

    def reads(call, *tensors):
        read.extend(t.detach() for t in tensors if t is not None)
        return call()

    monkeypatch.setattr(F, "linear", lambda x, w, b=None: reads(lambda: linear(x, w, b), w, b))
    monkeypatch.setattr(
        F,
        "layer_norm",
        lambda x, s, w, b, e: reads(lambda: layer_norm(x, s, w, b, e), w, b),
    )
    monkeypatch.setattr(
        MaskedConv2d, "_conv_forward", lambda m, x, w, b: reads(lambda: conv(m, x, w, b), w)
    )
    sn.train()
    sn.forward_working(x)
    names = ["patch_embed.weight"]
    for i in range(2):
        block = [f"blocks.{i}.{n}" for n in ("attn.q", "attn.k", "attn.v", "attn.proj")]
        block += [f"blocks.{i}.fc1", f"blocks.{i}.fc2"]
        norms = [f"blocks.{i}.norm{j}.{t}" for j in (1, 2) for t in ("weight", "bias")]
        names += norms[:2] + [f"{n}.weight" for n in block[:4]] + norms[2:]
        names += [f"{n}.weight" for n in block[4:]]
    names += ["norm.weight", "norm.bias", "head.weight", "head.bias"]
    want = dict(slim.named_parameters())
    assert len(read) == len(names)
    for name, got in zip(names, read, strict=True):
        assert got.shape == want[name].shape and torch.equal(got, want[name]), name
    assert want["blocks.1.fc1.weight"].shape == (48, 21)  # narrowed: 48 of 64 neurons, 21 of 32


def test_token_linear_layers_are_gated_on_the_last_dimension():
    class Tokens(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.fc = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 3)

        def forward(self, x):
            return self.fc(torch.relu(self.b(torch.relu(self.a(x.flatten(1, 2))))).mean(1))

    x = torch.randn(4, 1, 8, 8)
    sn = espn.wrap(Tokens(), x)
    assert sum(isinstance(m, TokenGate) for m in sn.model.modules()) == 2
    assert sn.dense_flops == measured_flops(sn.model, x[:1])
    sn.begin_task(3)
    sn.set_unit_masks({g: torch.arange(n) % 2 == 0 for g, n in sn.group_sizes.items()})
    sn.commit_task()
    slim = slim_copy(sn, 0, x)
    assert measured_flops(slim, x) == sn.flops()
    sn.eval()
    with torch.no_grad():
        assert torch.allclose(slim(x), sn(x, task=0), atol=1e-5)


def test_vit_run_resumes_exactly(tmp_path, monkeypatch):
    assert_resumes_exactly(tmp_path, monkeypatch, benchmark="tiny-tokens", model="tiny-vit")


class _CrossAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True, kdim=8, vdim=8)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        t = x.flatten(1, 2)
        return self.fc(self.attn(self.inp(t), t, t)[0].mean(1))


class _StreamFromInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.layer(x.flatten(1, 2)).mean(1))


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (_CrossAttention(), "MultiheadAttention 'attn' has kdim/vdim"),
        (_StreamFromInput(), "come partly from the model input or a bare parameter"),
        (
            nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.Unflatten(1, (2, 4)), nn.LayerNorm(4)),
            "espn needs logits of shape [N, classes]",
        ),
    ],
    ids=["cross-attention", "stream-from-input", "layernorm-output"],
)
def test_unsupported_models_are_refused_in_one_line(model, message):
    with pytest.raises(EspnError) as info:
        espn.wrap(model, torch.zeros(2, 1, 8, 8))
    text = str(info.value)
    assert message in text and "\n" not in text


def _small_swin(v2: bool) -> nn.Module:
    from torchvision.models import swin_transformer as swin

    more = {"block": swin.SwinTransformerBlockV2, "downsample_layer": swin.PatchMergingV2}
    return swin.SwinTransformer(
        [2, 2], 16, [2, 1], [2, 4], [2, 2], num_classes=3, **(more if v2 else {})
    )


def test_torchvision_swin_wraps_with_its_window_attention_kept_whole():
    """torchvision's Swin (V1, small): its window attention (``F.linear`` on its projections'
    weights, a relative position bias table of its own) is kept whole with the stream, the
    MLPs are pruned; wrap itself proves the FLOPs and a random task's slim copy."""
    sn = espn.wrap(_small_swin(v2=False), torch.zeros(2, 3, 16, 16))
    assert sn.group_sizes == {
        "features.0.0": 1,
        "features.1.0.mlp.0": 64,
        "features.1.1.mlp.0": 64,
        "features.3.0.mlp.0": 128,
    }


def test_attention_normalising_q_and_k_is_kept_whole_with_its_stream():
    """timm's ``Attention(qk_norm=True)``: q and k cut from ``qkv`` and normalised by
    LayerNorms of the module: its channels and the stream are one unit never pruned, the
    LayerNorms' parameters per task; wrap proves the FLOPs and a random task's slim copy."""
    from timm.layers import Attention

    model = QkvSplit()
    model.attn = Attention(16, 4, qk_norm=True, norm_layer=nn.LayerNorm)
    model.fc = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    sn = espn.wrap(model, torch.randn(2, 3, 32, 32))
    assert sn.group_sizes == {"patches": 1, "fc.0": 32}  # the MLP's hidden features pruned
    assert isinstance(sn.model.attn.q_norm, TaskLayerNorm)


def test_swin_v2_attention_is_refused_in_one_line_naming_it():
    """torchvision's Swin V2 clones its qkv bias to zero the k part at every call: refused
    before anything else, naming the layer and the function."""
    with pytest.raises(EspnError) as info:
        espn.wrap(_small_swin(v2=True), torch.zeros(2, 3, 16, 16))
    text = str(info.value)
    assert text.startswith(
        "forward() computes torch.Tensor.clone on the weights of 'features.1.0.attn.qkv'"
    )
    assert "\n" not in text


def test_vit_refuses_inputs_it_cannot_cut_into_patches():
    with pytest.raises(EspnError, match=r"patch size 4 .* got input shape \(3, 30, 30\)"):
        espn.wrap("vit-p4", torch.zeros(2, 3, 30, 30), n_classes=2)


def test_post_and_pre_norm_encoder_layers_compute_what_torch_does():
    """Converted nn.TransformerEncoder(Layer) equals torch's (biases zeroed: the converter
    drops biases that no norm absorbs) until the first task resets the task state."""
    for norm_first in (False, True):
        torch.manual_seed(0)
        model = RowTransformer(norm_first=norm_first).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias") and "norm" not in name and not name.startswith("fc"):
                    p.zero_()
        x = torch.randn(4, 1, 8, 8)
        sn = espn.wrap(model, x).eval()
        with torch.no_grad():
            assert torch.allclose(sn.forward_working(x), model(x), atol=1e-5)


def test_timm_vit_is_converted_and_exported():
    """timm's ViT (its Attention cuts q, k and v from one projection) through the general
    converter: heads as units, the converted model computing timm's (biases that no norm
    absorbs zeroed: the converter drops them), a dead head's slim copy costing what espn
    counts; its layer scale (``init_values``) converts too (mean pooling and the distilled
    DeiT: benchmarks/model_matrix.py); an input of another size than the model's is refused
    in one line."""
    pytest.importorskip("timm")
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    x = torch.randn(4, 1, 8, 8)
    model = VisionTransformer(
        img_size=8, patch_size=4, in_chans=1, num_classes=3, embed_dim=32, depth=2,
        num_heads=2, init_values=0.5,
    ).eval()  # fmt: skip
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and "norm" not in name and not name.startswith("head"):
                p.zero_()
    sn = espn.wrap(model, x)
    assert sn.group_sizes["blocks.1.attn.heads"] == 2
    sn.eval()
    with torch.no_grad():
        assert torch.allclose(sn.forward_working(x), model(x), atol=1e-5)
    sn.begin_task(3)
    units = sn.unit_masks()
    units["blocks.0.attn.heads"][1] = False
    sn.set_unit_masks(units)
    sn.commit_task()
    slim = slim_copy(sn, 0, x)
    assert measured_flops(slim, x) == sn.flops()
    with pytest.raises(EspnError) as info:  # timm asserts its input size
        espn.wrap(model, torch.randn(2, 1, 4, 4))
    assert str(info.value) == (
        "example_input: the model cannot be built and run on it: "
        "Input height (4) doesn't match model (8)."
    )


class _HeadByHead(QkvAttention):
    """q, k and v cut head by head: each head's ``3 * d`` features of ``qkv`` together."""

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, self.heads, -1).transpose(1, 2)
        out = nn.functional.scaled_dot_product_attention(*qkv.chunk(3, -1))
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class _OtherScale(QkvAttention):
    """Attention scaled by the model width instead of the head width: not what
    ``nn.MultiheadAttention`` computes."""

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        out = ((q @ k.transpose(-2, -1)) * c**-0.5).softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


@pytest.mark.parametrize("layout", ["unbind", "chunk", "head-by-head"])
def test_attention_written_by_hand_becomes_heads_as_units(layout):
    """q, k and v cut from one projection (``helpers.constructs``): its heads are the units of
    one group (a head's q, k and v rows and its output projection's columns together) and
    the converted model computes the model brought (biases that no norm absorbs zeroed);
    wrap itself checks the FLOPs and a random task's slim copy at batch sizes 1 and 3."""
    torch.manual_seed(0)
    model = QkvSplit(chunk=layout == "chunk").eval()
    if layout == "head-by-head":
        model.attn = _HeadByHead(16, 4, chunk=False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and name.startswith(("patches", "attn")):
                p.zero_()
    x = torch.randn(2, 3, 32, 32)
    sn = espn.wrap(model, x)
    attn = sn.model.attn
    assert isinstance(attn, MaskedAttention) and sn.group_sizes["attn.heads"] == 4
    assert attn.q.out_units == attn.v.out_units == attn.proj.in_units == "attn.heads"
    assert attn.proj.in_unit_size == 4
    sn.eval()
    with torch.no_grad():
        torch.testing.assert_close(sn.forward_working(x), model(x), rtol=1e-5, atol=1e-5)


def test_attention_written_by_hand_computing_something_else_is_refused():
    model = QkvSplit()
    model.attn = _OtherScale(16, 4, chunk=False)
    with pytest.raises(EspnError) as info:
        espn.wrap(model, torch.zeros(2, 3, 32, 32))
    text = str(info.value)
    assert text.startswith("module 'attn' cuts the output of 'attn.qkv' into parts read by")
    assert "does not compute multi-head self-attention" in text and "\n" not in text
